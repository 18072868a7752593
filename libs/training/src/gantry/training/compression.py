"""Gradient compression for ``DistributedDataParallel``, installed as DDP communication hooks.

:func:`register_compression` puts one of five modes on a DDP model and returns the
:class:`CompressionStats` that count what this rank sends per step:

========== ===================================================================== ===========
mode       what goes on the wire                                                 vs fp32
========== ===================================================================== ===========
none       PyTorch's all-reduce of each gradient bucket                          1x
fp16       PyTorch's ``fp16_compress_hook``: the bucket cast to float16          2x
int8       this module: one int8 code per value plus a float32 scale per chunk   ~3.97x
int4       this module: two 4-bit codes per byte plus a float32 scale per chunk  ~7.9x
powersgd   PyTorch's ``powerSGD_hook``: rank-r factors P, Q of each matrix       model-dependent
========== ===================================================================== ===========

Wire format of int8 and int4
----------------------------
A bucket of ``n`` gradient values is cut into chunks of ``chunk_size`` values (the last may be
short). Chunk ``c`` gets the scale ``s_c = max|x| / q_max`` (``q_max`` is 127 for int8, 7 for
int4) and each value the code ``q = round(x / s_c)`` in ``[-q_max, q_max]``. One rank's payload
is a flat ``uint8`` tensor::

    [ m scales, float32, native byte order (4m bytes) | codes ]      m = ceil(n / chunk_size)

    int8 codes: n bytes, two's complement.
    int4 codes: ceil(n / 2) bytes; code + 8 (so 1..15); value 2i in the low nibble of byte i,
                value 2i+1 in the high nibble.

Summing codes with an all-reduce would overflow and would need one scale shared by all ranks, so
every rank all-gathers every rank's payload (``all_gather`` of ``uint8`` works on gloo and NCCL),
dequantises each and adds them up in rank order before dividing by the world size. All ranks add
the same tensors in the same order, so they end with bit-identical gradients and stay in sync.

Rounding is to the nearest code, not stochastic. Error feedback (below) already cancels the
bias that stochastic rounding exists to remove, while nearest rounding halves the worst-case
error of each step (``s_c / 2`` instead of ``s_c``), needs no random numbers (nothing to keep
in step across ranks or to restore on resume) and makes a step reproducible.

Error feedback
--------------
Rounding loses up to ``s_c / 2`` per value. Instead of dropping it, each rank keeps the residual
``e_t = (g_t + e_{t-1}) - dequantise(quantise(g_t + e_{t-1}))`` and adds it to the next step's
gradient before quantising. The sum of what a rank sent over ``T`` steps then equals the sum of
its true gradients minus ``e_T``: the error stays within half a quantisation step instead of
growing with ``T`` (Seide et al. 2014; Karimireddy et al. 2019). Residuals are kept per
parameter rather than per bucket because DDP rebuilds its buckets, in a new order, after the
first iteration. A non-finite gradient (an fp16 overflow) turns its chunk into NaN on every
rank, as an all-reduce would, so a ``GradScaler`` still skips the step; its residual is reset to
zero rather than left to poison every later step.

Byte accounting
---------------
:class:`CompressionStats` counts the payload this rank hands to its collectives per step
(codes and scales; P, Q and the uncompressed tensors for PowerSGD; ``numel * 4`` for the fp32
all-reduce) next to the fp32 equivalent ``numel * 4``. With two ranks, a ring all-reduce and a
ring all-gather each send exactly that payload per rank, so the ratio is the bandwidth saved.
With ``W`` ranks a ring all-reduce sends ``2(W-1)/W`` times its payload per rank but an
all-gather ``W-1`` times, so int8/int4 save ``ratio * 2 / W`` on the wire: break-even at about
8 ranks for int8 and 16 for int4. PowerSGD all-reduces and keeps its full ratio at any size.
"""

# No ``from __future__ import annotations``: DDP compares the hooks' annotations with the real
# ``GradBucket`` and ``torch.futures.Future[torch.Tensor]`` objects, not with strings.

