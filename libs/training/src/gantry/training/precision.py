"""Mixed precision: the spec's ``precision`` (fp32, fp16, bf16) turned into autocast and scaling.

What runs for each request, and why:

======== ================= =====================================================================
request  device            runs as
======== ================= =====================================================================
fp32     any               fp32, no autocast
bf16     CUDA with bf16    bf16 autocast, no loss scaling (bf16 has fp32's exponent range)
bf16     CPU               bf16 autocast (CPU autocast supports bf16 natively)
bf16     CUDA without bf16 fp32, with a note (GPUs before Ampere have no bf16 arithmetic)
fp16     CUDA              fp16 autocast with dynamic loss scaling (``torch.amp.GradScaler``)
fp16     CPU               fp32, with a note: torch 2.13 does run fp16 autocast and
                           ``GradScaler("cpu")`` on CPU, but CPUs without native fp16
                           arithmetic (AVX512-FP16 / AMX-FP16) emulate it; measured on an AMD
                           EPYC: a 512-1024-512 MLP step takes 491 ms in fp16 against 88 ms in
                           fp32 and 51 ms in bf16 -- so fp16 on a CPU is a mistake to undo, not a
                           wish to honour. Ask for bf16 to get reduced precision on a CPU.
any      other             fp32, with a note, when torch has no autocast for that device type
======== ================= =====================================================================

The runtime never swaps one reduced precision for another (fp16 for bf16 or back): they differ
in range and in whether loss scaling is needed, so a substitute would change the numerics the
user chose. A fallback is always to fp32, recorded in :attr:`Precision.note` and logged once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
from torch.optim import Optimizer

from gantry.core import ConfigError
from gantry.core.logging import get_logger

PrecisionMode = Literal["fp32", "fp16", "bf16"]

_MODES: tuple[str, ...] = get_args(PrecisionMode)
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_log = get_logger("gantry.training.precision")


def resolve_precision(requested: str, device: torch.device) -> tuple[PrecisionMode, str | None]:
    """The precision that runs for ``requested`` on ``device``, and why it differs, if it does.

    Raises :class:`ConfigError` for a name that is not fp32, fp16 or bf16.
    """
    if requested not in _MODES:
        raise ConfigError(f"unknown precision {requested!r}", hint="use one of fp32, fp16 or bf16")
    if requested == "fp32":
        return "fp32", None
    kind = device.type
    if not torch.amp.is_autocast_available(kind):
        return "fp32", f"{requested} requested but torch has no autocast for {kind}; using fp32"
    if requested == "fp16" and kind != "cuda":
        return "fp32", (
            f"fp16 requested on {kind}, where it is emulated and several times slower than "
            "fp32; using fp32 (ask for bf16 to train in reduced precision on a CPU)"
        )
    if (
        requested == "bf16"
        and kind == "cuda"
        and not torch.cuda.is_bf16_supported(including_emulation=False)
    ):
        return "fp32", "bf16 requested but this GPU has no bf16 arithmetic; using fp32"
    return ("fp16" if requested == "fp16" else "bf16"), None


class Precision:
    """Autocast and loss scaling for one training run.

    Use :meth:`autocast` around the forward pass and the loss, :meth:`backward` instead of
    ``loss.backward()`` and :meth:`step` instead of ``optimizer.step()``; with fp16 these scale
    the loss, unscale the gradients and skip a step whose gradients overflowed, adjusting the
    scale as they go. For fp32 and bf16 they are the plain calls.

    ``requested`` is what the spec asked for, ``mode`` what runs, ``note`` why they differ
    (None when they do not).
    """

    def __init__(self, requested: str, device: torch.device) -> None:
        mode, note = resolve_precision(requested, device)
        self.requested = requested
        self.mode: PrecisionMode = mode
        self.device = device
        self.note = note
        self.dtype: torch.dtype | None = _DTYPES.get(mode)
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(device.type) if mode == "fp16" else None
        )
        if note:
            _log.warning("precision fallback", requested=requested, runs_as=mode, note=note)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """A context in which eligible ops run in the reduced precision (none for fp32)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, scaled when fp16 needs it."""
        # torch.autograd.backward is Tensor.backward with type annotations
        torch.autograd.backward(loss if self.scaler is None else self.scaler.scale(loss))

    def unscale(self, optimizer: Optimizer) -> None:
        """Divide the gradients by the loss scale now (before clipping them); no-op otherwise.

        Call it at most once per step, before :meth:`step`.
        """
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: Optimizer) -> None:
        """Apply the optimizer step (skipped by the scaler when gradients overflowed)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    @property
    def loss_scale(self) -> float:
        """The current fp16 loss scale; 1.0 when no scaling is used."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the same loss scale (empty without scaling)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; an empty state leaves the scale as is."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def __repr__(self) -> str:
        return f"Precision(requested={self.requested!r}, mode={self.mode!r}, device={self.device})"


__all__ = ["Precision", "PrecisionMode", "resolve_precision"]
