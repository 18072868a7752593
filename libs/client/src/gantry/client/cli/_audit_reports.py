"""``gantry audit reports``: signed compliance reports (daily, weekly, monthly or any period) —
generate one now, list the stored ones, download them as PDF, CSV or JSON, and verify them
against the log they were read from. :data:`reports_app` is registered on ``gantry audit`` in
:mod:`gantry.client.cli._audit`.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
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
from gantry.core import InvalidInput

reports_app = typer.Typer(
    help="Signed compliance reports: generate, list, download, verify (auditors).",
    no_args_is_help=True,
)


class Period(enum.StrEnum):
    """Values of --period."""

    daily = "daily"
    weekly = "weekly"
    monthly = "monthly"
    custom = "custom"


class Format(enum.StrEnum):
    """Values of --format."""

    pdf = "pdf"
    csv = "csv"
    json = "json"


ReportIdArg = Annotated[str, typer.Argument(help="The report's id (as listed).")]


def report_json(r: Any) -> dict[str, Any]:
    """A stored report's record as JSON."""
    return {
        "report_id": r.report_id,
        "period": r.period,
        "since": iso_ms(r.since_ms),
        "until": iso_ms(r.until_ms),
        "created": iso_ms(r.created_ms),
        "created_by": r.created_by,
        "tree_size": r.tree_head.tree_size,
        "root_hash": r.tree_head.root_hash.hex(),
        "digest": r.digest,
        "formats": list(r.formats),
        "summary": json.loads(r.summary_json) if r.summary_json else {},
    }


@reports_app.command("generate")
def reports_generate(
    ctx: typer.Context,
    period: Annotated[
        Period,
        typer.Option(
            "--period", help="The last whole day, week or month; or custom with --since/--until."
        ),
    ] = Period.daily,
    since: SinceOpt = None,
    until: UntilOpt = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Generate, sign and store a report now (scheduled ones are made on their own)."""
    since_ms, until_ms = time_window(since, until)
    if period != Period.custom and (since_ms or until_ms):
        raise InvalidInput(
            "--since/--until go with --period custom",
            hint="drop them, or add --period custom",
        )
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with audit_client(settings) as client:
        r = client.generate_report(period.value, since_ms=since_ms, until_ms=until_ms)
    state.out.print(
        f"report {r.report_id} ({r.period}, {fmt_ms(r.since_ms)} .. {fmt_ms(r.until_ms)} UTC) "
        f"signed over the log of {r.tree_head.tree_size} events; formats "
        f"{', '.join(r.formats)}",
        markup=False,
        highlight=False,
    )


@reports_app.command("list")
def reports_list(
    ctx: typer.Context,
    period: Annotated[
        Period | None, typer.Option("--period", help="Only this period.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Stored reports, newest first."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with audit_client(settings) as client:
        found = client.reports(period=period.value if period else "", limit=limit)
    if as_json:
        for r in found:
            print(json.dumps(report_json(r), sort_keys=True))
        return
    table = Table(title=f"{len(found)} report(s)")
    for col in ("id", "period", "from (UTC)", "to (UTC)", "created (UTC)", "by", "tree size"):
        table.add_column(col, overflow="fold")
    for r in found:
        table.add_row(
            escape(r.report_id),
            escape(r.period),
            fmt_ms(r.since_ms),
            fmt_ms(r.until_ms),
            fmt_ms(r.created_ms),
            escape(r.created_by or "(schedule)"),
            f"{r.tree_head.tree_size:,}",
        )
    state.out.print(table)


@reports_app.command("download")
def reports_download(
    ctx: typer.Context,
    report_id: ReportIdArg,
    fmt: Annotated[Format, typer.Option("--format", help="pdf, csv or json.")] = Format.pdf,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Where to write it (default: report-<id>.<format>)."),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download a stored report (decrypted by the service for auditors only)."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with audit_client(settings) as client:
        data = client.download_report(report_id, fmt.value)
    path = output or Path(f"report-{report_id[:8]}.{fmt.value}")
    path.write_bytes(data)
    state.out.print(f"wrote {path} ({len(data):,} bytes)", markup=False, highlight=False)


@reports_app.command("verify")
def reports_verify(
    ctx: typer.Context,
    report_id: Annotated[
        str, typer.Argument(help="A stored report's id (or use --file).", show_default=False)
    ] = "",
    file: Annotated[
        Path | None,
        typer.Option("--file", help="A downloaded report's JSON.", show_default=False),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check a report's signatures, that its tree head is part of today's log, and that its
    figures are what the log's first tree-size events give."""
    if bool(report_id) == (file is not None):
        raise InvalidInput("give a report id or --file, not both or neither")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    raw = b""
    if file is not None:
        try:
            raw = file.read_bytes()
        except FileNotFoundError:
            raise InvalidInput(f"no file {file}", hint="pass a report downloaded as JSON") from None
    with audit_client(settings) as client:
        result = client.verify_report(report_id=report_id, report_json=raw)
    marks = {True: "ok", False: "FAILED"}
    state.out.print(
        f"signatures {marks[result.signature_ok]}, tree head of size "
        f"{result.tree_head.tree_size} {'consistent with' if result.consistent else 'NOT part of'}"
        f" today's log, figures {'match' if result.figures_match else 'DIFFER'}",
        markup=False,
        highlight=False,
    )
    for problem in result.problems:
        state.err.print(problem, markup=False, highlight=False)
    if not result.ok:
        raise typer.Exit(1)
    state.out.print("report verified", markup=False, highlight=False)


__all__ = ["report_json", "reports_app"]
