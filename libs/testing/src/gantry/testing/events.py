"""Watching the event bus from tests: every event on a subject, and dead letters' reasons."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.errors
import orjson

from gantry.events import EventEnvelope


async def dead_letter_reasons(
    nats_url: str, subject: str, count: int, *, wait_s: float = 10.0
) -> list[str]:
    """The reasons of the first ``count`` dead letters on ``subject`` (waits for them)."""
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe(subject, durable=None)
        reasons: list[str] = []
        async with asyncio.timeout(wait_s):
            while len(reasons) < count:
                try:
                    msgs = await sub.fetch(count - len(reasons), timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                for m in msgs:
                    reasons.append((m.headers or {}).get("Gantry-Dead-Reason", ""))
                    await m.ack()
        return reasons
    finally:
        await nc.close()


class EventTap:
    """Collects every event on a subject pattern from now on (core NATS subscription)."""

    def __init__(self) -> None:
        self.events: list[EventEnvelope] = []
        self._nc: Any = None

    async def start(self, nats_url: str, subject: str) -> EventTap:
        self._nc = await nats.connect(nats_url)

        async def on(msg: Any) -> None:
            self.events.append(EventEnvelope.model_validate(orjson.loads(msg.data)))

        await self._nc.subscribe(subject, cb=on)
        return self

    def of(self, type_: str, **match: Any) -> list[EventEnvelope]:
        """The events of ``type_`` seen so far whose data has the ``match`` values."""
        return [
            e
            for e in self.events
            if e.type == type_ and all(e.data.get(k) == v for k, v in match.items())
        ]

    async def wait_for(
        self,
        type_: str,
        count: int = 1,
        timeout: float = 10.0,  # noqa: ASYNC109
        **match: Any,
    ) -> list[EventEnvelope]:
        """Wait until ``count`` such events were seen; all of them."""
        async with asyncio.timeout(timeout):
            while len(self.of(type_, **match)) < count:  # noqa: ASYNC110 - polled by design
                await asyncio.sleep(0.02)
        return self.of(type_, **match)

    async def close(self) -> None:
        await self._nc.close()


__all__ = ["EventTap", "dead_letter_reasons"]
