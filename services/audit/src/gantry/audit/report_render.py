"""Compliance-report renderings (domain): CSV for spreadsheets, PDF for people.

Both are views of the signed JSON report (the source of truth, see :mod:`gantry.audit.reports`)
and take it as built there: ``{"report": {...}, "digest", "key_id", "signature"}``. The CSV is
one table whose first column names the section; every section fills its own columns, in a
fixed order. The PDF shows the period, the signed tree head, the digest and signature, and a
table per section (long sections are cut at :data:`PDF_MAX_ROWS`; the JSON and CSV hold all).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import fpdf  # type: ignore[import-untyped]
import orjson
from fpdf.enums import WrapMode, XPos, YPos  # type: ignore[import-untyped]

#: Rows of one section shown in the PDF.
PDF_MAX_ROWS = 200
_CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_LATIN1_FALLBACKS = str.maketrans(  # dashes and curly quotes, common in notes
    {"\u2014": "-", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}
)

Row = dict[str, str]


@dataclass(frozen=True)
class Section:
    """One table of the report: its name, title, columns (CSV), columns shown in the PDF."""

    name: str
    title: str
    columns: tuple[str, ...]
    pdf_columns: tuple[str, ...]
    rows: list[Row]


def iso_ms(ms: int, zone: dt.tzinfo = dt.UTC) -> str:
    """A Unix-millisecond time as ISO 8601 in ``zone`` (a zero offset is written ``Z``)."""
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).astimezone(zone)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


def _versions(value: object) -> str:
    parts = []
    for v in value if isinstance(value, list) else []:
        if not isinstance(v, dict):
            continue
        text = f"v{v.get('version', '?')}"
        if v.get("weight") or v.get("role"):
            text += f" {v.get('weight', 0)}% {v.get('role', '')}".rstrip()
        parts.append(text)
    return ", ".join(parts)


_EVENT_COLS = ("time", "seq", "event_id", "actor")


def _event_rows(
    items: object, columns: Sequence[str], special: Mapping[str, Callable[[Any], str]] | None = None
) -> list[Row]:
    special = special or {}
    rows = []
    for item in items if isinstance(items, list) else []:
        row = {"time": iso_ms(int(item.get("time_ms", 0)))}
        for col in columns:
            if col == "time":
                continue
            fn = special.get(col)
            row[col] = fn(item.get(col)) if fn else _cell(item.get(col))
        rows.append(row)
    return rows


def sections(signed: Mapping[str, Any]) -> list[Section]:
    """The tables of a signed report, in the order they are rendered."""
    doc: Mapping[str, Any] = signed.get("report", {})
    head: Mapping[str, Any] = doc.get("tree_head", {})
    fig: Mapping[str, Any] = doc.get("figures", {})
    totals: Mapping[str, Any] = fig.get("totals", {})
    denials: Mapping[str, Any] = fig.get("denials", {})
    anomalies: Mapping[str, Any] = fig.get("anomalies", {})

    def kv(pairs: Sequence[tuple[str, object]]) -> list[Row]:
        return [{"field": k, "value": _cell(v)} for k, v in pairs]

    report_rows = kv(
        [
            ("report_id", doc.get("report_id")),
            ("period", doc.get("period")),
            ("timezone", doc.get("timezone", "UTC")),
            ("since", iso_ms(int(doc.get("since_ms", 0)))),
            ("until", iso_ms(int(doc.get("until_ms", 0)))),
            ("since_ms", doc.get("since_ms")),
            ("until_ms", doc.get("until_ms")),
            ("created", iso_ms(int(doc.get("created_ms", 0)))),
            ("created_by", doc.get("created_by") or "(scheduled)"),
            ("tree_size", head.get("tree_size")),
            ("root_hash", head.get("root_hash")),
            ("tree_timestamp", iso_ms(int(head.get("timestamp_ms", 0)))),
            ("tree_key_id", head.get("key_id")),
            ("tree_signature", head.get("signature")),
            ("digest", signed.get("digest")),
            ("key_id", signed.get("key_id")),
            ("signature", signed.get("signature")),
        ]
    )
    total_rows = kv(
        [
            ("events", totals.get("events", 0)),
            ("principals", totals.get("principals", 0)),
            ("purged_events", totals.get("purged_events", 0)),
            ("archived_unread", totals.get("archived_unread", 0)),
            ("malformed_events", totals.get("malformed_events", 0)),
            ("denials", denials.get("total", 0)),
            ("denials_distinct", denials.get("distinct", 0)),
            *(
                (f"anomalies_{state}", n)
                for state, n in sorted(anomalies.get("by_state", {}).items())
            ),
        ]
    )
    by_type = [
        {"event_type": t, "count": _cell(n)} for t, n in sorted(totals.get("by_type", {}).items())
    ]
    ds_cols = (
        "dataset", "reads_allowed", "reads_denied", "rows_read", "raw_reads",
        "deidentified_reads", "principals", "authz_allowed", "authz_denied", "readers",
    )  # fmt: skip
    datasets = [{c: _cell(d.get(c)) for c in ds_cols} for d in fig.get("datasets", [])]
    denial_cols = ("principal", "action", "resource", "count")
    top = [{c: _cell(d.get(c)) for c in denial_cols} for d in denials.get("top", [])]
    an_cols = (
        "time", "anomaly_id", "kind", "principal", "state", "severity", "by", "note", "reason",
    )  # fmt: skip
    an_rows = _event_rows(anomalies.get("items", []), an_cols)
    ev = _EVENT_COLS

    def section(name: str, title: str, cols: Sequence[str], pdf: Sequence[str]) -> Section:
        special = {"versions": _versions} if name == "deployments" else {}
        return Section(
            name,
            title,
            (*ev, *cols),
            ("time", *pdf),
            _event_rows(fig.get(name), (*ev, *cols), special),
        )

    return [
        Section("report", "Report", ("field", "value"), ("field", "value"), report_rows),
        Section("totals", "Totals", ("field", "value"), ("field", "value"), total_rows),
        Section("events_by_type", "Events by type", ("event_type", "count"),
                ("event_type", "count"), by_type),
        Section("datasets", "Dataset access", ds_cols, ds_cols[:-1], datasets),
        Section("denials", f"Denials (top {len(top)} of {denials.get('distinct', 0)})",
                denial_cols, denial_cols, top),
        Section("anomalies", "Anomalies and their resolution", an_cols, an_cols, an_rows),
        section("key_rotations", "Key rotations", ("data",), ("actor", "data")),
        section("deployments", "Deployments",
                ("deployment", "model", "action", "versions", "detail"),
                ("actor", "deployment", "model", "action", "versions", "detail")),
        section("erasures", "Data-subject erasures",
                ("erasure_id", "requested_by", "datasets", "rows_removed", "models_to_retrain",
                 "reason"),
                ("requested_by", "datasets", "rows_removed", "models_to_retrain", "reason")),
        section("holds", "Legal holds", ("hold_id", "name", "state", "by", "reason",
                                         "principals", "datasets"),
                ("name", "state", "by", "reason", "principals", "datasets")),
        section("retention", "Retention changes", ("event_type", "keep_days", "by"),
                ("event_type", "keep_days", "by")),
        section("purges", "Purges", ("purge_id", "by", "events", "held_back", "by_type"),
                ("by", "events", "held_back", "by_type")),
        section("archives", "Archives", ("first_seq", "end_seq", "events", "object",
                                         "tree_size"),
                ("actor", "first_seq", "end_seq", "events", "object")),
    ]  # fmt: skip


def _csv_safe(text: str) -> str:
    """Text a spreadsheet will not run as a formula (names come from events: untrusted)."""
    return "'" + text if text.startswith(_CSV_FORMULA_START) else text


def render_csv(report: Mapping[str, Any]) -> bytes:
    """The signed report as one CSV (UTF-8): a ``section`` column, then every section's
    columns in a fixed order; each row fills the columns of its own section."""
    secs = sections(report)
    header: list[str] = ["section"]
    for sec in secs:
        header.extend(c for c in sec.columns if c not in header)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for sec in secs:
        for row in sec.rows:
            writer.writerow([sec.name, *(_csv_safe(row.get(c, "")) for c in header[1:])])
    return out.getvalue().encode()


def latin1(text: str) -> str:
    """``text`` in the PDF core fonts' character set (latin-1); others become ``?``."""
    text = unicodedata.normalize("NFKC", text.translate(_LATIN1_FALLBACKS))
    return text.encode("latin-1", "replace").decode("latin-1")


