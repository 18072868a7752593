"""Emitting events into Gantry from outside services: one call, or a connected :class:`Emitter`.

::

    from gantry.client.emit import emit

    await emit(
        "gantry.data.accessed",
        {"dataset": "customers", "rows": 120},
        source="feature-store",
        actor="alice",
        key_path=".gantry/keys/services/feature-store.pem",
    )

Events are signed with the service account's key (``gantry admin service-account create``);
the audit service refuses unsigned events. The NATS URL is, in order: ``url``, the running
platform's ``<data_dir>/run/nats.json``, ``GANTRY_NATS__URL``. The NATS user is, in order:
``user``/``password``, ``GANTRY_NATS__USER``/``GANTRY_NATS__PASSWORD``, the ``external`` user of
the platform's ``<data_dir>/nats/credentials.env`` (outside services may publish only
``ext.<service>.*`` events and data access reports).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nats.js.api import PubAck
from pydantic import ValidationError

from gantry.core import (
    CommonSettings,
    ConfigError,
    InvalidInput,
    NatsSettings,
    load_settings,
)
from gantry.core.tls import nats_tls
from gantry.events import Bus, Emitter, EventEnvelope, Publisher, validate_event
from gantry.events.nats_auth import password_of, read_credentials
from gantry.events.topology import EXTERNAL_USER
from gantry.security import SigningKey, load_or_create_signing_key
from gantry.security.keyring import ACCOUNT_KID_PREFIX, SERVICE_KID_PREFIX


def resolve_nats_url(url: str | None = None, data_dir: Path | None = None) -> str:
    """The event bus URL: ``url``, else ``<data_dir>/run/nats.json``, else GANTRY_NATS__URL."""
    if url:
        return url
    settings = load_settings(CommonSettings)
    run_file = Path(data_dir if data_dir is not None else settings.data_dir) / "run" / "nats.json"
    try:
        found = json.loads(run_file.read_text(encoding="utf-8")).get("url")
    except (OSError, ValueError, AttributeError):
        found = None
    return str(found) if found else settings.nats.url


def resolve_nats_user(
    user: str | None = None, password: str | None = None, data_dir: Path | None = None
) -> tuple[str | None, str | None]:
    """The NATS user and password to connect with (see the module's docstring for the order)."""
    if user:
        return user, password
    settings = load_settings(CommonSettings)
    if settings.nats.user:
        return settings.nats.user, settings.nats.password
    creds = Path(data_dir if data_dir is not None else settings.data_dir) / "nats"
    creds = creds / "credentials.env"
    if creds.is_file():
        return EXTERNAL_USER, password_of(read_credentials(creds), EXTERNAL_USER)
    return None, None


def load_service_key(key_path: Path, kid: str | None = None) -> SigningKey:
    """Load a service account's signing key (it must exist).

    The key id defaults to the one the keyring gives the file: ``sa-<stem>`` for service
    accounts (``keys/accounts/<name>.pem``), ``svc-<stem>`` for platform services.
    """
    path = Path(key_path)
    if not path.is_file():
        raise ConfigError(
            f"no signing key at {path}",
            hint="create one with 'gantry admin service-account create NAME'",
        )
    prefix = ACCOUNT_KID_PREFIX if path.parent.name == "accounts" else SERVICE_KID_PREFIX
    return load_or_create_signing_key(path, kid=kid or f"{prefix}{path.stem}")


async def connect(
    *,
    source: str,
    actor: str,
    url: str | None = None,
    data_dir: Path | None = None,
    key_path: Path | None = None,
    kid: str | None = None,
    user: str | None = None,
    password: str | None = None,
    connect_timeout_s: float = 5.0,
) -> Emitter:
    """A connected :class:`Emitter` (close it, or use it as ``async with``).

    Raises :class:`gantry.core.Unavailable` when no NATS server answers within
    ``connect_timeout_s``.
    """
    signer = load_service_key(key_path, kid) if key_path is not None else None
    user, password = resolve_nats_user(user, password, data_dir)
    settings = NatsSettings(
        url=resolve_nats_url(url, data_dir),
        user=user,
        password=password,
        initial_wait_s=connect_timeout_s,
    )
    # The platform creates the streams; an outside service on a cluster has no right to.
    bus = await Bus.connect(settings, name=source, tls=nats_tls(load_settings(CommonSettings).tls))
    return Emitter(bus, Publisher(bus, signer=signer), source=source, actor=actor)


def build_event(
    type_: str,
    data: Mapping[str, Any],
    *,
    source: str,
    actor: str,
    subject: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> EventEnvelope:
    """An envelope checked against the event catalog; problems raise :class:`InvalidInput`."""
    extra: dict[str, Any] = {"correlation_id": correlation_id} if correlation_id else {}
    try:
        event = EventEnvelope(
            type=type_,
            source=source,
            actor=actor,
            subject=subject,
            causation_id=causation_id,
            data=dict(data),
            **extra,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"invalid event: {problems}") from None
    validate_event(event)
    return event


async def emit(
    type_: str,
    data: Mapping[str, Any],
    *,
    source: str,
    actor: str,
    url: str | None = None,
    data_dir: Path | None = None,
    key_path: Path | None = None,
    kid: str | None = None,
    subject: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> PubAck:
    """Connect, publish one event (checked against the catalog, signed), wait for the ack.

    Raises :class:`InvalidInput` for a malformed event, :class:`ConfigError` for a missing key
    and :class:`gantry.core.Unavailable` when NATS cannot be reached.
    """
    event = build_event(
        type_,
        data,
        source=source,
        actor=actor,
        subject=subject,
        correlation_id=correlation_id,
        causation_id=causation_id,
    )
    async with await connect(
        source=source,
        actor=actor,
        url=url,
        data_dir=data_dir,
        key_path=key_path,
        kid=kid,
        user=user,
        password=password,
    ) as emitter:
        return await emitter.publisher.publish(event)


__all__ = [
    "Emitter",
    "build_event",
    "connect",
    "emit",
    "load_service_key",
    "resolve_nats_url",
    "resolve_nats_user",
]
