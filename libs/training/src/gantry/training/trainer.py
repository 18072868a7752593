"""The training loop a user's model runs in.

A user writes a model, a loss and a dataset factory; the runtime does the rest, configured by the
job spec's ``training`` section::

    from gantry.training.trainer import Trainer, TrainingOptions

    options = TrainingOptions.from_spec(job.spec.training, micro_batch_size=64, epochs=3)
    history = Trainer(build_model, torch.nn.functional.mse_loss, build_dataset,
                      options=options).fit()

One :class:`Trainer` per worker process: it joins the job's process group from the node
agent's environment (:class:`WorkerEnv`), wraps the model in ``DistributedDataParallel`` (or
shards it with FSDP), splits the data with a ``DistributedSampler``, accumulates gradients,
runs in the requested precision and reports every optimizer step to its callbacks. With
``eval_every`` and an ``evaluate`` function, rank 0 also evaluates the model at the end of every
``eval_every``-th epoch and hands the metrics to its evaluation callbacks
(:class:`EpochEvaluation`).

Features built elsewhere plug in through :class:`Hooks`: gradient compression
(:class:`CommHook`), checkpoints (:class:`CheckpointHook`, called at step boundaries -- every
``checkpoint_interval_s`` and once when SIGTERM asks the worker to stop) and differential
privacy (:class:`PrivacyHook`). The trainer calls them; it implements none of them.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, Protocol, TypeVar, get_args

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gantry.core import ConfigError, Conflict, InvalidInput
from gantry.core.logging import get_logger
from gantry.sched.spec import Privacy, Training
from gantry.training.augment import Augmentation, AugmentedDataset, parse_augmentation
from gantry.training.precision import Precision, PrecisionMode
from gantry.training.seeding import (
    capture_rng_state,
    derive_seed,
    restore_rng_state,
    seed_everything,
)

ModelFn = Callable[[], nn.Module]
LossFn = Callable[[Any, Any], torch.Tensor]
DatasetFn = Callable[[], Dataset[Any]]
OptimizerFactory = Callable[[list[nn.Parameter]], Optimizer]
EvaluateFn = Callable[[nn.Module], Mapping[str, Any]]
SaveReason = Literal["interval", "stop"]
ModuleSelector = str | type[nn.Module]

_M = TypeVar("_M", bound=nn.Module)
# the spec owns the list of compression names; the hooks implement them
_COMPRESSIONS: tuple[str, ...] = get_args(Training.model_fields["compression"].annotation)
_CHECKPOINT_MARK = "_gantry_checkpoint_activations"
_CHECKPOINT_APPLIED = "_gantry_activations_checkpointed"
_log = get_logger("gantry.training")
# How long a collective waits for a missing peer before failing the worker: long enough for a
# slow checkpoint on another rank, short enough that a dead peer does not hold the GPUs for the
# 30 minutes torch waits by default.
_COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class WorkerEnv:
    """Where this worker sits in the job: what the node agent puts in its environment.

    ``init_method`` overrides the rendezvous that ``master_addr``/``master_port`` give (a
    ``file://`` path for tests on one machine).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    checkpoint_dir: Path | None = None
    resume: bool = False
    init_method: str | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is not within a world of {self.world_size} worker(s)",
                hint="RANK must be 0 <= RANK < WORLD_SIZE",
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """The worker's place from ``environ`` (the process environment by default).

        Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, GANTRY_JOB_ID,
        GANTRY_CHECKPOINT_DIR and GANTRY_RESUME; unset ones mean a single local worker.
        """
        env = os.environ if environ is None else environ

        def number(name: str, default: int | None) -> int | None:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not an integer") from None

        checkpoint_dir = env.get("GANTRY_CHECKPOINT_DIR")
        return cls(
            rank=number("RANK", 0) or 0,
            world_size=number("WORLD_SIZE", 1) or 1,
            local_rank=number("LOCAL_RANK", 0) or 0,
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=number("MASTER_PORT", None),
            job_id=env.get("GANTRY_JOB_ID") or None,
            checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
            resume=env.get("GANTRY_RESUME") == "1",
        )

    def rendezvous(self) -> str:
        """The ``init_method`` URL that ``torch.distributed`` joins the job's group with."""
        if self.init_method:
            return self.init_method
        if not self.master_addr or self.master_port is None:
            raise ConfigError(
                f"a world of {self.world_size} workers needs MASTER_ADDR and MASTER_PORT",
                hint="run the worker under a Gantry node agent, or set both variables",
            )
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


@dataclass(frozen=True)
class TrainingOptions:
    """How to train: the spec's ``training`` section plus what the training script decides.

    The first five fields mirror :class:`gantry.sched.spec.Training`; build them from a job with
    :meth:`from_spec`.
    """

    precision: PrecisionMode = "fp32"
    """fp32, fp16 or bf16; see :mod:`gantry.training.precision` for what runs on each device."""
    gradient_accumulation: int = 1
    """Micro-batches per optimizer step; gradients are synchronised only on the last one."""
    compression: str = "none"
    """Gradient compression, one of the spec's names (none, fp16, ...); anything but none needs a
    :class:`CommHook` when there are several workers."""
    checkpoint_interval_s: float = 600
    """Seconds between checkpoints (at the next step boundary); the spec's default, 10 min."""
    privacy: Privacy | None = None
    """DP-SGD parameters; training with them needs a :class:`PrivacyHook`."""
    micro_batch_size: int = 32
    """Samples per worker per micro-batch. One optimizer step sees
    ``micro_batch_size * gradient_accumulation * world_size`` samples."""
    epochs: int = 1
    """Passes over the dataset (the run ends earlier when ``max_steps`` is reached)."""
    max_steps: int | None = None
    """Optimizer steps after which the run ends; None: run every epoch to the end."""
    lr: float = 1e-3
    """Learning rate of the default optimizer (AdamW); ignored when ``optimizer`` is given."""
    optimizer: OptimizerFactory | None = None
    """Builds the optimizer from the (wrapped) model's parameters; None: AdamW at ``lr``."""
    seed: int = 0
    """Seeds weights, data order, dropout and augmentation: the same seed reproduces a run."""
    deterministic: bool = False
    """Refuse nondeterministic torch kernels (slower on GPUs; off by default)."""
    checkpoint_modules: tuple[ModuleSelector, ...] = ()
    """Modules whose activations are recomputed in backward instead of kept: a class, a class
    name or a qualified module name ("encoder.layers.0"). Modules marked with
    :func:`checkpoint_activations` are always included."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state across workers (FSDP2) instead of
    replicating them (DDP). Worth it when the model does not fit one worker's memory."""
    augment: Augmentation | Mapping[str, Any] | None = None
    """Per-sample data augmentation, e.g. ``{"image": {"crop": 28, "padding": 2, "flip": 0.5}}``
    (see :mod:`gantry.training.augment`)."""
    num_workers: int = 0
    """DataLoader worker processes per training worker; 0 loads in the training process."""
    device: str | None = None
    """Run on this device; None: this worker's GPU (by LOCAL_RANK) when there is one, else
    the CPU."""
    step_metrics: bool = True
    """Time where each step goes (data, forward, backward, communication, optimizer) for the
    profiler; off, the phases but communication are still timed, with no hooks on the
    gradients (bench/profiler.py measures what it costs)."""
    eval_every: int = 0
    """Epochs between evaluations during training: rank 0 evaluates the model after every
    ``eval_every``-th epoch (the metrics a hyperparameter search prunes poor trials by); 0:
    only the runtime's evaluation once training is done. The other ranks do not wait for it
    until their next gradient all-reduce, which fails after 10 minutes: an evaluation must take
    less than that."""

    def __post_init__(self) -> None:
        positive = {
            "gradient_accumulation": self.gradient_accumulation,
            "micro_batch_size": self.micro_batch_size,
            "epochs": self.epochs,
            "max_steps": 1 if self.max_steps is None else self.max_steps,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "lr": self.lr,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"training option {name} must be positive, got {value}")
        if self.precision not in get_args(PrecisionMode):
            raise ConfigError(
                f"unknown precision {self.precision!r}", hint="use fp32, fp16 or bf16"
            )
        if self.compression not in _COMPRESSIONS:
            raise ConfigError(
                f"unknown compression {self.compression!r}",
                hint=f"use one of {', '.join(_COMPRESSIONS)}",
            )
        if self.num_workers < 0 or self.seed < 0 or self.eval_every < 0:
            raise ConfigError("num_workers, seed and eval_every must not be negative")
        parse_augmentation(self.augment)  # fail here, not in the first epoch

    @classmethod
    def from_spec(cls, training: Training, **options: Any) -> TrainingOptions:
        """Options from a job spec's ``training`` section plus the script's own ``options``."""
        return cls(
            precision=training.precision,
            gradient_accumulation=training.gradient_accumulation,
            compression=training.compression,
            checkpoint_interval_s=training.checkpoint_interval_s,
            privacy=training.privacy,
            **options,
        )


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step did, as every rank's callbacks see it."""

    step: int
    """Optimizer steps done so far in the run (1 after the first)."""
    epoch: int
    """The epoch the step belongs to, from 0."""
    loss: float
    """The step's loss, averaged over its micro-batches and all workers."""
    samples_per_s: float
    """Samples of all workers per second over this step, data loading included."""
    eta_s: float | None
    """Seconds until the run ends at the recent step rate; None before it is known."""
    rank: int
    """The worker reporting (each rank reports the same numbers; log from rank 0)."""
    total_steps: int = 0
    """Optimizer steps the run will take in all (0 when unknown)."""
    step_s: float = 0.0
    """Wall seconds of this step on this rank, from the end of the previous one."""
    data_s: float = 0.0
    """Of which waiting for batches from the loader."""
    compute_s: float = 0.0
    """Of which computing: forward and backward (``forward_s + backward_s``)."""
    optimizer_s: float = 0.0
    """Of which the optimizer step."""
    forward_s: float = 0.0
    """Of the compute, the forward pass and the loss."""
    backward_s: float = 0.0
    """Of the compute, the backward pass until this rank's last gradient was ready."""
    comm_s: float = 0.0
    """Of which waiting on other ranks: the gradient all-reduce still running once this rank's
    gradients were ready (DDP overlaps the rest with the backward pass) and the per-step
    agreement. A rank that waits long here is waiting for a slower one."""
    samples: int = 0
    """Samples this rank processed in the step."""
    tokens: int = 0
    """Tokens this rank processed in the step (sequence inputs; 0 for other data)."""


@dataclass(frozen=True)
class EpochEvaluation:
    """Rank 0's evaluation of the model at the end of an epoch (``eval_every``)."""

    step: int
    """Optimizer steps done when it ran."""
    epoch: int
    """Epochs done: 1 after the first (the epoch of :class:`StepMetrics` plus one)."""
    metrics: dict[str, Any]
    """What the evaluate function returned, as it returned it (NaN and non-numbers included:
    whoever sends them on keeps what it can)."""


@dataclass
class TrainState:
    """Everything a checkpoint saves and restores, as the trainer holds it.

    ``model`` is the model as trained (DDP- or FSDP-wrapped; use :attr:`module` for the user's
    own module); ``step``, ``epoch`` and ``batch_in_epoch`` say where the run is: a restored
    state resumes with micro-batch ``batch_in_epoch`` of ``epoch`` in the same data order.
    """

    model: nn.Module
    optimizer: Optimizer
    precision: Precision
    env: WorkerEnv
    options: TrainingOptions
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    history: list[float] = field(default_factory=list)

    @property
    def module(self) -> nn.Module:
        """The user's model, without the DDP wrapper (FSDP2 shards it in place)."""
        inner = self.model.module if isinstance(self.model, DistributedDataParallel) else None
        return inner if isinstance(inner, nn.Module) else self.model


class CommHook(Protocol):
    """Registers a gradient communication hook (compression) on the DDP model."""

    def register(self, model: DistributedDataParallel) -> None:
        """Called once, after wrapping and before the first step."""
        ...


class CheckpointHook(Protocol):
    """Saves and restores :class:`TrainState` (and whatever else it wants, e.g. RNG states)."""

    def restore(self, state: TrainState) -> bool:
        """Load the latest checkpoint into ``state``; False when there is none.

        Called on every rank before the first step when the attempt resumes (GANTRY_RESUME=1).
        """
        ...

    def save(self, state: TrainState, reason: SaveReason) -> None:
        """Save ``state`` at a step boundary, on every rank at the same step.

        ``reason`` is "interval" (``checkpoint_interval_s`` passed) or "stop" (SIGTERM or
        :meth:`Trainer.request_stop`: the run ends after this call).
        """
        ...


class PrivacyHook(Protocol):
    """Makes training differentially private (e.g. by Opacus' per-sample gradient clipping)."""

    def attach(
        self, model: nn.Module, optimizer: Optimizer, loader: DataLoader[Any]
    ) -> tuple[nn.Module, Optimizer, DataLoader[Any]]:
        """The model, optimizer and loader to train with instead; called once, after wrapping.

        A returned loader is iterated as it is each epoch; the trainer still calls
        ``set_epoch`` on its own sampler and dataset.
        """
        ...


@dataclass(frozen=True)
class Hooks:
    """The plug-in points a trainer calls; None leaves the feature out."""

    comm: CommHook | None = None
    checkpoint: CheckpointHook | None = None
    privacy: PrivacyHook | None = None


def checkpoint_activations(module: _M) -> _M:
    """Mark ``module`` so the trainer recomputes its activations in backward; returns it.

    Trades compute for memory: the module's inner activations are not kept between the
    forward and backward passes. Mark repeated blocks (transformer layers), not the whole model.
    """
    setattr(module, _CHECKPOINT_MARK, True)
    return module


class _ResumableSampler(DistributedSampler[Any]):
    """A ``DistributedSampler`` that can start an epoch part-way, after ``skip`` samples."""

    skip = 0

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


class _LoaderWorkerSignals:
    """``worker_init_fn`` that keeps DataLoader workers alive through a stop's SIGTERM.

    A stop signals the worker's whole process group. Killed loader processes would make the
    trainer fail before it reaches the step boundary where it checkpoints, so they ignore
    SIGTERM -- until the trainer is done with them (:meth:`release`); after that SIGTERM ends
    them as usual (``multiprocessing`` terminates leftover workers with it at exit).
    """

    def __init__(self) -> None:
        self.released = multiprocessing.get_context().Event()

    def release(self) -> None:
        """Let SIGTERM end the workers again."""
        self.released.set()

    def __call__(self, worker_id: int) -> None:
        released = self.released

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            if released.is_set():
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)


