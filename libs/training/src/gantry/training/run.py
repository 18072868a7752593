"""``python -m gantry.training.run [--evaluate] module:task [key=value ...]``: one worker of a
task job.

The node agent starts this for a job whose ``spec.entrypoint`` is a ``task``. It loads the
user's :class:`~gantry.training.task.Task`, builds the options from the job spec, wires
compression, checkpoints (encrypted, in the object store, under the job's id), DP-SGD and
progress reporting, and trains. SIGTERM (preemption, cancel) checkpoints and exits 0 at the
next step boundary. With ``eval_every=N`` rank 0 also evaluates the model after every N-th
epoch, as it does at the end, prints the metrics and sends them to the agent (which publishes
``gantry.metrics.job.evaluation``). When training finishes, rank 0 evaluates, writes the metrics
(``metrics.json``), exports the model and writes the manifest the agent registers (all into
``$GANTRY_OUTPUT_DIR``).

With ``--evaluate`` (``entrypoint.mode: evaluate``) it trains nothing: it loads the exported
model in ``$GANTRY_MODEL_DIR`` (the job's ``spec.model``, downloaded by the agent), evaluates
it as training would at its end, prints the metrics and writes ``metrics.json``; it writes no
checkpoint and exports or registers no model.

Exit codes: 0 done or stopped on request; 1 the user's code raised (its traceback is on
stderr, so ``gantry jobs logs`` shows it); 2 the job is misconfigured; 3 the privacy budget
would be exceeded.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader

from gantry.core import (
    CommonSettings,
    ConfigError,
    GantryError,
    configure_logging,
    load_settings,
)
from gantry.storage.settings import StorageSettings, open_store
from gantry.training.budget import BudgetExceeded
from gantry.training.checkpoint import CheckpointManager
from gantry.training.export import ModelManifest, code_version, export_model, load_exported
from gantry.training.hooks import hooks_for
from gantry.training.outputs import clean_metrics, write_metrics
from gantry.training.progress import ProgressReporter
from gantry.training.task import (
    DataContext,
    Task,
    load_task,
    options_for,
    parse_overrides,
    read_spec,
    split_params,
)
from gantry.training.tracing import TraceOnRequest
from gantry.training.trainer import (
    EpochEvaluation,
    EvaluateFn,
    Trainer,
    TrainingOptions,
    WorkerEnv,
)

EXIT_USER_ERROR = 1
EXIT_CONFIG = 2
EXIT_BUDGET = 3
EVALUATE_FLAG = "--evaluate"


class WorkerSettings(CommonSettings):
    """What a worker reads from the environment the agent gives it."""

    storage: StorageSettings = Field(default_factory=StorageSettings)
    output_dir: Path | None = Field(
        default=None,
        description="Where rank 0 writes the metrics and the exported model (GANTRY_OUTPUT_DIR).",
    )
    model_dir: Path | None = Field(
        default=None,
        description="The exported model an evaluation loads (GANTRY_MODEL_DIR): model.json and "
        "its artefact, downloaded by the node agent for spec.model.",
    )
    checkpoint_keep: int = Field(
        default=3, ge=1, description="Checkpoints kept per job (GANTRY_CHECKPOINT_KEEP)."
    )


def run(reference: str, args: Sequence[str], settings: WorkerSettings) -> int:
    """Train the task at ``reference``; the process exit code."""
    env = WorkerEnv.from_environ()
    _cap_gpu_memory()
    spec, name = read_spec()
    task = load_task(reference)
    rest, params = split_params(args, task.params)
    options = options_for(task, spec, parse_overrides(rest))
    ctx = DataContext(env, spec, options.seed, params=params)
    manager = None
    if env.job_id:
        store = open_store(settings.storage, data_dir=settings.data_dir)
        manager = CheckpointManager(store, env.job_id, keep=settings.checkpoint_keep)
    marker = env.checkpoint_dir / "step" if env.checkpoint_dir else None
    hooks, checkpoints, privacy = hooks_for(options, env, checkpoints=manager, marker=marker)
    reporter = ProgressReporter.from_environ()
    tracer = TraceOnRequest.from_environ()
    evaluations: list[EpochEvaluation] = []
    trainer = Trainer(
        task.model,
        task.loss,
        lambda: task.dataset(ctx),
        options=options,
        env=env,
        hooks=hooks,
        callbacks=[reporter] if tracer is None else [reporter, tracer],
        evaluate=_evaluation_during_training(task, ctx, options),
        evaluation_callbacks=[reporter.evaluated, evaluations.append],
    )
    try:
        with trainer:
            trainer.fit()
            if privacy is not None and env.rank == 0:
                epsilon = privacy.epsilon()
                reporter.send({"kind": "epsilon", "epsilon": epsilon})
                print(f"dp-sgd: epsilon spent {epsilon:.4f} (delta {privacy.privacy.delta})")
            if trainer.stopped:
                print(f"stopped at step {trainer.state.step}; checkpoint saved", flush=True)
                return 0
            if options.fsdp and env.world_size > 1:
                # the model is sharded: every rank takes part in gathering it; rank 0 then
                # evaluates and exports a plain copy
                full = get_model_state_dict(
                    trainer.state.module,
                    options=StateDictOptions(full_state_dict=True, cpu_offload=True),
                )
                if env.rank == 0:
                    plain = task.model()
                    plain.load_state_dict(full)
                    _finish(task, trainer, ctx, options, name, reference, settings, privacy, plain)
            elif env.rank == 0:
                last = evaluations[-1] if evaluations else None
                # the last epoch's evaluation is the final one when no step came after it
                done = last.metrics if last and last.step == trainer.state.step else None
                _finish(
                    task, trainer, ctx, options, name, reference, settings, privacy, evaluated=done
                )
        return 0
    finally:
        reporter.close()
        if tracer is not None:
            tracer.close()
        if checkpoints is not None:
            checkpoints.close()


def _cap_gpu_memory() -> None:
    """A fractional-GPU worker keeps to its share of the device's memory
    (``GANTRY_GPU_MEMORY_FRACTION``, set by the node agent)."""
    raw = os.environ.get("GANTRY_GPU_MEMORY_FRACTION", "").strip()
    if not raw or not torch.cuda.is_available():
        return
    try:
        fraction = float(raw)
    except ValueError:
        raise ConfigError(f"GANTRY_GPU_MEMORY_FRACTION={raw!r} is not a number") from None
    if not 0 < fraction <= 1:
        raise ConfigError(f"GANTRY_GPU_MEMORY_FRACTION={raw} is not within (0, 1]")
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    print(f"gpu memory capped at {fraction:.0%} of the device (fractional GPU)", flush=True)


def _finish(
    task: Task,
    trainer: Trainer,
    ctx: DataContext,
    options: TrainingOptions,
    job_name: str,
    reference: str,
    settings: WorkerSettings,
    privacy: Any,
    module: torch.nn.Module | None = None,
    *,
    evaluated: Mapping[str, Any] | None = None,
) -> None:
    """Evaluate, export and write the manifest (rank 0, after training); ``module`` is the
    trained model when the trainer's is sharded; ``evaluated``, the metrics of an evaluation
    of the model as it is now (during training, after the last step), reused."""
    module = _plain(module if module is not None else trainer.state.module)
    module.eval()
    history = trainer.state.history
    metrics: dict[str, Any] = {"final_loss": history[-1] if history else math.nan}
    if evaluated is None:
        evaluated = _evaluate(task, module, ctx, options)
    metrics.update(evaluated)
    if privacy is not None:
        metrics["dp_epsilon"] = privacy.epsilon()
        metrics["dp_delta"] = privacy.privacy.delta
    metrics = _finite(metrics)
    print(f"finished after {trainer.state.step} steps: {_shown(metrics)}", flush=True)
    if settings.output_dir is not None:
        write_metrics(settings.output_dir, metrics)
    if not task.register or settings.output_dir is None:
        return
    example = task.example_input() if task.example_input is not None else _first_inputs(trainer)
    artifact, fmt, signature = export_model(
        module, example, settings.output_dir, quantize=task.quantize
    )
    if task.generation is not None:
        signature["generation"] = dict(task.generation)
    manifest = ModelManifest(
        name=task.model_name or job_name or "model",
        artifact=artifact,
        format=fmt,
        metrics=metrics,
        signature=signature,
        code_version=code_version(reference.partition(":")[0]),
        description=task.description,
        quantized=task.quantize,
    )
    manifest.write(settings.output_dir)
    print(f"exported {manifest.name} as {fmt} ({artifact})", flush=True)


def evaluate(reference: str, args: Sequence[str], settings: WorkerSettings) -> int:
    """Evaluate the exported model in ``settings.model_dir`` with the task at ``reference``
    (no training); the process exit code."""
    env = WorkerEnv.from_environ()
    _cap_gpu_memory()
    spec, _name = read_spec()
    task = load_task(reference)
    rest, params = split_params(args, task.params)
    options = options_for(task, spec, parse_overrides(rest))
    if settings.model_dir is None:
        raise ConfigError(
            "an evaluation needs the model to evaluate, and GANTRY_MODEL_DIR is not set",
            hint="in a job, give spec.model: {name: ..., version: N}; by hand, point "
            "GANTRY_MODEL_DIR at a directory holding model.json and its artefact",
        )
    if env.rank != 0:
        print(f"rank {env.rank}: an evaluation runs on rank 0 only", flush=True)
        return 0
    torch.manual_seed(options.seed)
    device = torch.device(f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu")
    module = load_exported(settings.model_dir, device=device)
    manifest = ModelManifest.read(settings.model_dir)
    label = manifest.name if manifest is not None else str(settings.model_dir)
    print(f"evaluating model {label} ({settings.model_dir}) on {device}", flush=True)
    ctx = DataContext(env, spec, options.seed, params=params)
    metrics = _finite(_evaluate(task, module, ctx, options))
    if not metrics:
        raise ConfigError(
            f"the task {reference} has nothing to evaluate a model with",
            hint="give the Task an evaluate(model, ctx) or an eval_dataset",
        )
    print(f"evaluated {label}: {_shown(metrics)}", flush=True)
    if settings.output_dir is not None:
        write_metrics(settings.output_dir, metrics)
    return 0


def _plain(module: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside a privacy wrapper (Opacus' GradSampleModule keeps it in
    ``_module``), or ``module`` itself."""
    inner = getattr(module, "_module", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def _evaluation_during_training(
    task: Task, ctx: DataContext, options: TrainingOptions
) -> EvaluateFn | None:
    """How rank 0 evaluates after an epoch (``eval_every``): as at the end of training; None
    when the task has nothing to evaluate with."""
    if task.evaluate is None and task.eval_dataset is None:
        return None
    return lambda module: _evaluate(task, _plain(module), ctx, options)


def _evaluate(
    task: Task, module: torch.nn.Module, ctx: DataContext, options: TrainingOptions
) -> dict[str, Any]:
    """The task's own metrics of ``module``: ``evaluate(module, ctx)``, else the mean loss on
    ``eval_dataset``, else none."""
    if task.evaluate is not None:
        return dict(task.evaluate(module, ctx))
    if task.eval_dataset is not None:
        return {"eval_loss": _mean_loss(task, module, ctx, options)}
    return {}


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics as floats, leaving out NaN (a loss never computed); other non-finite or
    non-numeric values are errors."""
    kept = {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
    return clean_metrics(kept)


def _shown(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))


def _mean_loss(task: Task, module: torch.nn.Module, ctx: DataContext, options: Any) -> float:
    assert task.eval_dataset is not None
    device = next(module.parameters()).device
    loader = DataLoader(task.eval_dataset(ctx), batch_size=options.micro_batch_size)
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            out = module(inputs.to(device))
            total += float(task.loss(out, targets.to(device))) * len(targets)
            count += len(targets)
    return total / max(count, 1)


def _first_inputs(trainer: Trainer) -> Any:
    # two samples: a batch of one would fix the exported batch dimension to 1
    dataset: Any = trainer.dataset
    samples = [dataset[i][0] for i in range(min(2, len(dataset)))]
    if samples and all(isinstance(s, torch.Tensor) for s in samples):
        return torch.stack(samples)
    raise ConfigError(
        "cannot derive an example input for the exported model",
        hint="give the task an example_input() returning one batch of inputs",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit codes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    evaluating = bool(argv) and argv[0] == EVALUATE_FLAG
    if evaluating:
        argv = argv[1:]
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if argv else EXIT_CONFIG
    try:
        settings = load_settings(WorkerSettings)
        configure_logging("training-worker", level=settings.log_level, json=settings.log_json)
        if evaluating:
            return evaluate(argv[0], argv[1:], settings)
        return run(argv[0], argv[1:], settings)
    except BudgetExceeded as exc:
        print(f"gantry: {exc}", file=sys.stderr, flush=True)
        return EXIT_BUDGET
    except GantryError as exc:
        print(f"gantry: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception:  # the user's code: show their traceback, as Python would
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_USER_ERROR


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: gloo's threads can abort it (see trainer)
