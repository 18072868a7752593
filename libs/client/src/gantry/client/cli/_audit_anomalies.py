"""``gantry audit anomalies``: list, show, acknowledge and dismiss access-behaviour anomalies.

The audit service raises an anomaly when a principal's access departs from its usual behaviour
(a bulk read, a first access to sensitive data, a storm of denials, an unusual hour or place, a
raw-view read). Only auditors and platform admins may list or resolve them, and both are
themselves audited. There is no call to fetch one anomaly: ``show`` lists the newest
:data:`MAX_LIMIT` and picks it by id. :data:`anomalies_app` is registered on ``gantry audit``
in :mod:`gantry.client.cli._audit`.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    SinceOpt,
    State,
    TokenOpt,
    UntilOpt,
    audit_client,
    command_settings,
    fmt_ms,
    iso_ms,
    state_of,
    time_window,
)
from gantry.core import InvalidInput, NotFound

anomalies_app = typer.Typer(
    help="Access-behaviour anomalies: list, show, acknowledge, dismiss (auditors).",
    no_args_is_help=True,
)

#: The most anomalies the service answers with in one call.
MAX_LIMIT = 1000
#: The colour of each state of an anomaly.
STATE_STYLE = {"raised": "bold red", "acknowledged": "yellow", "dismissed": "dim"}
KINDS = (
    "bulk_read",
    "first_sensitive_access",
    "denial_storm",
    "unusual_hour",
    "unusual_place",
    "raw_view_read",
)


class AnomalyState(enum.StrEnum):
    """Values of --state."""

    raised = "raised"
    acknowledged = "acknowledged"
    dismissed = "dismissed"


IdArg = Annotated[str, typer.Argument(help="The anomaly's id (as listed).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON.")]


def _evidence(a: Any) -> Any:
    """The anomaly's evidence as parsed JSON (the raw text if it is not JSON)."""
    try:
        return json.loads(a.evidence_json) if a.evidence_json else {}
    except ValueError:
        return a.evidence_json


def anomaly_json(a: Any) -> dict[str, Any]:
    """An anomaly as a JSON object (times as ISO 8601 UTC; ``updated`` null until resolved)."""
    return {
        "anomaly_id": a.anomaly_id,
        "kind": a.kind,
        "principal": a.principal,
        "state": a.state,
        "severity": a.severity,
        "reason": a.reason,
        "evidence": _evidence(a),
        "event_ids": list(a.event_ids),
        "time": iso_ms(a.time_ms),
        "updated": iso_ms(a.updated_ms) if a.updated_ms else None,
        "by": a.by,
        "note": a.note,
    }


