"""The workflows SDK: submit pipelines and cron pipelines, start runs and follow them step by step.

::

    from pathlib import Path
    from gantry.client.workflows import WorkflowsClient

    with WorkflowsClient("127.0.0.1:7036", token) as workflows:
        workflows.submit(Path("churn.yaml").read_text())
        run = workflows.start("churn", {"epochs": "20"}, request_id="churn-2026-01-31").run
        run = workflows.wait(run.id, timeout_s=3600, on_update=lambda r: print(r.state))
        for step in run.steps:
            print(step.name, step.state, step.reason, dict(step.outputs))

Calls go to ``gantry.workflows.v1.WorkflowService``. Every call returns plain frozen dataclasses
(:class:`PipelineInfo`, :class:`RunInfo`, ...), never protocol messages; failures raise
Gantry's typed errors (see :mod:`gantry.client.errors`). The pipeline format itself is
described in ``docs/workflows.md``.
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

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
STEP_KINDS = ("train", "data", "evaluate", "deploy")
# A step's own fields; the one other key of a step is its kind (a kind added to the service
# later is shown as it is written).
_STEP_FIELDS = frozenset({"name", "dependsOn", "gate", "retries", "queue", "priority"})

# ``${steps.<name>.outputs...}`` (not the literal ``$${``): what makes an implicit dependency.
_STEP_REF = re.compile(r"(?<!\$)\$\{\s*steps\.([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.outputs\.")


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
    """train | data | evaluate | deploy, as written ("" when the document does not say)"""
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
    """train | data | evaluate | deploy"""
    state: str
    """One of :data:`STEP_STATES`."""
    reason: str
    attempt: int
    """The current (or last) attempt, from 1; 0 before the first."""
    job_id: str
    """The current attempt's job ("" for deploy steps and steps not started)."""
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


# ---------------------------------------------------------------------- the client


class WorkflowsClient(RpcClient):
    """A synchronous client of the workflows service, authenticated with a bearer token.

    ``timeout_s`` bounds each call; :meth:`wait` has its own ``timeout_s``.
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
        if timeout_s <= 0:
            raise InvalidInput(f"timeout_s must be more than 0, not {timeout_s:g}")
        if poll_s <= 0:
            raise InvalidInput(f"poll_s must be more than 0, not {poll_s:g}")
        last = self.run(run_id)  # an unreachable service or an unknown run: said at once
        deadline = time.monotonic() + timeout_s
        seen = _change(last)
        if on_update is not None:
            on_update(last)
        while not last.done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunWaitTimeout(last, timeout_s)
            time.sleep(min(poll_s, left))
            try:
                run = self.run(run_id)
            except Unavailable:
                continue  # the service is restarting (runs carry on from its database)
            last = run
            if _change(run) != seen:
                seen = _change(run)
                if on_update is not None:
                    on_update(run)
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
    "RUN_DONE",
    "RUN_STATES",
    "STEP_DONE",
    "STEP_KINDS",
    "STEP_STATES",
    "ArtifactInfo",
    "PipelineInfo",
    "PipelineStepInfo",
    "RunInfo",
    "RunWaitTimeout",
    "ScheduleInfo",
    "StartRunResult",
    "StepAttemptInfo",
    "StepRunInfo",
    "SubmitPipelineResult",
    "WorkflowsClient",
]
