"""The trainer's hooks, built from the features in this package.

:class:`StoreCheckpoints` saves the trainer's state to the encrypted object store through a
:class:`~gantry.training.checkpoint.CheckpointManager` and restores it exactly;
:class:`PrivacyHook` makes training differentially private with
:class:`~gantry.training.privacy.PrivateTraining`; compression is
:class:`~gantry.training.compression.CompressionHook` as it is. :func:`hooks_for` picks them
for a job from its options.

Checkpoints of a data-parallel job are written by rank 0 only (every rank holds the same
model); the other ranks send it their random-generator states, so after a resume every rank
draws the same dropout masks and augmentations it would have drawn. FSDP models are gathered
into a full state dict first, so a job can resume on a different number of workers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from gantry.core.logging import get_logger
from gantry.sched.spec import Privacy
from gantry.training.checkpoint import CheckpointManager, DataPosition, RngState, TrainingState
from gantry.training.compression import CompressionHook
from gantry.training.seeding import capture_rng_state, restore_rng_state
from gantry.training.trainer import Hooks, SaveReason, TrainingOptions, TrainState, WorkerEnv

if TYPE_CHECKING:
    from gantry.training.privacy import PrivateTraining

_log = get_logger("gantry.training")
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class StoreCheckpoints:
    """A :class:`~gantry.training.trainer.CheckpointHook` over a checkpoint manager.

    ``marker`` (the node agent's ``$GANTRY_CHECKPOINT_DIR/step``) is rewritten with the step of
    each checkpoint once it is fully stored, so the agent can report it. ``extra`` adds state
    of other parts (the privacy accountant) under its keys: ``(save, load)`` pairs.
    """

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        marker: Path | None = None,
        extra: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] | None = None,
    ) -> None:
        self.manager = manager
        self.marker = marker
        self.extra = dict(extra or {})
        self.saved: list[tuple[int, SaveReason, float]] = []
        """(step, reason, seconds the training loop was blocked) of every save, in order."""
        self.restored_step: int | None = None
        self._marked = -1
        self._mark_lock = threading.Lock()

    # -- save ---------------------------------------------------------------------------------

    def save(self, state: TrainState, reason: SaveReason) -> None:
        """Capture on every rank; write from rank 0 (asynchronously unless stopping)."""
        rngs = _gather(capture_rng_state(), state.env)
        model_sd, optim_sd = _state_dicts(state)
        if state.env.rank != 0:
            return
        metadata: dict[str, Any] = {
            "rng_by_rank": rngs,
            "history": list(state.history),
            "world_size": state.env.world_size,
        }
        for key, (get, _) in self.extra.items():
            metadata[key] = get()
        scaler = state.precision.state_dict() or None
        snapshot = TrainingState(
            step=state.step,
            model=model_sd,
            optimizer=optim_sd,
            scaler=scaler,
            data=DataPosition(epoch=state.epoch, batch=state.batch_in_epoch),
            rng=RngState(rngs[0]),
            metadata=metadata,
        )
        handle = self.manager.save(snapshot, blocking=reason == "stop")
        self.saved.append((state.step, reason, handle.blocking_s))
        if self.marker is not None:
            if reason == "stop":
                self._mark(state.step)
            else:
                threading.Thread(
                    target=_mark_when_stored,
                    args=(handle, self._mark, state.step),
                    name="gantry-checkpoint-marker",
                    daemon=True,
                ).start()

    def _mark(self, step: int) -> None:
        """Write ``step`` to the marker unless a later step is there already: the threads that
        mark asynchronous saves may run in any order, and the marker must never go back."""
        if self.marker is None:
            return
        with self._mark_lock:
            if step <= self._marked:
                return
            _write_marker(self.marker, step)
            self._marked = step

    # -- restore ------------------------------------------------------------------------------

    def restore(self, state: TrainState) -> bool:
        """Load the newest readable checkpoint into ``state`` on every rank; False if none."""
        loaded = self.manager.load_latest()
        if loaded is None:
            return False
        saved = loaded.state
        module = state.module
        if isinstance(module, FSDPModule):
            set_model_state_dict(
                module, saved.model, options=StateDictOptions(full_state_dict=True)
            )
            if saved.optimizer is not None:
                set_optimizer_state_dict(
                    module,
                    state.optimizer,
                    saved.optimizer,
                    options=StateDictOptions(full_state_dict=True),
                )
        else:
            module.load_state_dict(saved.model)
            if saved.optimizer is not None:
                state.optimizer.load_state_dict(saved.optimizer)
        if saved.scaler:
            state.precision.load_state_dict(saved.scaler)
        state.step = saved.step
        state.epoch = saved.data.epoch
        state.batch_in_epoch = saved.data.batch
        metadata = saved.metadata
        history = metadata.get("history")
        if isinstance(history, list):
            state.history[:] = [float(x) for x in history]
        for key, (_, load) in self.extra.items():
            if key in metadata:
                load(metadata[key])
        rngs = metadata.get("rng_by_rank")
        same_world = metadata.get("world_size") == state.env.world_size
        if isinstance(rngs, list) and same_world and state.env.rank < len(rngs):
            restore_rng_state(rngs[state.env.rank])
        elif saved.rng is not None and state.env.rank == 0:
            saved.rng.restore()
        self.restored_step = saved.step
        if loaded.skipped:
            _log.warning(
                "resumed from an older checkpoint",
                step=saved.step,
                skipped=[s.name for s in loaded.skipped],
                rank=state.env.rank,
            )
        return True

    def close(self) -> None:
        """Wait for the last write (and mark it)."""
        self.manager.close()
        if self.saved:
            self._mark(self.saved[-1][0])


class PrivacyHook:
    """Makes the trainer's model, optimizer and loader private for ``privacy``.

    ``epochs`` or ``steps`` is the training planned (the noise is sized for it). After
    :meth:`attach`, :attr:`private` holds the :class:`PrivateTraining`, which reports epsilon.
    """

    def __init__(self, privacy: Privacy, *, epochs: int | None, steps: int | None) -> None:
        self.privacy = privacy
        self.epochs = epochs
        self.steps = steps
        self.private: PrivateTraining | None = None

    def attach(
        self, model: nn.Module, optimizer: Optimizer, loader: DataLoader[Any]
    ) -> tuple[nn.Module, Optimizer, DataLoader[Any]]:
        """Wrap for DP-SGD (Opacus' per-sample clipping and noise, an RDP accountant)."""
        from gantry.training.privacy import INPUT_LAYER_HOOK_WARNING, PrivateTraining

        # harmless with Opacus (its hooks read only output gradients); the trainer calls
        # backward itself, so silence it for this training process
        warnings.filterwarnings("ignore", message=INPUT_LAYER_HOOK_WARNING)

        private = PrivateTraining(
            self.privacy,
            model=model,
            optimizer=optimizer,
            data_loader=loader,
            epochs=None if self.steps is not None else self.epochs,
            steps=self.steps,
        )
        self.private = private
        return private.model, private.optimizer, private.data_loader

    def epsilon(self) -> float:
        """Epsilon spent so far (0 before attaching)."""
        return self.private.epsilon() if self.private is not None else 0.0

    def state(self) -> dict[str, Any]:
        """The accountant's state, for checkpoints."""
        return self.private.state_dict() if self.private is not None else {}

    def load(self, state: Any) -> None:
        """Restore the privacy spent by an earlier attempt."""
        if self.private is not None and state:
            self.private.load_state_dict(state)


def hooks_for(
    options: TrainingOptions,
    env: WorkerEnv,
    *,
    checkpoints: CheckpointManager | None = None,
    marker: Path | None = None,
) -> tuple[Hooks, StoreCheckpoints | None, PrivacyHook | None]:
    """The hooks a job's options ask for: compression (with several workers), checkpoints
    (when ``checkpoints`` is given) and DP-SGD (when ``options.privacy`` is set)."""
    comm = None
    if options.compression != "none" and env.world_size > 1 and not options.fsdp:
        comm = CompressionHook(options.compression)  # type: ignore[arg-type]
    privacy = None
    if options.privacy is not None:
        privacy = PrivacyHook(options.privacy, epochs=options.epochs, steps=options.max_steps)
    store = None
    if checkpoints is not None:
        extra: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
        if privacy is not None:
            extra["privacy"] = (privacy.state, privacy.load)
        store = StoreCheckpoints(checkpoints, marker=marker, extra=extra)
    return Hooks(comm=comm, checkpoint=store, privacy=privacy), store, privacy


def _state_dicts(state: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
    module = state.module
    if isinstance(module, FSDPModule):  # collective: every rank takes part
        return (
            get_model_state_dict(module, options=_FULL),
            get_optimizer_state_dict(module, state.optimizer, options=_FULL),
        )
    if state.env.rank != 0:
        return {}, {}
    return module.state_dict(), state.optimizer.state_dict()


def _gather(value: dict[str, Any], env: WorkerEnv) -> list[dict[str, Any]]:
    if env.world_size == 1 or not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, value)
    return [dict(v) for v in out]


def _write_marker(marker: Path, step: int) -> None:
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
        tmp.write_text(f"{step}\n")
        tmp.replace(marker)


def _mark_when_stored(handle: Any, mark: Callable[[int], None], step: int) -> None:
    try:
        handle.result()
    except Exception as exc:  # the failure is the manager's to raise at the next save
        _log.warning("checkpoint write failed", step=step, error=str(exc))
        return
    mark(step)


__all__ = ["PrivacyHook", "StoreCheckpoints", "hooks_for"]
