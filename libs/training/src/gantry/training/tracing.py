"""Deep traces on request: ``torch.profiler`` over a few steps, as a gzipped Chrome trace.

The profiler service asks for a trace of a job; the node agent running the job's workers
writes the request into the directory it gave them (``GANTRY_TRACE_DIR``), atomically::

    $GANTRY_TRACE_DIR/request.json   {"trace_id": "...", "steps": 20, "ranks": [0, 3]}

(``ranks`` empty: every rank). :class:`TraceOnRequest`, a trainer callback, looks at that file
at most every ``check_s`` seconds (one ``os.stat`` when nothing changed, so an idle worker pays
nothing); when a new ``trace_id`` names this rank it profiles the next ``steps`` optimizer
steps, then writes::

    <trace_id>.rank<R>.json.gz     the Chrome/Perfetto trace (export_chrome_trace, gzipped)
    <trace_id>.rank<R>.done.json   {"trace_id", "rank", "first_step", "steps", "bytes",
                                    "failed_reason"} -- always last: the agent waits for it

both through a temporary name and a rename (the node agent, which uploads them, takes the
names from :func:`trace_file` and :func:`done_file`). A trace that cannot be recorded gets a
done file with ``failed_reason`` and training goes on; a ``trace_id`` is handled once; a run
that ends before the steps are done exports what was recorded (at its last step, or in
:meth:`close`).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gantry.core.logging import get_logger

if TYPE_CHECKING:
    from gantry.training.trainer import StepMetrics

#: The file the agent writes a request into, inside ``GANTRY_TRACE_DIR``.
REQUEST_FILE = "request.json"
#: Most steps one trace records (what the profiler service accepts).
MAX_STEPS = 1000
_TRACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_log = get_logger("gantry.training")


def trace_file(trace_dir: Path, trace_id: str, rank: int) -> Path:
    """Where rank ``rank`` leaves its gzipped Chrome trace."""
    return trace_dir / f"{trace_id}.rank{rank}.json.gz"


def done_file(trace_dir: Path, trace_id: str, rank: int) -> Path:
    """Where rank ``rank`` says its trace is finished (or failed), last of all."""
    return trace_dir / f"{trace_id}.rank{rank}.done.json"


def valid_trace_id(trace_id: object) -> bool:
    """Whether ``trace_id`` can name files (letters, digits, ``._-``; no ``..``)."""
    return (
        isinstance(trace_id, str) and bool(_TRACE_ID.fullmatch(trace_id)) and ".." not in trace_id
    )


class TraceOnRequest:
    """A trainer callback: records the next steps with ``torch.profiler`` when asked.

    ``clock`` (``time.monotonic``) paces the checks of the request file: one per ``check_s``.
    """

    def __init__(
        self,
        trace_dir: Path,
        *,
        check_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trace_dir = Path(trace_dir)
        self.check_s = check_s
        self._clock = clock
        self._next_check = -float("inf")
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last read
        self._handled: set[str] = set()
        # the trace being recorded
        self._profiler: Any = None
        self._trace_id = ""
        self._rank = 0
        self._wanted = 0
        self._first_step = 0
        self._recorded = 0

    @classmethod
    def from_environ(cls) -> TraceOnRequest | None:
        """A callback watching ``GANTRY_TRACE_DIR``, or None when the agent gave no directory."""
        raw = os.environ.get("GANTRY_TRACE_DIR", "").strip()
        return cls(Path(raw)) if raw else None

    @property
    def recording(self) -> bool:
        """Whether a trace is being recorded now."""
        return self._profiler is not None

    def __call__(self, metrics: StepMetrics) -> None:
        if self._profiler is not None:
            self._stepped(metrics)
            return
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self.check_s
        request = self._poll()
        if request is not None:
            self._start(request, metrics)

    def close(self) -> None:
        """Export what a trace in progress recorded (the run ended before its steps)."""
        if self._profiler is not None:
            self._finish()

    # -- the request --------------------------------------------------------------------------

    def _poll(self) -> tuple[str, int, list[int]] | None:
        """A request not handled yet, as (trace_id, steps, ranks); None when there is none."""
        path = self.trace_dir / REQUEST_FILE
        try:
            st = os.stat(path)
        except OSError:
            return None
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if signature == self._seen:
            return None
        self._seen = signature
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            _log.warning("unreadable trace request", path=str(path), error=str(exc))
            return None
        if not isinstance(raw, dict):
            return None
        trace_id, steps, ranks = raw.get("trace_id"), raw.get("steps"), raw.get("ranks") or []
        if not valid_trace_id(trace_id) or trace_id in self._handled:
            return None
        assert isinstance(trace_id, str)
        self._handled.add(trace_id)
        if (
            not isinstance(steps, int)
            or isinstance(steps, bool)
            or not 1 <= steps <= MAX_STEPS
            or not isinstance(ranks, list)
            or not all(isinstance(r, int) for r in ranks)
        ):
            _log.warning("bad trace request", trace_id=trace_id, steps=steps, ranks=ranks)
            return None
        return trace_id, steps, ranks

    # -- recording ----------------------------------------------------------------------------

    def _start(self, request: tuple[str, int, list[int]], metrics: StepMetrics) -> None:
        trace_id, steps, ranks = request
        if ranks and metrics.rank not in ranks:
            return
        self._trace_id, self._rank, self._wanted = trace_id, metrics.rank, steps
        self._first_step, self._recorded = metrics.step + 1, 0
        try:
            # here, not at import: the node agent shares this module's file names
            import torch
            import torch.profiler as tp

            activities = [tp.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(tp.ProfilerActivity.CUDA)
            profiler = tp.profile(activities=activities, record_shapes=False, with_stack=False)
            profiler.start()
        except Exception as exc:  # a trace must never stop training
            self._write_done(0, f"profiler could not start: {type(exc).__name__}: {exc}")
            return
        self._profiler = profiler
        _log.info("trace started", trace_id=trace_id, rank=self._rank, steps=steps)

    def _stepped(self, metrics: StepMetrics) -> None:
        self._recorded += 1
        try:
            self._profiler.step()
        except Exception as exc:
            self._abandon(f"profiler failed at step {metrics.step}: {type(exc).__name__}: {exc}")
            return
        final = metrics.total_steps > 0 and metrics.step >= metrics.total_steps
        if self._recorded >= self._wanted or final:
            self._finish()

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        gz = trace_file(self.trace_dir, self._trace_id, self._rank)
        tag = f"{os.getpid()}.{threading.get_ident()}"
        raw = self.trace_dir / f".{self._trace_id}.rank{self._rank}.{tag}.json"
        tmp = self.trace_dir / f".{gz.name}.{tag}.tmp"
        try:
            profiler.stop()
            profiler.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            tmp.replace(gz)
            size = gz.stat().st_size
        except Exception as exc:
            for path in (tmp, gz):
                with contextlib.suppress(OSError):
                    path.unlink()
            self._write_done(0, f"trace could not be exported: {type(exc).__name__}: {exc}")
            return
        finally:
            with contextlib.suppress(OSError):
                raw.unlink()
        self._write_done(size, "")
        _log.info(
            "trace recorded",
            trace_id=self._trace_id,
            rank=self._rank,
            first_step=self._first_step,
            steps=self._recorded,
            bytes=size,
        )

    def _abandon(self, reason: str) -> None:
        profiler, self._profiler = self._profiler, None
        with contextlib.suppress(Exception):
            profiler.stop()
        self._write_done(0, reason)

    def _write_done(self, size: int, failed_reason: str) -> None:
        if failed_reason:
            _log.warning(
                "trace failed", trace_id=self._trace_id, rank=self._rank, reason=failed_reason
            )
        record = {
            "trace_id": self._trace_id,
            "rank": self._rank,
            "first_step": self._first_step,
            "steps": 0 if failed_reason else self._recorded,
            "bytes": size,
            "failed_reason": failed_reason,
        }
        path = done_file(self.trace_dir, self._trace_id, self._rank)
        tmp = self.trace_dir / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
        except OSError as exc:  # the directory went away: nobody waits for it any more
            _log.warning("trace not reported", trace_id=self._trace_id, error=str(exc))
            with contextlib.suppress(OSError):
                tmp.unlink()


__all__ = [
    "MAX_STEPS",
    "REQUEST_FILE",
    "TraceOnRequest",
    "done_file",
    "trace_file",
    "valid_trace_id",
]
