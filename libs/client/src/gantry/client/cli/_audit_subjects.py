"""``gantry audit subject``: data-subject reports (GDPR art. 15) — which dataset versions hold a
person's identifier, which jobs read them, which models those jobs produced — signed by the
audit service, with the audit entries that prove every link; and checking such a report offline.

Erasure (art. 17) is a change to the data, so it lives with the data: ``gantry data subject
erase``. :data:`subject_app` is registered on ``gantry audit`` in
:mod:`gantry.client.cli._audit`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    State,
    TokenOpt,
    audit_client,
    audit_trust,
    command_settings,
    fmt_ms,
    state_of,
)
from gantry.client.subject_report import SubjectReportCheck, check_subject_report
from gantry.core import InvalidInput

subject_app = typer.Typer(
    help="Data-subject reports: every version, job and model holding a person's data, proven "
    "(auditors).",
    no_args_is_help=True,
)

IdentifierArg = Annotated[
    str,
    typer.Argument(
        help="The person's identifier as stored in a pii column: an e-mail or customer id.",
        show_default=False,
    ),
]


def _say(state: State, text: str) -> None:
    state.out.print(text, markup=False, highlight=False)


def print_report(state: State, doc: dict[str, Any], check: SubjectReportCheck) -> None:
    """The report's findings as tables, then the outcome of checking it."""
    f = doc.get("findings", {})
    versions = Table(title=f"{len(f.get('versions', []))} dataset version(s) holding the subject")
    for col in ("dataset", "version", "rows", "columns", "committed (UTC)", "head", "proven"):
        versions.add_column(col)
    proofs = doc.get("proofs", {})
    for v in f.get("versions", []):
        versions.add_row(
            escape(v["dataset"]),
            escape(v["version"][:12]),
            str(v["rows"]),
            escape(", ".join(v["columns"])),
            fmt_ms(v["created_ms"]),
            "yes" if v["is_head"] else "",
            "yes" if v["event_id"] in proofs else "no",
        )
    state.out.print(versions)
    links = Table(title=f"{len(f.get('links', []))} link(s): versions → jobs → models")
    for col in ("from", "to", "recorded by", "proven"):
        links.add_column(col, overflow="fold")
    for link in f.get("links", []):
        links.add_row(
            escape(f"{link['from_kind']} {link['from_id']}"),
            escape(f"{link['to_kind']} {link['to_id']}"),
            escape(link["event_type"]),
            "yes" if link["event_id"] in proofs else "no",
        )
    state.out.print(links)
    models = f.get("models", [])
    _say(state, f"jobs: {', '.join(f.get('jobs', [])) or 'none'}")
    _say(state, f"models trained on the subject's data: {', '.join(models) or 'none'}")
    for e in f.get("erasures", []):
        _say(
            state,
            f"erased {fmt_ms(e['requested_ms'])} by {e['requested_by']} ({e['reason']}): "
            f"retrain {', '.join(e['models_to_retrain']) or 'nothing'}",
        )
    skipped = f.get("datasets_not_searchable", [])
    if skipped:
        _say(state, f"not searchable (files, or no pii column): {', '.join(skipped)}")
    if check.ok:
        _say(
            state,
            f"report verified: signature ok, {check.proven} audit event(s) proven against the "
            f"signed tree of size {check.tree_size}"
            + (f"; {len(check.unproven)} not yet in the log" if check.unproven else ""),
        )
    else:
        for problem in check.problems:
            state.err.print(f"NOT VERIFIED: {problem}", markup=False, highlight=False)


@subject_app.command("report")
def subject_report(
    ctx: typer.Context,
    identifier: IdentifierArg,
    reason: Annotated[
        str,
        typer.Option(
            "--reason",
            help="Why it is asked, e.g. the request's ticket (recorded).",
            show_default=False,
        ),
    ] = "",
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Write the signed report here (default: subject-report-<id>.json).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Find every dataset version, job and model holding IDENTIFIER; save the signed report
    and check it here against the audit service's key."""  # fmt: skip
    if not reason.strip():
        raise InvalidInput(
            "a data-subject report needs --reason",
            hint="say why it is asked, e.g. --reason 'DSAR-2041'",
        )
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with audit_client(settings) as client:
        doc = client.subject_report(identifier, reason=reason)
    check = check_subject_report(doc, audit_trust(settings))
    path = output or Path(f"subject-report-{doc['report_id'][:8]}.json")
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    if as_json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print_report(state, doc, check)
        _say(state, f"signed report written to {path}")
    if not check.ok:
        raise typer.Exit(1)


@subject_app.command("verify")
def subject_verify(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A report written by 'subject report'.")],
    data_dir: DataDirOpt = None,
) -> None:
    """Check a saved report offline: its signature, the tree head and every proof."""
    settings = command_settings(ctx, data_dir)
    state = state_of(ctx)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInput(f"no file {path}", hint="pass the report file's path") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a JSON report: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{path} is not a report (it is not a JSON object)")
    check = check_subject_report(doc, audit_trust(settings))
    print_report(state, doc, check)
    if not check.ok:
        raise typer.Exit(1)


__all__ = ["print_report", "subject_app"]