import math
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import torch
import torch.distributed as dist

# ``dist.GradBucket`` is this class, but torch's __init__ does not re-export it for type checkers.
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from gantry.core import ConfigError

Compression = Literal["none", "fp16", "int8", "int4", "powersgd"]
"""A gradient compression mode; see the module docstring for what each sends."""

Bits = Literal[8, 4]
"""Width of one quantised code."""

DEFAULT_CHUNK_SIZE: Final = 512
"""Values per float32 scale. Scales then cost 4/512 byte per value, which keeps int8 at 3.97x
and int4 at 7.88x (targets 3.9x and 7.5x), while an outlier coarsens only its own 512 values."""

_QMAX: Final[dict[int, int]] = {8: 127, 4: 7}
_FP32_BYTES: Final = 4


class UnknownCompression(ConfigError):
    """A compression mode this runtime does not implement."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.allowed: tuple[str, ...] = get_args(Compression)
        hint = f"use one of {', '.join(self.allowed)}"
        if mode == "onebit":
            hint += "; for the strongest quantisation use int4 (about 8x less traffic)"
        super().__init__(f"unknown gradient compression {mode!r}", hint=hint)


@dataclass
class CompressionStats:
    """What this rank's gradient communication costs per optimizer step.

    A step ends when DDP hands over the last bucket of a backward pass. ``bytes_per_step`` and
    ``fp32_bytes_per_step`` describe the latest finished step (for PowerSGD, the steady state
    once its warm-up is over); the totals cover every step since registration. Bytes are the
    payload this rank gives its collectives; the module docstring relates them to the traffic
    of an all-gather or all-reduce with more than two ranks. The hooks update these counters
    on the backward pass's thread; read them between steps.
    """

    mode: Compression
    steps: int = 0
    """Backward passes whose gradients were communicated."""
    bytes_per_step: int = 0
    """Bytes this rank handed to collectives in the latest step: payload plus scales."""
    fp32_bytes_per_step: int = 0
    """What the latest step would have cost as an fp32 all-reduce: 4 bytes per value."""
    total_bytes: int = 0
    """Bytes handed to collectives over all finished steps, warm-up included."""
    total_fp32_bytes: int = 0
    """fp32 all-reduce bytes over all finished steps."""
    _open_bytes: int = field(default=0, init=False, repr=False)
    _open_fp32_bytes: int = field(default=0, init=False, repr=False)

    @property
    def compression_ratio(self) -> float:
        """fp32 bytes over bytes sent in the latest step; NaN before the first step."""
        if self.bytes_per_step == 0:
            return math.nan
        return self.fp32_bytes_per_step / self.bytes_per_step

    def _record(self, sent: int, numel: int, *, last_bucket: bool) -> None:
        self._open_bytes += sent
        self._open_fp32_bytes += numel * _FP32_BYTES
        if last_bucket:
            self.bytes_per_step, self.fp32_bytes_per_step = self._open_bytes, self._open_fp32_bytes
            self.total_bytes += self._open_bytes
            self.total_fp32_bytes += self._open_fp32_bytes
            self._open_bytes = self._open_fp32_bytes = 0
            self.steps += 1


def payload_nbytes(numel: int, *, bits: Bits, chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Bytes one rank sends for a bucket of ``numel`` values: codes plus float32 scales."""
    code_bytes = numel if bits == 8 else (numel + 1) // 2
    return code_bytes + _FP32_BYTES * math.ceil(numel / chunk_size)


