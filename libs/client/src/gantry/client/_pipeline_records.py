"""What the workflows service says about pipelines and their runs, as plain frozen records.

A pipeline (:class:`PipelineInfo`) is a document of steps with its schedule; each run of it
(:class:`RunInfo`) has a :class:`StepRunInfo` per step with its attempts and the artifacts it
used and made. :class:`~gantry.client.workflows.WorkflowsClient` returns these; they are
re-exported by :mod:`gantry.client.workflows`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gantry.core import InvalidInput
from gantry.protos.v1 import workflows_pb2 as pb

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
# A step's own fields; the one other key of a step is its kind (a kind added to the service
# later is shown as it is written).
_STEP_FIELDS = frozenset({"name", "dependsOn", "gate", "retries", "queue", "priority"})

# ``${steps.<name>.outputs...}`` (not the literal ``$${``): what makes an implicit dependency.
_STEP_REF = re.compile(r"(?<!\$)\$\{\s*steps\.([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.outputs\.")


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


def param_text(value: object) -> str:
    """A parameter value as the service reads it: ``true``/``false`` for booleans, else
    ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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
    "ScheduleInfo",
    "StartRunResult",
    "StepAttemptInfo",
    "StepRunInfo",
    "SubmitPipelineResult",
    "param_text",
]
