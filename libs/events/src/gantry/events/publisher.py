"""Publishing events to JetStream: schema-checked, signed, de-duplicated, acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import nats.errors
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError

from gantry.core import Unavailable, get_logger
from gantry.events.bus import Bus
from gantry.events.catalog import validate_event
from gantry.events.envelope import EventEnvelope
from gantry.events.errors import EventTooLarge
from gantry.events.signing import SIGNATURE_HEADER, EventSigner, signature_header

_log = get_logger("gantry.events.publisher")

DEFAULT_MAX_EVENT_BYTES = 256 * 1024

_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    NoStreamResponseError,
)


class Publisher:
    """Publishes events and waits for JetStream's ack.

    ``Nats-Msg-Id`` is the event id, so a publish retried after a timeout or a server restart
    is stored once (within the stream's duplicate window). Every event is validated against the
    catalog first: a bad event raises :class:`gantry.core.InvalidInput` and is never sent.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        signer: EventSigner | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        ack_timeout_s: float = 5.0,
        retry_for_s: float = 60.0,
    ) -> None:
        self._bus = bus
        self._signer = signer
        self._max = max_event_bytes
        self._ack_timeout_s = ack_timeout_s
        self._retry_for_s = retry_for_s

    def encode(self, event: EventEnvelope) -> tuple[bytes, dict[str, str]]:
        """Validate ``event`` and return its canonical bytes and NATS headers."""
        validate_event(event)
        payload = event.canonical_bytes()
        if len(payload) > self._max:
            raise EventTooLarge(len(payload), self._max)
        headers = {"Nats-Msg-Id": event.id}
        if self._signer is not None:
            headers[SIGNATURE_HEADER] = signature_header(self._signer, payload)
        return payload, headers

    async def publish(self, event: EventEnvelope) -> api.PubAck:
        """Publish one event; retry transient failures for up to ``retry_for_s`` seconds."""
        payload, headers = self.encode(event)
        return await self.publish_raw(event.type, payload, headers)

    async def publish_raw(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> api.PubAck:
        """Publish pre-encoded bytes with retries (used by the outbox relay and dead-lettering)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_for_s
        delay = 0.05
        while True:
            try:
                return await self._bus.js.publish(
                    subject, payload, timeout=self._ack_timeout_s, headers=headers
                )
            except _RETRYABLE as exc:
                if loop.time() >= deadline:
                    raise Unavailable(
                        f"JetStream did not acknowledge {subject} within {self._retry_for_s}s: "
                        f"{type(exc).__name__}",
                        hint="check that NATS is running ('gantry up') and reachable",
                    ) from None
            except APIError as exc:
                if exc.code in (503,) and loop.time() < deadline:
                    pass
                else:
                    raise Unavailable(f"JetStream refused {subject}: {exc}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def publish_many(
        self, events: Iterable[EventEnvelope], *, concurrency: int = 256
    ) -> Sequence[api.PubAck]:
        """Publish many events with up to ``concurrency`` acks outstanding (pipelined)."""
        semaphore = asyncio.Semaphore(concurrency)

        async def _one(event: EventEnvelope) -> api.PubAck:
            async with semaphore:
                return await self.publish(event)

        return await asyncio.gather(*(_one(e) for e in events))


__all__ = ["DEFAULT_MAX_EVENT_BYTES", "Publisher"]
