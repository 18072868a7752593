"""``gantry admin nats-config | streams``: the bus's users and streams for a deployment."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from gantry.client.cli._common import DataDirOpt, command_settings, state_of
from gantry.core import InvalidInput


def admin_nats_config(
    ctx: typer.Context,
    out: Annotated[
        list[Path] | None,
        typer.Option("--out", help="Write the file here (repeatable); default: print it."),
    ] = None,
    check: Annotated[
        bool,
        typer.Option("--check", help="Only check that each --out file is up to date."),
    ] = False,
) -> None:
    """The NATS users and their permissions, generated from the event catalog.

    Every deployment includes this file (auth.conf) in its nats-server configuration; the
    passwords are environment variables filled from 'gantry admin init's credentials file.
    """
    from gantry.events.nats_auth import render_auth_conf

    text = render_auth_conf()
    paths = list(out or [])
    if not paths:
        if check:
            raise InvalidInput("--check needs the files to check", hint="add --out FILE")
        print(text, end="")
        return
    stale = []
    for path in paths:
        if check:
            current = path.read_text(encoding="utf-8") if path.is_file() else ""
            if current != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            state_of(ctx).out.print(f"wrote {path}", markup=False)
    if stale:
        raise InvalidInput(
            f"out of date with the event catalog: {', '.join(stale)}",
            hint="regenerate with 'gantry admin nats-config --out FILE'",
        )


def admin_streams(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", help="NATS URL(s); default: the running platform's.")
    ] = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", help="Replicas per stream (3 on a cluster).")
    ] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create or update every JetStream stream, as the NATS admin user.

    The admin password comes from GANTRY_NATS__USER/GANTRY_NATS__PASSWORD, else from the
    data directory's nats/credentials.env.
    """
    from gantry.client.emit import resolve_nats_url
    from gantry.events.admin import create_streams
    from gantry.events.nats_auth import password_of, read_credentials
    from gantry.events.topology import ADMIN_USER

    settings = command_settings(ctx, data_dir)
    nats = settings.nats.model_copy()
    nats.url = resolve_nats_url(url, settings.data_dir)
    if replicas is not None:
        nats.stream_replicas = replicas
    if not nats.user:
        creds = settings.data_dir / "nats" / "credentials.env"
        nats.user = ADMIN_USER
        nats.password = password_of(read_credentials(creds), ADMIN_USER)
    counts = asyncio.run(create_streams(nats, settings.tls))
    out = state_of(ctx).out
    for name, messages in counts:
        out.print(f"{name:<11} {messages:>10,} messages  replicas {nats.stream_replicas}")


__all__ = ["admin_nats_config", "admin_streams"]
