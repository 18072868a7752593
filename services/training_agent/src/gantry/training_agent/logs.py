"""Worker output, batched into ``gantry.log.job`` events (the LOGS stream).

Lines are cut at 4096 characters and batched per (job, attempt, worker, stream) for
``log_flush_s`` seconds or ``log_batch_lines`` lines, whichever comes first; the agent's own
notes about a job (restarts, registration) go to the ``gantry`` stream of worker 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

from gantry.core import GantryError, get_logger, new_id
from gantry.events import Publisher
from gantry.events.catalog import JOB_LOG, EventData, JobLogLines
from gantry.events.envelope import EventEnvelope
from gantry.security.keyring import SERVICE_KID_PREFIX
from gantry.training_agent.settings import AgentOptions

SERVICE_NAME = "training-agent"
SOURCE = f"gantry/{SERVICE_NAME}"
MAX_LINE_CHARS = 4096
LogStream = Literal["stdout", "stderr", "gantry"]
_log = get_logger("gantry.training_agent")


def event(
    type_: str,
    data: EventData,
    *,
    subject: str,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> EventEnvelope:
    """An event of this agent (source ``gantry/training-agent``)."""
    return EventEnvelope(
        type=type_,
        source=SOURCE,
        subject=subject,
        actor=f"{SERVICE_KID_PREFIX}{SERVICE_NAME}",
        correlation_id=correlation_id or new_id(),
        causation_id=causation_id,
        data=data.model_dump(mode="json"),
    )


class LogBatcher:
    """Worker output lines, batched per (job, attempt, worker, stream) into gantry.log.job."""

    def __init__(self, publisher: Publisher, node: str, options: AgentOptions) -> None:
        self._publisher = publisher
        self._node = node
        self._flush_s = options.log_flush_s
        self._max = options.log_batch_lines
        self._pending: dict[tuple[str, int, int, LogStream], tuple[int, list[str]]] = {}
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()

    def add(self, job_id: str, attempt: int, worker: int, stream: LogStream, line: str) -> None:
        """Queue one line."""
        key = (job_id, attempt, worker, stream)
        _, lines = self._pending.setdefault(key, (int(time.time() * 1000), []))
        lines.append(line[:MAX_LINE_CHARS])
        if len(lines) >= self._max:
            self._full.set()

    async def flush(self) -> None:
        """Publish everything pending now (in the order it was written, per worker)."""
        async with self._lock:
            pending, self._pending = self._pending, {}
            self._full.clear()
            for (job_id, attempt, worker, stream), (at_ms, lines) in pending.items():
                for start in range(0, len(lines), self._max):
                    data = JobLogLines(
                        job_id=job_id,
                        attempt=attempt,
                        node=self._node,
                        worker=worker,
                        stream=stream,
                        lines=lines[start : start + self._max],
                        at_ms=at_ms,
                    )
                    try:
                        await self._publisher.publish(event(JOB_LOG.type, data, subject=job_id))
                    except GantryError as exc:  # logs are best effort; the job goes on
                        _log.warning("log lines dropped", job=job_id, error=str(exc))

    async def run(self, stopping: asyncio.Event) -> None:
        """Flush every ``log_flush_s`` (sooner when a batch is full) until ``stopping``."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), timeout=self._flush_s)
            await self.flush()
        await self.flush()


__all__ = ["MAX_LINE_CHARS", "SERVICE_NAME", "SOURCE", "LogBatcher", "LogStream", "event"]