@dataclass(frozen=True)
class QuantizedBucket:
    """One rank's quantised gradient bucket, as laid out on the wire (see the module docstring).

    ``codes`` is ``uint8``: ``numel`` bytes for int8, ``ceil(numel / 2)`` for int4. ``scales``
    holds one float32 per chunk of ``chunk_size`` values.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    numel: int
    bits: Bits
    chunk_size: int

    @property
    def nbytes(self) -> int:
        """Size of :meth:`to_wire`'s payload."""
        return self.codes.numel() + self.scales.numel() * _FP32_BYTES

    def to_wire(self) -> torch.Tensor:
        """The flat ``uint8`` payload: scales, then codes."""
        return torch.cat([self.scales.view(torch.uint8), self.codes])

    @classmethod
    def from_wire(
        cls, payload: torch.Tensor, *, numel: int, bits: Bits, chunk_size: int
    ) -> "QuantizedBucket":
        """Read a payload written by :meth:`to_wire` for a bucket of ``numel`` values."""
        expected = payload_nbytes(numel, bits=bits, chunk_size=chunk_size)
        if payload.numel() != expected:
            raise ValueError(
                f"payload of {payload.numel()} bytes does not hold {numel} {bits}-bit values "
                f"in chunks of {chunk_size}; expected {expected} bytes"
            )
        scale_bytes = _FP32_BYTES * math.ceil(numel / chunk_size)
        # clone(): a row of a gathered tensor need not start 4-byte aligned, view() insists.
        scales = payload[:scale_bytes].clone().view(torch.float32)
        return cls(payload[scale_bytes:], scales, numel, bits, chunk_size)

    def dequantize(self) -> torch.Tensor:
        """The float32 values the codes stand for, flat, ``numel`` long."""
        if self.bits == 8:
            codes = self.codes.view(torch.int8).float()
        else:
            nibbles = torch.stack([self.codes & 0x0F, self.codes >> 4], dim=1).reshape(-1)
            codes = nibbles[: self.numel].float() - 8
        return _scale_chunks(codes, self.scales, self.chunk_size)[: self.numel]


