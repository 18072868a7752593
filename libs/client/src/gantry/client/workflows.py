"""The workflows SDK: pipelines and their runs, step by step; experiments and their trials.

::

    from pathlib import Path
    from gantry.client.workflows import WorkflowsClient

    with WorkflowsClient("127.0.0.1:7036", token) as workflows:
        workflows.submit(Path("churn.yaml").read_text())
        run = workflows.start("churn", {"epochs": "20"}, request_id="churn-2026-01-31").run
        run = workflows.wait(run.id, timeout_s=3600, on_update=lambda r: print(r.state))
        for step in run.steps:
            print(step.name, step.state, step.reason, dict(step.outputs))

An experiment (a hyperparameter search) is submitted and followed the same way::

        exp = workflows.submit_experiment(Path("churn-hpo.yaml").read_text())
        exp = workflows.wait_experiment(exp.name, timeout_s=7200)
        if exp.best is not None:
            print(exp.best.number, exp.best.value, dict(exp.best.values), exp.best.model)

Calls go to ``gantry.workflows.v1.WorkflowService``. Every call returns plain frozen dataclasses
(:class:`PipelineInfo`, :class:`RunInfo`, :class:`ExperimentInfo`, ...), never protocol
messages; failures raise Gantry's typed errors (see :mod:`gantry.client.errors`). The pipeline
and experiment formats are described in ``docs/workflows.md``.
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from gantry.client._rpc import ActAs, RpcClient
from gantry.core import InvalidInput, Unavailable
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

#: Run states, in the order a run may pass through them.
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "skipped")
#: Run states after which nothing changes any more (until a retry).
RUN_DONE = frozenset({"succeeded", "failed", "cancelled", "skipped"})
#: Step states.
STEP_STATES = ("pending", "starting", "running", "succeeded", "failed", "skipped", "cancelled")
#: Step states after which the step has ended.
STEP_DONE = frozenset({"succeeded", "failed", "skipped", "cancelled"})
#: The kinds of step a pipeline is made of.
STEP_KINDS = ("train", "data", "evaluate", "deploy", "experiment")
#: Experiment states (a dry run answers ``checked``).
EXPERIMENT_STATES = ("running", "succeeded", "failed", "cancelled")
#: Experiment states after which no trial starts any more.
EXPERIMENT_DONE = frozenset({"succeeded", "failed", "cancelled"})
#: Trial states.
TRIAL_STATES = ("starting", "running", "succeeded", "pruned", "failed", "cancelled")
#: Trial states of a trial whose job is (about to be) running.
TRIAL_ACTIVE = frozenset({"starting", "running"})
# A step's own fields; the one other key of a step is its kind (a kind added to the service
# later is shown as it is written).
_STEP_FIELDS = frozenset({"name", "dependsOn", "gate", "retries", "queue", "priority"})

# ``${steps.<name>.outputs...}`` (not the literal ``$${``): what makes an implicit dependency.
_STEP_REF = re.compile(r"(?<!\$)\$\{\s*steps\.([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.outputs\.")


_T = TypeVar("_T")


class RunWaitTimeout(Unavailable):
    """:meth:`WorkflowsClient.wait` gave up: the run was still active after ``timeout_s``.

    ``last`` is the run as last seen.
    """

    def __init__(self, last: RunInfo, timeout_s: float) -> None:
        self.last = last
        self.timeout_s = timeout_s
        super().__init__(
            f"run {last.id} of {last.pipeline} is still {last.state} after {timeout_s:g}s",
            hint=f"look at it with 'gantry pipelines runs get {last.id}', or wait longer",
        )


class ExperimentWaitTimeout(Unavailable):
    """:meth:`WorkflowsClient.wait_experiment` gave up: the experiment was still running after
    ``timeout_s``. ``last`` is the experiment as last seen."""

    def __init__(self, last: ExperimentInfo, timeout_s: float) -> None:
        self.last = last
        self.timeout_s = timeout_s
        super().__init__(
            f"experiment {last.name} is still {last.state} after {timeout_s:g}s "
            f"({len(last.trials)} of {last.budget_trials} trials started)",
            hint=f"look at it with 'gantry experiments get {last.name}', or wait longer",
        )


# ---------------------------------------------------------------------- pipelines


@dataclass(frozen=True)
class ScheduleInfo:
    """When a cron pipeline runs, and what it does when a run is still going."""

    cron: str
    timezone: str
    concurrency: str
    """skip | queue | replace"""
    next_fire_ms: int
    """Unix ms of the next fire; 0 while suspended."""
    suspended: bool
    missed: int
    """Fires missed past their starting deadline (the service was down), ever."""

    @classmethod
    def from_pb(cls, s: pb.Schedule) -> ScheduleInfo:
        """From the protocol message."""
        return cls(
            cron=s.cron,
            timezone=s.timezone,
            concurrency=s.concurrency,
            next_fire_ms=s.next_fire_ms,
            suspended=s.suspended,
            missed=s.missed,
        )


@dataclass(frozen=True)
class PipelineStepInfo:
    """One step as the pipeline declares it: its kind, what it waits for, its gate."""

    name: str
    kind: str
    """train | data | evaluate | deploy | experiment, as written ("" when the document does not
    say)"""
    depends_on: tuple[str, ...]
    """``dependsOn`` and the steps whose outputs it refers to."""
    gate: str
    """The gate in words (``evaluate.accuracy >= ${params.min_accuracy}``); "" without one."""
    retries: int


@dataclass(frozen=True)
class PipelineInfo:
    """A pipeline's latest revision, its schedule (cron pipelines) and its last run."""

    name: str
    kind: str
    """Pipeline | CronPipeline"""
    owner: str
    revision: int
    """0 for a dry run (nothing was stored)."""
    spec_yaml: str
    """The document as submitted."""
    description: str
    steps: tuple[str, ...]
    """Step names in an order they can run in."""
    params: Mapping[str, str]
    """The declared parameters and their defaults, as text."""
    schedule: ScheduleInfo | None
    created_ms: int
    updated_ms: int
    last_run_id: str
    last_run_state: str

    @classmethod
    def from_pb(cls, p: pb.Pipeline) -> PipelineInfo:
        """From the protocol message."""
        return cls(
            name=p.name,
            kind=p.kind,
            owner=p.owner,
            revision=p.revision,
            spec_yaml=p.spec_yaml,
            description=p.description,
            steps=tuple(p.steps),
            params=dict(p.params),
            schedule=ScheduleInfo.from_pb(p.schedule) if p.HasField("schedule") else None,
            created_ms=p.created_ms,
            updated_ms=p.updated_ms,
            last_run_id=p.last_run_id,
            last_run_state=p.last_run_state,
        )

    def step_graph(self) -> tuple[PipelineStepInfo, ...]:
        """Each step in :attr:`steps` order with its kind, its dependencies and its gate, read
        from :attr:`spec_yaml` the way the service reads them (the service checked it)."""
        declared = _declared_steps(self.spec_yaml)
        out = []
        for name in self.steps:
            raw = declared.get(name, {})
            kind = next((str(k) for k in raw if k not in _STEP_FIELDS), "")
            explicit = [str(d) for d in raw.get("dependsOn") or () if str(d) != name]
            found = [s for s in _step_refs([raw.get(kind), raw.get("gate")]) if s != name]
            retries = raw.get("retries", 0)
            out.append(
                PipelineStepInfo(
                    name=name,
                    kind=kind,
                    depends_on=tuple(dict.fromkeys([*explicit, *found])),
                    gate=_gate_text(raw.get("gate")),
                    retries=retries if isinstance(retries, int) else 0,
                )
            )
        return tuple(out)


