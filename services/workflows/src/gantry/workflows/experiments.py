"""Experiment documents (``kind: Experiment``): a search space, an objective, a budget, a trial.

::

    apiVersion: gantry/v1
    kind: Experiment
    metadata: {name: churn-hpo}
    spec:
      objective: {metric: accuracy, goal: maximize}
      method: tpe                 # tpe (Bayesian) or random
      pruner: {kind: asha}        # asha (successive halving), median, hyperband or none
      budget: {trials: 16, gpuHours: 2}
      parallelism: 4
      space:
        lr: {logUniform: [0.0001, 0.1]}
        hidden: {int: [16, 128], step: 16}
        optimizer: {choice: [adam, sgd]}
      trial:                      # the spec of each trial's TrainingJob
        entrypoint:
          task: gantry.training.examples.tabular:task
          args: ["lr=${trial.lr}", "hidden=${trial.hidden}"]

Each trial is an ordinary job (quotas, priorities and preemption apply) whose ``${trial.x}``
references are the values the search method chose; ``${trial.number}`` numbers it. The job's
runtime reports the objective after every epoch (the experiment adds ``eval_every=1`` to its
args unless they set it), which the pruner compares with the other trials' at the same epoch.
The search itself is Optuna's (samplers and pruners), kept in the service's database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gantry.core import InvalidInput
from gantry.sched.spec import PRIORITY_CLASSES, parse_job
from gantry.workflows.documents import (
    API_VERSION,
    NAME_PATTERN,
    Metadata,
    load_document,
    validation_problems,
)
from gantry.workflows.references import Reference, parse_reference, references_in, substitute

Scalar = str | int | float | bool
TRIAL_LABELS = ("gantry.io/experiment", "gantry.io/trial")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Parameter(_Model):
    """One dimension of the space: exactly one of ``uniform``, ``logUniform``, ``int`` or
    ``choice`` (``step`` quantises ``uniform`` and ``int``; ``log`` makes ``int`` log-scaled)."""

    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = Field(default=None, alias="logUniform")
    int_: tuple[int, int] | None = Field(default=None, alias="int")
    choice: tuple[Scalar, ...] | None = None
    step: float | None = Field(default=None, gt=0)
    log: bool = False

    @property
    def kind(self) -> str:
        kinds = [
            k
            for k, v in (
                ("uniform", self.uniform),
                ("logUniform", self.log_uniform),
                ("int", self.int_),
                ("choice", self.choice),
            )
            if v is not None
        ]
        return kinds[0] if len(kinds) == 1 else ""

    def problem(self) -> str | None:
        """Why no value (or more than one kind) can be drawn from this dimension, or None."""
        kinds = [k for k in ("uniform", "logUniform", "int", "choice") if _given(self, k)]
        if len(kinds) != 1:
            return (
                "give exactly one of uniform, logUniform, int or choice "
                f"(found {', '.join(kinds) or 'none'})"
            )
        if self.choice is not None:
            if not self.choice:
                return "choice [] has no values to choose from"
            if len(set(map(repr, self.choice))) != len(self.choice):
                return f"choice {list(self.choice)} lists a value twice"
            return None
        low, high = self.uniform or self.log_uniform or self.int_ or (0, 0)
        if not (math.isfinite(low) and math.isfinite(high)):
            return f"{self.kind} [{low}, {high}] must be finite numbers"
        if low > high:
            return f"{self.kind} [{low}, {high}] has no values: the low end is above the high end"
        if (self.log_uniform is not None or (self.int_ is not None and self.log)) and low <= 0:
            return (
                f"{self.kind} [{low}, {high}] has no values on a log scale: the low end must be > 0"
            )
        if self.step is not None:
            if self.log_uniform is not None or self.log:
                return "step cannot be combined with a log scale"
            if self.int_ is not None and self.step != int(self.step):
                return f"an int step must be a whole number, not {self.step}"
            span = high - low
            if span and abs(span / self.step - round(span / self.step)) > 1e-9:
                return f"step {self.step:g} does not divide [{low}, {high}] into whole steps"
        return None

    def distribution(self) -> Any:
        """The Optuna distribution of this dimension (call :meth:`problem` first)."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.choice is not None:
            return CategoricalDistribution(list(self.choice))
        if self.int_ is not None:
            return IntDistribution(
                self.int_[0], self.int_[1], log=self.log, step=int(self.step or 1)
            )
        if self.log_uniform is not None:
            return FloatDistribution(self.log_uniform[0], self.log_uniform[1], log=True)
        assert self.uniform is not None
        return FloatDistribution(self.uniform[0], self.uniform[1], step=self.step)


