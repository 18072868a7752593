"""What the workflows service says about experiments (hyperparameter searches), as plain
frozen records.

An experiment (:class:`ExperimentInfo`) searches a space of parameters (:class:`ParameterInfo`,
read from its document) with trials (:class:`TrialInfo`), each a job with its learning curve.
:class:`~gantry.client.workflows.WorkflowsClient` returns these; they are re-exported by
:mod:`gantry.client.workflows`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gantry.client._pipeline_records import param_text
from gantry.protos.v1 import workflows_pb2 as pb

#: Experiment states (a dry run answers ``checked``).
EXPERIMENT_STATES = ("running", "succeeded", "failed", "cancelled")
#: Experiment states after which no trial starts any more.
EXPERIMENT_DONE = frozenset({"succeeded", "failed", "cancelled"})
#: Trial states.
TRIAL_STATES = ("starting", "running", "succeeded", "pruned", "failed", "cancelled")
#: Trial states of a trial whose job is (about to be) running.
TRIAL_ACTIVE = frozenset({"starting", "running"})


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
        choices = tuple(param_text(v) for v in raw["choice"])
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


__all__ = [
    "EXPERIMENT_DONE",
    "EXPERIMENT_STATES",
    "TRIAL_ACTIVE",
    "TRIAL_STATES",
    "ExperimentInfo",
    "ParameterInfo",
    "TrialInfo",
]
