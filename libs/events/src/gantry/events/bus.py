"""The connection to NATS JetStream, and idempotent stream set-up."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from gantry.core import NatsSettings, Unavailable, get_logger
from gantry.events.streams import STREAMS, StreamDef

_log = get_logger("gantry.events.bus")


class Bus:
    """A NATS connection with JetStream; reconnects by itself after the server restarts."""

    def __init__(self, nc: Client, settings: NatsSettings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self._closing = [False]

    @classmethod
    async def connect(cls, settings: NatsSettings, *, name: str) -> Bus:
        """Connect to ``settings.url``; raise :class:`Unavailable` if no server answers."""

        async def _error(exc: Exception) -> None:
            _log.warning("nats error", error=str(exc))

        async def _disconnected() -> None:
            if not closing[0]:
                _log.warning("nats disconnected")

        async def _reconnected() -> None:
            _log.info(
                "nats reconnected", url=str(nc.connected_url.netloc if nc.connected_url else "")
            )

        closing = [False]
        options: dict[str, Any] = {
            "servers": [u.strip() for u in settings.url.split(",") if u.strip()],
            "name": name,
            "connect_timeout": settings.connect_timeout_s,
            "reconnect_time_wait": settings.reconnect_wait_s,
            "max_reconnect_attempts": settings.max_reconnect_attempts,
            "allow_reconnect": True,
            "error_cb": _error,
            "disconnected_cb": _disconnected,
            "reconnected_cb": _reconnected,
            "pending_size": 64 * 1024 * 1024,
        }
        if settings.user:
            options["user"] = settings.user
            options["password"] = settings.password or ""
        try:
            nc = await asyncio.wait_for(nats.connect(**options), timeout=settings.initial_wait_s)
        except (OSError, TimeoutError, nats.errors.NoServersError) as exc:
            raise Unavailable(
                f"cannot connect to NATS at {settings.url} within {settings.initial_wait_s}s: "
                f"{type(exc).__name__} {exc}",
                hint="start the platform with 'gantry up' or set GANTRY_NATS__URL",
            ) from None
        bus = cls(nc, settings)
        bus._closing = closing
        return bus

    async def ensure_streams(self, streams: tuple[StreamDef, ...] = STREAMS) -> None:
        """Create each stream, or update it to the definition if it exists (idempotent)."""
        for definition in streams:
            config = api.StreamConfig(
                name=definition.name,
                description=definition.description,
                subjects=list(definition.subjects),
                storage=api.StorageType.FILE,
                retention=api.RetentionPolicy.LIMITS,
                max_age=definition.max_age_s or None,
                max_bytes=definition.max_bytes,
                num_replicas=self.settings.stream_replicas,
                duplicate_window=120.0,
            )
            try:
                await self.js.stream_info(definition.name)
            except NotFoundError:
                await self.js.add_stream(config)
                _log.info("stream created", stream=definition.name)
            else:
                await self.js.update_stream(config)

    async def close(self) -> None:
        """Flush what was sent (acks included), then close the connection.

        Consumers stop fetching before this is called, so there is nothing left to drain.
        """
        if self.nc.is_closed:
            return
        self._closing[0] = True
        try:
            await self.nc.flush(timeout=2)
        except (TimeoutError, nats.errors.Error) as exc:
            _log.warning("flush before close failed", error=repr(exc))
        await self.nc.close()


__all__ = ["Bus"]