def _zone(name: object) -> dt.tzinfo:
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return dt.UTC


def render_pdf(report: Mapping[str, Any]) -> bytes:
    """The signed report as a PDF (A4 landscape, core fonts)."""
    doc: Mapping[str, Any] = report.get("report", {})
    head: Mapping[str, Any] = doc.get("tree_head", {})
    zone = _zone(doc.get("timezone", "UTC"))
    pdf = fpdf.FPDF(orientation="L", format="A4")
    pdf.set_creation_date(dt.datetime.fromtimestamp(int(doc.get("created_ms", 0)) / 1000, dt.UTC))
    pdf.set_title(latin1(f"Gantry compliance report {doc.get('report_id', '')}"))
    pdf.set_author("Gantry audit service")
    pdf.set_auto_page_break(auto=True, margin=12)
    pdf.add_page()

    def line(text: str, size: float = 9, style: str = "", wrap: bool = False) -> None:
        pdf.set_font("Helvetica", style=style, size=size)
        pdf.multi_cell(
            0, size * 0.5, latin1(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT,
            wrapmode=WrapMode.CHAR if wrap else WrapMode.WORD,
        )  # fmt: skip

    line("Gantry compliance report", 18, "B")
    since, until = int(doc.get("since_ms", 0)), int(doc.get("until_ms", 0))
    line(
        f"{str(doc.get('period', '')).capitalize()} report for {iso_ms(since, zone)} to "
        f"{iso_ms(until, zone)} ({doc.get('timezone', 'UTC')}); created "
        f"{iso_ms(int(doc.get('created_ms', 0)))} by {doc.get('created_by') or 'the schedule'}",
        10,
    )
    line(f"Report id {doc.get('report_id', '')}", 9)
    pdf.ln(2)
    line("Signed tree head (the audit log the figures were read from)", 11, "B")
    line(f"Tree size: {head.get('tree_size', '')} events", wrap=True)
    line(f"Root hash (SHA-256): {head.get('root_hash', '')}", wrap=True)
    line(f"Signed at: {iso_ms(int(head.get('timestamp_ms', 0)))}", wrap=True)
    line(f"Key id: {head.get('key_id', '')}", wrap=True)
    line(f"Signature (Ed25519, base64): {head.get('signature', '')}", wrap=True)
    pdf.ln(1)
    line("Report signature", 11, "B")
    line(f"Digest (SHA-256 of the canonical JSON report): {report.get('digest', '')}", wrap=True)
    line(f"Key id: {report.get('key_id', '')}", wrap=True)
    line(f"Signature (Ed25519, base64): {report.get('signature', '')}", wrap=True)
    line(
        "The JSON file is the signed original; verify it with `gantry audit reports verify`.",
        8,
        "I",
    )
    _bar_chart(pdf, doc.get("figures", {}).get("totals", {}).get("by_type", {}))
    for sec in sections(report)[1:]:
        _table(pdf, sec)
    return bytes(pdf.output())


def _bar_chart(pdf: Any, by_type: Mapping[str, int], top: int = 10) -> None:
    """Horizontal bars of the most frequent event types."""
    items = sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    if not items:
        return
    pdf.ln(3)
    pdf.set_font("Helvetica", style="B", size=11)
    pdf.cell(0, 6, "Most frequent event types", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font("Helvetica", size=8)
    most = max(n for _, n in items) or 1
    width = pdf.epw - 90
    for name, n in items:
        y = pdf.get_y()
        pdf.cell(75, 5, latin1(name))
        pdf.set_fill_color(70, 110, 170)
        pdf.rect(pdf.l_margin + 76, y + 1, max(0.5, width * n / most), 3, style="F")
        pdf.set_xy(pdf.l_margin + 78 + width * n / most, y)
        pdf.cell(12, 5, str(n), new_x=XPos.LMARGIN, new_y=YPos.NEXT)


def _table(pdf: Any, sec: Section) -> None:
    pdf.ln(3)
    pdf.set_font("Helvetica", style="B", size=11)
    pdf.cell(0, 6, latin1(sec.title), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font("Helvetica", size=7)
    if not sec.rows:
        pdf.cell(0, 4, "None in this period.", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        return
    with pdf.table(
        text_align="LEFT", line_height=3.5, wrapmode=WrapMode.CHAR, align="LEFT"
    ) as table:
        heading = table.row()
        for col in sec.pdf_columns:
            heading.cell(latin1(col))
        for row in sec.rows[:PDF_MAX_ROWS]:
            cells = table.row()
            for col in sec.pdf_columns:
                cells.cell(latin1(row.get(col, "")))
    if len(sec.rows) > PDF_MAX_ROWS:
        pdf.cell(
            0,
            4,
            f"... and {len(sec.rows) - PDF_MAX_ROWS} more rows in the JSON and CSV report.",
            new_x=XPos.LMARGIN,
            new_y=YPos.NEXT,
        )


__all__ = ["PDF_MAX_ROWS", "Section", "iso_ms", "latin1", "render_csv", "render_pdf", "sections"]
