"""Bus administration a deployment runs once: create the streams, print the NATS users' config.

Platform services may only look at streams (their NATS users cannot create or change them), so
a cluster creates them first, as the ``admin`` user, with this module — in every image, since
each installs gantry-events::

    GANTRY_NATS__URL=nats://nats:4222 GANTRY_NATS__USER=admin \\
    GANTRY_NATS__PASSWORD=... GANTRY_NATS__STREAM_REPLICAS=3 python -m gantry.events.admin streams

    python -m gantry.events.admin auth-conf > auth.conf     # the users, from the catalog

``gantry admin streams`` and ``gantry admin nats-config`` are the same commands in the CLI.
"""

from __future__ import annotations

import asyncio
import sys

from gantry.core import (
    CommonSettings,
    GantryError,
    NatsSettings,
    TlsSettings,
    configure_logging,
    load_settings,
)
from gantry.core.tls import nats_tls
from gantry.events.bus import Bus
from gantry.events.nats_auth import render_auth_conf
from gantry.events.streams import STREAMS


async def create_streams(
    settings: NatsSettings, tls: TlsSettings | None = None
) -> list[tuple[str, int]]:
    """Create or update every stream; return each one's name and message count."""
    bus = await Bus.connect(settings, name="gantry-admin-streams", tls=nats_tls(tls))
    try:
        await bus.ensure_streams()
        out = []
        for definition in STREAMS:
            info = await bus.js.stream_info(definition.name)
            out.append((definition.name, int(info.state.messages)))
        return out
    finally:
        await bus.close()


_USAGE = "usage: python -m gantry.events.admin {streams|auth-conf}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m gantry.events.admin``."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["auth-conf"]:
        sys.stdout.write(render_auth_conf())
        return 0
    if args != ["streams"]:
        print(_USAGE, file=sys.stderr)
        return 2
    try:
        settings = load_settings(CommonSettings)
        configure_logging("gantry-admin", level=settings.log_level, json=settings.log_json)
        for name, messages in asyncio.run(create_streams(settings.nats, settings.tls)):
            print(f"stream {name}: {messages} messages, {settings.nats.stream_replicas} replicas")
    except GantryError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        print(f"error: {exc.message}{hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
