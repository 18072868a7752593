"""The TrainingJob spec: what users submit, as YAML in a Kubernetes-like shape.

::

    apiVersion: gantry/v1
    kind: TrainingJob
    metadata: {name: resnet-ft, queue: vision, priority: high, labels: {team: cv}}
    spec:
      replicas: 4              # workers
      minReplicas: 2           # elastic: may run with 2..4
      resources: {gpus: 1, gpuModels: [A100], cpus: 8, memory: 32Gi}
      topology: pack           # pack | spread | same-node
      entrypoint: {module: train, args: [--epochs, "3"]}
      data: [{dataset: customers, version: 3f2a9c81d0e4, view: deidentified}]
      model: {name: churn-classifier, version: 3}   # an input model ($GANTRY_MODEL_DIR)
      output: {dataset: customers-clean}            # commit a dataset version
      training: {precision: bf16, checkpointInterval: 10m}
      maxRuntime: 24h

Three kinds of job share the shape: training (``entrypoint.task``, ``module`` or ``command``),
evaluation (``entrypoint: {task: ..., mode: evaluate}`` with ``model``) and data jobs
(``entrypoint.transform``, or any entrypoint, with ``output``).

:func:`parse_job` validates everything at once and raises :class:`~gantry.core.InvalidInput`
listing every problem as ``<path>: <what is wrong> (<what is allowed>)``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gantry.core import InvalidInput

API_VERSION = "gantry/v1"
KIND = "TrainingJob"
MAX_GPUS_PER_WORKER = 16
MILLI = 1000

_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_REFERENCE = r"^$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
#: Governance's dataset names: path segments in its storage.
_DATASET = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T|k)?")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
_UNITS_MIB = {
    None: 1 / (1 << 20),
    "Ki": 1 / 1024,
    "k": 1000 / (1 << 20),
    "K": 1000 / (1 << 20),
    "Mi": 1,
    "M": 1e6 / (1 << 20),
    "Gi": 1024,
    "G": 1e9 / (1 << 20),
    "Ti": 1 << 20,
    "T": 1e12 / (1 << 20),
}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

#: Priority classes by name; an integer priority may be given instead (higher runs first).
#: libyaml's safe loader when PyYAML was built with it (10x faster), else the pure-Python one.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PRIORITY_CLASSES: dict[str, int] = {"low": 100, "normal": 500, "high": 1000, "critical": 5000}


def parse_memory_mib(value: Any) -> int:
    """A Kubernetes-style quantity (``32Gi``, ``512Mi``, ``1.5G``, bytes as a number) in MiB."""
    if isinstance(value, bool):
        raise ValueError("must be a quantity like 32Gi or 512Mi")
    if isinstance(value, int | float):
        return int(value / (1 << 20))
    m = _QUANTITY.fullmatch(str(value).strip())
    if m is None:
        raise ValueError(f"{value!r} is not a quantity: write e.g. 32Gi, 512Mi or 2G")
    return int(float(m.group(1)) * _UNITS_MIB[m.group(2)])


def parse_duration_s(value: Any) -> int:
    """A duration (``30m``, ``24h``, ``2d``, seconds as a number) in seconds."""
    if isinstance(value, bool):
        raise ValueError("must be a duration like 30m or 24h")
    if isinstance(value, int | float):
        return int(value)
    m = _DURATION.fullmatch(str(value).strip())
    if m is None:
        raise ValueError(f"{value!r} is not a duration: write e.g. 90s, 30m, 24h or 2d")
    return int(float(m.group(1)) * _SECONDS[m.group(2)])


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class _At(ValueError):
    """A cross-field problem found by a model validator, at ``path`` below the model (pydantic
    would report it at the model itself); :func:`parse_job` adds the path."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


class Topology(StrEnum):
    """Where a gang's workers go: all on one node, packed on few nodes, or spread out."""

    SAME_NODE = "same-node"
    PACK = "pack"
    SPREAD = "spread"


class Metadata(_Model):
    """Who the job is and where it queues."""

    name: str = Field(description="DNS-label-like: lower-case letters, digits and '-'.")
    queue: str = "default"
    priority: int | str = "normal"
    labels: dict[str, str] = Field(default_factory=dict)
    request_id: str = Field(default="", alias="requestId", max_length=128)

    @field_validator("name", "queue")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "must be 1-63 lower-case letters, digits or '-', starting and ending with a "
                "letter or digit"
            )
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: int | str) -> int | str:
        if isinstance(value, str) and value not in PRIORITY_CLASSES:
            raise ValueError(
                f"unknown priority class {value!r}: use one of {', '.join(PRIORITY_CLASSES)} "
                "or an integer"
            )
        if isinstance(value, int) and not 0 <= value <= 1_000_000:
            raise ValueError("an integer priority must be between 0 and 1000000")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _LABEL_KEY.fullmatch(key):
                raise ValueError(f"label key {key!r} is not allowed (letters, digits, ._/-)")
        return value

    @property
    def priority_value(self) -> int:
        """The priority as a number (classes mapped through :data:`PRIORITY_CLASSES`)."""
        return PRIORITY_CLASSES[self.priority] if isinstance(self.priority, str) else self.priority


