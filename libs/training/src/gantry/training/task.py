"""What a user writes for a Gantry training job: a :class:`Task`.

A task names a model, a loss and a dataset factory, and optionally an evaluation and an
example input for the exported model. The job spec points at it, and the runtime does the
rest (distribution, precision, compression, checkpoints, privacy, progress, export and
registration)::

    # my_job.py
    from gantry.training import Task

    def model():
        return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))

    def dataset(ctx):
        return ctx.tensors("clicks", label="clicked")  # the job's governed dataset

    task = Task(model=model, loss=torch.nn.functional.cross_entropy, dataset=dataset,
                options={"epochs": 3, "micro_batch_size": 64, "lr": 1e-3})

and in the job's YAML ``spec.entrypoint: {task: my_job:task}``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from gantry.core import ConfigError, InvalidInput, load_settings
from gantry.sched.spec import DataUse, JobSpec
from gantry.training.trainer import LossFn, ModelFn, TrainingOptions, WorkerEnv

DatasetFactory = Callable[["DataContext"], Dataset[Any]]
Evaluate = Callable[[nn.Module, "DataContext"], Mapping[str, float]]


@dataclass(frozen=True)
class Task:
    """A training task: ``model()`` trained on ``dataset(ctx)`` to minimise ``loss``.

    ``dataset`` and ``eval_dataset`` receive a :class:`DataContext` (the job's governed data,
    its rank, its spec); ``evaluate(model, ctx)`` returns the metrics recorded with the model
    (default: the mean loss on ``eval_dataset``, when there is one). ``example_input()`` is a
    batch the exported model is traced with (default: the first inputs of ``dataset``).
    ``options`` are :class:`~gantry.training.trainer.TrainingOptions` fields the spec does not
    set (micro_batch_size, epochs, max_steps, lr, augment, ...); the job's
    ``entrypoint.args`` may override them as ``key=value``. ``model_name`` names the model in
    the registry (default: the job's name); ``quantize`` also exports a dynamically
    INT8-quantised version of the linear layers; ``register`` turns registration off.
    ``params`` are the task's own parameters with their defaults; the job's
    ``entrypoint.args`` set them as ``key=value`` too (typed as the default) and the factories
    read them from :attr:`DataContext.params`. ``generation``, for language models:
    ``{"vocabulary": ..., "context": ...}`` (character ``vocabulary[i]`` is token ``i``; the
    model reads ``context`` tokens at once), which the model's signature carries and serving
    uses to stream generated text.
    """

    model: ModelFn
    loss: LossFn
    dataset: DatasetFactory
    eval_dataset: DatasetFactory | None = None
    evaluate: Evaluate | None = None
    example_input: Callable[[], Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    model_name: str = ""
    quantize: bool = False
    register: bool = True
    description: str = ""
    generation: Mapping[str, Any] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class DataContext:
    """What a task's dataset factories may use: where the worker is and the job's data.

    :meth:`table` and :meth:`tensors` read a dataset of the job's spec through the job's
    governance grant, in the view the grant allows (never raw rows for a de-identified job).
    """

    env: WorkerEnv
    spec: JobSpec | None = None
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    """The task's parameters: its defaults, with the job's ``key=value`` args applied."""
    _tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def data(self) -> Sequence[DataUse]:
        """The dataset versions the job's spec reads."""
        return self.spec.data if self.spec is not None else ()

    def use(self, dataset: str) -> DataUse:
        """The spec's entry for ``dataset``, or a clear error naming the ones it has."""
        for item in self.data:
            if item.dataset == dataset:
                return item
        have = ", ".join(d.dataset for d in self.data) or "none"
        raise InvalidInput(
            f"the job's spec does not read dataset {dataset!r} (it reads: {have})",
            hint="add it to spec.data, e.g. {dataset: clicks, version: <version id>}",
        )

    def table(self, dataset: str) -> Any:
        """Every row of ``dataset`` (the spec's version) as a ``pyarrow.Table``, in the view
        of the job's grant. Read once per process and kept."""
        if dataset in self._tables:
            return self._tables[dataset]
        import pyarrow as pa

        from gantry.dataload import DataSettings, GovernanceShardSource, decode_shard

        use = self.use(dataset)
        settings = load_settings(DataSettings)
        address, token, grant = settings.require()
        source = GovernanceShardSource(
            address,
            token,
            dataset,
            use.version,
            grant,
            view=use.view,
            grant_file=str(settings.data_grant_file or ""),
            tls=settings.tls,
        )
        try:
            parts = [decode_shard(source.fetch(ref.id)) for ref in source.list_shards()]
        finally:
            source.close()
        if not parts:
            raise InvalidInput(f"dataset {dataset}@{use.version} has no rows")
        table = pa.concat_tables(parts, promote_options="default")
        self._tables[dataset] = table
        return table

    def tensors(
        self,
        dataset: str,
        *,
        label: str,
        features: Sequence[str] | None = None,
        label_dtype: torch.dtype = torch.long,
    ) -> TensorDataset:
        """``dataset`` as (features, label) tensors: ``features`` (default: every numeric
        column but the label) stacked as float32, the label as ``label_dtype``."""
        import pyarrow as pa

        table = self.table(dataset)
        if label not in table.column_names:
            raise InvalidInput(
                f"dataset {dataset} has no column {label!r}",
                hint=f"its columns: {', '.join(table.column_names)}",
            )
        if features is None:
            features = [
                name
                for name in table.column_names
                if name != label
                and (
                    pa.types.is_integer(table.schema.field(name).type)
                    or pa.types.is_floating(table.schema.field(name).type)
                    or pa.types.is_boolean(table.schema.field(name).type)
                )
            ]
        if not features:
            raise InvalidInput(f"dataset {dataset} has no numeric feature columns")
        columns = []
        for name in features:
            if name not in table.column_names:
                raise InvalidInput(f"dataset {dataset} has no column {name!r}")
            values = table.column(name).to_numpy(zero_copy_only=False)
            columns.append(torch.as_tensor(values.astype("float32")))
        x = torch.stack(columns, dim=1)
        # a copy: Arrow's zero-copy view is read-only, and a tensor over it would alias it
        y = torch.tensor(table.column(label).to_numpy(zero_copy_only=False)).to(label_dtype)
        return TensorDataset(x, y)


def load_reference(reference: str, *, example: str = "my_package.train:task") -> Any:
    """The object at ``module:attribute`` (dotted attributes allowed).

    An import error in the user's module is raised as it is, so the user sees their own
    traceback; a reference that names nothing raises :class:`InvalidInput`.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(
            f"reference {reference!r} is not module:attribute", hint=f"e.g. {example}"
        )
    module = importlib.import_module(module_name)
    try:
        value: Any = module
        for part in attribute.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise InvalidInput(
            f"module {module_name} has no attribute {attribute!r}", hint=f"e.g. {example}"
        ) from None
    return value


def load_task(reference: str) -> Task:
    """The :class:`Task` at ``module:attribute`` (an attribute that is a Task or returns one).

    An import error in the user's module is raised as it is, so the user sees their own
    traceback; a reference that names nothing raises :class:`InvalidInput`.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(
            f"task reference {reference!r} is not module:attribute",
            hint="e.g. entrypoint: {task: my_package.train:task}",
        )
    try:
        value = load_reference(reference)
    except InvalidInput:
        raise InvalidInput(
            f"module {module_name} has no attribute {attribute!r}",
            hint="point entrypoint.task at a gantry.training.Task object or a function "
            "returning one",
        ) from None
    if callable(value) and not isinstance(value, Task):
        value = value()
    if not isinstance(value, Task):
        raise InvalidInput(
            f"{reference} is a {type(value).__name__}, not a gantry.training.Task",
            hint="define task = Task(model=..., loss=..., dataset=...)",
        )
    return value


_OPTION_NAMES = {f.name for f in fields(TrainingOptions)}
_SPEC_OWNED = {"precision", "gradient_accumulation", "compression", "checkpoint_interval_s"}
_INT_OPTIONS = {"micro_batch_size", "epochs", "max_steps", "seed", "num_workers", "eval_every"}
_BOOL_OPTIONS = {"deterministic", "fsdp", "step_metrics"}


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """``key=value`` arguments as typed :class:`TrainingOptions` overrides."""
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidInput(
                f"argument {arg!r} is not key=value",
                hint="give task options as entrypoint.args: [epochs=3, lr=0.001]",
            )
        if key not in _OPTION_NAMES or key in _SPEC_OWNED or key in {"optimizer", "privacy"}:
            allowed = sorted(_OPTION_NAMES - _SPEC_OWNED - {"optimizer", "privacy"})
            raise InvalidInput(
                f"unknown task option {key!r}",
                hint=f"use one of {', '.join(allowed)}; precision, compression, accumulation "
                "and checkpoint interval come from spec.training",
            )
        value: Any
        try:
            if key in _INT_OPTIONS:
                value = int(raw)
            elif key in _BOOL_OPTIONS:
                if raw.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                    raise ValueError(raw)
                value = raw.lower() in {"true", "1", "yes"}
            elif key == "lr":
                value = float(raw)
            elif key == "augment":
                value = json.loads(raw)
            elif key == "checkpoint_modules":  # names, comma-separated: Block,encoder.layers.0
                value = tuple(part.strip() for part in raw.split(",") if part.strip())
            else:
                value = raw
        except ValueError:
            raise InvalidInput(f"task option {key}={raw!r} is not a valid value") from None
        out[key] = value
    return out


def split_params(
    args: Sequence[str], defaults: Mapping[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """The ``key=value`` args that set a task parameter, typed as its default, apart from the
    rest (training options); ``(rest, params)`` where params holds every parameter."""
    params = dict(defaults)
    rest: list[str] = []
    for arg in args:
        key, sep, raw = arg.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in defaults:
            rest.append(arg)
            continue
        default = defaults[key]
        try:
            if isinstance(default, bool):
                if raw.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                    raise ValueError(raw)
                params[key] = raw.lower() in {"true", "1", "yes"}
            elif isinstance(default, int):
                params[key] = int(raw)
            elif isinstance(default, float):
                params[key] = float(raw)
            else:
                params[key] = raw
        except ValueError:
            raise InvalidInput(
                f"task parameter {key}={raw!r} is not a valid {type(default).__name__}",
                hint=f"give it like its default, {key}={default!r}",
            ) from None
    return rest, params


def options_for(task: Task, spec: JobSpec | None, overrides: Mapping[str, Any]) -> TrainingOptions:
    """The run's options: the spec's ``training`` section, then the task's, then overrides."""
    merged = {**dict(task.options), **dict(overrides)}
    unknown = sorted(set(merged) - _OPTION_NAMES)
    if unknown:
        raise ConfigError(
            f"task options {', '.join(unknown)} are not training options",
            hint=f"use {', '.join(sorted(_OPTION_NAMES))}",
        )
    if spec is None:
        return TrainingOptions(**merged)
    merged = {k: v for k, v in merged.items() if k not in _SPEC_OWNED | {"privacy"}}
    return TrainingOptions.from_spec(spec.training, **merged)


def read_spec(environ: Mapping[str, str] | None = None) -> tuple[JobSpec | None, str]:
    """The job's spec and name from ``GANTRY_JOB_SPEC`` (a JSON file the agent writes)."""
    env = os.environ if environ is None else environ
    path = env.get("GANTRY_JOB_SPEC")
    if not path:
        return None, env.get("GANTRY_JOB_NAME", "")
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the job spec {path}: {exc}") from None
    try:
        spec = JobSpec.model_validate(raw.get("spec", raw))
    except ValueError as exc:
        raise ConfigError(f"the job spec in {path} is not valid: {exc}") from None
    return spec, str(raw.get("name", env.get("GANTRY_JOB_NAME", "")))


__all__ = [
    "DataContext",
    "DatasetFactory",
    "Evaluate",
    "Task",
    "load_reference",
    "load_task",
    "options_for",
    "parse_overrides",
    "read_spec",
    "split_params",
]