def _declared_steps(source: str) -> dict[str, dict[str, Any]]:
    try:
        doc = yaml.safe_load(source)
    except yaml.YAMLError:
        return {}
    spec = doc.get("spec") if isinstance(doc, dict) else None
    steps = spec.get("steps") if isinstance(spec, dict) else None
    if not isinstance(steps, list):
        return {}
    return {str(s["name"]): s for s in steps if isinstance(s, dict) and "name" in s}


def _step_refs(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield from (m.group(1) for m in _STEP_REF.finditer(value))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _step_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _step_refs(item)


def _short(value: Any) -> str:
    """``evaluate.accuracy`` for ``${steps.evaluate.outputs.metrics.accuracy}``; else the
    text without ``${ }``."""
    text = str(value).strip()
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1].strip()
    m = re.fullmatch(r"steps\.([^.]+)\.outputs\.(?:metrics\.)?(.+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else text


def _gate_text(gate: Any) -> str:
    if not isinstance(gate, dict) or "metric" not in gate:
        return ""
    metric = _short(gate["metric"])
    bounds = [
        f"{metric} {op} {_short(gate[key])}"
        for key, op in (("atLeast", ">="), ("atMost", "<="))
        if gate.get(key) is not None
    ]
    return " and ".join(bounds) or metric


@dataclass(frozen=True)
class SubmitPipelineResult:
    """A submitted (or, for a dry run, checked) pipeline; ``replaced`` when an earlier
    revision existed."""

    pipeline: PipelineInfo
    replaced: bool = False


# ---------------------------------------------------------------------- runs


@dataclass(frozen=True)
class ArtifactInfo:
    """Something a step used or produced: a dataset version, a model version, a deployment."""

    kind: str
    """dataset | model | deployment"""
    name: str
    version: str

    @classmethod
    def from_pb(cls, a: pb.Artifact) -> ArtifactInfo:
        """From the protocol message."""
        return cls(kind=a.kind, name=a.name, version=a.version)

    @property
    def text(self) -> str:
        """``model churn@4``."""
        return f"{self.kind} {self.name}" + (f"@{self.version}" if self.version else "")


@dataclass(frozen=True)
class StepAttemptInfo:
    """One try of a step: its job and how it ended."""

    number: int
    job_id: str
    state: str
    reason: str
    started_ms: int
    finished_ms: int

    @classmethod
    def from_pb(cls, a: pb.StepAttempt) -> StepAttemptInfo:
        """From the protocol message."""
        return cls(a.number, a.job_id, a.state, a.reason, a.started_ms, a.finished_ms)


@dataclass(frozen=True)
class StepRunInfo:
    """One step of one run: where it stands, why, its job, outputs, metrics and lineage."""

    name: str
    kind: str
    """train | data | evaluate | deploy | experiment"""
    state: str
    """One of :data:`STEP_STATES`."""
    reason: str
    attempt: int
    """The current (or last) attempt, from 1; 0 before the first."""
    job_id: str
    """The current attempt's job ("" for deploy and experiment steps and steps not started; an
    experiment step names its best trial's job in ``outputs["job"]`` once it succeeded)."""
    depends_on: tuple[str, ...]
    """The steps it waits for (empty in run lists: only a single run carries them)."""
    outputs: Mapping[str, str]
    metrics: Mapping[str, float]
    inputs: tuple[ArtifactInfo, ...]
    """What it used."""
    produced: tuple[ArtifactInfo, ...]
    """What it made."""
    attempts: tuple[StepAttemptInfo, ...]
    started_ms: int
    finished_ms: int

    @classmethod
    def from_pb(cls, s: pb.StepRun) -> StepRunInfo:
        """From the protocol message."""
        return cls(
            name=s.name,
            kind=s.kind,
            state=s.state,
            reason=s.reason,
            attempt=s.attempt,
            job_id=s.job_id,
            depends_on=tuple(s.depends_on),
            outputs=dict(s.outputs),
            metrics=dict(s.metrics),
            inputs=tuple(ArtifactInfo.from_pb(a) for a in s.inputs),
            produced=tuple(ArtifactInfo.from_pb(a) for a in s.produced),
            attempts=tuple(StepAttemptInfo.from_pb(a) for a in s.attempts),
            started_ms=s.started_ms,
            finished_ms=s.finished_ms,
        )

    @property
    def done(self) -> bool:
        """Whether the step has ended (succeeded, failed, skipped or cancelled)."""
        return self.state in STEP_DONE

    @property
    def duration_ms(self) -> int | None:
        """How long it ran (None before it started or while it runs)."""
        if not self.started_ms or not self.finished_ms:
            return None
        return max(self.finished_ms - self.started_ms, 0)


@dataclass(frozen=True)
class RunInfo:
    """One run of one revision of a pipeline, step by step."""

    id: str
    pipeline: str
    revision: int
    owner: str
    """Whom its steps run as."""
    state: str
    """One of :data:`RUN_STATES`."""
    reason: str
    trigger: str
    """manual | schedule"""
    params: Mapping[str, str]
    """The values it ran with, as text."""
    steps: tuple[StepRunInfo, ...]
    """In the pipeline's order."""
    scheduled_ms: int
    """The cron fire it was made for (0 for manual runs)."""
    created_ms: int
    started_ms: int
    finished_ms: int

    @classmethod
    def from_pb(cls, r: pb.Run) -> RunInfo:
        """From the protocol message."""
        return cls(
            id=r.id,
            pipeline=r.pipeline,
            revision=r.revision,
            owner=r.owner,
            state=r.state,
            reason=r.reason,
            trigger=r.trigger,
            params=dict(r.params),
            steps=tuple(StepRunInfo.from_pb(s) for s in r.steps),
            scheduled_ms=r.scheduled_ms,
            created_ms=r.created_ms,
            started_ms=r.started_ms,
            finished_ms=r.finished_ms,
        )

    @property
    def done(self) -> bool:
        """Whether the run has ended (no longer queued or running)."""
        return self.state in RUN_DONE

    @property
    def succeeded(self) -> bool:
        """Whether it ended well (a gate that skipped a step still counts as success)."""
        return self.state == "succeeded"

    @property
    def duration_ms(self) -> int | None:
        """From start to end (None before it started or while it runs)."""
        if not self.started_ms or not self.finished_ms:
            return None
        return max(self.finished_ms - self.started_ms, 0)

    def step(self, name: str) -> StepRunInfo:
        """The step called ``name``; :class:`InvalidInput` naming the steps there are."""
        for s in self.steps:
            if s.name == name:
                return s
        raise InvalidInput(
            f"run {self.id} has no step {name!r}",
            hint=f"its steps: {', '.join(s.name for s in self.steps) or 'none'}",
        )


@dataclass(frozen=True)
class StartRunResult:
    """A started run; ``duplicate`` when its request id matched an earlier start (this is
    that run, as it is now)."""

    run: RunInfo
    duplicate: bool = False


def _change(run: RunInfo) -> tuple[Any, ...]:
    """What makes a polled run worth an update."""
    return (
        run.state,
        run.reason,
        tuple((s.state, s.reason, s.attempt, s.job_id) for s in run.steps),
    )


# ---------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class ParameterInfo:
    """One dimension of an experiment's search space, as its document declares it."""

    name: str
    kind: str
    """uniform | logUniform | int | choice ("" when the document cannot be read)"""
    low: float | None
    """The low end of a range (None for choice)."""
    high: float | None
    choices: tuple[str, ...]
    """A choice's values, as text (empty for ranges)."""
    step: float | None
    log: bool
    """Drawn on a log scale: ``logUniform``, or ``int`` with ``log: true``."""

    @property
    def text(self) -> str:
        """``logUniform [0.0001, 0.1]``, ``int [16, 128] step 16``, ``choice [adam, sgd]``."""
        if self.kind == "choice":
            return f"choice [{', '.join(self.choices)}]"
        if not self.kind:
            return "?"
        text = f"{self.kind} [{self.low:g}, {self.high:g}]"
        if self.step is not None:
            text += f" step {self.step:g}"
        if self.log and self.kind == "int":
            text += " log"
        return text


@dataclass(frozen=True)
class TrialInfo:
    """One trial of an experiment: the values it tried, how it went, what it cost."""

    number: int
    """From 0, in the order the search asked for them."""
    state: str
    """One of :data:`TRIAL_STATES`."""
    job_id: str
    values: Mapping[str, str]
    """The parameters it tried, as text."""
    value: float | None
    """The objective: the final one, or where a pruned trial stopped; None before either."""
    curve: tuple[tuple[int, float], ...]
    """``(epoch, objective)`` after each epoch it reported, by epoch."""
    metrics: Mapping[str, float]
    """Everything its job reported at the end."""
    model: str
    """The model version its job registered (``name:version``), "" if none."""
    reason: str
    device_s: float
    """Run time times devices, over its workers (a CPU-only worker counts as one device)."""
    started_ms: int
    finished_ms: int

    @classmethod
    def from_pb(cls, t: pb.Trial) -> TrialInfo:
        """From the protocol message."""
        return cls(
            number=t.number,
            state=t.state,
            job_id=t.job_id,
            values=dict(t.values),
            value=t.value if t.has_value else None,
            curve=tuple(sorted((p.epoch, p.value) for p in t.curve)),
            metrics=dict(t.metrics),
            model=t.model,
            reason=t.reason,
            device_s=t.device_s,
            started_ms=t.started_ms,
            finished_ms=t.finished_ms,
        )

    @property
    def epochs(self) -> int:
        """The epochs it reported (a pruned trial stops early); 0 before the first."""
        return max((e for e, _ in self.curve), default=0)

    @property
    def done(self) -> bool:
        """Whether it has ended (no longer starting or running)."""
        return self.state not in TRIAL_ACTIVE

    def values_text(self, order: Sequence[str] = ()) -> str:
        """``lr=0.0038, hidden=96, act=relu``: its values in ``order`` (then the others, by
        name), fractions to 4 significant digits."""
        names = [n for n in order if n in self.values]
        names += sorted(n for n in self.values if n not in names)
        return ", ".join(f"{n}={_short_number(self.values[n])}" for n in names)


@dataclass(frozen=True)
class ExperimentInfo:
    """An experiment: its search settings, every trial so far, the best one and the cost."""

    name: str
    owner: str
    state: str
    """One of :data:`EXPERIMENT_STATES`; ``checked`` for a dry run."""
    reason: str
    spec_yaml: str
    """The document as submitted (for an experiment step: as the pipeline made it)."""
    metric: str
    """The objective."""
    goal: str
    """maximize | minimize"""
    method: str
    """tpe | random"""
    pruner: str
    """asha | median | hyperband | none"""
    budget_trials: int
    budget_gpu_hours: float | None
    """The device-hour budget; None for none."""
    parallelism: int
    run_id: str
    """The pipeline run (``<run>/<attempt>``) that started it; "" when submitted on its own."""
    best_trial: int
    """The best trial's number; -1 until a trial succeeded."""
    trials: tuple[TrialInfo, ...]
    """By number."""
    device_s: float
    """Device-seconds used by every trial together."""
    parameters: tuple[str, ...]
    """The space's dimensions, in the document's order."""
    created_ms: int
    finished_ms: int

    @classmethod
    def from_pb(cls, e: pb.Experiment) -> ExperimentInfo:
        """From the protocol message."""
        return cls(
            name=e.name,
            owner=e.owner,
            state=e.state,
            reason=e.reason,
            spec_yaml=e.spec_yaml,
            metric=e.metric,
            goal=e.goal,
            method=e.method,
            pruner=e.pruner,
            budget_trials=e.budget_trials,
            budget_gpu_hours=e.budget_gpu_hours or None,
            parallelism=e.parallelism,
            run_id=e.run_id,
            best_trial=e.best_trial,
            trials=tuple(sorted((TrialInfo.from_pb(t) for t in e.trials), key=_number)),
            device_s=e.device_s,
            parameters=tuple(e.parameters),
            created_ms=e.created_ms,
            finished_ms=e.finished_ms,
        )

    @property
    def best(self) -> TrialInfo | None:
        """The best trial that succeeded so far, or None."""
        return next((t for t in self.trials if t.number == self.best_trial), None)

    @property
    def done(self) -> bool:
        """Whether the search has ended (succeeded, failed or cancelled)."""
        return self.state in EXPERIMENT_DONE

    @property
    def succeeded(self) -> bool:
        """Whether it ended with a best trial."""
        return self.state == "succeeded"

    @property
    def pruned(self) -> tuple[TrialInfo, ...]:
        """The trials the pruner stopped early."""
        return self.trials_in("pruned")

    @property
    def active(self) -> tuple[TrialInfo, ...]:
        """The trials starting or running now."""
        return self.trials_in(*TRIAL_ACTIVE)

    @property
    def device_hours(self) -> float:
        """:attr:`device_s` in hours, the unit of ``budget.gpuHours``."""
        return self.device_s / 3600

    def trials_in(self, *states: str) -> tuple[TrialInfo, ...]:
        """The trials in any of ``states``, by number."""
        return tuple(t for t in self.trials if t.state in states)

    def better(self, value: float, than: float) -> bool:
        """Whether objective ``value`` beats ``than`` (by :attr:`goal`)."""
        return value < than if self.goal == "minimize" else value > than

    def best_so_far(self) -> tuple[tuple[int, float], ...]:
        """``(trial number, best objective up to it)`` for each trial that succeeded, in order:
        how the search improved."""
        out: list[tuple[int, float]] = []
        for t in self.trials_in("succeeded"):
            if t.value is None:
                continue
            if not out or self.better(t.value, out[-1][1]):
                out.append((t.number, t.value))
            else:
                out.append((t.number, out[-1][1]))
        return tuple(out)

    def space(self) -> tuple[ParameterInfo, ...]:
        """Each dimension of the search space in :attr:`parameters` order, read from
        :attr:`spec_yaml` (the service checked it); a dimension it cannot read has kind ""."""
        declared = _declared_space(self.spec_yaml)
        names = self.parameters or tuple(declared)
        return tuple(_parameter(name, declared.get(name)) for name in names)


def _short_number(text: str) -> str:
    """``0.0038`` for ``0.00380061270665093``; whole numbers and words as they are."""
    if not re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return text
    if re.fullmatch(r"[-+]?\d+", text):
        return text
    return f"{float(text):.4g}"


def _number(t: TrialInfo) -> int:
    return t.number


def _declared_space(source: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(source)
    except yaml.YAMLError:
        return {}
    spec = doc.get("spec") if isinstance(doc, dict) else None
    space = spec.get("space") if isinstance(spec, dict) else None
    return {str(k): v for k, v in space.items()} if isinstance(space, dict) else {}


def _parameter(name: str, raw: Any) -> ParameterInfo:
    unknown = ParameterInfo(name, "", None, None, (), None, False)
    if not isinstance(raw, dict):
        return unknown
    if isinstance(raw.get("choice"), list):
        choices = tuple(_param_text(v) for v in raw["choice"])
        return ParameterInfo(name, "choice", None, None, choices, None, False)
    for kind in ("uniform", "logUniform", "int"):
        bounds = raw.get(kind)
        if isinstance(bounds, list) and len(bounds) == 2:
            try:
                low, high = float(bounds[0]), float(bounds[1])
                step = float(raw["step"]) if raw.get("step") is not None else None
            except (TypeError, ValueError):
                return unknown
            log = kind == "logUniform" or (kind == "int" and raw.get("log") is True)
            return ParameterInfo(name, kind, low, high, (), step, log)
    return unknown


def _experiment_change(e: ExperimentInfo) -> tuple[Any, ...]:
    """What makes a polled experiment worth an update."""
    return (
        e.state,
        e.reason,
        e.best_trial,
        tuple((t.number, t.state, t.epochs, t.value) for t in e.trials),
    )


# ---------------------------------------------------------------------- the client


class WorkflowsClient(RpcClient):
    """A synchronous client of the workflows service (pipelines, runs, experiments),
    authenticated with a bearer token.

    ``timeout_s`` bounds each call; :meth:`wait` and :meth:`wait_experiment` have their own.
    """

    service = "workflows"

    def __init__(
        self,
        address: str,
        bearer: str | None,
        *,
        timeout_s: float = 30.0,
        act_as: ActAs | None = None,
    ) -> None:
        super().__init__(address, bearer, timeout_s=timeout_s, act_as=act_as)
        self._stub = pb_grpc.WorkflowServiceStub(self._channel)

    # ------------------------------------------------------------------ pipelines

    def submit(self, spec_yaml: str, *, dry_run: bool = False) -> SubmitPipelineResult:
        """Check a ``kind: Pipeline`` or ``kind: CronPipeline`` document (YAML text) and store
        it as the pipeline's next revision; ``dry_run`` only checks it.

        A document with problems raises :class:`InvalidInput` listing every one with its
        place (``spec.steps[2] (evaluate).evaluate.model: ...``).
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the pipeline document is empty",
                hint="write a Pipeline document (see docs/workflows.md)",
            )
        request = pb.SubmitPipelineRequest(spec_yaml=spec_yaml, dry_run=dry_run)
        reply: pb.SubmitPipelineResponse = self._call("SubmitPipeline", request)
        return SubmitPipelineResult(PipelineInfo.from_pb(reply.pipeline), reply.replaced)

    def get(self, name: str) -> PipelineInfo:
        """A pipeline's latest revision, its schedule and its last run."""
        request = pb.NameRequest(name=_needed(name, "a pipeline name"))
        return PipelineInfo.from_pb(self._call("GetPipeline", request))

    def list(self) -> builtins.list[PipelineInfo]:
        """Every pipeline, by name, each with its last run."""
        reply: pb.ListPipelinesResponse = self._call("ListPipelines", pb.ListPipelinesRequest())
        return [PipelineInfo.from_pb(p) for p in reply.pipelines]

    def delete(self, name: str) -> PipelineInfo:
        """Delete a pipeline with no active run (its runs stay in the history); the pipeline
        as it was. Only its owner or a platform admin may."""
        request = pb.NameRequest(name=_needed(name, "a pipeline name"))
        return PipelineInfo.from_pb(self._call("DeletePipeline", request))

    # ------------------------------------------------------------------ runs

    def start(
        self,
        pipeline: str,
        params: Mapping[str, str] | None = None,
        *,
        request_id: str = "",
    ) -> StartRunResult:
        """Start a run of ``pipeline`` as the caller, with ``params`` overriding its defaults
        (text, typed by the service like the defaults).

        ``request_id`` makes the start idempotent: a repeat returns the first run with
        ``duplicate=True``.
        """
        given: dict[str, str] = {}
        for key, value in (params or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise InvalidInput(
                    f"a parameter needs a name, got {key!r}", hint="e.g. {'epochs': '20'}"
                )
            given[key] = _param_text(value)
        request = pb.StartRunRequest(
            pipeline=_needed(pipeline, "a pipeline name"), params=given, request_id=request_id
        )
        reply: pb.StartRunResponse = self._call("StartRun", request)
        return StartRunResult(RunInfo.from_pb(reply.run), reply.duplicate)

    def run(self, run_id: str) -> RunInfo:
        """One run with each step's state, job, outputs, metrics and lineage."""
        return RunInfo.from_pb(self._call("GetRun", pb.RunRequest(id=_needed(run_id, "a run id"))))

    def runs(self, pipeline: str = "", state: str = "", limit: int = 100) -> builtins.list[RunInfo]:
        """Runs, newest first: of one ``pipeline`` and in one ``state`` ("" = any); at most
        ``limit`` (0: the service's default of 100)."""
        if state and state not in RUN_STATES:
            raise InvalidInput(
                f"unknown run state {state!r}", hint=f"one of {', '.join(RUN_STATES)}"
            )
        if limit < 0:
            raise InvalidInput(f"limit must be 0 or more, not {limit}")
        request = pb.ListRunsRequest(pipeline=pipeline, state=state, limit=limit)
        reply: pb.ListRunsResponse = self._call("ListRuns", request)
        return [RunInfo.from_pb(r) for r in reply.runs]

    def cancel(self, run_id: str, reason: str = "") -> RunInfo:
        """Cancel an active run: its running jobs are cancelled, its pending steps never start.
        ``reason`` is kept on the run and its steps."""
        request = pb.RunRequest(id=_needed(run_id, "a run id"), reason=reason)
        return RunInfo.from_pb(self._call("CancelRun", request))

    def retry(self, run_id: str, from_step: str = "") -> RunInfo:
        """Run a finished run's failed, cancelled and not-run steps again, or ``from_step`` and
        every step after it; steps that succeeded keep their outputs."""
        request = pb.RunRequest(id=_needed(run_id, "a run id"), from_step=from_step)
        return RunInfo.from_pb(self._call("RetryRun", request))

    def wait(
        self,
        run_id: str,
        *,
        timeout_s: float,
        poll_s: float = 0.5,
        on_update: Callable[[RunInfo], None] | None = None,
    ) -> RunInfo:
        """Poll the run until it is no longer queued or running; the run as it ended.

        ``on_update`` is called with the run the first time and whenever a state, a reason, an
        attempt or a job changes. Once the run was seen, a service that becomes unreachable
        (restarting: runs carry on from its database) does not end the wait; after
        ``timeout_s`` it raises :class:`RunWaitTimeout`, an :class:`~gantry.core.Unavailable`.
        """
        return _poll(
            lambda: self.run(run_id),
            done=lambda r: r.done,
            change=_change,
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_update=on_update,
            timed_out=lambda r: RunWaitTimeout(r, timeout_s),
        )

    # ------------------------------------------------------------------ experiments

    def submit_experiment(self, spec_yaml: str, *, dry_run: bool = False) -> ExperimentInfo:
        """Check a ``kind: Experiment`` document (YAML text) and start its search as the caller;
        ``dry_run`` only checks it (the answer's state is ``checked`` and it has no trials).

        A document with problems raises :class:`InvalidInput` listing every one with its
        place (``spec.space.lr: logUniform [0.0, 1.0] has no values on a log scale: ...``); a
        name already used raises :class:`~gantry.core.AlreadyExists` (experiments keep their
        history).
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the experiment document is empty",
                hint="write an Experiment document (see docs/workflows.md)",
            )
        request = pb.SubmitExperimentRequest(spec_yaml=spec_yaml, dry_run=dry_run)
        return ExperimentInfo.from_pb(self._call("SubmitExperiment", request))

    def experiment(self, name: str) -> ExperimentInfo:
        """An experiment with every trial, its learning curve and the best so far."""
        request = pb.NameRequest(name=_needed(name, "an experiment name"))
        return ExperimentInfo.from_pb(self._call("GetExperiment", request))

    def experiments(self, state: str = "") -> builtins.list[ExperimentInfo]:
        """Experiments, newest first; only those in ``state`` unless it is ""."""
        if state and state not in EXPERIMENT_STATES:
            raise InvalidInput(
                f"unknown experiment state {state!r}",
                hint=f"one of {', '.join(EXPERIMENT_STATES)}",
            )
        reply: pb.ListExperimentsResponse = self._call(
            "ListExperiments", pb.ListExperimentsRequest(state=state)
        )
        return [ExperimentInfo.from_pb(e) for e in reply.experiments]

    def cancel_experiment(self, name: str, reason: str = "") -> ExperimentInfo:
        """Cancel a running experiment: its running trials' jobs are cancelled (freeing their
        devices) and no trial starts any more. ``reason`` is kept on it. Only its owner or a
        platform admin may."""
        request = pb.NameRequest(name=_needed(name, "an experiment name"), reason=reason)
        return ExperimentInfo.from_pb(self._call("CancelExperiment", request))

    def wait_experiment(
        self,
        name: str,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        on_update: Callable[[ExperimentInfo], None] | None = None,
    ) -> ExperimentInfo:
        """Poll the experiment until its search has ended; the experiment as it ended.

        ``on_update`` is called with the experiment the first time and whenever its state, a
        trial (started, reported an epoch, ended) or the best trial changes. A service that
        becomes unreachable after the first look does not end the wait (the search carries on
        from its database); after ``timeout_s`` it raises :class:`ExperimentWaitTimeout`, an
        :class:`~gantry.core.Unavailable`.
        """
        return _poll(
            lambda: self.experiment(name),
            done=lambda e: e.done,
            change=_experiment_change,
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_update=on_update,
            timed_out=lambda e: ExperimentWaitTimeout(e, timeout_s),
        )


def _poll(
    fetch: Callable[[], _T],
    *,
    done: Callable[[_T], bool],
    change: Callable[[_T], Any],
    timeout_s: float,
    poll_s: float,
    on_update: Callable[[_T], None] | None,
    timed_out: Callable[[_T], Exception],
) -> _T:
    """``fetch`` until ``done``, calling ``on_update`` on the first answer and each ``change``;
    a service unreachable after the first answer is tried again (it is restarting)."""
    if timeout_s <= 0:
        raise InvalidInput(f"timeout_s must be more than 0, not {timeout_s:g}")
    if poll_s <= 0:
        raise InvalidInput(f"poll_s must be more than 0, not {poll_s:g}")
    last = fetch()  # an unreachable service or an unknown name: said at once
    deadline = time.monotonic() + timeout_s
    seen = change(last)
    if on_update is not None:
        on_update(last)
    while not done(last):
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out(last)
        time.sleep(min(poll_s, left))
        try:
            current = fetch()
        except Unavailable:
            continue  # the service is restarting (everything carries on from its database)
        last = current
        if change(current) != seen:
            seen = change(current)
            if on_update is not None:
                on_update(current)
    return last


def _param_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _needed(value: str, what: str) -> str:
    if not value.strip():
        raise InvalidInput(f"{what} is needed")
    return value


__all__ = [
    "EXPERIMENT_DONE",
    "EXPERIMENT_STATES",
    "RUN_DONE",
    "RUN_STATES",
    "STEP_DONE",
    "STEP_KINDS",
    "STEP_STATES",
    "TRIAL_ACTIVE",
    "TRIAL_STATES",
    "ArtifactInfo",
    "ExperimentInfo",
    "ExperimentWaitTimeout",
    "ParameterInfo",
    "PipelineInfo",
    "PipelineStepInfo",
    "RunInfo",
    "RunWaitTimeout",
    "ScheduleInfo",
    "StartRunResult",
    "StepAttemptInfo",
    "StepRunInfo",
    "SubmitPipelineResult",
    "TrialInfo",
    "WorkflowsClient",
]
