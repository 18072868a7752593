"""A background publisher: hand events over without waiting; they leave in order.

Used where the caller must not block on NATS (the auth interceptor records every decision
this way). On shutdown :meth:`BackgroundPublisher.drain` publishes what is queued. Events that
cannot be published while NATS is down wait in the bounded queue and are retried; only when
the queue is full does ``submit`` refuse, loudly (it never drops silently).
"""

from __future__ import annotations

import asyncio
import contextlib

from gantry.core import GantryError, Unavailable, get_logger
from gantry.events.envelope import EventEnvelope
from gantry.events.publisher import Publisher

_log = get_logger("gantry.events.background")


class BackgroundPublisher:
    """Queues events and publishes them from one task."""

    def __init__(self, publisher: Publisher, *, max_queue: int = 100_000) -> None:
        self._publisher = publisher
        self._queue: asyncio.Queue[EventEnvelope] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.refused = 0

    def submit(self, event: EventEnvelope) -> None:
        """Queue ``event``; raise :class:`Unavailable` if the queue is full."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            raise Unavailable(
                f"{self._queue.maxsize} events are waiting for NATS; refusing more",
                hint="check the NATS connection",
            ) from None

    def start(self) -> None:
        """Start the publishing task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="background-publisher")

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            while True:
                try:
                    await self._publisher.publish(event)
                    self.published += 1
                    break
                except GantryError as exc:
                    if not exc.temporary:
                        # a bad event can never be published: say so loudly, keep the rest going
                        self.refused += 1
                        _log.error(
                            "event refused; not published",
                            event_id=event.id,
                            type=event.type,
                            error=str(exc),
                        )
                        break
                    _log.warning("background publish failed; retrying", error=str(exc))
                    await asyncio.sleep(1.0)
            self._queue.task_done()

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Publish everything queued (up to ``timeout_s``), then stop the task."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)
        if not self._queue.empty():
            _log.error("events left unpublished at shutdown", count=self._queue.qsize())
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


__all__ = ["BackgroundPublisher"]
