"""``gantry audit``: query, export and report on the audit log; verify, proof and anomalies are
wired here.

The filter options shared by ``query`` and ``export`` are defined once below. ``verify`` and
``proof`` (the commands that check signatures and Merkle proofs locally) live in
:mod:`gantry.client.cli._audit_verify` and are registered on :data:`audit_app` after ``report``;
the ``anomalies`` group (list, show, ack, dismiss) lives in
:mod:`gantry.client.cli._audit_anomalies` and is added after them, then ``subject``
(:mod:`~gantry.client.cli._audit_subjects`), ``reports`` (:mod:`~gantry.client.cli._audit_reports`)
and retention, holds, archive, segments and purge (:mod:`~gantry.client.cli._audit_retention`).
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    FileSizeColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from gantry.client.cli._audit_anomalies import anomalies_app
from gantry.client.cli._audit_reports import reports_app
from gantry.client.cli._audit_retention import register as register_retention
from gantry.client.cli._audit_subjects import subject_app
from gantry.client.cli._audit_verify import audit_proof, audit_verify
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

if TYPE_CHECKING:
    from gantry.client.audit import Filter

audit_app = typer.Typer(help="The tamper-evident audit log.", no_args_is_help=True)


class DecisionChoice(enum.StrEnum):
    """Values of --decision."""

    allow = "allow"
    deny = "deny"


class ExportFormat(enum.StrEnum):
    """Values of --format."""

    jsonl = "jsonl"
    csv = "csv"


ActorOpt = Annotated[
    list[str] | None,
    typer.Option("--actor", help="Only these actors (repeatable).", show_default=False),
]
TypeOpt = Annotated[
    list[str] | None,
    typer.Option("--type", help="Only these event types (repeatable).", show_default=False),
]
ResourceOpt = Annotated[
    str, typer.Option("--resource", help="e.g. dataset/customers.", show_default=False)
]
ActionOpt = Annotated[str, typer.Option("--action", help="e.g. read.", show_default=False)]
DecisionOpt = Annotated[
    DecisionChoice | None, typer.Option("--decision", help="allow or deny.", show_default=False)
]
CorrelationOpt = Annotated[
    str, typer.Option("--correlation-id", help="One request's events.", show_default=False)
]


def _filter(
    actors: list[str] | None,
    types: list[str] | None,
    resource: str,
    action: str,
    decision: DecisionChoice | None,
    correlation_id: str,
    since: str | None,
    until: str | None,
) -> Filter:
    from gantry.client.audit import Filter

    since_ms, until_ms = time_window(since, until)
    return Filter(
        actors=tuple(actors or ()),
        types=tuple(types or ()),
        resource=resource,
        action=action,
        decision=decision.value if decision else "",
        correlation_id=correlation_id,
        since_ms=since_ms,
        until_ms=until_ms,
    )


def _record_json(r: Any) -> dict[str, Any]:
    return {
        "index": r.index,
        "event_id": r.event_id,
        "time": iso_ms(r.time_ms),
        "type": r.type,
        "actor": r.actor,
        "subject": r.subject,
        "resource": r.resource,
        "action": r.action,
        "decision": r.decision,
        "correlation_id": r.correlation_id,
        "event": json.loads(r.event_json),
    }


def _decision_text(decision: str) -> str:
    return {"allow": "[green]allow[/]", "deny": "[red]deny[/]"}.get(decision, escape(decision))


@audit_app.command("query")
def audit_query(
    ctx: typer.Context,
    actor: ActorOpt = None,
    type_: TypeOpt = None,
    resource: ResourceOpt = "",
    action: ActionOpt = "",
    decision: DecisionOpt = None,
    correlation_id: CorrelationOpt = "",
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="At most N records; 0 = all.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List audit records matching the filters, oldest first."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    flt = _filter(actor, type_, resource, action, decision, correlation_id, since, until)
    page = min(limit + 1, 1000) if limit else 1000
    with audit_client(settings) as client:
        found = client.query(flt, page_size=page)
        records = list(itertools.islice(found, limit + 1) if limit else found)
    more = bool(limit) and len(records) > limit
    records = records[:limit] if limit else records
    if as_json:
        for r in records:
            print(json.dumps(_record_json(r), sort_keys=True))
    else:
        table = Table(title=f"{len(records)} audit record{'s' if len(records) != 1 else ''}")
        for col in ("#", "time (UTC)", "type", "actor", "resource", "action", "decision"):
            table.add_column(col, justify="right" if col == "#" else "left")
        table.add_column("event id", overflow="fold")
        for r in records:
            table.add_row(
                str(r.index),
                fmt_ms(r.time_ms),
                escape(r.type),
                escape(r.actor),
                escape(r.resource),
                escape(r.action),
                _decision_text(r.decision),
                escape(r.event_id),
            )
        state.out.print(table)
    if more:
        state.err.print(f"showing the first {limit}; pass --limit 0 for all")


@audit_app.command("export")
def audit_export(
    ctx: typer.Context,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="jsonl or csv.")] = (
        ExportFormat.jsonl
    ),
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write to FILE (default: stdout).", show_default=False),
    ] = None,
    actor: ActorOpt = None,
    type_: TypeOpt = None,
    resource: ResourceOpt = "",
    action: ActionOpt = "",
    decision: DecisionOpt = None,
    correlation_id: CorrelationOpt = "",
    since: SinceOpt = None,
    until: UntilOpt = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Export matching records as JSON lines or CSV."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    flt = _filter(actor, type_, resource, action, decision, correlation_id, since, until)
    with audit_client(settings) as client:
        chunks = client.export(flt, fmt=fmt.value)
        if output is None:
            sys.stdout.flush()
            sink = sys.stdout.buffer
            for chunk in chunks:
                sink.write(chunk)
            sink.flush()
            return
        records, size = _export_to_file(state, chunks, output, fmt)
    header = 1 if fmt is ExportFormat.csv else 0
    state.err.print(f"wrote {max(records - header, 0):,} records ({size:,} bytes) to {output}")


def _export_to_file(
    state: State, chunks: Iterator[bytes], output: Path, fmt: ExportFormat
) -> tuple[int, int]:
    partial = output.with_name(f".{output.name}.part")
    lines = size = 0
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[lines]:,} lines"),
        FileSizeColumn(),
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
    )
    try:
        with progress, partial.open("wb") as fh:
            task = progress.add_task(f"exporting {fmt.value} to {output}", total=None, lines=0)
            for chunk in chunks:
                fh.write(chunk)
                lines += chunk.count(b"\n")
                size += len(chunk)
                progress.update(task, completed=size, lines=lines)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return lines, size


@audit_app.command("report")
def audit_report(
    ctx: typer.Context,
    resource: Annotated[str, typer.Argument(help="e.g. dataset/customers")],
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Who accessed RESOURCE, how, how often allowed and denied, first and last time."""
    settings = command_settings(ctx, data_dir, token)
    since_ms, until_ms = time_window(since, until)
    with audit_client(settings) as client:
        report = client.access_report(resource, since_ms, until_ms)
    if as_json:
        rows = [
            {
                "actor": r.actor,
                "action": r.action,
                "allowed": r.allowed,
                "denied": r.denied,
                "first": iso_ms(r.first_ms),
                "last": iso_ms(r.last_ms),
            }
            for r in report.rows
        ]
        print(json.dumps({"resource": report.resource, "total": report.total, "rows": rows}))
        return
    state_of(ctx).out.print(access_table(report))


def access_table(report: Any) -> Table:
    """A rich table of an access report (actor, action, allowed, denied, first, last)."""
    table = Table(title=f"Access to {escape(report.resource)} — {report.total:,} accesses")
    table.add_column("actor")
    table.add_column("action")
    table.add_column("allowed", justify="right", style="green")
    table.add_column("denied", justify="right", style="red")
    table.add_column("first (UTC)")
    table.add_column("last (UTC)")
    for r in report.rows:
        table.add_row(
            escape(r.actor),
            escape(r.action),
            f"{r.allowed:,}",
            f"{r.denied:,}",
            fmt_ms(r.first_ms),
            fmt_ms(r.last_ms),
        )
    return table


# Registered last so that ``gantry audit --help`` lists query, export, report, verify, proof,
# anomalies.
audit_app.command("verify")(audit_verify)
audit_app.command("proof")(audit_proof)
audit_app.add_typer(anomalies_app, name="anomalies")
audit_app.add_typer(subject_app, name="subject")
audit_app.add_typer(reports_app, name="reports")
register_retention(audit_app)