class Trainer:
    """Trains ``model_fn()`` on ``dataset_fn()`` by minimising ``loss_fn(model(x), y)``.

    The dataset is map-style and yields ``(inputs, targets)`` pairs; the model is called with
    the batched inputs, the loss with the model's output and the batched targets, and must
    return a scalar averaged over the batch.

    ``env`` defaults to :meth:`WorkerEnv.from_environ`. A world of one worker trains without a
    process group. ``callbacks`` are called with :class:`StepMetrics` after every optimizer
    step. With ``options.eval_every``, rank 0 calls ``evaluate(module)`` at the end of every
    ``eval_every``-th epoch -- with the user's module (never the DDP wrapper), in eval mode,
    without gradients, and with the random generators as they were before, so evaluating does
    not change the training -- and ``evaluation_callbacks`` with the :class:`EpochEvaluation`;
    a sharded (FSDP) model is not evaluated per epoch. A trainer trains once; :meth:`fit`
    leaves the process group it created torn down when it returns, unless the trainer is used
    as a context manager, in which case leaving the ``with`` block does (so sharded FSDP
    parameters can still be gathered in it).
    """

    def __init__(
        self,
        model_fn: ModelFn,
        loss_fn: LossFn,
        dataset_fn: DatasetFn,
        *,
        options: TrainingOptions | None = None,
        env: WorkerEnv | None = None,
        hooks: Hooks | None = None,
        callbacks: Sequence[Callable[[StepMetrics], None]] = (),
        evaluate: EvaluateFn | None = None,
        evaluation_callbacks: Sequence[Callable[[EpochEvaluation], None]] = (),
    ) -> None:
        self.options = options or TrainingOptions()
        self.env = env or WorkerEnv.from_environ()
        self.hooks = hooks or Hooks()
        self._model_fn = model_fn
        self._loss_fn = loss_fn
        self._dataset_fn = dataset_fn
        self._callbacks = tuple(callbacks)
        self._evaluate = evaluate
        self._evaluation_callbacks = tuple(evaluation_callbacks)
        self._evaluation_skipped = False
        self._check_hooks()
        self._stop_requested = False
        self._state: TrainState | None = None
        self._loader: DataLoader[Any] | None = None
        self._sampler: _ResumableSampler | None = None
        self._dataset: Dataset[Any] | None = None
        self._worker_signals = _LoaderWorkerSignals() if self.options.num_workers else None
        self._owns_group = False
        self._grad_clock: _GradClock | None = None
        self._in_context = False
        self._used = False
        self.stopped = False
        """Whether the last :meth:`fit` ended early, on SIGTERM or :meth:`request_stop`."""
        self.device = self._pick_device()

    # -- public -------------------------------------------------------------------------------

    def fit(self) -> list[float]:
        """Train to the end (or until stopped); the loss of every optimizer step, in order.

        SIGTERM (in the main thread) or :meth:`request_stop` ends the run at the next step
        boundary, after one checkpoint "stop" save when a checkpoint hook is set; :attr:`stopped`
        then says so and the history holds the steps done.
        """
        if self._used:
            raise Conflict("this Trainer has already trained", hint="build a new Trainer")
        self._used = True
        restore_sigterm = self._install_sigterm()
        try:
            state = self._setup()
            self._train(state)
            return list(state.history)
        finally:
            restore_sigterm()
            if self._worker_signals is not None:
                self._worker_signals.release()
            if not self._in_context:
                self.close()

    def request_stop(self) -> None:
        """Ask the run to checkpoint and stop at the next step boundary (what SIGTERM does)."""
        self._stop_requested = True

    @property
    def state(self) -> TrainState:
        """The run's state; available once :meth:`fit` has started."""
        if self._state is None:
            raise Conflict("the trainer has not started", hint="call fit() first")
        return self._state

    @property
    def dataset(self) -> Dataset[Any]:
        """The dataset as the loader reads it (augmentation applied); after :meth:`fit` starts."""
        if self._dataset is None:
            raise Conflict("the trainer has not started", hint="call fit() first")
        return self._dataset

    def close(self) -> None:
        """Leave the process group the trainer joined (a no-op when it joined none)."""
        if self._owns_group and dist.is_initialized():
            self._drop_ddp_wrapper()
            dist.destroy_process_group()
        self._owns_group = False

    def _drop_ddp_wrapper(self) -> None:
        # torch frees a DDP reducer holding the GIL; were it the last owner of a gloo process
        # group, the group's destructor would join a thread that waits for the GIL to free a
        # tensor of the last all-reduce: a deadlock (seen 1 run in ~8). So the wrapper goes
        # first, and the group is freed by destroy_process_group, which releases the GIL.
        state = self._state
        if state is not None and isinstance(state.model, DistributedDataParallel):
            state.model = state.module
            gc.collect()  # the wrapper may sit in a reference cycle

    def __enter__(self) -> Trainer:
        self._in_context = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._in_context = False
        self.close()

    # -- setup --------------------------------------------------------------------------------

    def _check_hooks(self) -> None:
        options, hooks, world = self.options, self.hooks, self.env.world_size
        if options.privacy is not None and hooks.privacy is None:
            raise ConfigError(
                "the spec asks for differentially private training but no privacy hook is set",
                hint="pass hooks=Hooks(privacy=...) or remove training.privacy from the spec",
            )
        if options.fsdp and hooks.comm is not None:
            raise ConfigError(
                "a DDP communication hook cannot run with FSDP, which reduce-scatters instead",
                hint="turn off fsdp or compression",
            )
        if options.compression != "none" and hooks.comm is None:
            if world > 1:
                raise ConfigError(
                    f"the spec asks for {options.compression} gradient compression but no "
                    "communication hook is set",
                    hint="pass hooks=Hooks(comm=...) or set training.compression to none",
                )
            _log.info("compression has nothing to do with one worker", asked=options.compression)
        if options.eval_every and self._evaluate is None and self.env.rank == 0:
            _log.warning("eval_every is set but there is no evaluation: nothing to evaluate")

    def _pick_device(self) -> torch.device:
        if self.options.device is not None:
            return torch.device(self.options.device)
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch.device("cuda", self.env.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def _install_sigterm(self) -> Callable[[], None]:
        """Make SIGTERM request a stop; returns what puts the previous handler back."""
        if threading.current_thread() is not threading.main_thread():
            _log.warning("not in the main thread: SIGTERM will not checkpoint and stop the run")
            return lambda: None

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            self._stop_requested = True

        previous = signal.signal(signal.SIGTERM, on_sigterm)

        def restore() -> None:
            # None: a handler installed outside Python; the default is the closest to it
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

        return restore

    def _join_group(self) -> None:
        env = self.env
        if env.world_size == 1:
            return
        if dist.is_initialized():
            if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
                raise ConfigError(
                    f"the process group already initialised is rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}, not rank {env.rank} of {env.world_size}"
                )
            return
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=env.rendezvous(),
            rank=env.rank,
            world_size=env.world_size,
            timeout=_COLLECTIVE_TIMEOUT,
            device_id=self.device if cuda else None,
        )
        self._owns_group = True

    def _setup(self) -> TrainState:
        options, env = self.options, self.env
        seed_everything(options.seed, deterministic=options.deterministic or None)
        self._join_group()
        model = self._model_fn()
        if not isinstance(model, nn.Module):
            raise InvalidInput(f"model_fn returned a {type(model).__name__}, not a torch.nn.Module")
        _apply_activation_checkpointing(model, options.checkpoint_modules)
        model.to(self.device)
        # Same weights on every rank above; from here each rank draws its own (dropout).
        seed_everything(derive_seed(options.seed, "rank", env.rank))
        model = self._wrap(model)
        factory = options.optimizer or (lambda params: torch.optim.AdamW(params, lr=options.lr))
        optimizer = factory(list(model.parameters()))
        precision = Precision(options.precision, self.device)
        loader = self._build_loader()
        if self.hooks.comm is not None and isinstance(model, DistributedDataParallel):
            self.hooks.comm.register(model)
        if isinstance(model, DistributedDataParallel) and self.options.step_metrics:
            self._grad_clock = _GradClock()
            self._grad_clock.attach(model.module)
        if self.hooks.privacy is not None:
            model, optimizer, loader = self.hooks.privacy.attach(model, optimizer, loader)
        self._loader = loader
        state = TrainState(model, optimizer, precision, env, options)
        self._state = state
        if env.resume:
            restored = (
                self.hooks.checkpoint.restore(state) if self.hooks.checkpoint is not None else False
            )
            _log.info(
                "resume", restored=restored, step=state.step, epoch=state.epoch, rank=env.rank
            )
        return state

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.env.world_size == 1:
            if self.options.fsdp:
                _log.info("fsdp with one worker: nothing to shard, training unwrapped")
            return model
        if self.options.fsdp:
            mesh = init_device_mesh(self.device.type, (self.env.world_size,))
            for unit in _fsdp_units(model):
                fully_shard(unit, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def _build_loader(self) -> DataLoader[Any]:
        options, env = self.options, self.env
        dataset = self._dataset_fn()
        augmentation = parse_augmentation(options.augment)
        if augmentation is not None:
            dataset = AugmentedDataset(dataset, augmentation, seed=derive_seed(options.seed, "aug"))
        self._dataset = dataset
        sampler = _ResumableSampler(
            dataset,
            num_replicas=env.world_size,
            rank=env.rank,
            shuffle=True,
            seed=options.seed,
        )
        self._sampler = sampler
        workers = options.num_workers
        return DataLoader(
            dataset,
            batch_size=options.micro_batch_size,
            sampler=sampler,
            drop_last=True,  # equal micro-batches: their mean losses combine exactly
            num_workers=workers,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=self._worker_signals,
            generator=torch.Generator().manual_seed(derive_seed(options.seed, "loader", env.rank)),
            persistent_workers=workers > 0,
        )

    # -- the loop -----------------------------------------------------------------------------

    def _train(self, state: TrainState) -> None:
        options = self.options
        loader, sampler = self._loader, self._sampler
        assert loader is not None and sampler is not None  # _setup built them
        accumulation = options.gradient_accumulation
        batches_per_epoch = sampler.num_samples // options.micro_batch_size
        if batches_per_epoch == 0:
            raise InvalidInput(
                f"the dataset gives each of {self.env.world_size} worker(s) {sampler.num_samples} "
                f"sample(s) per epoch, not one micro-batch of {options.micro_batch_size}",
                hint="lower micro_batch_size or use a larger dataset",
            )
        steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
        total_steps = options.epochs * steps_per_epoch
        if options.max_steps is not None:
            total_steps = min(total_steps, options.max_steps)
        clock = _StepClock(total_steps)
        last_save = time.monotonic()
        while state.epoch < options.epochs and state.step < total_steps:
            sampler.set_epoch(state.epoch)
            if isinstance(self._dataset, AugmentedDataset):
                self._dataset.set_epoch(state.epoch)
            first = state.batch_in_epoch
            sampler.skip = first * options.micro_batch_size
            batches = first + len(loader)
            loss_sum = torch.zeros((), device=self.device)
            phases = _Phases(self._grad_clock, _marks_for(self.device))
            ended = True  # unless the run ends mid-epoch: the loader runs out
            for index, batch in enumerate(loader, start=first):
                phases.batch_arrived(batch)
                group_start = index - index % accumulation
                group_size = min(accumulation, batches - group_start)
                last = index - group_start == group_size - 1
                loss = self._micro_step(state, batch, sync=last, divisor=group_size, phases=phases)
                loss_sum += loss
                if not last:
                    continue
                state.precision.step(state.optimizer)
                state.optimizer.zero_grad(set_to_none=True)
                phases.optimized()
                state.step += 1
                state.batch_in_epoch = index + 1
                due = time.monotonic() - last_save >= options.checkpoint_interval_s
                mean_loss, stop, save = self._agree(loss_sum / group_size, due)
                loss_sum = torch.zeros((), device=self.device)
                state.history.append(mean_loss)
                samples = options.micro_batch_size * group_size * self.env.world_size
                timing = clock.tick(samples, state.step)
                self._report(state, mean_loss, timing, phases.end(), total_steps)
                if stop:
                    self._stop(state)
                    return
                if save and self.hooks.checkpoint is not None:
                    self.hooks.checkpoint.save(state, "interval")
                    last_save = time.monotonic()
                if state.step >= total_steps:
                    ended = state.batch_in_epoch >= batches  # the run's last step ends an epoch
                    break
            if ended:
                self._end_epoch(state)
            if state.step >= total_steps:
                return
            state.epoch += 1
            state.batch_in_epoch = 0

    def _micro_step(
        self, state: TrainState, batch: Any, *, sync: bool, divisor: int, phases: _Phases
    ) -> torch.Tensor:
        if not isinstance(batch, tuple | list) or len(batch) != 2:
            raise InvalidInput(
                f"a batch must be an (inputs, targets) pair, got {type(batch).__name__}",
                hint="return (features, target) from the dataset's __getitem__",
            )
        inputs, targets = (_to_device(part, self.device) for part in batch)
        with self._gradient_sync(state.model, sync):
            with state.precision.autocast():
                loss = self._loss_fn(state.model(inputs), targets)
            phases.forwarded()
            # no division for a single micro-batch: one op and one autograd node less per step
            state.precision.backward(loss / divisor if divisor > 1 else loss)
        phases.backwarded(synced=sync)
        return loss.detach().float()

    @staticmethod
    def _gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        # Only the last micro-batch of a step all-reduces gradients; the others accumulate.
        if isinstance(model, DistributedDataParallel) and not sync:
            return model.no_sync()
        if isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def _agree(self, loss: torch.Tensor, save_due: bool) -> tuple[float, bool, bool]:
        """The loss averaged over workers, and whether any worker wants to stop or to save.

        One all-reduce per step carries all three, so every rank stops and saves at the same
        step even when SIGTERM or the interval reaches them at different times.
        """
        can_save = self.hooks.checkpoint is not None
        if self.env.world_size == 1:  # nobody to agree with: no tensor to build for an all-reduce
            return float(loss), self._stop_requested, save_due and can_save
        values = torch.stack(
            [
                loss.to(torch.float64),
                torch.tensor(float(self._stop_requested), dtype=torch.float64, device=loss.device),
                torch.tensor(float(save_due and can_save), dtype=torch.float64, device=loss.device),
            ]
        )
        if self.env.world_size > 1:
            dist.all_reduce(values)
            values[0] /= self.env.world_size
        mean_loss, stop, save = values.tolist()
        return mean_loss, stop > 0, save > 0

    def _report(
        self,
        state: TrainState,
        loss: float,
        timing: tuple[float, float | None],
        phases: PhaseTimes,
        total_steps: int,
    ) -> None:
        samples_per_s, eta_s = timing
        p = phases
        metrics = StepMetrics(
            state.step,
            state.epoch,
            loss,
            samples_per_s,
            eta_s,
            self.env.rank,
            total_steps=total_steps,
            step_s=p.step_s,
            data_s=p.data_s,
            compute_s=p.forward_s + p.backward_s,
            optimizer_s=p.optimizer_s,
            forward_s=p.forward_s,
            backward_s=p.backward_s,
            comm_s=p.comm_s,
            samples=p.samples,
            tokens=p.tokens,
        )
        for callback in self._callbacks:
            callback(metrics)

    def _end_epoch(self, state: TrainState) -> None:
        """Rank 0 evaluates after every ``eval_every``-th epoch; the other ranks go on at once.

        No collective runs here (the module is the user's, not the DDP wrapper, whose forward
        would broadcast buffers), so nothing waits on anything the other ranks do: their next
        gradient all-reduce simply waits for rank 0 to finish evaluating and join it.
        """
        every, done = self.options.eval_every, state.epoch + 1
        if not every or done % every or self.env.rank != 0 or self._evaluate is None:
            return
        module = state.module
        if isinstance(module, FSDPModule):
            if not self._evaluation_skipped:
                self._evaluation_skipped = True
                _log.warning(
                    "eval_every: a sharded (FSDP) model is evaluated only once training is done",
                    epoch=done,
                )
            return
        metrics = _evaluated(self._evaluate, module)
        evaluation = EpochEvaluation(step=state.step, epoch=done, metrics=metrics)
        for callback in self._evaluation_callbacks:
            callback(evaluation)

    def _stop(self, state: TrainState) -> None:
        self.stopped = True
        if self.hooks.checkpoint is not None:
            self.hooks.checkpoint.save(state, "stop")
        _log.info(
            "stopped on request",
            step=state.step,
            checkpointed=self.hooks.checkpoint is not None,
            rank=self.env.rank,
        )


def _evaluated(evaluate: EvaluateFn, module: nn.Module) -> dict[str, Any]:
    """``evaluate(module)`` in eval mode and without gradients, leaving the module's mode and
    the random generators as they were (an evaluation's draws must not change the training)."""
    training = module.training
    rng = capture_rng_state()
    module.eval()
    try:
        with torch.no_grad():
            return dict(evaluate(module))
    finally:
        module.train(training)
        restore_rng_state(rng)


@dataclass(frozen=True)
class PhaseTimes:
    """Where one rank's step went, in seconds, and what it processed."""

    step_s: float
    data_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    optimizer_s: float
    samples: int
    tokens: int


class _Mark(Protocol):
    """A point in a step's timeline: a host timestamp, or a CUDA event on the stream."""

    def record(self) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...

    def synchronize(self) -> None: ...


class _HostMark:
    """A :class:`_Mark` on the host clock (CPU training: the work is done when the call
    returns)."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostMark) -> float:
        """Milliseconds from this mark to ``end`` (as ``torch.cuda.Event`` answers)."""
        return (end.t - self.t) * 1000

    def synchronize(self) -> None:
        return None


def _marks_for(device: torch.device) -> Callable[[], _Mark]:
    """How to mark time on ``device``: CUDA events (queued on the stream, so they time the
    kernels, not their launch) on a GPU, the host clock otherwise."""
    if device.type == "cuda":
        return lambda: torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return _HostMark


class _GradClock:
    """When this rank's last gradient of the backward pass was ready.

    Hooks on the parameters (after a gradient is accumulated) record a mark; what the backward
    call takes after the last of them is waiting for the gradient all-reduce (DDP launches a
    bucket's all-reduce as soon as its gradients are ready and waits for all of them at the
    end). On a GPU the mark is a CUDA event recorded in the stream, after the kernels that made
    the gradient.
    """

    def __init__(self) -> None:
        self.mark: _Mark | None = None
        self.fired = False
        self._handles: list[Any] = []

    def attach(self, model: nn.Module) -> None:
        for param in model.parameters():
            if param.requires_grad:
                hook = param.register_post_accumulate_grad_hook
                self._handles.append(hook(self._ready))  # type: ignore[no-untyped-call]

    def arm(self, mark: _Mark) -> None:
        """Record into ``mark`` during the next backward pass."""
        self.mark = mark
        self.fired = False

    def _ready(self, param: torch.Tensor) -> None:
        if self.mark is not None:
            self.mark.record()
            self.fired = True

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _Phases:
    """Where one rank's step time goes: data, forward, backward, communication, optimizer.

    Waiting for data is timed on the host (the loader is host code). The rest is timed between
    marks (:func:`_marks_for`): on a GPU, CUDA events, read once the step's agreement between
    ranks has synchronised the stream, so forward, backward and optimizer are the kernels' time,
    not their launch. Communication is the backward pass after the last local gradient (the
    all-reduce still running, or waiting for slower ranks) plus what the step took beyond its
    timed phases (the agreement between ranks at its end).
    """

    def __init__(
        self, grads: _GradClock | None = None, new_mark: Callable[[], _Mark] = _HostMark
    ) -> None:
        self._grads = grads
        self._new = new_mark
        self._mark = time.perf_counter()
        self._start = self._mark
        self._spans: list[tuple[str, _Mark, _Mark]] = []
        self._compute: _Mark | None = None
        self.data_s = 0.0
        self.samples = self.tokens = 0

    def _at(self) -> _Mark:
        mark = self._new()
        mark.record()
        return mark

    def batch_arrived(self, batch: Any) -> None:
        now = time.perf_counter()
        self.data_s += now - self._mark
        self._mark = now
        samples, tokens = _batch_counts(batch)
        self.samples += samples
        self.tokens += tokens
        self._compute = self._at()

    def forwarded(self) -> None:
        mark = self._at()
        if self._compute is not None:
            self._spans.append(("forward", self._compute, mark))
        self._compute = mark
        if self._grads is not None:
            self._grads.arm(self._new())

    def backwarded(self, *, synced: bool) -> None:
        mark = self._at()
        grads = self._grads
        if self._compute is not None:
            if synced and grads is not None and grads.fired and grads.mark is not None:
                # after the last local gradient: the all-reduce of the last buckets, and the
                # wait for slower ranks to send theirs
                self._spans.append(("backward", self._compute, grads.mark))
                self._spans.append(("comm", grads.mark, mark))
            else:
                self._spans.append(("backward", self._compute, mark))
        self._compute = mark
        self._mark = time.perf_counter()

    def optimized(self) -> None:
        mark = self._at()
        if self._compute is not None:
            self._spans.append(("optimizer", self._compute, mark))
        self._compute = None
        self._mark = time.perf_counter()

    def end(self) -> PhaseTimes:
        """The step's phases; starts the next step."""
        now = time.perf_counter()
        timed = {"forward": 0.0, "backward": 0.0, "comm": 0.0, "optimizer": 0.0}
        if self._spans:
            self._spans[-1][2].synchronize()
        for kind, first, last in self._spans:
            timed[kind] += max(0.0, first.elapsed_time(last)) / 1000
        step = now - self._start
        rest = step - self.data_s - sum(timed.values())
        out = PhaseTimes(
            step_s=step,
            data_s=self.data_s,
            forward_s=timed["forward"],
            backward_s=timed["backward"],
            comm_s=timed["comm"] + max(0.0, rest),
            optimizer_s=timed["optimizer"],
            samples=self.samples,
            tokens=self.tokens,
        )
        self._start = self._mark = now
        self._spans = []
        self._compute = None
        self.data_s = 0.0
        self.samples = self.tokens = 0
        return out


def _batch_counts(batch: Any) -> tuple[int, int]:
    """(samples, tokens) of a micro-batch: its first dimension, and for sequence inputs (integer
    token ids ``[batch, seq]``, or ``[batch, seq, features]``) batch times sequence length, or
    the sum of an ``attention_mask`` when the inputs are a mapping that has one."""
    if not (isinstance(batch, tuple | list) and batch):
        return 0, 0
    first = batch[0]
    if isinstance(first, Mapping):
        mask = first.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() > 0:
            return int(mask.shape[0]), int(mask.sum()) if mask.dim() > 1 else 0
        tensors = [v for v in first.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        if not tensors:
            return 0, 0
        first = tensors[0]
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        return 0, 0
    samples = int(first.shape[0])
    # token ids [batch, seq], or embedded sequences [batch, seq, features]; not images
    # ([batch, channels, height, width]) nor feature rows ([batch, features])
    sequence = (first.dim() == 2 and not first.is_floating_point()) or first.dim() == 3
    return samples, samples * int(first.shape[1]) if sequence else 0


class _StepClock:
    """Samples per second of the last step, and the time left at the recent step rate."""

    _SMOOTHING = 0.1  # weight of the newest step in the moving average of step times

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.steps = 0
        self.last = time.perf_counter()
        self.average_s: float | None = None

    def tick(self, samples: int, step: int) -> tuple[float, float | None]:
        """Rate of the step just done and the time left after ``step`` (the run's step count,
        which starts past 0 after a resume)."""
        now = time.perf_counter()
        elapsed = max(now - self.last, 1e-9)
        self.last = now
        self.steps += 1
        if self.steps == 1:  # the first step warms up (allocations, autotuning): not a rate
            return samples / elapsed, None
        if self.average_s is None:
            self.average_s = elapsed
        else:
            self.average_s += self._SMOOTHING * (elapsed - self.average_s)
        left = max(self.total_steps - step, 0)
        return samples / elapsed, left * self.average_s


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple | list):
        return type(value)(_to_device(item, device) for item in value)
    if isinstance(value, Mapping):
        return {key: _to_device(item, device) for key, item in value.items()}
    return value


def _selected(name: str, module: nn.Module, selectors: tuple[ModuleSelector, ...]) -> bool:
    if getattr(module, _CHECKPOINT_MARK, False):
        return True
    for selector in selectors:
        if isinstance(selector, str):
            if selector in (name, type(module).__name__):
                return True
        elif isinstance(module, selector):
            return True
    return False


def _apply_activation_checkpointing(
    model: nn.Module, selectors: tuple[ModuleSelector, ...]
) -> list[str]:
    """Recompute the selected modules' activations in backward; the names of those modules.

    The module's own ``forward`` is replaced on the instance, so parameter names, hooks and
    state dicts are unchanged. Non-reentrant checkpointing preserves the RNG state, so dropout
    draws the same masks in the recomputation.
    """
    names = [name for name, module in model.named_modules() if _selected(name, module, selectors)]
    if selectors and not names:
        raise ConfigError(
            f"checkpoint_modules {list(map(str, selectors))} matches no module of the model",
            hint="give a module class, a class name or a name from model.named_modules()",
        )
    modules = dict(model.named_modules())
    for name in names:
        module = modules[name]
        if getattr(module, _CHECKPOINT_APPLIED, False):
            continue
        forward = module.forward

        def checkpointed(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # evaluation keeps nothing anyway
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        setattr(module, "forward", checkpointed)  # noqa: B010 - mypy rejects assigning a method
        setattr(module, _CHECKPOINT_APPLIED, True)
    if names:
        _log.info("activation checkpointing", modules=names)
    return names


def _fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP shards as separate units: each direct child that holds parameters,
    or each item of a child container (``Sequential``, ``ModuleList``) -- one transformer block
    per unit, so only one block's full parameters are gathered at a time."""
    units: list[nn.Module] = []
    for child in model.children():
        members = (
            list(child.children()) if isinstance(child, nn.Sequential | nn.ModuleList) else [child]
        )
        units.extend(m for m in members if any(True for _ in m.parameters()))
    return units


__all__ = [
    "CheckpointHook",
    "CommHook",
    "DatasetFn",
    "EpochEvaluation",
    "EvaluateFn",
    "Hooks",
    "LossFn",
    "ModelFn",
    "OptimizerFactory",
    "PrivacyHook",
    "SaveReason",
    "StepMetrics",
    "TrainState",
    "Trainer",
    "TrainingOptions",
    "WorkerEnv",
    "checkpoint_activations",
]
