"""Emitting events from outside services: the SDK's entry point into Gantry's event bus."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nats.js import api

from gantry.core import NatsSettings
from gantry.events.bus import Bus
from gantry.events.envelope import EventEnvelope
from gantry.events.publisher import Publisher
from gantry.events.signing import EventSigner


class Emitter:
    """A connected, signing publisher for one producer (``source``) acting as ``actor``.

    ``emit`` builds the envelope, checks it against the event catalog (``ext.*`` types need a
    JSON object as data; ``gantry.*`` types must match their registered model), signs it and
    waits for JetStream's ack. Bad events raise :class:`gantry.core.InvalidInput` locally.
    """

    def __init__(self, bus: Bus, publisher: Publisher, *, source: str, actor: str) -> None:
        self._bus = bus
        self.publisher = publisher
        self.source = source
        self.actor = actor

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        source: str,
        actor: str,
        signer: EventSigner | None = None,
        user: str | None = None,
        password: str | None = None,
        ensure_streams: bool = False,
    ) -> Emitter:
        """Connect to the Gantry event bus at ``url`` (as NATS ``user``, on clusters).

        The platform creates the streams; ``ensure_streams`` is for tests and tools that start
        their own NATS server.
        """
        bus = await Bus.connect(NatsSettings(url=url, user=user, password=password), name=source)
        if ensure_streams:
            await bus.ensure_streams()
        return cls(bus, Publisher(bus, signer=signer), source=source, actor=actor)

    def build(
        self,
        type_: str,
        data: Mapping[str, Any],
        *,
        subject: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        actor: str | None = None,
        schema_version: int = 1,
    ) -> EventEnvelope:
        """Build an envelope stamped with this emitter's source and actor."""
        extra: dict[str, Any] = {}
        if correlation_id:
            extra["correlation_id"] = correlation_id
        return EventEnvelope(
            type=type_,
            source=self.source,
            actor=actor or self.actor,
            subject=subject,
            causation_id=causation_id,
            schema_version=schema_version,
            data=dict(data),
            **extra,
        )

    async def emit(self, type_: str, data: Mapping[str, Any], **kwargs: Any) -> api.PubAck:
        """Build, check, sign and publish one event."""
        return await self.publisher.publish(self.build(type_, data, **kwargs))

    async def emit_many(
        self, events: Iterable[EventEnvelope], *, concurrency: int = 256
    ) -> Sequence[api.PubAck]:
        """Publish pre-built events, pipelined."""
        return await self.publisher.publish_many(events, concurrency=concurrency)

    async def close(self) -> None:
        """Flush and close the connection."""
        await self._bus.close()

    async def __aenter__(self) -> Emitter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["Emitter"]
