"""Pipeline documents (``kind: Pipeline`` / ``kind: CronPipeline``): parsed, checked, compiled.

A pipeline is a graph of steps. Each step is one of:

- ``train``: a training job (the ``spec`` of a TrainingJob document); outputs ``job``,
  ``model`` (the version it registered, ``name:version``) and ``metrics.<name>``;
- ``data``: a job that commits a version of the dataset named by ``commit`` (its
  ``entrypoint`` is usually a ``transform``); outputs ``job``, ``dataset`` and ``version``;
- ``evaluate``: a job that evaluates ``model`` (a ``name:version``, usually a train step's
  output) with its task's ``evaluate``; outputs ``job``, ``model`` and ``metrics.<name>``;
- ``deploy``: deploys ``model`` through the serving service, as a canary when the deployment
  already serves a version; outputs ``deployment``, ``model`` and ``version``.

A step runs once the steps it ``dependsOn`` and the steps it refers to have succeeded. A
``gate`` (a metric against ``atLeast``/``atMost``) decides whether it runs at all: a closed
gate skips the step and everything after it, and says why. Everything is checked when the
pipeline is submitted — unknown fields, unknown steps, cycles, references to outputs a step
cannot have, parameters nobody declared, each step's job spec as the scheduler would check it,
the ``spec.triggers`` that start runs by themselves (:mod:`gantry.workflows.triggers`) — and
every problem is reported at once with where it is.
"""

from __future__ import annotations

import graphlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gantry.core import InvalidInput
from gantry.sched.spec import PRIORITY_CLASSES, parse_duration_s, parse_job
from gantry.workflows.documents import (
    API_VERSION,
    NAME_PATTERN,
    Metadata,
    load_document,
    validation_problems,
)
from gantry.workflows.references import (
    OUTPUTS,
    Reference,
    check_output,
    parse_reference,
    references_in,
    substitute,
)
from gantry.workflows.triggers import MAX_TRIGGERS, Trigger, trigger_problems

KINDS = ("Pipeline", "CronPipeline")
STEP_KINDS = ("train", "data", "evaluate", "deploy", "experiment")
MAX_STEPS = 100
JOB_LABELS = ("gantry.io/pipeline", "gantry.io/run", "gantry.io/step")
_JOB_KEYS_RESERVED = ("apiVersion", "kind", "metadata")

Scalar = str | int | float | bool


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Gate(_Model):
    """Run the step only when ``metric`` is at least ``atLeast`` and/or at most ``atMost``."""

    metric: str = Field(description="A reference: ${steps.evaluate.outputs.metrics.accuracy}")
    at_least: float | str | None = Field(default=None, alias="atLeast")
    at_most: float | str | None = Field(default=None, alias="atMost")


