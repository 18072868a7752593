"""Progress and per-step metrics from the workers to the node agent.

The agent gives each worker a pipe (``GANTRY_PROGRESS_FD``); a :class:`ProgressReporter`
writes JSON lines to it: ``{"kind": "progress", ...}`` from rank 0 at most every
``progress_s`` seconds (how far the job is), and ``{"kind": "steps", ...}`` from every rank
once per window of steps (where the step time goes, for the profiler). The agent turns them
into ``gantry.metrics.job.progress`` and ``gantry.metrics.job.step`` events. With
``eval_every``, rank 0 also sends ``{"kind": "evaluation", "step": ..., "epoch": ...,
"metrics": {...}}`` after each evaluation during training (finite numbers only), which the
agent turns into a ``gantry.metrics.job.evaluation`` event. Never one message
per tiny step: a window closes after ``window_steps`` steps once ``min_window_s`` has passed,
or after ``window_s`` seconds, so a worker sends at most one window per ``min_window_s`` (4 a
second by default) however short its steps, and the profiler sees a slow rank within a few
windows (tens of steps) however long they are.

Without the pipe (a script run by hand) the reporter only prints the progress line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
import time
from typing import IO, Any

import torch

from gantry.training.trainer import EpochEvaluation, StepMetrics


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s`` or ``?``."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class ProgressReporter:
    """A trainer callback: progress lines for the agent and the log, step-metric windows."""

    def __init__(
        self,
        *,
        fd: int | None = None,
        progress_s: float = 2.0,
        print_s: float = 10.0,
        window_steps: int = 10,
        window_s: float = 10.0,
        min_window_s: float = 0.25,
        out: IO[str] | None = None,
    ) -> None:
        self._pipe: IO[str] | None = None
        if fd is not None:
            try:
                self._pipe = os.fdopen(fd, "w", buffering=1, closefd=True)
            except OSError:
                self._pipe = None
        self._out = out if out is not None else sys.stdout
        self.progress_s = progress_s
        self.print_s = print_s
        self.window_steps = window_steps
        self.window_s = window_s
        self.min_window_s = min_window_s
        self._last_progress = 0.0
        self._last_print = 0.0
        self._window: list[StepMetrics] = []
        self._window_start = time.monotonic()
        self.last: StepMetrics | None = None

    @classmethod
    def from_environ(cls) -> ProgressReporter:
        """A reporter writing to ``GANTRY_PROGRESS_FD`` when the agent gave one."""
        raw = os.environ.get("GANTRY_PROGRESS_FD", "").strip()
        return cls(fd=int(raw) if raw.isdigit() else None)

    def __call__(self, metrics: StepMetrics) -> None:
        self.last = metrics
        now = time.monotonic()
        final = metrics.total_steps > 0 and metrics.step >= metrics.total_steps
        if metrics.rank == 0:
            if final or metrics.step == 1 or now - self._last_progress >= self.progress_s:
                self._last_progress = now
                self._send(
                    {
                        "kind": "progress",
                        "step": metrics.step,
                        "total_steps": metrics.total_steps,
                        "epoch": metrics.epoch,
                        "loss": metrics.loss,
                        "samples_per_s": metrics.samples_per_s,
                        "eta_s": metrics.eta_s,
                    }
                )
            if final or metrics.step == 1 or now - self._last_print >= self.print_s:
                self._last_print = now
                total = f"/{metrics.total_steps}" if metrics.total_steps else ""
                print(
                    f"step {metrics.step}{total} epoch {metrics.epoch} loss {metrics.loss:.4f} "
                    f"{metrics.samples_per_s:.0f} samples/s ETA {format_eta(metrics.eta_s)}",
                    file=self._out,
                    flush=True,
                )
        self._window.append(metrics)
        open_s = now - self._window_start
        if (
            final
            or (len(self._window) >= self.window_steps and open_s >= self.min_window_s)
            or open_s >= self.window_s
        ):
            self.flush()

    def flush(self) -> None:
        """Send the open window of step metrics."""
        window, self._window = self._window, []
        self._window_start = time.monotonic()
        if not window:
            return
        n = len(window)
        self._send(
            {
                "kind": "steps",
                "first_step": window[0].step,
                "last_step": window[-1].step,
                "step_ms": 1000 * sum(m.step_s for m in window) / n,
                "step_ms_max": 1000 * max(m.step_s for m in window),
                "data_ms": 1000 * sum(m.data_s for m in window) / n,
                "compute_ms": 1000 * sum(m.compute_s for m in window) / n,
                "forward_ms": 1000 * sum(m.forward_s for m in window) / n,
                "backward_ms": 1000 * sum(m.backward_s for m in window) / n,
                "comm_ms": 1000 * sum(m.comm_s for m in window) / n,
                "optimizer_ms": 1000 * sum(m.optimizer_s for m in window) / n,
                "samples": sum(m.samples for m in window),
                "tokens": sum(m.tokens for m in window),
                "loss": window[-1].loss,
                "memory_mib": peak_memory_mib(),
            }
        )

    def evaluated(self, evaluation: EpochEvaluation) -> None:
        """A trainer evaluation callback: send rank 0's metrics after an epoch and print them
        (``eval epoch 3: accuracy=0.8123 eval_loss=0.41``). Only finite numbers are sent; the
        others are named in the printed line."""
        metrics, dropped = {}, []
        for name, value in evaluation.metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if math.isfinite(number):
                metrics[str(name)] = number
            else:
                dropped.append(str(name))
        self._send(
            {
                "kind": "evaluation",
                "step": evaluation.step,
                "epoch": evaluation.epoch,
                "metrics": metrics,
            }
        )
        shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())) or "no metrics"
        if dropped:
            shown += f" (not finite numbers: {', '.join(sorted(dropped))})"
        print(f"eval epoch {evaluation.epoch}: {shown}", file=self._out, flush=True)

    def send(self, record: dict[str, Any]) -> None:
        """Send another record (e.g. ``{"kind": "epsilon", ...}``) to the agent."""
        self._send(record)

    def close(self) -> None:
        """Flush the window and close the pipe."""
        self.flush()
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                self._pipe.close()
            self._pipe = None

    def _send(self, record: dict[str, Any]) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(json.dumps(record, separators=(",", ":")) + "\n")
        except (OSError, ValueError):  # the agent went away: training goes on
            self._pipe = None


def peak_memory_mib() -> int:
    """Peak memory of this worker: the GPU's allocator peak on CUDA, else the process's RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return int(torch.cuda.max_memory_allocated()) >> 20
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) >> 10  # kB on Linux


__all__ = ["ProgressReporter", "format_eta", "peak_memory_mib"]
