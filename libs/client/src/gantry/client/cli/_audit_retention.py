"""``gantry audit retention|holds|archive|segments|purge``: how long each event type is kept,
legal holds that stop any deletion, archival of old log segments to the object store with
their proofs, and the one way to delete from the audit log (expired retention, no hold;
recorded). :func:`register` adds them to ``gantry audit`` in :mod:`gantry.client.cli._audit`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    SinceOpt,
    TokenOpt,
    UntilOpt,
    audit_client,
    command_settings,
    fmt_ms,
    iso_ms,
    state_of,
    time_window,
)

retention_app = typer.Typer(
    help="Retention rules: how long each event type is kept (auditors).", no_args_is_help=True
)
holds_app = typer.Typer(
    help="Legal holds: stop deletion of named principals', datasets' or periods' events.",
    no_args_is_help=True,
)
segments_app = typer.Typer(
    help="Archived log segments: list them, verify one against its signed tree head.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON.")]


def _say(ctx: typer.Context, text: str) -> None:
    state_of(ctx).out.print(text, markup=False, highlight=False)


@retention_app.command("set")
def retention_set(
    ctx: typer.Context,
    event_type: Annotated[
        str, typer.Argument(help="An event type, a prefix ending in '*', or '*'.")
    ],
    days: Annotated[int, typer.Argument(help="Keep this many days; 0 removes the rule.", min=0)],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Keep events of EVENT_TYPE DAYS days (e.g. gantry.data.accessed 2557 = seven years)."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        rule = client.set_retention(event_type, days)
    if days:
        _say(ctx, f"{rule.event_type}: kept {rule.keep_days} days")
    else:
        _say(ctx, f"{event_type}: rule removed (kept for ever unless a wider rule applies)")


@retention_app.command("list")
def retention_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Every rule; the most specific one applies to an event (exact, longest prefix, '*')."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        rules = client.retention()
    if as_json:
        for r in rules:
            print(
                json.dumps(
                    {
                        "event_type": r.event_type,
                        "keep_days": r.keep_days,
                        "updated_by": r.updated_by,
                        "updated": iso_ms(r.updated_ms),
                    }
                )
            )
        return
    table = Table(title=f"{len(rules)} retention rule(s); other events are kept for ever")
    for col in ("event type", "keep (days)", "set by", "set (UTC)"):
        table.add_column(col)
    for r in rules:
        table.add_row(
            escape(r.event_type), str(r.keep_days), escape(r.updated_by), fmt_ms(r.updated_ms)
        )
    state_of(ctx).out.print(table)


def hold_json(h: Any) -> dict[str, Any]:
    """A legal hold as JSON."""
    return {
        "name": h.name,
        "hold_id": h.hold_id,
        "state": h.state,
        "reason": h.reason,
        "principals": list(h.principals),
        "datasets": list(h.datasets),
        "since": iso_ms(h.since_ms) if h.since_ms else None,
        "until": iso_ms(h.until_ms) if h.until_ms else None,
        "created_by": h.created_by,
        "created": iso_ms(h.created_ms),
        "released_by": h.released_by,
        "released": iso_ms(h.released_ms) if h.released_ms else None,
        "release_note": h.release_note,
    }


@holds_app.command("place")
def holds_place(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A name for the hold, e.g. case-2026-114.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (e.g. the case).")] = "",
    principal: Annotated[
        list[str] | None,
        typer.Option("--principal", help="Hold this principal's events (repeatable)."),
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option("--dataset", help="Hold events about this dataset (repeatable)."),
    ] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Stop any deletion of the events the hold names (every criterion given must match)."""
    since_ms, until_ms = time_window(since, until)
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        h = client.place_hold(
            name,
            reason=reason,
            principals=principal or [],
            datasets=dataset or [],
            since_ms=since_ms,
            until_ms=until_ms,
        )
    _say(ctx, f"legal hold {h.name} placed: nothing it covers can be deleted until released")


