"""The connection to NATS JetStream, and idempotent stream set-up."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError

from gantry.core import ConfigError, NatsSettings, Unavailable, get_logger
from gantry.events.streams import REVOCATIONS_BUCKET, STREAMS, StreamDef
from gantry.events.topology import USERS, inbox_prefix

_log = get_logger("gantry.events.bus")


class Bus:
    """A NATS connection with JetStream; reconnects by itself after the server restarts."""

    def __init__(self, nc: Client, settings: NatsSettings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=settings.api_timeout_s)
        self.settings = settings
        self._closing = [False]
        #: Subjects the server refused this connection (permissions violations), newest last.
        self.denied: list[str] = []

    @classmethod
    async def connect(
        cls, settings: NatsSettings, *, name: str, tls: ssl.SSLContext | None = None
    ) -> Bus:
        """Connect to ``settings.url``; raise :class:`Unavailable` if no server answers.

        With ``settings.user`` set, replies come back under that user's own inbox prefix (the
        only one its NATS permissions let it subscribe to). ``tls`` verifies the server (and
        presents a client certificate if it holds one).
        """
        denied: list[str] = []

        async def _error(exc: Exception) -> None:
            text = str(exc)
            if "permissions violation" in text.lower():
                denied.append(text)
                del denied[:-50]
            _log.warning("nats error", error=text)

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
            if settings.user in _KNOWN_USERS:
                options["inbox_prefix"] = inbox_prefix(settings.user)
        if tls is not None:
            options["tls"] = tls
            # TLS from the first byte: a server that does not speak TLS (or something in its
            # place) never sees the credentials; the servers are configured handshake_first.
            options["tls_handshake_first"] = True
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
        bus.denied = denied
        return bus

    async def ensure_streams(self, streams: tuple[StreamDef, ...] = STREAMS) -> None:
        """Create each stream, or update it to the definition (idempotent).

        A stream that exists as defined is left alone, so a service whose NATS user may only
        look at streams (every platform service in a cluster) starts as long as the admin has
        created them (``gantry admin streams``); if one is missing or differs and this user may
        not fix it, :class:`ConfigError` says so.
        """
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
                info = await self.js.stream_info(definition.name)
            except NotFoundError:
                await self._change_stream("create", config)
                _log.info("stream created", stream=definition.name)
                continue
            if not _same_stream(info.config, config):
                await self._change_stream("update", config)
                _log.info("stream updated", stream=definition.name)
        if streams is STREAMS:
            await self.ensure_buckets()

    async def ensure_buckets(self) -> None:
        """Create the platform's key-value buckets if missing (the token revocation list)."""
        before = len(self.denied)
        try:
            await self.js.key_value(REVOCATIONS_BUCKET)
            return
        except BucketNotFoundError:
            pass
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            if len(self.denied) > before:
                raise ConfigError(
                    f"NATS user {self.settings.user!r} may not look up the key-value bucket "
                    f"{REVOCATIONS_BUCKET}",
                    hint="regenerate the NATS users ('gantry admin nats-config') and reload "
                    "the server's configuration",
                ) from None
            raise Unavailable(f"NATS did not answer about bucket {REVOCATIONS_BUCKET}") from exc
        config = api.KeyValueConfig(
            bucket=REVOCATIONS_BUCKET,
            description="Revoked identity tokens by jti",
            history=1,
            storage=api.StorageType.FILE,
            replicas=self.settings.stream_replicas,
        )
        try:
            await self.js.create_key_value(config)
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            if len(self.denied) > before:
                raise ConfigError(
                    f"key-value bucket {REVOCATIONS_BUCKET} is missing, and NATS user "
                    f"{self.settings.user!r} may not create it",
                    hint="run 'gantry admin streams' with the admin credentials",
                ) from None
            raise Unavailable(f"NATS did not answer creating bucket {REVOCATIONS_BUCKET}") from exc
        _log.info("bucket created", bucket=REVOCATIONS_BUCKET)

    async def _change_stream(self, how: str, config: api.StreamConfig) -> None:
        before = len(self.denied)
        try:
            if how == "create":
                await self.js.add_stream(config)
            else:
                await self.js.update_stream(config)
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            name = str(config.name).lower()
            if len(self.denied) > before or any(name in d.lower() for d in self.denied):
                raise ConfigError(
                    f"stream {config.name} must be {how}d, and NATS user "
                    f"{self.settings.user!r} may not do it",
                    hint="run 'gantry admin streams' with the admin credentials (the "
                    "deployment's set-up job does), then start the service again",
                ) from None
            raise Unavailable(f"NATS did not answer the {how} of stream {config.name}") from exc

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


def _same_stream(have: api.StreamConfig, want: api.StreamConfig) -> bool:
    """Whether an existing stream already has the defined subjects, limits and replicas."""
    return (
        sorted(have.subjects or []) == sorted(want.subjects or [])
        and (have.max_age or 0) == (want.max_age or 0)
        and (have.max_bytes or -1) == (want.max_bytes or -1)
        and (have.num_replicas or 1) == (want.num_replicas or 1)
        and (have.description or "") == (want.description or "")
        and (have.duplicate_window or 0) == (want.duplicate_window or 0)
    )


_KNOWN_USERS = frozenset(USERS)

__all__ = ["Bus"]
