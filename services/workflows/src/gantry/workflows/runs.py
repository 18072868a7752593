"""Pipeline runs (domain, no I/O): the state of a run and its steps, and what to do next.

:func:`plan` looks at a run and its pipeline and says what should happen now: start a step
whose parents all succeeded (or skip it, if its gate is closed or a parent did not succeed),
retry a failed step that has retries left, end the run once every step has ended. The
controller carries the actions out and records what came of them; calling :func:`plan` again
on the same state gives the same answer, so a restarted service simply carries on.

Run states: ``queued`` (waiting for an earlier run of a cron pipeline) → ``running`` →
``succeeded`` | ``failed`` | ``cancelled``; ``skipped`` for a cron fire that did not run.
Step states: ``pending`` → ``starting`` (its job is being submitted) → ``running`` →
``succeeded`` | ``failed`` | ``skipped`` | ``cancelled``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gantry.workflows.pipelines import Pipeline, Scalar, Step
from gantry.workflows.references import Reference, Unresolved, parse_reference

RUN_ACTIVE = ("queued", "running")
RUN_DONE = ("succeeded", "failed", "cancelled", "skipped")
STEP_DONE = ("succeeded", "failed", "skipped", "cancelled")


@dataclass(frozen=True)
class Artifact:
    """A thing a step used or produced: a dataset version, a model version, a deployment."""

    kind: Literal["dataset", "model", "deployment", "job"]
    name: str
    version: str = ""

    def text(self) -> str:
        return f"{self.kind} {self.name}" + (f"@{self.version}" if self.version else "")


@dataclass
class Attempt:
    """One try of a step: its job (if any), how it ended and why."""

    number: int
    job_id: str = ""
    state: str = ""
    reason: str = ""
    started_ms: int = 0
    finished_ms: int = 0


@dataclass
class StepRun:
    """One step of one run."""

    name: str
    kind: str
    state: str = "pending"
    reason: str = ""
    attempt: int = 0
    job_id: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    inputs: list[Artifact] = field(default_factory=list)
    produced: list[Artifact] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def done(self) -> bool:
        return self.state in STEP_DONE

    def reset(self) -> None:
        """Back to pending for a retry or a resume (earlier attempts stay in the history)."""
        self.state = "pending"
        self.reason = ""
        self.job_id = ""
        self.outputs = {}
        self.metrics = {}
        self.inputs = []
        self.produced = []
        self.started_ms = self.finished_ms = 0


@dataclass
class Run:
    """One run of one revision of a pipeline."""

    id: str
    pipeline: str
    revision: int
    owner: str
    roles: tuple[str, ...]
    state: str = "running"
    reason: str = ""
    trigger: str = "manual"
    params: dict[str, Scalar] = field(default_factory=dict)
    steps: dict[str, StepRun] = field(default_factory=dict)
    scheduled_ms: int = 0
    created_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def done(self) -> bool:
        return self.state in RUN_DONE


@dataclass(frozen=True)
class Start:
    """Start ``step`` (attempt ``attempt``)."""

    step: str
    attempt: int


@dataclass(frozen=True)
class Skip:
    """Do not run ``step``: ``reason``."""

    step: str
    reason: str
    gate: bool = False


@dataclass(frozen=True)
class Finish:
    """End the run in ``state`` because ``reason``."""

    state: str
    reason: str


Action = Start | Skip | Finish


def new_run(
    pipeline: Pipeline,
    *,
    id: str,
    revision: int,
    owner: str,
    roles: tuple[str, ...],
    params: Mapping[str, Scalar],
    trigger: str = "manual",
    state: str = "running",
    now_ms: int = 0,
    scheduled_ms: int = 0,
) -> Run:
    """A run of ``pipeline`` with every step pending."""
    return Run(
        id=id,
        pipeline=pipeline.name,
        revision=revision,
        owner=owner,
        roles=roles,
        state=state,
        trigger=trigger,
        params=dict(params),
        steps={s.name: StepRun(s.name, s.kind) for s in pipeline.steps},
        scheduled_ms=scheduled_ms,
        created_ms=now_ms,
        started_ms=now_ms if state == "running" else 0,
    )


def plan(run: Run, pipeline: Pipeline) -> list[Action]:
    """What to do now, in the pipeline's order (see the module docstring)."""
    if run.state != "running":
        return []
    actions: list[Action] = []
    for step in pipeline.steps:
        sr = run.steps[step.name]
        if sr.state == "failed" and sr.attempt <= step.retries:
            actions.append(Start(step.name, sr.attempt + 1))
            continue
        if sr.state != "pending":
            continue
        parents = [run.steps[p] for p in pipeline.parents[step.name]]
        blocked = next((p for p in parents if p.state in ("failed", "cancelled")), None)
        if blocked is not None and not _retrying(blocked, pipeline):
            actions.append(Skip(step.name, f"not run: step {blocked.name} {blocked.state}"))
            continue
        skipped = next((p for p in parents if p.state == "skipped"), None)
        if skipped is not None:
            actions.append(Skip(step.name, f"not run: step {skipped.name} was skipped"))
            continue
        if all(p.state == "succeeded" for p in parents):
            if step.gate is not None:
                opened, why = gate(step, run)
                if not opened:
                    actions.append(Skip(step.name, why, gate=True))
                    continue
            actions.append(Start(step.name, sr.attempt + 1))
    if not actions:
        finish = _finish(run, pipeline)
        if finish is not None:
            actions.append(finish)
    return actions


