"""``gantry data subject find | erase | erasures``: data-subject requests (GDPR art. 15 and 17).

The identifier (an e-mail address, a customer id) is matched as stored in the datasets' pii
columns, surrounding whitespace aside. Give ``-`` to read it from standard input and keep it
out of the shell's history. Auditors (and platform admins) only.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    State,
    TokenOpt,
    command_settings,
    fmt_ms,
    governance_client,
    state_of,
)
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.governance import Erasure, SubjectFindings, SubjectVersion

subject_app = typer.Typer(
    help="Data subjects: find a person's data and where it went; erase them.",
    no_args_is_help=True,
)

IdentifierArg = Annotated[
    str,
    typer.Argument(
        help="The person's identifier as stored (e-mail, customer id); - reads it from stdin.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]


def _identifier(text: str) -> str:
    if text == "-":
        text = sys.stdin.readline()
    if not text.strip():
        raise InvalidInput(
            "no identifier given", hint="give the person's e-mail or customer id (or - for stdin)"
        )
    return text.strip()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@subject_app.command("find")
def subject_find(
    ctx: typer.Context,
    identifier: IdentifierArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Every dataset version holding the person, the jobs that read them, the models made."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        found = client.find_subject(_identifier(identifier))
    if as_json:
        print(json.dumps(found.to_json(), indent=2, sort_keys=True))
        return
    print_findings(state_of(ctx), found)


def print_findings(state: State, found: SubjectFindings) -> None:
    """Findings as a summary, then the versions, links and erasures."""
    out = state.out
    datasets = {v.dataset for v in found.versions}
    out.print(
        f"subject {found.subject_ref}: {_plural(len(found.versions), 'version')} of "
        f"{_plural(len(datasets), 'dataset')}, read by {_plural(len(found.jobs), 'job')}, "
        f"{_plural(len(found.models), 'model version')} made from them",
        markup=False,
    )
    out.print(
        f"searched: {', '.join(found.datasets_searched) or 'no dataset'}"
        + (
            f"; not searchable (files, or no pii columns): "
            f"{', '.join(found.datasets_not_searchable)}"
            if found.datasets_not_searchable
            else ""
        ),
        markup=False,
    )
    if found.versions:
        out.print(versions_table("Versions holding the subject", found.versions))
    if found.links:
        table = Table(title="Where the data went")
        for col in ("from", "", "to", "time (UTC)", "event"):
            table.add_column(col)
        for link in found.links:
            table.add_row(
                f"{link.from_kind} {escape(link.from_id)}",
                "→",
                f"{link.to_kind} {escape(link.to_id)}",
                fmt_ms(link.time_ms),
                f"{link.event_type} {link.event_id}".strip() or "—",
            )
        out.print(table)
    if found.erasures:
        out.print(erasures_table(found.erasures))


def versions_table(title: str, versions: tuple[SubjectVersion, ...]) -> Table:
    """Subject versions as a table."""
    table = Table(title=title)
    for col in ("dataset", "version", "rows", "columns", "committed (UTC)", "author", "event"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for v in versions:
        table.add_row(
            escape(v.dataset),
            (v.short_id or "(planned)") + (" (head)" if v.is_head else ""),
            f"{v.rows:,}",
            escape(", ".join(v.columns)),
            fmt_ms(v.created_ms),
            escape(v.author),
            v.event_id or "—",
        )
    return table


@subject_app.command("erase")
def subject_erase(
    ctx: typer.Context,
    identifier: IdentifierArg,
    reason: Annotated[
        str,
        typer.Option("--reason", help="Why (e.g. the request's ticket); recorded and audited."),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would change; change nothing.")
    ] = False,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Commit new versions without the person's rows; later uploads drop them too."""
    if not reason.strip():
        raise InvalidInput("an erasure needs a reason", hint="e.g. --reason 'DSR-2041'")
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        erasure = client.erase_subject(_identifier(identifier), reason, dry_run=dry_run)
    if as_json:
        print(json.dumps(erasure.to_json(), indent=2, sort_keys=True))
        return
    print_erasure(state_of(ctx), erasure)


def print_erasure(state: State, erasure: Erasure) -> None:
    """An erasure (or a dry run's plan) in words."""
    out = state.out
    verb = "would remove" if erasure.dry_run else "removed"
    head = "dry run" if erasure.dry_run else f"erasure {erasure.erasure_id}"
    out.print(
        f"{head} of subject {erasure.subject_ref}: {verb} "
        f"{_plural(sum(erasure.rows_removed), 'row')} from "
        f"{_plural(len(erasure.new_versions), 'dataset')}",
        markup=False,
    )
    for v, rows in zip(erasure.new_versions, erasure.rows_removed, strict=False):
        target = f"new version {v.version}" if v.version else "a new version"
        out.print(f"  {v.dataset}: {target} without {_plural(rows, 'row')}", markup=False)
    models = ", ".join(erasure.models_to_retrain) or "none"
    out.print(f"models to retrain: {models}", markup=False)
    if erasure.dry_run:
        out.print("nothing was changed (dry run)", markup=False)


@subject_app.command("erasures")
def subject_erasures(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="At most N erasures; 0 = the default (50).")
    ] = 0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Erasures made, newest first."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        erasures = client.erasures(limit)
    if as_json:
        print(json.dumps([e.to_json() for e in erasures], indent=2, sort_keys=True))
        return
    state_of(ctx).out.print(erasures_table(tuple(erasures)))


def erasures_table(erasures: tuple[Erasure, ...]) -> Table:
    """Erasures as a table."""
    table = Table(title=_plural(len(erasures), "erasure"))
    for col in ("erasure", "time (UTC)", "by", "reason", "versions", "rows", "retrain"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for e in erasures:
        table.add_row(
            e.erasure_id,
            fmt_ms(e.requested_ms),
            escape(e.requested_by),
            escape(e.reason),
            escape(", ".join(f"{v.dataset}@{v.short_id}" for v in e.new_versions)),
            f"{sum(e.rows_removed):,}",
            escape(", ".join(e.models_to_retrain)),
        )
    return table
