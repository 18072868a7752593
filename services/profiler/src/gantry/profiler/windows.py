"""Step windows (domain): one worker's step timings over a run of steps, checked and merged.

A :class:`Window` is what a ``gantry.metrics.job.step`` event says, in the profiler's terms:
per-step means of each phase over steps ``first_step..last_step`` of one rank. Events that
cannot be true are refused by :func:`check` with the reason (a :class:`MetricRejected`):
phases that add up to more than the step, a slowest step faster than the mean, steps that go
backwards, numbers that are not finite. :func:`merge` folds two consecutive windows of one
rank into one, weighted by their steps, which is how a flood of small windows is rate-limited
without losing what they say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gantry.core import InvalidInput
from gantry.events.catalog import JobStepMetrics

PHASES = ("data", "forward", "backward", "comm", "optimizer")
"""The phases of a step, in the order they happen."""
BUSY_PHASES = ("data", "forward", "backward", "optimizer")
"""The phases a rank spends on its own work; ``comm`` is waiting for the others."""
_SLACK_MS = 1.0
_SLACK = 1.10


class MetricRejected(InvalidInput):
    """A metric event that is malformed or cannot be true; ``reason`` is a short label."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        self.reason = reason
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class Window:
    """Per-step means (milliseconds) of one rank over ``first_step..last_step``."""

    job_id: str
    attempt: int
    rank: int
    node: str
    first_step: int
    last_step: int
    step_ms: float
    step_ms_max: float
    data_ms: float
    forward_ms: float
    backward_ms: float
    comm_ms: float
    optimizer_ms: float
    samples: int
    tokens: int
    loss: float | None
    memory_mib: int
    at_ms: int

    @property
    def steps(self) -> int:
        """Steps the window covers."""
        return self.last_step - self.first_step + 1

    @property
    def compute_ms(self) -> float:
        """Forward and backward per step."""
        return self.forward_ms + self.backward_ms

    @property
    def busy_ms(self) -> float:
        """Time per step on this rank's own work (everything but waiting for other ranks)."""
        return self.data_ms + self.forward_ms + self.backward_ms + self.optimizer_ms

    def phase(self, name: str) -> float:
        """The per-step milliseconds of phase ``name`` (one of :data:`PHASES`)."""
        value: float = getattr(self, f"{name}_ms")
        return value

    @property
    def samples_per_step(self) -> float:
        return self.samples / self.steps

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps

    @classmethod
    def from_event(cls, m: JobStepMetrics) -> Window:
        """The window an event describes, checked (see :func:`check`)."""
        forward, backward = m.forward_ms, m.backward_ms
        if forward == 0 and backward == 0 and m.compute_ms > 0:  # a runtime without the split
            backward = m.compute_ms
        window = cls(
            job_id=m.job_id,
            attempt=m.attempt,
            rank=m.worker,
            node=m.node,
            first_step=m.first_step,
            last_step=m.last_step,
            step_ms=m.step_ms,
            step_ms_max=m.step_ms_max,
            data_ms=m.data_ms,
            forward_ms=forward,
            backward_ms=backward,
            comm_ms=m.comm_ms,
            optimizer_ms=m.optimizer_ms,
            samples=m.samples,
            tokens=m.tokens,
            loss=m.loss,
            memory_mib=m.memory_mib,
            at_ms=m.at_ms,
        )
        check(window, compute_ms=m.compute_ms)
        return window


def check(w: Window, *, compute_ms: float | None = None) -> None:
    """Refuse a window that cannot be true, saying why."""
    where = f"job {w.job_id} rank {w.rank} steps {w.first_step}-{w.last_step}"
    numbers = [w.step_ms, w.step_ms_max, *(w.phase(p) for p in PHASES)]
    if w.loss is not None:
        numbers.append(w.loss)
    if not all(math.isfinite(x) for x in numbers):
        raise MetricRejected(f"{where}: a time or the loss is not a finite number", reason="nan")
    if min(w.step_ms, w.step_ms_max, *(w.phase(p) for p in PHASES)) < 0:
        raise MetricRejected(f"{where}: negative time", reason="negative")
    if w.last_step < w.first_step:
        raise MetricRejected(
            f"{where}: the last step is before the first", reason="steps_backwards"
        )
    if w.step_ms <= 0:
        raise MetricRejected(f"{where}: a step cannot take no time", reason="zero_step")
    phases = sum(w.phase(p) for p in PHASES)
    if phases > w.step_ms * _SLACK + _SLACK_MS:
        raise MetricRejected(
            f"{where}: its phases add up to {phases:.1f} ms, more than the step's "
            f"{w.step_ms:.1f} ms",
            reason="phases_exceed_step",
        )
    if w.step_ms_max * _SLACK + _SLACK_MS < w.step_ms:
        raise MetricRejected(
            f"{where}: the slowest step ({w.step_ms_max:.1f} ms) is faster than the mean "
            f"({w.step_ms:.1f} ms)",
            reason="max_below_mean",
        )
    if compute_ms is not None and w.forward_ms + w.backward_ms > 0 and compute_ms > 0:
        total = w.forward_ms + w.backward_ms
        if abs(total - compute_ms) > compute_ms * (_SLACK - 1) + _SLACK_MS:
            raise MetricRejected(
                f"{where}: forward and backward ({total:.1f} ms) do not add up to the compute "
                f"time ({compute_ms:.1f} ms)",
                reason="compute_mismatch",
            )


def merge(a: Window, b: Window) -> Window:
    """``a`` and the window after it of the same rank as one window (step-weighted means)."""
    na, nb = a.steps, b.steps
    total = na + nb

    def mean(x: float, y: float) -> float:
        return (x * na + y * nb) / total

    return replace(
        b,
        first_step=min(a.first_step, b.first_step),
        last_step=max(a.last_step, b.last_step),
        step_ms=mean(a.step_ms, b.step_ms),
        step_ms_max=max(a.step_ms_max, b.step_ms_max),
        data_ms=mean(a.data_ms, b.data_ms),
        forward_ms=mean(a.forward_ms, b.forward_ms),
        backward_ms=mean(a.backward_ms, b.backward_ms),
        comm_ms=mean(a.comm_ms, b.comm_ms),
        optimizer_ms=mean(a.optimizer_ms, b.optimizer_ms),
        samples=a.samples + b.samples,
        tokens=a.tokens + b.tokens,
        memory_mib=max(a.memory_mib, b.memory_mib),
    )


__all__ = ["BUSY_PHASES", "PHASES", "MetricRejected", "Window", "check", "merge"]
