"""``gantry events emit``: publish one signed event to the bus."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gantry.client.cli._common import DataDirOpt, command_settings, state_of
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.events import EventEnvelope

events_app = typer.Typer(help="The event bus.", no_args_is_help=True)


@events_app.command("emit")
def events_emit(
    ctx: typer.Context,
    type_: Annotated[str, typer.Argument(metavar="TYPE", help="e.g. gantry.data.accessed")],
    source: Annotated[str, typer.Option("--source", help="The producing service.")],
    actor: Annotated[str, typer.Option("--actor", help="The principal that caused it.")],
    data: Annotated[str, typer.Option("--data", help="Event data as a JSON object.")] = "{}",
    subject: Annotated[
        str | None, typer.Option("--subject", help="Resource id.", show_default=False)
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            help="Service-account signing key (default: <data-dir>/keys/accounts/<source>.pem).",
            show_default=False,
        ),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="NATS URL (default: the running platform's).")
    ] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Publish one signed event."""
    from gantry.client.emit import build_event

    settings = command_settings(ctx, data_dir)
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise InvalidInput(f"--data is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidInput('--data must be a JSON object, e.g. \'{"dataset": "customers"}\'')
    event = build_event(type_, payload, source=source, actor=actor, subject=subject)
    if key is None:
        default_key = settings.data_dir / "keys" / "accounts" / f"{source}.pem"
        key = default_key if default_key.is_file() else None
    if key is None:
        state_of(ctx).err.print(
            f"warning: no signing key for {source!r}; the event is unsigned and the audit "
            "service will refuse it (create one: gantry admin service-account create)",
            markup=False,
        )
    ack = asyncio.run(_publish(event, url=url, data_dir=settings.data_dir, key=key))
    duplicate = " (duplicate, stored once)" if getattr(ack, "duplicate", False) else ""
    state_of(ctx).out.print(
        f"published {event.type} id={event.id} stream={ack.stream} seq={ack.seq}{duplicate}",
        markup=False,
    )


async def _publish(
    event: EventEnvelope, *, url: str | None, data_dir: Path, key: Path | None
) -> Any:
    from gantry.client.emit import connect

    async with await connect(
        source=event.source, actor=event.actor, url=url, data_dir=data_dir, key_path=key
    ) as emitter:
        return await emitter.publisher.publish(event)