def quantize(
    values: torch.Tensor, *, bits: Bits, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> QuantizedBucket:
    """Quantise ``values`` (any shape, read flat) to the nearest code; no error feedback."""
    flat = values.detach().reshape(-1).float()
    return _quantize(flat, bits, chunk_size)[0]


def quantize_with_feedback(
    grad: torch.Tensor,
    residual: torch.Tensor,
    *,
    bits: Bits,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[QuantizedBucket, torch.Tensor]:
    """Quantise ``grad + residual``; return it with the new residual, what rounding lost.

    ``residual`` is flat float32, as long as ``grad`` has values (zeros on the first step).
    Non-finite parts of the new residual are zeroed, so one overflowing step cannot corrupt
    all later ones.
    """
    compensated = grad.detach().reshape(-1).float() + residual
    bucket, sent = _quantize(compensated, bits, chunk_size)
    return bucket, (compensated - sent).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def _quantize(
    flat: torch.Tensor, bits: Bits, chunk_size: int
) -> tuple[QuantizedBucket, torch.Tensor]:
    """Quantised ``flat`` and the float32 values its codes stand for."""
    numel = flat.numel()
    qmax = _QMAX[bits]
    chunks = _pad_to_chunks(flat, chunk_size)
    scales = chunks.abs().amax(dim=1) / qmax
    # An all-zero chunk has scale 0: divide by 1 instead (codes are 0 either way). A NaN or inf
    # scale is sent as is, so dequantising yields NaN for the chunk on every rank.
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = (chunks / divisor[:, None]).nan_to_num_(nan=0.0).round_().clamp_(-qmax, qmax)
    sent = (codes * scales[:, None]).reshape(-1)[:numel]
    flat_codes = codes.reshape(-1)
    if bits == 8:
        packed = flat_codes[:numel].to(torch.int8).view(torch.uint8)
    else:
        pairs = (flat_codes + 8).to(torch.uint8).view(-1, 2)
        packed = (pairs[:, 0] | (pairs[:, 1] << 4))[: (numel + 1) // 2]
    return QuantizedBucket(packed.contiguous(), scales, numel, bits, chunk_size), sent


def _pad_to_chunks(flat: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``flat`` as rows of ``chunk_size``, the last row padded with zeros."""
    rows = math.ceil(flat.numel() / chunk_size)
    padded = flat.new_zeros(rows * chunk_size)
    padded[: flat.numel()] = flat
    return padded.view(rows, chunk_size)


def _scale_chunks(codes: torch.Tensor, scales: torch.Tensor, chunk_size: int) -> torch.Tensor:
    return (_pad_to_chunks(codes, chunk_size) * scales[:, None]).reshape(-1)


@dataclass
class _HookState:
    stats: CompressionStats
    group: dist.ProcessGroup


@dataclass
class _PowerSGDHookState(_HookState):
    powersgd: powersgd.PowerSGDState
    blocking: bool
    """Finish each bucket inside the hook; needed on gloo (see ``_powersgd_hook``)."""


@dataclass
class _QuantizedHookState(_HookState):
    bits: Bits
    chunk_size: int
    residuals: dict[int, torch.Tensor] = field(default_factory=dict)
    """Error feedback per parameter, keyed by ``id(param)``: DDP's buckets change layout."""


def _allreduce_hook(state: _HookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    sent = buffer.numel() * buffer.element_size()
    state.stats._record(sent, buffer.numel(), last_bucket=bucket.is_last())
    return default_hooks.allreduce_hook(state.group, bucket)


def _fp16_hook(state: _HookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    numel = bucket.buffer().numel()
    state.stats._record(numel * 2, numel, last_bucket=bucket.is_last())
    return default_hooks.fp16_compress_hook(state.group, bucket)


def _powersgd_hook(
    state: _PowerSGDHookState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    numel, last = buffer.numel(), bucket.is_last()
    ps = state.powersgd
    warming_up = int(ps.iter) < int(ps.start_powerSGD_iter)
    before = int(ps.total_numel_after_compression)
    future = powersgd.powerSGD_hook(ps, bucket)
    if state.blocking:
        # PyTorch's hook waits for its P and Q all-reduces inside future callbacks. On gloo
        # those callbacks run on the process group's few worker threads (two by default), so
        # with more buckets in flight than threads they block each other and training hangs.
        # Finishing each bucket before DDP hands over the next avoids that, and keeps every
        # rank issuing collectives in the same order, at the cost of overlapping this bucket's
        # communication with the rest of the backward pass.
        future.wait()
    # During warm-up PowerSGD all-reduces the plain bucket; afterwards it counts the values it
    # all-reduces (P, Q and the tensors too small to be worth compressing).
    sent = numel if warming_up else int(ps.total_numel_after_compression) - before
    state.stats._record(sent * buffer.element_size(), numel, last_bucket=last)
    return future


def _quantized_hook(
    state: _QuantizedHookState, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    numel, bits, chunk_size = buffer.numel(), state.bits, state.chunk_size
    world = state.group.size()

    # Where each parameter sits in the bucket: its gradient is a view into the buffer.
    slots = [
        (id(param), (grad.data_ptr() - buffer.data_ptr()) // buffer.element_size(), grad.numel())
        for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True)
    ]
    residual = torch.zeros(numel, dtype=torch.float32, device=buffer.device)
    for key, start, size in slots:
        kept = state.residuals.get(key)
        if kept is not None:
            residual[start : start + size] = kept
    quantized, residual = quantize_with_feedback(buffer, residual, bits=bits, chunk_size=chunk_size)
    for key, start, size in slots:
        state.residuals[key] = residual[start : start + size]

    payload = quantized.to_wire()
    gathered = payload.new_empty(world * payload.numel())
    state.stats._record(payload.numel(), numel, last_bucket=bucket.is_last())
    work = dist.all_gather_single(gathered, payload, group=state.group, async_op=True)

    def average(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        done.value()  # re-raises a failed all-gather
        total = torch.zeros(numel, dtype=torch.float32, device=buffer.device)
        # Same payloads, same order on every rank: identical sums, replicas stay in sync.
        for row in gathered.view(world, -1):
            total += QuantizedBucket.from_wire(
                row, numel=numel, bits=bits, chunk_size=chunk_size
            ).dequantize()
        buffer.copy_(total.div_(world))
        return buffer

    future: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    return future.then(average)


def register_compression(
    ddp_model: DistributedDataParallel,
    mode: Compression,
    *,
    process_group: dist.ProcessGroup | None = None,
    powersgd_rank: int = 1,
    powersgd_start_iter: int = 1000,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> CompressionStats:
    """Compress ``ddp_model``'s gradient communication with ``mode``; return its byte counters.

    Call once per model, on every rank, with the same arguments, before the first backward
    pass (DDP accepts one communication hook per model). ``process_group`` defaults to the
    world. ``powersgd_rank`` is PowerSGD's ``matrix_approximation_rank``; PowerSGD all-reduces
    uncompressed gradients for its first ``powersgd_start_iter`` steps, which protects early
    training (PyTorch suggests about 10% of the run; at least 2). ``chunk_size`` is the number
    of values per scale for int8 and int4.
    """
    if mode not in get_args(Compression):
        raise UnknownCompression(mode)
    if not isinstance(ddp_model, DistributedDataParallel):
        raise ConfigError(
            f"gradient compression needs a DistributedDataParallel model, "
            f"got {type(ddp_model).__name__}",
            hint="wrap the model in torch.nn.parallel.DistributedDataParallel first",
        )
    if powersgd_rank < 1:
        raise ConfigError(f"powersgd_rank must be at least 1, got {powersgd_rank}")
    if powersgd_start_iter < 2:
        raise ConfigError(
            f"powersgd_start_iter must be at least 2, got {powersgd_start_iter}",
            hint="DDP rebuilds its buckets after the first step; PowerSGD's error feedback "
            "can only start after that",
        )
    if chunk_size < 2 or chunk_size % 2:
        raise ConfigError(
            f"chunk_size must be an even number of at least 2, got {chunk_size}",
            hint=f"int4 packs pairs of values; the default is {DEFAULT_CHUNK_SIZE}",
        )
    group = process_group if process_group is not None else dist.group.WORLD
    if group is None:
        raise ConfigError(
            "torch.distributed is not initialised",
            hint="call torch.distributed.init_process_group before registering compression",
        )

    stats = CompressionStats(mode)
    if mode == "none":
        ddp_model.register_comm_hook(_HookState(stats, group), _allreduce_hook)
    elif mode == "fp16":
        ddp_model.register_comm_hook(_HookState(stats, group), _fp16_hook)
    elif mode == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_iter,
        )
        blocking = dist.get_backend(group) == dist.Backend.GLOO
        ddp_model.register_comm_hook(
            _PowerSGDHookState(stats, group, state, blocking), _powersgd_hook
        )
    else:
        bits: Bits = 8 if mode == "int8" else 4
        ddp_model.register_comm_hook(
            _QuantizedHookState(stats, group, bits, chunk_size), _quantized_hook
        )
    return stats


@dataclass
class CompressionHook:
    """:func:`register_compression` as an object, for the trainer's ``CommHook`` slot.

    ``stats`` is set by :meth:`register`; the other fields are its keyword arguments.
    """

    mode: Compression
    process_group: dist.ProcessGroup | None = None
    powersgd_rank: int = 1
    powersgd_start_iter: int = 1000
    chunk_size: int = DEFAULT_CHUNK_SIZE
    stats: CompressionStats | None = field(default=None, init=False)

    def register(self, model: DistributedDataParallel) -> None:
        """Install the compression hook on ``model``; called once, before the first step."""
        self.stats = register_compression(
            model,
            self.mode,
            process_group=self.process_group,
            powersgd_rank=self.powersgd_rank,
            powersgd_start_iter=self.powersgd_start_iter,
            chunk_size=self.chunk_size,
        )


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "Bits",
    "Compression",
    "CompressionHook",
    "CompressionStats",
    "QuantizedBucket",
    "UnknownCompression",
    "payload_nbytes",
    "quantize",
    "quantize_with_feedback",
    "register_compression",
]