class Canary(_Model):
    """How the serving service rolls the new version out (its defaults are Flagger's)."""

    percent: int = Field(default=10, ge=1, le=100, description="The canary's first weight.")
    step_percent: int = Field(default=0, ge=0, le=100, alias="stepPercent")
    max_percent: int = Field(default=0, ge=0, le=100, alias="maxPercent")
    interval_s: float = Field(default=0.0, ge=0, alias="interval")
    failure_threshold: int = Field(default=0, ge=0, alias="failureThreshold")
    min_success_rate: float = Field(default=0.0, ge=0, le=1, alias="minSuccessRate")
    max_p99_ms: float = Field(default=0.0, ge=0, alias="maxP99Ms")
    min_requests: int = Field(default=0, ge=0, alias="minRequests")

    @field_validator("interval_s", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> float:
        return float(parse_duration_s(value)) if isinstance(value, str) else value

    def analysis(self) -> dict[str, float]:
        """The settings given (non-zero), named and typed as the serving API has them."""
        fields = (
            "step_percent",
            "max_percent",
            "interval_s",
            "failure_threshold",
            "min_success_rate",
            "max_p99_ms",
            "min_requests",
        )
        return {f: getattr(self, f) for f in fields if getattr(self, f)}


class Deploy(_Model):
    """A deploy step: ``model`` (``name:version`` or a reference) into ``deployment``."""

    deployment: str = Field(pattern=NAME_PATTERN)
    model: str
    environment: str = "staging"
    canary: Canary = Field(default_factory=Canary)
    max_batch_size: int = Field(default=0, ge=0, le=4096, alias="maxBatchSize")
    max_queue_delay_us: int | None = Field(default=None, ge=0, alias="maxQueueDelayUs")
    wait_for: Literal["started", "promoted"] = Field(default="started", alias="waitFor")
    timeout_s: int = Field(default=3600, ge=1, alias="timeout")

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> int:
        return parse_duration_s(value)


class Step(_Model):
    """One step: exactly one of ``train``, ``data``, ``evaluate``, ``deploy`` or
    ``experiment``."""

    name: str = Field(pattern=NAME_PATTERN)
    depends_on: tuple[str, ...] = Field(default=(), alias="dependsOn")
    train: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    evaluate: dict[str, Any] | None = None
    deploy: Deploy | None = None
    experiment: dict[str, Any] | None = None
    gate: Gate | None = None
    retries: int = Field(default=0, ge=0, le=10, description="Automatic retries on failure.")
    queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    priority: int | str | None = None

    @property
    def kind(self) -> str:
        """``train``, ``data``, ``evaluate`` or ``deploy``."""
        for kind in STEP_KINDS:
            if getattr(self, kind) is not None:
                return kind
        return ""

    def body(self) -> Any:
        """The step's own settings (the job spec, or the deploy settings) as a plain document."""
        if self.deploy is not None:
            return self.deploy.model_dump(by_alias=True)
        return getattr(self, self.kind) or {} if self.kind else {}


class Schedule(_Model):
    """When a CronPipeline runs and what happens when a run is still going."""

    cron: str = Field(description="Five fields: minute hour day-of-month month day-of-week.")
    timezone: str = "UTC"
    concurrency: Literal["skip", "queue", "replace"] = "skip"
    starting_deadline_s: int = Field(
        default=300,
        ge=1,
        alias="startingDeadline",
        description="A fire missed by more than this (the service was down) is skipped.",
    )
    suspend: bool = False

    @field_validator("starting_deadline_s", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> int:
        return parse_duration_s(value)


class PipelineSpec(_Model):
    """Steps, parameters, defaults for the steps' jobs, (CronPipeline) the schedule and the
    events that start a run by themselves (:mod:`gantry.workflows.triggers`)."""

    queue: str = Field(default="default", pattern=NAME_PATTERN)
    priority: int | str = "normal"
    params: dict[str, Scalar] = Field(default_factory=dict)
    steps: tuple[Step, ...] = Field(min_length=1, max_length=MAX_STEPS)
    schedule: Schedule | None = None
    triggers: tuple[Trigger, ...] = Field(default=(), max_length=MAX_TRIGGERS)


class PipelineDoc(_Model):
    """A whole submitted pipeline document."""

    api_version: Literal["gantry/v1"] = Field(alias="apiVersion")
    kind: Literal["Pipeline", "CronPipeline"]
    metadata: Metadata
    spec: PipelineSpec


@dataclass(frozen=True)
class Pipeline:
    """A checked pipeline: its document, its steps in a runnable order, their parents."""

    doc: PipelineDoc
    source: str
    order: tuple[str, ...]
    parents: Mapping[str, tuple[str, ...]]

    @property
    def name(self) -> str:
        return self.doc.metadata.name

    @property
    def kind(self) -> str:
        return self.doc.kind

    @property
    def schedule(self) -> Schedule | None:
        return self.doc.spec.schedule

    @property
    def params(self) -> Mapping[str, Scalar]:
        return self.doc.spec.params

    @property
    def triggers(self) -> tuple[Trigger, ...]:
        return self.doc.spec.triggers

    def step(self, name: str) -> Step:
        for step in self.doc.spec.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    @property
    def steps(self) -> tuple[Step, ...]:
        by_name = {s.name: s for s in self.doc.spec.steps}
        return tuple(by_name[n] for n in self.order)

    def children(self, name: str) -> tuple[str, ...]:
        return tuple(n for n in self.order if name in self.parents[n])

    def downstream(self, name: str) -> tuple[str, ...]:
        """Every step that depends on ``name``, directly or not, in order."""
        found = {name}
        for n in self.order:
            if found & set(self.parents[n]):
                found.add(n)
        return tuple(n for n in self.order if n in found and n != name)

    def run_params(self, given: Mapping[str, str]) -> dict[str, Scalar]:
        """The defaults with ``given`` (from the command line, as text) applied, typed as the
        defaults; :class:`InvalidInput` for an undeclared or ill-typed one."""
        params: dict[str, Scalar] = dict(self.params)
        problems = []
        for key, text in given.items():
            if key not in params:
                problems.append(
                    f"unknown parameter {key!r}; the pipeline declares "
                    f"{', '.join(sorted(params)) or 'none'}"
                )
                continue
            try:
                params[key] = _typed(text, params[key])
            except ValueError as exc:
                problems.append(f"parameter {key}: {exc}")
        if problems:
            raise InvalidInput("; ".join(problems), hint="pass parameters as --param name=value")
        return params


def _typed(text: Any, default: Scalar) -> Scalar:
    if not isinstance(text, str):
        text = str(text)
    if isinstance(default, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{text!r} is not true or false")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number") from None
    if isinstance(default, float):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{text!r} is not a finite number")
        return value
    return str(text)


# -- parsing ----------------------------------------------------------------------------------


def parse_pipeline(source: str) -> Pipeline:
    """A checked :class:`Pipeline` from YAML text; :class:`InvalidInput` listing every problem
    with its place (``spec.steps[2] (evaluate): ...``)."""
    raw = load_document(source)
    if raw.get("kind") not in KINDS:
        raise InvalidInput(
            f"kind {raw.get('kind')!r} is not a pipeline",
            hint="use kind: Pipeline, or kind: CronPipeline for one with a schedule",
        )
    try:
        doc = PipelineDoc.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(
            "the pipeline is invalid: " + "; ".join(validation_problems(exc, raw)),
            hint="see docs/workflows.md for the pipeline format",
        ) from None
    problems: list[str] = []
    _check_kind(doc, problems)
    _check_steps(doc, problems)
    parents = _dependencies(doc, problems)
    order: tuple[str, ...] = ()
    if not problems:
        order = _order(parents, problems)
    if not problems:
        pipeline = Pipeline(doc, source, order, parents)
        _check_jobs(pipeline, problems)
        if not problems:
            return pipeline
    raise InvalidInput(
        f"pipeline {doc.metadata.name!r} is invalid: " + "; ".join(problems),
        hint="fix these and submit again; see docs/workflows.md",
    )


def _at(i: int, step: Step) -> str:
    return f"spec.steps[{i}] ({step.name})"


def _check_kind(doc: PipelineDoc, problems: list[str]) -> None:
    schedule = doc.spec.schedule
    if doc.kind == "CronPipeline" and schedule is None:
        problems.append("a CronPipeline needs spec.schedule (cron, timezone, concurrency)")
    if doc.kind == "Pipeline" and schedule is not None:
        problems.append("spec.schedule is for kind: CronPipeline; a Pipeline runs when started")
    if schedule is not None:
        from gantry.workflows.cron import CronError, check_cron

        try:
            check_cron(schedule.cron, schedule.timezone)
        except CronError as exc:
            problems.append(f"spec.schedule: {exc}")
    prio = doc.spec.priority
    if isinstance(prio, str) and prio not in PRIORITY_CLASSES:
        problems.append(
            f"spec.priority: unknown priority class {prio!r} (use {', '.join(PRIORITY_CLASSES)})"
        )
    for key, value in doc.spec.params.items():
        if not key.isidentifier():
            problems.append(f"spec.params.{key}: a parameter name is letters, digits and '_'")
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"spec.params.{key}: {value} is not a finite number")
    problems.extend(trigger_problems(doc.spec.triggers, doc.spec.params))


def _check_steps(doc: PipelineDoc, problems: list[str]) -> None:
    seen: set[str] = set()
    for i, step in enumerate(doc.spec.steps):
        at = _at(i, step)
        if step.name in seen:
            problems.append(f"{at}: the step name {step.name!r} is used twice")
        seen.add(step.name)
        kinds = [k for k in STEP_KINDS if getattr(step, k) is not None]
        if len(kinds) != 1:
            problems.append(
                f"{at}: give exactly one of train, data, evaluate, deploy or experiment "
                f"(found {', '.join(kinds) or 'none'})"
            )
            continue
        if step.kind == "experiment":
            problems.extend(_experiment_problems(step, at, doc.metadata.name))
            continue
        body = step.body()
        if step.kind != "deploy":
            for key in _JOB_KEYS_RESERVED:
                if key in body:
                    problems.append(
                        f"{at}.{step.kind}.{key}: write only the job's spec here; the pipeline "
                        "names the job and sets its queue and priority"
                    )
        if step.kind == "data" and not isinstance(body.get("commit"), str):
            problems.append(f"{at}.data.commit: name the dataset this step commits a version of")
        if step.kind == "evaluate" and not isinstance(body.get("model"), str):
            problems.append(
                f"{at}.evaluate.model: name the model version to evaluate, e.g. "
                "${steps.train.outputs.model}"
            )
        if step.kind == "deploy" and step.deploy is not None:
            _check_model_ref(step.deploy.model, f"{at}.deploy.model", problems)
        if step.kind == "evaluate" and isinstance(body.get("model"), str):
            _check_model_ref(body["model"], f"{at}.evaluate.model", problems)
        if isinstance(step.priority, str) and step.priority not in PRIORITY_CLASSES:
            problems.append(f"{at}.priority: unknown priority class {step.priority!r}")
        if step.gate is not None:
            g = step.gate
            if g.at_least is None and g.at_most is None:
                problems.append(f"{at}.gate: give atLeast and/or atMost")


def _experiment_problems(step: Step, at: str, pipeline: str) -> list[str]:
    from gantry.workflows.experiments import ExperimentSpec, check_spec

    body = step.experiment or {}
    try:
        spec = ExperimentSpec.model_validate(body)
    except ValidationError as exc:
        return [f"{at}.experiment.{p}" for p in validation_problems(exc, body)]
    return check_spec(spec, f"{at}.experiment", job_name(pipeline, step.name))


def _check_model_ref(text: str, where: str, problems: list[str]) -> None:
    if "${" in text:
        return
    name, sep, version = text.partition(":")
    if not sep or not name or not version.lstrip("v").isdigit():
        problems.append(f"{where}: {text!r} is not a model version; write name:version")


def _gate_refs(step: Step) -> list[tuple[str, str]]:
    if step.gate is None:
        return []
    g = step.gate
    out = [("gate.metric", _bare(g.metric))]
    for label, value in (("gate.atLeast", g.at_least), ("gate.atMost", g.at_most)):
        if isinstance(value, str):
            out.append((label, _bare(value)))
    return out


def _bare(text: str) -> str:
    """``steps.x.outputs.y`` from ``${steps.x.outputs.y}`` or itself."""
    text = text.strip()
    return text[2:-1].strip() if text.startswith("${") and text.endswith("}") else text


def step_references(step: Step) -> list[tuple[str, Reference | str]]:
    """``(where, reference)`` for every reference in the step, or ``(where, problem)``."""
    out: list[tuple[str, Reference | str]] = []
    for path, text in [*references_in(step.body()), *_gate_refs(step)]:
        try:
            out.append((path, parse_reference(text)))
        except InvalidInput as exc:
            out.append((path, exc.message))
    return out


def _dependencies(doc: PipelineDoc, problems: list[str]) -> dict[str, tuple[str, ...]]:
    steps = {s.name: s for s in doc.spec.steps}
    parents: dict[str, tuple[str, ...]] = {}
    for i, step in enumerate(doc.spec.steps):
        at = _at(i, step)
        found: list[str] = []
        for dep in step.depends_on:
            if dep == step.name:
                problems.append(f"{at}.dependsOn: a step cannot depend on itself")
            elif dep not in steps:
                problems.append(
                    f"{at}.dependsOn: there is no step {dep!r} (steps: {', '.join(steps)})"
                )
            else:
                found.append(dep)
        for where, ref in step_references(step):
            place = f"{at}.{step.kind}.{where}" if not where.startswith("gate") else f"{at}.{where}"
            if isinstance(ref, str):
                problems.append(f"{place}: {ref}")
                continue
            if ref.kind == "trial" and step.kind != "experiment":
                problems.append(
                    f"{place}: ${{{ref.text}}} only means something in an experiment's trial"
                )
            if ref.kind == "param" and ref.name not in doc.spec.params:
                problems.append(
                    f"{place}: ${{{ref.text}}} names a parameter spec.params does not declare "
                    f"(declared: {', '.join(doc.spec.params) or 'none'})"
                )
            if ref.kind != "step":
                continue
            if ref.name == step.name:
                problems.append(f"{place}: a step cannot use its own outputs")
            elif ref.name not in steps:
                problems.append(
                    f"{place}: ${{{ref.text}}} names no step of this pipeline "
                    f"(steps: {', '.join(steps)})"
                )
            else:
                why = check_output(ref, steps[ref.name].kind or "train")
                if why is not None:
                    problems.append(f"{place}: ${{{ref.text}}}: {why}")
                found.append(ref.name)
        if step.gate is not None:
            metric = parse_reference_or_none(_bare(step.gate.metric))
            if metric is None or not (metric.kind == "step" and metric.metric):
                problems.append(
                    f"{at}.gate.metric: must be a step's metric, e.g. "
                    "${steps.evaluate.outputs.metrics.accuracy}"
                )
        parents[step.name] = tuple(dict.fromkeys(found))
    return parents


def parse_reference_or_none(text: str) -> Reference | None:
    try:
        return parse_reference(text)
    except InvalidInput:
        return None


def _order(parents: Mapping[str, tuple[str, ...]], problems: list[str]) -> tuple[str, ...]:
    sorter = graphlib.TopologicalSorter(parents)
    try:
        return tuple(sorter.static_order())
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1]) if len(exc.args) > 1 else []
        path = " → ".join(reversed(cycle)) if cycle else "some steps"
        problems.append(
            f"the steps form a cycle ({path}): a step cannot wait, directly or through others, "
            "for itself — remove one of these dependencies"
        )
        return ()


