"""Checkpoints that make preemption lossless: encrypted, asynchronous, verified, exactly resumable.

**What a checkpoint holds** (:class:`TrainingState`): the model's ``state_dict``, the
optimiser's state, the AMP ``GradScaler`` state (when one is enabled), the data position
(:class:`DataPosition`: epoch, batches consumed in it, and a small dict the sampler or
iterator gives), the RNG states (:class:`RngState`: Python ``random``, NumPy's global
generator, torch CPU, and torch CUDA once CUDA is initialised), the global step, and user
metadata. :func:`capture` gathers it from live objects; :func:`restore` puts it back.

**Object layout** in Gantry's encrypted object store (AES-256-GCM per object, see
``docs/storage-format.md``), one folder per job::

    checkpoints/<job_id>/<step:012d>.pt   torch.save of the state (a dict of tensors and
                                          plain values); object metadata: job, step, format
    checkpoints/<job_id>/latest           JSON pointer {"format", "name", "step", ...}

Both are encrypted and authenticated like every stored object. The pointer is written only
after its checkpoint is committed (the store makes an object visible atomically, header
last), so it always names a fully written checkpoint; a crash at any point leaves the previous
pointer in place.

**Asynchronous protocol** (:class:`CheckpointManager`): ``save()`` copies every tensor to CPU
memory on the calling thread (a device's copy waits for the work queued on it) — the only part
that holds up training — then serialises, encrypts and writes in one background thread,
streaming through the store's writer so memory stays at the snapshot plus a few blocks. At most
one write is in flight: a ``save()`` that finds the previous write unfinished *waits* for it
before taking its own snapshot (back-pressure, not coalescing). Every requested checkpoint is
therefore written, memory holds one snapshot, and a checkpoint interval shorter than a write
shows up as ``SaveHandle.waited_s`` instead of silently dropped steps. ``SaveHandle.blocking_s``
is how long ``save()`` held the caller. A failed write is logged, leaves the pointer on the
previous checkpoint, and is raised as :class:`CheckpointWriteFailed` by ``SaveHandle.result()``,
by ``save(blocking=True)``, and by ``wait()``/``close()`` when it was the most recent write.

**The snapshot** runs at memory speed: since the previous write has finished when a snapshot
starts, the manager copies into the CPU buffers of the snapshot before (fresh memory would cost
a page fault per 4 KiB, several times the copy itself), a CPU tensor with one ``memcpy`` on the
calling thread, a GPU tensor into page-locked memory without waiting per tensor (one
synchronisation at the end). The manager therefore holds one snapshot's memory between saves;
:meth:`CheckpointManager.close` frees it.

**Retention:** after a write and its pointer succeed, checkpoints with a *lower* step than the
one just written are deleted beyond the newest ``keep`` (counting the new one). Checkpoints with
a higher step are never deleted: they belong to a timeline this run resumed away from (e.g. a
corrupted newest checkpoint), and are left for a person, or replaced when this run saves that
step again.

**Loading and fallback** (``load_latest``): the pointer's checkpoint first, then the older
checkpoints newest first (without a usable pointer: all checkpoints, newest first). Checkpoints
newer than the pointer are not considered: the pointer names the newest checkpoint of the
timeline this run is on (a newer object is one whose pointer write failed, or one a resume
moved away from). A candidate that fails verification (:class:`~gantry.storage.TamperedObject`:
the GCM tags catch any changed byte), whose key is unavailable, that vanished, or that does not
decode is skipped, logged with its reason, and listed in :attr:`LoadedCheckpoint.skipped`. No
checkpoint at all returns ``None``; checkpoints that exist but none of which can be read raise
:class:`CheckpointsUnreadable` — silently starting from scratch could cost days of training,
so that choice is left to the caller. An unreachable store raises (a network blip must not
roll a job back to an older checkpoint).

**Exact resume:** restoring the RNG states with the model, optimiser and data position makes
the continued run reproduce the uninterrupted one on CPU (and on GPU with deterministic
algorithms enabled). :func:`seed_everything` seeds all generators for a reproducible start.
One manager writes a job's checkpoints at a time (rank 0 of the job).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Any, cast

import numpy as np
import torch

from gantry.core import Conflict, GantryError, IntegrityError, InvalidInput, get_logger
from gantry.storage import (
    KeyUnavailable,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectWriter,
    TamperedObject,
)
from gantry.storage.naming import check_object_name
from gantry.training.seeding import capture_rng_state, restore_rng_state, seed_everything

FORMAT = "gantry.checkpoint/1"
MAX_STEP = 10**12 - 1  # twelve digits in the object name
_STEP_FILE = re.compile(r"(\d{12})\.pt")
_SINK_BLOCK = 4 << 20  # torch.save issues many tiny writes; hand the store 4 MiB blocks

_log = get_logger("gantry.training.checkpoint")


# -- errors -------------------------------------------------------------------------------------


class CheckpointError(GantryError):
    """Base of the errors this module raises (the store's own errors pass through)."""


class CheckpointWriteFailed(CheckpointError):
    """A checkpoint was not written; the ``latest`` pointer still names the previous one."""

    def __init__(self, job_id: str, step: int, cause: BaseException) -> None:
        self.job_id = job_id
        self.step = step
        self.cause = cause
        super().__init__(
            f"checkpoint of job {job_id!r} at step {step} was not written: "
            f"{type(cause).__name__}: {cause}",
            hint="the previous checkpoint is still the latest; fix the store and save again",
        )


class CheckpointFormatError(IntegrityError, CheckpointError):
    """An object authenticated but does not decode as a checkpoint of this format."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"object {name!r} is not a {FORMAT} checkpoint: {reason}",
            hint="it was written by another tool or version; load it with that, or delete it",
        )


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint ``load_latest`` could not use, and why."""

    name: str
    step: int
    reason: str


class CheckpointsUnreadable(IntegrityError, CheckpointError):
    """Checkpoints exist, but none of them could be read; ``skipped`` says why for each."""

    def __init__(self, job_id: str, skipped: tuple[SkippedCheckpoint, ...]) -> None:
        self.job_id = job_id
        self.skipped = skipped
        reasons = "; ".join(f"{s.name}: {s.reason}" for s in skipped)
        super().__init__(
            f"none of the {len(skipped)} checkpoints of job {job_id!r} could be read ({reasons})",
            hint="restore them from a backup, or start from scratch on purpose with a new job id",
        )


# -- what a checkpoint holds ---------------------------------------------------------------------


@dataclass
class DataPosition:
    """Where the input pipeline stands: resume by skipping to ``batch`` of ``epoch``."""

    epoch: int = 0
    batch: int = 0  # batches already consumed in ``epoch``
    sampler: dict[str, Any] = field(default_factory=dict)  # small, torch.load(weights_only)-safe


@dataclass
class RngState:
    """Every random generator a training step may draw from, in serialisable form: Python
    ``random``, NumPy's global generator, torch CPU and (once initialised) every CUDA device —
    as :func:`gantry.training.seeding.capture_rng_state` records them.

    ``np.random.Generator`` instances the caller owns belong in :attr:`DataPosition.sampler`
    or metadata.
    """

    state: dict[str, Any]

    @classmethod
    def capture(cls) -> RngState:
        """The current states."""
        return cls(capture_rng_state())

    def restore(self) -> None:
        """Make every generator continue exactly where it was captured."""
        restore_rng_state(self.state)


@dataclass
class TrainingState:
    """Everything needed to continue a run exactly where it stopped.

    Built by :func:`capture`, it references the live tensors (cheap); :meth:`snapshot` makes
    an independent CPU copy, like the one :meth:`CheckpointManager.save` makes into the
    buffers it reuses from save to save.
    """

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any] | None = None
    scaler: dict[str, Any] | None = None
    data: DataPosition = field(default_factory=DataPosition)
    rng: RngState | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> TrainingState:
        """A deep copy with every tensor copied to CPU; later training cannot change it.

        Tensors shared within the state (tied weights) stay shared in the copy.
        """
        return cast(TrainingState, _copy_tree(self, {}))