def _given(p: Parameter, kind: str) -> bool:
    return {
        "uniform": p.uniform,
        "logUniform": p.log_uniform,
        "int": p.int_,
        "choice": p.choice,
    }[kind] is not None


class Objective(_Model):
    """The metric the trials report and which way is better."""

    metric: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    goal: Literal["maximize", "minimize"] = "maximize"


class Pruner(_Model):
    """Early stopping of poor trials (compared at the same epoch)."""

    kind: Literal["asha", "median", "hyperband", "none"] = "asha"
    min_resource: int = Field(default=1, ge=1, alias="minEpochs")
    reduction_factor: int = Field(default=3, ge=2, alias="reductionFactor")
    warmup_trials: int = Field(
        default=2, ge=0, alias="warmupTrials", description="median: trials before pruning."
    )

    def optuna(self) -> Any:
        import optuna

        if self.kind == "asha":
            return optuna.pruners.SuccessiveHalvingPruner(
                min_resource=self.min_resource, reduction_factor=self.reduction_factor
            )
        if self.kind == "hyperband":
            return optuna.pruners.HyperbandPruner(
                min_resource=self.min_resource, reduction_factor=self.reduction_factor
            )
        if self.kind == "median":
            return optuna.pruners.MedianPruner(
                n_startup_trials=self.warmup_trials, n_warmup_steps=self.min_resource - 1
            )
        return optuna.pruners.NopPruner()


class Budget(_Model):
    """When the search stops: after ``trials`` trials, or once they used ``gpuHours``."""

    trials: int = Field(ge=1, le=10_000)
    gpu_hours: float | None = Field(default=None, gt=0, alias="gpuHours")