# -- building a step's job --------------------------------------------------------------------

_PLACEHOLDERS: Mapping[str, Any] = {
    "job": "job-0",
    "model": "model:1",
    "dataset": "dataset",
    "version": "0" * 64,
    "deployment": "deployment",
}


def placeholder(ref: Reference, params: Mapping[str, Scalar]) -> Any:
    """A stand-in value for a reference while checking a step at submit time."""
    if ref.kind == "param":
        return params.get(ref.name, "")
    if ref.kind == "run":
        return "2026-01-01" if ref.name == "date" else "placeholder"
    if ref.metric:
        return 0.0
    return _PLACEHOLDERS.get(ref.output, "placeholder")


def job_document(
    pipeline: Pipeline,
    step: Step,
    resolve: Callable[[Reference], Any],
    *,
    run_id: str,
) -> dict[str, Any]:
    """The TrainingJob document a train/data/evaluate step submits, references resolved."""
    body = dict(substitute(step.body(), resolve))
    own = {"data": ("commit", "message"), "evaluate": ("model",)}.get(step.kind, ())
    spec = {k: v for k, v in body.items() if k not in own}
    if step.kind == "data":
        spec["output"] = {
            "dataset": body["commit"],
            "message": body.get("message")
            or f"pipeline {pipeline.name} run {run_id} step {step.name}",
        }
    if step.kind == "evaluate":
        name, _, version = str(body["model"]).partition(":")
        spec["model"] = {"name": name, "version": int(version.lstrip("v") or 0)}
        entry = dict(spec.get("entrypoint") or {})
        if entry.get("task"):
            entry.setdefault("mode", "evaluate")
        spec["entrypoint"] = entry
    d = pipeline.doc.spec
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {
            "name": job_name(pipeline.name, step.name),
            "queue": step.queue or d.queue,
            "priority": step.priority if step.priority is not None else d.priority,
            "labels": dict(zip(JOB_LABELS, (pipeline.name, run_id, step.name), strict=True)),
        },
        "spec": spec,
    }