def _state_text(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{escape(state)}[/]" if style else escape(state)


def _say(state: State, text: str) -> None:
    state.out.print(text, markup=False, highlight=False)


@anomalies_app.command("list")
def anomalies_list(
    ctx: typer.Context,
    state_: Annotated[
        AnomalyState | None,
        typer.Option("--state", help="raised, acknowledged or dismissed.", show_default=False),
    ] = None,
    principal: Annotated[
        str, typer.Option("--principal", help="Only this principal's.", show_default=False)
    ] = "",
    kind: Annotated[
        str,
        typer.Option("--kind", help=f"Only this kind: {', '.join(KINDS)}.", show_default=False),
    ] = "",
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="At most N anomalies.")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List anomalies matching the filters, newest first."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    since_ms, until_ms = time_window(since, until)
    with audit_client(settings) as client:
        found = client.anomalies(
            state=state_.value if state_ else "",
            principal=principal,
            kind=kind,
            since_ms=since_ms,
            until_ms=until_ms,
            limit=min(limit + 1, MAX_LIMIT),  # one more, to tell whether there are more
        )
    more = len(found) > limit
    found = found[:limit]
    if as_json:
        for a in found:
            print(json.dumps(anomaly_json(a), sort_keys=True))
    else:
        n = len(found)
        table = Table(title=f"{n} anomal{'y' if n == 1 else 'ies'}")
        for col in ("time (UTC)", "kind", "principal", "state"):
            table.add_column(col)
        table.add_column("severity", justify="right")
        table.add_column("reason", overflow="fold")
        table.add_column("id", overflow="fold", min_width=36)
        for a in found:
            table.add_row(
                fmt_ms(a.time_ms),
                escape(a.kind),
                escape(a.principal),
                _state_text(a.state),
                f"{a.severity:.2f}",
                escape(a.reason),
                escape(a.anomaly_id),
            )
        state.out.print(table)
    if more:
        state.err.print(
            f"showing the newest {limit}; narrow with --since/--until or raise --limit "
            f"(at most {MAX_LIMIT})",
            markup=False,
            highlight=False,
        )


def _find(found: list[Any], anomaly_id: str) -> Any:
    """The anomaly with this id, or the only one whose id starts with it."""
    wanted = anomaly_id.strip()
    exact = [a for a in found if a.anomaly_id == wanted]
    if exact:
        return exact[0]
    starts = [a for a in found if wanted and a.anomaly_id.startswith(wanted)]
    if len(starts) > 1:
        raise InvalidInput(
            f"{anomaly_id!r} is the start of {len(starts)} anomaly ids",
            hint="give the whole id, as listed by 'gantry audit anomalies list'",
        )
    if not starts:
        raise NotFound(
            "anomaly",
            anomaly_id,
            hint=f"it is not among the newest {MAX_LIMIT} anomalies you may see; find ids "
            "with 'gantry audit anomalies list'",
        )
    return starts[0]


@anomalies_app.command("show")
def anomalies_show(
    ctx: typer.Context,
    anomaly_id: IdArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show one anomaly: every field, its evidence and the audited events it rests on."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        a = _find(client.anomalies(limit=MAX_LIMIT), anomaly_id)
    if as_json:
        print(json.dumps(anomaly_json(a), indent=2, sort_keys=True))
        return
    state = state_of(ctx)
    state.out.print(f"anomaly {escape(a.anomaly_id)}: {_state_text(a.state)}", highlight=False)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows = [
        ("kind", a.kind),
        ("principal", a.principal),
        ("severity", f"{a.severity:.2f} (1 = at its threshold)"),
        ("time (UTC)", fmt_ms(a.time_ms)),
        ("reason", a.reason),
        ("updated (UTC)", fmt_ms(a.updated_ms)),
        ("by", a.by),
        ("note", a.note),
        ("evidence", json.dumps(_evidence(a), indent=2, sort_keys=True)),
        ("events", "\n".join(a.event_ids) or "none"),
    ]
    for label, value in rows:
        if value:
            grid.add_row(label, escape(value))
    state.out.print(grid, highlight=False)


def _resolve(ctx: typer.Context, settings: Any, anomaly_id: str, to: str, note: str) -> None:
    with audit_client(settings) as client:
        a = client.resolve_anomaly(anomaly_id, to, note)
    state = state_of(ctx)
    _say(state, f"{a.state} anomaly {a.anomaly_id}: {a.kind} by {a.principal}")
    if a.note:
        _say(state, f"  note: {a.note}")


@anomalies_app.command("ack")
def anomalies_ack(
    ctx: typer.Context,
    anomaly_id: IdArg,
    note: Annotated[
        str, typer.Option("--note", help="What is being done about it (audited).")
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Acknowledge an anomaly: it is real and being handled."""
    settings = command_settings(ctx, data_dir, token)
    _resolve(ctx, settings, anomaly_id, AnomalyState.acknowledged.value, note)


@anomalies_app.command("dismiss")
def anomalies_dismiss(
    ctx: typer.Context,
    anomaly_id: IdArg,
    note: Annotated[
        str,
        typer.Option(
            "--note", help="Why it is not a problem (required; audited).", show_default=False
        ),
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Dismiss an anomaly as not a problem; --note must say why."""
    if not note.strip():
        raise InvalidInput(
            "say why the anomaly is dismissed: give --note TEXT",
            hint="the note is kept with the anomaly and in the audit log",
        )
    settings = command_settings(ctx, data_dir, token)
    _resolve(ctx, settings, anomaly_id, AnomalyState.dismissed.value, note)