class Resources(_Model):
    """What ONE worker needs."""

    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_WORKER, description="Whole GPUs.")
    gpu_milli: int = Field(
        default=0,
        ge=0,
        le=MILLI,
        alias="gpuMilli",
        description="A share of ONE GPU in thousandths (1..1000), for workers that share a GPU.",
    )
    gpu_models: tuple[str, ...] = Field(default=(), alias="gpuModels")
    gpu_memory_mib: int = Field(default=0, ge=0, alias="gpuMemory")
    cpu_milli: int = Field(default=1000, ge=0, alias="cpus")
    memory_mib: int = Field(default=1024, ge=0, alias="memory")
    network_gbps: float = Field(default=0.0, ge=0, alias="networkGbps")

    @field_validator("cpu_milli", mode="before")
    @classmethod
    def _cpus(cls, value: Any) -> int:
        if isinstance(value, str) and value.endswith("m"):
            return int(value[:-1])
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("must be a number of cores like 4 or 0.5, or millicores like 500m")
        return int(float(value) * MILLI)

    @field_validator("memory_mib", "gpu_memory_mib", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_memory_mib(value)

    @model_validator(mode="after")
    def _gpu_shape(self) -> Resources:
        if self.gpu_milli and self.gpus > 1:
            raise ValueError(
                "gpuMilli shares ONE GPU: use it with gpus 0 or 1, or ask for whole gpus only"
            )
        return self

    @property
    def milli_gpus(self) -> int:
        """The GPU demand in milli-GPU (whole GPUs times 1000, or the share of one)."""
        return self.gpu_milli if self.gpu_milli else self.gpus * MILLI


class Entrypoint(_Model):
    """What the workers run: a Gantry training task, a data transform, a Python module or a
    command.

    ``task`` ("module:attribute", a :class:`gantry.training.Task`) runs under the training
    runtime, which reads ``args`` as ``key=value`` task options; with ``mode: evaluate`` it
    evaluates the job's input ``model`` instead of training. ``transform`` ("module:function",
    a function of a ``DataContext`` returning a table) runs under the transform runtime, which
    writes the table for the job's ``output``. ``module`` and ``command`` run as they are,
    with ``args`` appended.
    """

    task: str = Field(default="", pattern=_REFERENCE)
    transform: str = Field(default="", pattern=_REFERENCE)
    module: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    mode: Literal["train", "evaluate"] = Field(
        default="train",
        description="For a task: train it (default), or evaluate the job's input model.",
    )

    @model_validator(mode="after")
    def _one(self) -> Entrypoint:
        if sum(map(bool, (self.task, self.transform, self.module, self.command))) != 1:
            raise ValueError(
                "give exactly one of task (module:attribute of a gantry.training.Task), "
                "transform (module:function returning a table), module (a Python module) "
                "or command"
            )
        if self.mode != "train" and not self.task:
            raise _At(
                ("mode",),
                f"mode {self.mode!r} applies to task entrypoints only (a module or command "
                "reads $GANTRY_MODEL_DIR itself)",
            )
        return self

    @property
    def kind(self) -> Literal["task", "transform", "module", "command"]:
        """Which kind of entrypoint this is."""
        if self.task:
            return "task"
        if self.transform:
            return "transform"
        return "module" if self.module else "command"


class DataUse(_Model):
    """A dataset version the job reads, and in which view."""

    dataset: str
    version: str
    view: Literal["raw", "deidentified"] = "deidentified"


class ModelRef(_Model):
    """A registered model version the job reads (an evaluation's model): the node agent
    downloads it into the job's directory and points ``GANTRY_MODEL_DIR`` at it."""

    name: str = Field(min_length=1, max_length=128)
    version: int = Field(
        ge=1,
        description="An exact version (1, 2, ...): there is no 'latest', so a rerun evaluates "
        "the same model.",
    )


class Output(_Model):
    """The dataset a job commits a new version of, from the Parquet files its workers leave
    in ``$GANTRY_OUTPUT_DIR/dataset/``."""

    dataset: str
    message: str = Field(default="", max_length=2000)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not _DATASET.fullmatch(value) or ".." in value:
            raise ValueError(
                f"{value!r} is not a dataset name: 1-63 lower-case letters, digits, '-', '_' "
                "or '.', starting with a letter or digit"
            )
        return value


class Privacy(_Model):
    """Differentially private training (DP-SGD)."""

    epsilon: float = Field(gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    max_grad_norm: float = Field(default=1.0, gt=0, alias="maxGradNorm")


class Training(_Model):
    """Options the training runtime applies."""

    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    gradient_accumulation: int = Field(default=1, ge=1, le=1024, alias="gradientAccumulation")
    compression: Literal["none", "fp16", "int8", "int4", "powersgd"] = "none"
    checkpoint_interval_s: int = Field(default=600, ge=1, alias="checkpointInterval")
    privacy: Privacy | None = None

    @field_validator("checkpoint_interval_s", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> int:
        return parse_duration_s(value)


class JobSpec(_Model):
    """The job's shape and what it runs."""

    replicas: int = Field(default=1, ge=1, le=4096)
    min_replicas: int | None = Field(default=None, ge=1, alias="minReplicas")
    resources: Resources = Field(default_factory=Resources)
    topology: Topology = Topology.PACK
    entrypoint: Entrypoint
    data: tuple[DataUse, ...] = ()
    model: ModelRef | None = None
    output: Output | None = None
    training: Training = Field(default_factory=Training)
    max_runtime_s: int = Field(default=7 * 86400, ge=60, alias="maxRuntime")

    @field_validator("max_runtime_s", mode="before")
    @classmethod
    def _runtime(cls, value: Any) -> int:
        return parse_duration_s(value)

    @model_validator(mode="after")
    def _elastic(self) -> JobSpec:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) exceeds replicas ({self.replicas})"
            )
        views = {d.view for d in self.data}
        if len(views) > 1:
            raise ValueError("a job reads all its datasets in one view (raw or deidentified)")
        entry = self.entrypoint
        if entry.mode == "evaluate" and self.model is None:
            raise _At(
                ("model",),
                "an entrypoint with mode: evaluate needs the model to evaluate: give "
                "spec.model: {name: <model>, version: <n>}",
            )
        if entry.transform and self.output is None:
            raise _At(
                ("output",),
                "a transform entrypoint commits its table as a dataset version: give "
                "spec.output: {dataset: <existing dataset>}",
            )
        if (entry.transform or entry.mode == "evaluate") and self.replicas != 1:
            what = "a transform" if entry.transform else "an evaluation"
            raise _At(("replicas",), f"{what} runs in one worker: replicas must be 1")
        return self

    @property
    def elastic(self) -> bool:
        """Whether the job may run with fewer workers than ``replicas``."""
        return self.min_replicas is not None and self.min_replicas < self.replicas


class TrainingJob(_Model):
    """A whole submitted job document."""

    api_version: Literal["gantry/v1"] = Field(alias="apiVersion")
    kind: Literal["TrainingJob"]
    metadata: Metadata
    spec: JobSpec


def _where(loc: tuple[int | str, ...]) -> str:
    names = {
        "api_version": "apiVersion",
        "min_replicas": "minReplicas",
        "gpu_milli": "gpuMilli",
        "gpu_models": "gpuModels",
        "gpu_memory_mib": "gpuMemory",
        "cpu_milli": "cpus",
        "memory_mib": "memory",
        "network_gbps": "networkGbps",
        "max_runtime_s": "maxRuntime",
        "checkpoint_interval_s": "checkpointInterval",
        "gradient_accumulation": "gradientAccumulation",
        "max_grad_norm": "maxGradNorm",
        "request_id": "requestId",
    }
    parts = [f"[{p}]" if isinstance(p, int) else names.get(p, p) for p in loc]
    return ".".join(parts).replace(".[", "[") or "(document)"


def parse_job(source: str | dict[str, Any]) -> TrainingJob:
    """A validated :class:`TrainingJob` from YAML text (or a parsed mapping).

    Raises :class:`InvalidInput` naming every problem with its field path.
    """
    if isinstance(source, str):
        try:
            doc = yaml.load(source, Loader=_LOADER)  # noqa: S506 - a safe loader
        except yaml.YAMLError as exc:
            raise InvalidInput(f"the job file is not valid YAML: {exc}") from None
    else:
        doc = source
    if not isinstance(doc, dict):
        raise InvalidInput(
            "a job file must be a mapping with apiVersion, kind, metadata and spec",
            hint=f"start with 'apiVersion: {API_VERSION}' and 'kind: {KIND}'",
        )
    try:
        return TrainingJob.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            message = str(e["msg"]).removeprefix("Value error, ")
            loc = tuple(e["loc"])
            cause = (e.get("ctx") or {}).get("error")
            if isinstance(cause, _At):
                loc += cause.path
            if e["type"] == "extra_forbidden":
                message = "is not a known field (check its spelling and indentation)"
            elif e["type"] == "literal_error":
                message = f"{message} (got {e.get('input')!r})"
            problems.append(f"{_where(loc)}: {message}")
        raise InvalidInput(
            "the job spec is invalid:\n  " + "\n  ".join(problems),
            hint="see docs/jobs.md for every field and what it allows",
        ) from None


__all__ = [
    "API_VERSION",
    "KIND",
    "PRIORITY_CLASSES",
    "DataUse",
    "Entrypoint",
    "JobSpec",
    "Metadata",
    "ModelRef",
    "Output",
    "Privacy",
    "Resources",
    "Topology",
    "Training",
    "TrainingJob",
    "parse_duration_s",
    "parse_job",
    "parse_memory_mib",
]