def job_name(pipeline: str, step: str) -> str:
    """``<pipeline>-<step>``, cut to 63 characters."""
    return f"{pipeline}-{step}"[:63].rstrip("-")


def _check_jobs(pipeline: Pipeline, problems: list[str]) -> None:
    params = pipeline.params
    for i, step in enumerate(pipeline.doc.spec.steps):
        if step.kind in ("deploy", "experiment"):
            continue
        try:
            doc = job_document(pipeline, step, lambda ref: placeholder(ref, params), run_id="check")
            parse_job(doc)
        except InvalidInput as exc:
            message = exc.message.removeprefix("the job spec is invalid: ")
            problems.append(f"{_at(i, step)}.{step.kind}: {message}")
        except (ValueError, TypeError) as exc:
            problems.append(f"{_at(i, step)}.{step.kind}: {exc}")


def fire_date(at: datetime | None) -> str:
    """``run.date``: the day a run was scheduled for (or started), ``YYYY-MM-DD`` UTC."""
    return (at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d")


__all__ = [
    "API_VERSION",
    "JOB_LABELS",
    "OUTPUTS",
    "STEP_KINDS",
    "Canary",
    "Deploy",
    "Gate",
    "Pipeline",
    "PipelineDoc",
    "Schedule",
    "Step",
    "Trigger",
    "fire_date",
    "job_document",
    "job_name",
    "load_document",
    "parse_pipeline",
    "placeholder",
]