class _SnapshotBuffers:
    """CPU tensors that a manager's snapshots are copied into, reused from one save to the next.

    Tensors are matched to buffers by their order in the state (a state dict's order is the
    same at every step); a tensor whose shape, strides or dtype changed gets a new buffer.
    Copies from a GPU go to page-locked buffers without waiting, and :meth:`finish` waits once
    for all of them. The caller guarantees nothing still reads the buffers (the previous write
    has finished) when :meth:`start` begins the next snapshot.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._pending: set[torch.device] = set()

    def start(self) -> None:
        """Begin a snapshot: buffers are handed out from the first again."""
        self._next = 0
        self._pending.clear()

    def copy(self, value: torch.Tensor) -> torch.Tensor:
        """A CPU copy of ``value`` in a reused buffer (or a fresh copy for unusual tensors)."""
        source = value.detach()
        if not _reusable(source):
            return source.to("cpu", copy=True)
        pinned = source.device.type == "cuda"
        index = self._next
        self._next += 1
        buffer = self._buffers[index] if index < len(self._buffers) else None
        if (
            buffer is None
            or buffer.dtype != source.dtype
            or buffer.shape != source.shape
            or buffer.stride() != source.stride()
            or (pinned and not buffer.is_pinned())
        ):
            buffer = torch.empty_strided(
                source.shape, source.stride(), dtype=source.dtype, pin_memory=pinned
            )
            if index < len(self._buffers):
                self._buffers[index] = buffer
            else:
                self._buffers.append(buffer)
        if pinned:  # queued behind the device's work: the snapshot is consistent
            buffer.copy_(source, non_blocking=True)
            self._pending.add(source.device)
        elif source.is_complex():
            buffer.copy_(source)
        else:
            # One memcpy on this thread. torch would split the copy over its thread pool, and
            # the pool's barrier after each tensor costs more than the copy itself whenever
            # other processes share the cores (5x slower on a loaded 2-core machine); a copy
            # is bound by memory bandwidth, which one thread already uses up.
            np.copyto(_as_bytes(buffer), _as_bytes(source))
        return buffer

    def finish(self) -> None:
        """Wait for the copies still running; drop buffers the state no longer needs."""
        for device in self._pending:
            torch.cuda.current_stream(device).synchronize()  # type: ignore[no-untyped-call]
        self._pending.clear()
        del self._buffers[self._next :]

    def release(self) -> None:
        """Free every buffer."""
        self._buffers.clear()
        self._next = 0


def _as_bytes(tensor: torch.Tensor) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The bytes of a contiguous CPU tensor, as a NumPy array sharing its memory."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _reusable(tensor: torch.Tensor) -> bool:
    """Whether a plain buffer of the same shape and strides can hold a copy of ``tensor``."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and tensor.device.type in ("cpu", "cuda")
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
        and tensor.is_contiguous()
    )