@holds_app.command("release")
def holds_release(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The hold's name.")],
    note: Annotated[str, typer.Option("--note", help="Why it is released (required).")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Release a legal hold."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        h = client.release_hold(name, note=note)
    _say(ctx, f"legal hold {h.name} released by {h.released_by}")


@holds_app.command("list")
def holds_list(
    ctx: typer.Context,
    include_released: Annotated[bool, typer.Option("--all", help="Released ones too.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Legal holds."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        holds = client.holds(include_released=include_released)
    if as_json:
        for h in holds:
            print(json.dumps(hold_json(h), sort_keys=True))
        return
    table = Table(title=f"{len(holds)} legal hold(s)")
    for col in ("name", "state", "principals", "datasets", "period", "reason", "placed by"):
        table.add_column(col, overflow="fold")
    for h in holds:
        period = (
            f"{fmt_ms(h.since_ms) if h.since_ms else '...'} .. "
            f"{fmt_ms(h.until_ms) if h.until_ms else '...'}"
        )
        table.add_row(
            escape(h.name),
            escape(h.state),
            escape(", ".join(h.principals) or "any"),
            escape(", ".join(h.datasets) or "any"),
            period,
            escape(h.reason),
            escape(h.created_by),
        )
    state_of(ctx).out.print(table)


def audit_archive(
    ctx: typer.Context,
    older_than_days: Annotated[
        int,
        typer.Option(
            "--older-than-days",
            min=0,
            help="Archive whole segments older than this; 0 = the service's setting.",
        ),
    ] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would move.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Move old log segments to the object store with their proofs (still verifiable)."""
    import time

    older_than_ms = int(time.time() * 1000) - older_than_days * 86_400_000 if older_than_days else 0
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        result = client.archive(older_than_ms=older_than_ms, dry_run=dry_run)
    verb = "would archive" if dry_run else "archived"
    _say(ctx, f"{verb} {result.events:,} events in {len(result.segments)} segment(s)")
    for s in result.segments:
        _say(ctx, f"  {s.first_seq}..{s.end_seq - 1} ({fmt_ms(s.from_ms)} .. {fmt_ms(s.to_ms)}) "
             f"-> {s.object_name}")  # fmt: skip


@segments_app.command("list")
def segments_list(ctx: typer.Context, data_dir: DataDirOpt = None, token: TokenOpt = None) -> None:
    """Archived segments, oldest first."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        segments = client.segments()
    table = Table(title=f"{len(segments)} archived segment(s)")
    for col in ("first", "last", "events from (UTC)", "to (UTC)", "object", "proof to tree size"):
        table.add_column(col, overflow="fold")
    for s in segments:
        table.add_row(
            str(s.first_seq),
            str(s.end_seq - 1),
            fmt_ms(s.from_ms),
            fmt_ms(s.to_ms),
            escape(s.object_name),
            f"{s.tree_size:,}",
        )
    state_of(ctx).out.print(table)


@segments_app.command("verify")
def segments_verify(
    ctx: typer.Context,
    first_seq: Annotated[int, typer.Argument(help="The segment's first index (as listed).")],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check an archived segment on its own against the signed tree head it carries."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        result = client.verify_segment(first_seq)
    if result.ok:
        _say(ctx, f"segment {first_seq} verified: {result.detail}")
        return
    state_of(ctx).err.print(
        f"segment {first_seq} NOT verified: {result.detail}", markup=False, highlight=False
    )
    raise typer.Exit(1)


def audit_purge(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete events past their retention that no legal hold covers (recorded; the log still
    verifies)."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        result = client.purge(dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    _say(ctx, f"{verb} {result.events:,} event(s); {result.held_back:,} kept by legal holds")
    for kind, n in sorted(result.by_type.items()):
        _say(ctx, f"  {kind}: {n:,}")
    if result.purge_id:
        _say(ctx, f"recorded as purge {result.purge_id}")


def register(app: typer.Typer) -> None:
    """Add the retention, holds, archive, segments and purge commands to ``gantry audit``."""
    app.add_typer(retention_app, name="retention")
    app.add_typer(holds_app, name="holds")
    app.command("archive")(audit_archive)
    app.add_typer(segments_app, name="segments")
    app.command("purge")(audit_purge)


__all__ = ["hold_json", "register"]