def _retrying(sr: StepRun, pipeline: Pipeline) -> bool:
    return sr.state == "failed" and sr.attempt <= pipeline.step(sr.name).retries


def _finish(run: Run, pipeline: Pipeline) -> Finish | None:
    steps = [run.steps[s.name] for s in pipeline.steps]
    if not all(s.done for s in steps):
        return None
    failed = [s for s in steps if s.state == "failed"]
    if failed:
        first = failed[0]
        return Finish("failed", f"step {first.name} failed: {first.reason}")
    cancelled = [s for s in steps if s.state == "cancelled"]
    if cancelled:
        return Finish("cancelled", f"step {cancelled[0].name} was cancelled")
    gated = [s for s in steps if s.state == "skipped" and not s.reason.startswith("not run")]
    if gated:
        return Finish(
            "succeeded",
            "; ".join(f"{s.name} skipped ({s.reason})" for s in gated),
        )
    return Finish("succeeded", f"all {len(steps)} steps succeeded")


# -- references against a run -----------------------------------------------------------------


def resolve(run: Run, ref: Reference) -> Any:
    """The value of ``ref`` in ``run``; :class:`Unresolved` when it has none."""
    if ref.kind == "param":
        if ref.name not in run.params:
            raise Unresolved(f"the run has no parameter {ref.name!r}")
        return run.params[ref.name]
    if ref.kind == "run":
        from gantry.workflows.pipelines import fire_date

        if ref.name == "id":
            return run.id
        if ref.name == "pipeline":
            return run.pipeline
        import datetime as dt

        at = run.scheduled_ms or run.created_ms
        return fire_date(dt.datetime.fromtimestamp(at / 1000, dt.UTC) if at else None)
    sr = run.steps.get(ref.name)
    if sr is None or sr.state != "succeeded":
        raise Unresolved(f"step {ref.name} has not succeeded, so ${{{ref.text}}} has no value")
    if ref.metric:
        if ref.metric not in sr.metrics:
            have = ", ".join(sorted(sr.metrics)) or "none"
            raise Unresolved(
                f"step {ref.name} reported no metric {ref.metric!r} (it reported: {have})",
                hint="make the task's evaluate() return it, or gate on a metric it reports",
            )
        return sr.metrics[ref.metric]
    if not sr.outputs.get(ref.output):
        raise Unresolved(
            f"step {ref.name} produced no {ref.output}"
            + (" (its job registered no model)" if ref.output == "model" else "")
        )
    return sr.outputs[ref.output]


def gate(step: Step, run: Run) -> tuple[bool, str]:
    """Whether ``step``'s gate is open in ``run``, and the sentence that says why."""
    assert step.gate is not None
    g = step.gate

    def value(text: float | str) -> float:
        if isinstance(text, int | float):
            return float(text)
        bare = text.strip().removeprefix("${").removesuffix("}").strip()
        got = resolve(run, parse_reference(bare))
        try:
            number = float(got)
        except (TypeError, ValueError):
            raise Unresolved(f"{text} is {got!r}, not a number") from None
        return number

    try:
        metric_ref = parse_reference(g.metric.strip().removeprefix("${").removesuffix("}").strip())
        metric = value(g.metric)
        low = value(g.at_least) if g.at_least is not None else None
        high = value(g.at_most) if g.at_most is not None else None
    except Unresolved as exc:
        return False, f"gate closed: {exc.message}"
    name = f"{metric_ref.name}.{metric_ref.metric}"
    if math.isnan(metric):
        return False, f"gate closed: {name} is NaN"
    if low is not None and metric < low:
        return False, f"gate closed: {name} {metric:.4g} < {low:.4g} (atLeast)"
    if high is not None and metric > high:
        return False, f"gate closed: {name} {metric:.4g} > {high:.4g} (atMost)"
    bounds = " and ".join(
        b
        for b in (
            f"≥ {low:.4g}" if low is not None else "",
            f"≤ {high:.4g}" if high is not None else "",
        )
        if b
    )
    return True, f"gate open: {name} {metric:.4g} {bounds}"


__all__ = [
    "RUN_ACTIVE",
    "RUN_DONE",
    "STEP_DONE",
    "Action",
    "Artifact",
    "Attempt",
    "Finish",
    "Run",
    "Skip",
    "Start",
    "StepRun",
    "gate",
    "new_run",
    "plan",
    "resolve",
]