def _copy_tree(
    value: Any, memo: dict[int, torch.Tensor], buffers: _SnapshotBuffers | None = None
) -> Any:
    """``value`` with containers rebuilt and tensors copied to CPU (see ``snapshot``), into
    ``buffers`` when given (the caller then calls ``buffers.finish()``)."""
    if isinstance(value, torch.Tensor):
        done = memo.get(id(value))
        if done is None:  # a device-to-host copy waits for the device: the snapshot is consistent
            if buffers is not None:
                done = buffers.copy(value)
            else:
                done = value.detach().to("cpu", copy=True)
            memo[id(value)] = done
        return done
    if value is None or isinstance(value, str | bytes | int | float | bool | torch.dtype):
        return value
    if isinstance(value, dict):
        out: dict[Any, Any] = OrderedDict() if isinstance(value, OrderedDict) else {}
        for key, item in value.items():
            out[key] = _copy_tree(item, memo, buffers)
        metadata = getattr(value, "_metadata", None)  # state_dict versions used by load_state_dict
        if metadata is not None and isinstance(out, OrderedDict):
            out._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
        return out
    if type(value) in (list, tuple):
        return type(value)(_copy_tree(item, memo, buffers) for item in value)
    if isinstance(value, DataPosition | RngState | TrainingState):
        return type(value)(
            **{name: _copy_tree(item, memo, buffers) for name, item in vars(value).items()}
        )
    return copy.deepcopy(value)


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    step: int,
    scaler: torch.amp.GradScaler | None = None,
    data: DataPosition | None = None,
    metadata: dict[str, Any] | None = None,
    rng: bool = True,
) -> TrainingState:
    """The training state at ``step`` (live references; save or snapshot it before training on).

    Call it between steps — after ``optimizer.step()``, before the next batch is drawn — so
    the RNG and data position describe the next step to run. ``scaler`` is recorded only
    when enabled (a disabled scaler has no state).
    """
    _check_step(step)
    return TrainingState(
        step=step,
        model=model.state_dict(),
        optimizer=optimizer.state_dict() if optimizer is not None else None,
        scaler=scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        data=data if data is not None else DataPosition(),
        rng=RngState.capture() if rng else None,
        metadata=dict(metadata or {}),
    )