class ExperimentSpec(_Model):
    """The search: objective, method, pruner, budget, parallelism, space and trial template."""

    queue: str = Field(default="default", pattern=NAME_PATTERN)
    priority: int | str = "normal"
    objective: Objective
    method: Literal["tpe", "random"] = "tpe"
    pruner: Pruner = Field(default_factory=Pruner)
    budget: Budget
    parallelism: int = Field(default=2, ge=1, le=256)
    seed: int | None = None
    space: dict[str, Parameter] = Field(min_length=1)
    trial: dict[str, Any]

    def sampler(self) -> Any:
        import optuna

        if self.method == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        return optuna.samplers.TPESampler(
            seed=self.seed, n_startup_trials=min(10, max(2, self.budget.trials // 4))
        )


class ExperimentDoc(_Model):
    """A whole submitted experiment document."""

    api_version: Literal["gantry/v1"] = Field(alias="apiVersion")
    kind: Literal["Experiment"]
    metadata: Metadata
    spec: ExperimentSpec


@dataclass(frozen=True)
class Experiment:
    """A checked experiment document."""

    doc: ExperimentDoc
    source: str

    @property
    def name(self) -> str:
        return self.doc.metadata.name

    @property
    def spec(self) -> ExperimentSpec:
        return self.doc.spec

    def distributions(self) -> dict[str, Any]:
        return self.distributions_of(self.spec)

    @staticmethod
    def distributions_of(spec: ExperimentSpec) -> dict[str, Any]:
        """The Optuna distribution of every parameter of ``spec``'s space."""
        return {k: p.distribution() for k, p in spec.space.items()}


def check_spec(spec: ExperimentSpec, where: str, name: str) -> list[str]:
    """Every problem with ``spec`` (``where`` prefixes each: ``spec`` or a step's place)."""
    problems: list[str] = []
    for key, param in spec.space.items():
        if not key.isidentifier():
            problems.append(f"{where}.space.{key}: a parameter name is letters, digits and '_'")
        why = param.problem()
        if why is not None:
            problems.append(f"{where}.space.{key}: {why}")
    if isinstance(spec.priority, str) and spec.priority not in PRIORITY_CLASSES:
        problems.append(f"{where}.priority: unknown priority class {spec.priority!r}")
    used: set[str] = set()
    for path, text in references_in(spec.trial):
        try:
            ref = parse_reference(text)
        except InvalidInput as exc:
            problems.append(f"{where}.trial.{path}: {exc.message}")
            continue
        if ref.kind != "trial":
            if ref.kind == "step" or ref.kind == "param":
                continue  # a pipeline step's experiment: the pipeline checks these
            problems.append(f"{where}.trial.{path}: ${{{text}}} cannot be used in a trial")
        elif ref.name != "number" and ref.name not in spec.space:
            problems.append(
                f"{where}.trial.{path}: ${{{text}}} is not a parameter of the space "
                f"(space: {', '.join(spec.space)})"
            )
        used.add(ref.name)
    for key in spec.space:
        if key not in used:
            problems.append(
                f"{where}.space.{key}: the trial never uses it; write ${{trial.{key}}} where "
                "the task should get it (e.g. in entrypoint.args)"
            )
    for key in ("apiVersion", "kind", "metadata"):
        if key in spec.trial:
            problems.append(f"{where}.trial.{key}: write only the job's spec here")
    if not problems:
        try:
            parse_job(trial_document(name, spec, number=0, values=_midpoints(spec), run_id=""))
        except InvalidInput as exc:
            problems.append(
                f"{where}.trial: {exc.message.removeprefix('the job spec is invalid: ')}"
            )
    return problems


def _midpoints(spec: ExperimentSpec) -> dict[str, Scalar]:
    out: dict[str, Scalar] = {}
    for key, p in spec.space.items():
        if p.choice:
            out[key] = p.choice[0]
        elif p.int_ is not None:
            out[key] = p.int_[0]
        else:
            low, _ = p.uniform or p.log_uniform or (0.0, 0.0)
            out[key] = float(low)
    return out


def trial_document(
    name: str,
    spec: ExperimentSpec,
    *,
    number: int,
    values: Mapping[str, Scalar],
    run_id: str,
    resolve_other: Any = None,
) -> dict[str, Any]:
    """The TrainingJob document of trial ``number`` with ``values`` substituted."""

    def resolve(ref: Reference) -> Any:
        if ref.kind == "trial":
            return number if ref.name == "number" else values[ref.name]
        if resolve_other is not None:
            return resolve_other(ref)
        return ""

    body = dict(substitute(spec.trial, resolve))
    entry = dict(body.get("entrypoint") or {})
    if entry.get("task") and spec.pruner.kind != "none":
        args = [str(a) for a in entry.get("args") or ()]
        if not any(a.startswith("eval_every=") for a in args):
            args.append("eval_every=1")
        entry["args"] = args
    body["entrypoint"] = entry
    labels = {TRIAL_LABELS[0]: name, TRIAL_LABELS[1]: str(number)}
    if run_id:
        labels["gantry.io/run"] = run_id
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {
            "name": f"{name}-t{number}"[:63].rstrip("-"),
            "queue": spec.queue,
            "priority": spec.priority,
            "labels": labels,
        },
        "spec": body,
    }


def parse_experiment(source: str) -> Experiment:
    """A checked :class:`Experiment` from YAML; :class:`InvalidInput` listing every problem."""
    raw = load_document(source)
    if raw.get("kind") != "Experiment":
        raise InvalidInput(
            f"kind {raw.get('kind')!r} is not an experiment", hint="use kind: Experiment"
        )
    try:
        doc = ExperimentDoc.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(
            "the experiment is invalid: " + "; ".join(validation_problems(exc, raw)),
            hint="see docs/workflows.md for the experiment format",
        ) from None
    problems = check_spec(doc.spec, "spec", doc.metadata.name)
    if problems:
        raise InvalidInput(
            f"experiment {doc.metadata.name!r} is invalid: " + "; ".join(problems),
            hint="fix these and submit again; see docs/workflows.md",
        )
    return Experiment(doc, source)


__all__ = [
    "TRIAL_LABELS",
    "Budget",
    "Experiment",
    "ExperimentDoc",
    "ExperimentSpec",
    "Objective",
    "Parameter",
    "Pruner",
    "check_spec",
    "parse_experiment",
    "trial_document",
]