def restore(
    state: TrainingState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    scaler: torch.amp.GradScaler | None = None,
    rng: bool = True,
    strict: bool = True,
) -> None:
    """Load ``state`` into freshly built objects and, with ``rng``, the global generators.

    The data position is the caller's to apply (``state.data``). Asking to restore an
    optimiser or an enabled scaler the checkpoint has no state for raises
    :class:`~gantry.core.InvalidInput`: the resume would silently not be exact.
    """
    model.load_state_dict(state.model, strict=strict)
    if optimizer is not None:
        if state.optimizer is None:
            raise InvalidInput(
                f"the checkpoint of step {state.step} has no optimiser state",
                hint="pass optimizer=None to load only the model (fine-tuning, evaluation)",
            )
        optimizer.load_state_dict(state.optimizer)
    if scaler is not None and scaler.is_enabled():
        if state.scaler is None:
            raise InvalidInput(
                f"the checkpoint of step {state.step} has no GradScaler state",
                hint="pass scaler=None, or resume with the mixed precision it was saved with",
            )
        scaler.load_state_dict(state.scaler)
    if rng and state.rng is not None:
        state.rng.restore()  # last: nothing above may draw from the generators afterwards


def _check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise InvalidInput(
            f"a checkpoint step must be an int from 0 to {MAX_STEP}, got {step!r}",
            hint="pass the global optimiser step",
        )
    return step


_PLAIN = (type(None), str, bytes, int, float, bool)


def _check_plain(value: Any, where: str) -> None:
    """Refuse, at save time, values ``torch.load(weights_only=True)`` would refuse at load."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where)
            _check_plain(item, f"{where}[{key!r}]")
    elif type(value) in (list, tuple):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
    elif not (type(value) in _PLAIN or isinstance(value, torch.Tensor)):
        raise InvalidInput(
            f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which a "
            "checkpoint cannot hold",
            hint="use str, int, float, bool, None, bytes, tensors, and lists, tuples and dicts "
            "of them (numpy values: .item() or .tolist())",
        )


def _to_payload(state: TrainingState) -> dict[str, Any]:
    rng = state.rng
    return {
        "format": FORMAT,
        "step": state.step,
        "model": state.model,
        "optimizer": state.optimizer,
        "scaler": state.scaler,
        "data": {
            "epoch": state.data.epoch,
            "batch": state.data.batch,
            "sampler": state.data.sampler,
        },
        "rng": None if rng is None else vars(rng),
        "metadata": state.metadata,
    }


def _from_payload(name: str, payload: Any) -> TrainingState:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointFormatError(name, f"format is {found!r}")
    try:
        rng = payload["rng"]
        return TrainingState(
            step=int(payload["step"]),
            model=payload["model"],
            optimizer=payload["optimizer"],
            scaler=payload["scaler"],
            data=DataPosition(**payload["data"]),
            rng=None if rng is None else RngState(**rng),
            metadata=payload["metadata"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointFormatError(name, f"{type(exc).__name__}: {exc}") from None


class _StoreSink:
    """A write-only file for ``torch.save`` that streams blocks into an :class:`ObjectWriter`.

    torch swallows exceptions raised by ``write`` (it reports a generic RuntimeError), so the
    first one is kept in ``error`` for the caller to raise instead.
    """

    def __init__(self, writer: ObjectWriter, block: int = _SINK_BLOCK) -> None:
        self.error: BaseException | None = None
        self._writer = writer
        self._block = block
        self._buf = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.error is not None:
            raise self.error
        view = memoryview(data).cast("B")
        try:
            if len(self._buf) + len(view) > self._block:
                self._flush()
            if len(view) >= self._block:
                self._writer.write(bytes(view))
            else:
                self._buf += view
        except BaseException as exc:
            self.error = exc
            raise
        return len(view)

    def flush(self) -> None:
        """Nothing to do: blocks are handed over as they fill, the rest by :meth:`close`."""

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._writer.write(bytes(self._buf))
            self._buf = bytearray()


# -- the manager --------------------------------------------------------------------------------


class SaveHandle:
    """One ``save()``: how long it held the caller, and the background write's outcome."""

    def __init__(self, name: str, step: int, waited_s: float, snapshot_s: float) -> None:
        self.name = name
        self.step = step
        self.waited_s = waited_s  # for the previous write to finish
        self.snapshot_s = snapshot_s  # copying the state to CPU
        self.blocking_s = waited_s + snapshot_s  # all of save(); with blocking=True, the write too
        self.write_s: float | None = None  # serialise + encrypt + store, once done
        self._future: Future[ObjectInfo] = Future()

    def done(self) -> bool:
        """Whether the write has finished, successfully or not."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> ObjectInfo:
        """Wait for the write; the committed object, or :class:`CheckpointWriteFailed`."""
        return self._future.result(timeout)

    def _settle(self) -> None:
        wait_futures([self._future])


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What ``load_latest`` found: the state, which object it came from, and what it skipped."""

    state: TrainingState
    name: str
    step: int
    skipped: tuple[SkippedCheckpoint, ...] = ()


class CheckpointManager:
    """Writes, prunes and finds one job's checkpoints (see the module docstring).

    Promises: ``save()`` blocks only for the CPU snapshot (plus any wait for the previous
    write); the ``latest`` pointer only ever names a fully written checkpoint; ``load_latest``
    returns verified data or says why not. Use it from one training thread; close it (or use
    ``with``) to flush the last write.
    """

    def __init__(self, store: ObjectStore, job_id: str, *, keep: int = 3) -> None:
        if keep < 1:
            raise InvalidInput(f"keep must be >= 1, got {keep}", hint="keep=3 is the default")
        if "/" in job_id:
            raise InvalidInput(
                f"job id {job_id!r} contains '/'", hint="use the job's id, a single name segment"
            )
        check_object_name(f"checkpoints/{job_id}/latest")
        self.store = store
        self.job_id = job_id
        self.keep = keep
        self.prefix = f"checkpoints/{job_id}/"
        self.latest_name = self.prefix + "latest"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gantry-checkpoint")
        self._lock = threading.Lock()
        self._last: SaveHandle | None = None
        self._buffers = _SnapshotBuffers()  # reused only after the write reading them is done
        self._closed = False

    def name_for(self, step: int) -> str:
        """The object name of the checkpoint at ``step``."""
        return f"{self.prefix}{_check_step(step):012d}.pt"

    # -- writing -----------------------------------------------------------------------------

    def save(
        self, state: TrainingState, step: int | None = None, *, blocking: bool = False
    ) -> SaveHandle:
        """Checkpoint ``state`` (at ``step``, which defaults to and must match ``state.step``).

        Returns once the state is copied to CPU; the write continues in the background. With
        ``blocking`` (e.g. on a preemption notice) it returns after the write and pointer are
        stored, raising :class:`CheckpointWriteFailed` if they were not.
        """
        step = _check_step(state.step if step is None else step)
        if step != state.step:
            raise InvalidInput(
                f"save() got step {step} for a state captured at step {state.step}",
                hint="capture the state at the step you save, or omit step",
            )
        _check_plain(state.data.sampler, "data.sampler")
        _check_plain(state.metadata, "metadata")
        with self._lock:
            if self._closed:
                raise Conflict(
                    f"the checkpoint manager of job {self.job_id!r} is closed",
                    hint="save before close(), or make a new CheckpointManager",
                )
            start = time.perf_counter()
            if self._last is not None:
                self._last._settle()
            waited = time.perf_counter()
            self._buffers.start()
            try:
                snap = cast(TrainingState, _copy_tree(state, {}, self._buffers))
            finally:
                self._buffers.finish()
            handle = SaveHandle(
                self.name_for(step), step, waited - start, time.perf_counter() - waited
            )
            self._executor.submit(self._write, snap, handle)
            self._last = handle
        if blocking:
            handle.result()
        handle.blocking_s = time.perf_counter() - start
        return handle

    def wait(self) -> None:
        """Wait for the write in flight; raise :class:`CheckpointWriteFailed` if it failed."""
        last = self._last
        if last is not None:
            last.result()

    def close(self) -> None:
        """Flush (as :meth:`wait`), stop the writer thread and free the snapshot buffers."""
        with self._lock:  # a save() in another thread finishes its snapshot first
            self._closed = True
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            self._buffers.release()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # the exception in flight matters more than a failed write (already logged)
        with contextlib.suppress(CheckpointWriteFailed):
            self.close()

    def _write(self, snap: TrainingState, handle: SaveHandle) -> None:
        """The background half of ``save()``: checkpoint, then pointer, then retention."""
        future = handle._future
        if not future.set_running_or_notify_cancel():
            return
        start = time.perf_counter()
        try:
            info = self._store_checkpoint(handle.name, snap)
            pointer = {
                "format": FORMAT,
                "name": handle.name,
                "step": handle.step,
                "object_id": info.object_id,
                "size": info.size,
            }
            self.store.put(self.latest_name, json.dumps(pointer).encode())
        except BaseException as exc:
            handle.write_s = time.perf_counter() - start
            error = CheckpointWriteFailed(self.job_id, handle.step, exc)
            error.__cause__ = exc
            _log.error("checkpoint write failed", job=self.job_id, step=handle.step, error=str(exc))
            future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        handle.write_s = time.perf_counter() - start
        _log.info("checkpoint written", name=handle.name, bytes=info.size, write_s=handle.write_s)
        try:
            self._prune(handle.step)
        except Exception as exc:  # the checkpoint is safe; pruning is retried after the next save
            _log.warning("retention failed", job=self.job_id, error=str(exc))
        future.set_result(info)

    def _store_checkpoint(self, name: str, snap: TrainingState) -> ObjectInfo:
        meta = {"job": self.job_id, "step": str(snap.step), "format": FORMAT}
        with self.store.writer(name, metadata=meta) as writer:
            sink = _StoreSink(writer)
            try:
                torch.save(_to_payload(snap), cast(IO[bytes], sink))
                sink.close()
            except Exception:
                if sink.error is not None:  # the store's error, not torch's generic one
                    raise sink.error from None
                raise
        assert writer.info is not None
        return writer.info

    def _prune(self, step: int) -> None:
        older = [s for s in self.steps() if s < step]
        for old in older[: max(0, len(older) - (self.keep - 1))]:
            try:
                self.store.delete(self.name_for(old))
            except (GantryError, OSError) as exc:  # retried after the next save
                _log.warning("old checkpoint not deleted", step=old, error=str(exc))

    # -- reading -----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Steps of the committed checkpoints, ascending (reads no object)."""
        found = []
        for name in self.store.names(self.prefix):
            match = _STEP_FILE.fullmatch(name[len(self.prefix) :])
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int | None:
        """The step the ``latest`` pointer names; ``None`` when there is none.

        Raises the store's errors (e.g. :class:`~gantry.storage.TamperedObject`) and
        :class:`CheckpointFormatError` for a pointer that does not decode.
        """
        try:
            raw = self.store.get(self.latest_name)
        except ObjectNotFound:
            return None
        try:
            pointer = json.loads(raw)
            step = _check_step(pointer["step"])
            if pointer["format"] != FORMAT or pointer["name"] != self.name_for(step):
                raise ValueError("it names another object or format")
        except (ValueError, KeyError, TypeError, InvalidInput) as exc:
            raise CheckpointFormatError(self.latest_name, str(exc)) from None
        return step

    def load(self, step: int) -> TrainingState:
        """The verified checkpoint at ``step`` (tensors on CPU)."""
        name = self.name_for(step)
        data = self.store.get(name)
        try:
            payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds for bytes that are not its format
            raise CheckpointFormatError(name, f"{type(exc).__name__}: {exc}") from None
        finally:
            del data
        state = _from_payload(name, payload)
        if state.step != step:
            raise CheckpointFormatError(name, f"it holds step {state.step}")
        return state

    def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to older ones (module docstring).

        Waits for this manager's own write in flight first.
        """
        last = self._last
        if last is not None:
            last._settle()
        steps = self.steps()
        try:
            pointed = self.latest()
        except (TamperedObject, KeyUnavailable, CheckpointFormatError) as exc:
            _log.warning("latest pointer unusable", job=self.job_id, reason=_reason(exc))
            pointed = None
        if pointed is None:
            candidates = sorted(steps, reverse=True)
        else:
            candidates = [pointed, *sorted((s for s in steps if s < pointed), reverse=True)]
        if not candidates:
            return None
        skipped: list[SkippedCheckpoint] = []
        for step in candidates:
            name = self.name_for(step)
            try:
                state = self.load(step)
            except (TamperedObject, KeyUnavailable, ObjectNotFound, CheckpointFormatError) as exc:
                skipped.append(SkippedCheckpoint(name, step, _reason(exc)))
                _log.warning(
                    "checkpoint unusable, trying an older one", name=name, reason=_reason(exc)
                )
                continue
            _log.info("checkpoint loaded", name=name, skipped=[s.name for s in skipped])
            return LoadedCheckpoint(state, name, step, tuple(skipped))
        raise CheckpointsUnreadable(self.job_id, tuple(skipped))


def _reason(exc: BaseException) -> str:
    message = exc.message if isinstance(exc, GantryError) else str(exc)
    return f"{type(exc).__name__}: {message}"


__all__ = [
    "FORMAT",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointManager",
    "CheckpointWriteFailed",
    "CheckpointsUnreadable",
    "DataPosition",
    "LoadedCheckpoint",
    "RngState",
    "SaveHandle",
    "SkippedCheckpoint",
    "TrainingState",
    "capture",
    "restore",
    "seed_everything",
]
