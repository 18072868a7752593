"""``gantry data read | download | policy``: getting at data, and governing its views.

Reads pin the version first (the head is resolved to its id before any row is read), so a
commit landing mid-read cannot mix two versions. Output files are written beside their target
and renamed when complete.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.filesize import decimal as size_text
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
    transfer_progress,
)
from gantry.core import InvalidInput

if TYPE_CHECKING:
    import pyarrow as pa

    from gantry.client.governance import GovernanceClient

NameArg = Annotated[str, typer.Argument(help="Dataset name.", show_default=False)]

#: Rows ``gantry data read`` prints as a table unless --limit says otherwise.
DEFAULT_SHOWN_ROWS = 20
OUTPUT_SUFFIXES = (".csv", ".parquet", ".pq")


class ViewChoice(enum.StrEnum):
    """Values of --view."""

    raw = "raw"
    deidentified = "deidentified"


class RowFormat(enum.StrEnum):
    """Values of --format for ``data read``."""

    table = "table"
    csv = "csv"
    json = "json"


ViewOpt = Annotated[
    ViewChoice,
    typer.Option("--view", help="raw (needs the right to see raw data) or deidentified."),
]
VersionOpt = Annotated[
    str,
    typer.Option(
        "--version", help="Version id or unique prefix; default: the head.", show_default=False
    ),
]


# ---------------------------------------------------------------------- read


def data_read(
    ctx: typer.Context,
    name: NameArg,
    version: VersionOpt = "",
    view: ViewOpt = ViewChoice.deidentified,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=0,
            help=f"At most N rows; 0 = all. Default: {DEFAULT_SHOWN_ROWS} when printing a table, "
            "else all.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write to FILE.csv or FILE.parquet.", show_default=False
        ),
    ] = None,
    fmt: Annotated[
        RowFormat, typer.Option("--format", help="How to print: table, csv or json (lines).")
    ] = RowFormat.table,
    shard: Annotated[
        list[str] | None,
        typer.Option("--shard", help="Only this shard id (repeatable).", show_default=False),
    ] = None,
    purpose: Annotated[
        str, typer.Option("--purpose", help="Why you read it (recorded in the audit log).")
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Read rows of a table version in a view: print them, or write them to a file."""
    if output is not None:
        if output.suffix.lower() not in OUTPUT_SUFFIXES:
            raise InvalidInput(
                f"can't tell the format of --output {output}",
                hint="name the file .csv, .parquet or .pq",
            )
        if fmt is not RowFormat.table:
            raise InvalidInput(
                "--format is for printing; --output takes its format from its suffix"
            )
    if limit is None:
        limit = DEFAULT_SHOWN_ROWS if output is None and fmt is RowFormat.table else 0
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with governance_client(settings) as client:
        pinned = client.get_version(name, version)
        batches = client.read_batches(name, pinned.id, view.value, shard or (), purpose)
        rows = _Limited((t for _, t in batches), limit)
        if output is not None:
            count = _write_file(rows, output, lambda: _view_schema(client, name, pinned.id))
            state.err.print(f"wrote {count:,} rows to {output}", markup=False)
        elif fmt is RowFormat.table:
            _print_table(state, rows, f"{name} @ {pinned.id[:12]}, {view.value} view")
        elif fmt is RowFormat.csv:
            _print_csv(rows)
        else:
            _print_json(rows)
    if rows.truncated:
        state.err.print(f"showing the first {limit:,} rows; pass --limit 0 for all", markup=False)


class _Limited:
    """Tables cut to ``limit`` rows in all (0: no limit); ``truncated`` once rows were left."""

    def __init__(self, tables: Iterable[pa.Table], limit: int) -> None:
        self._tables = tables
        self._limit = limit
        self.truncated = False

    def __iter__(self) -> Iterator[pa.Table]:
        left = self._limit
        for table in self._tables:
            if not self._limit:
                yield table
            elif table.num_rows == 0:
                continue
            elif left == 0 or table.num_rows > left:
                self.truncated = True
                if left:
                    yield table.slice(0, left)
                return  # stops, and so cancels, the read
            else:
                left -= table.num_rows
                yield table


def _view_schema(client: GovernanceClient, name: str, version: str) -> pa.Schema:
    import pyarrow as pa

    from gantry.client.tables import arrow_type

    columns = client.list_shards(name, version).columns
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns])


def _write_file(
    tables: Iterable[pa.Table], output: Path, empty_schema: Callable[[], pa.Schema]
) -> int:
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    partial = output.with_name(f".{output.name}.part")
    parquet = output.suffix.lower() != ".csv"
    writer: Any = None
    rows = 0
    try:
        for table in tables:
            if writer is None:
                schema = table.schema
                writer = (
                    pq.ParquetWriter(str(partial), schema)
                    if parquet
                    else pa_csv.CSVWriter(str(partial), schema)
                )
            writer.write_table(table if table.schema.equals(schema) else table.cast(schema))
            rows += table.num_rows
        if writer is None:  # no rows: still a file with the view's columns
            empty = empty_schema()
            writer = (
                pq.ParquetWriter(str(partial), empty)
                if parquet
                else pa_csv.CSVWriter(str(partial), empty)
            )
        writer.close()
        writer = None
        os.replace(partial, output)
    finally:
        if writer is not None:
            writer.close()
        partial.unlink(missing_ok=True)
    return rows


def _print_table(state: State, tables: Iterable[pa.Table], title: str) -> None:
    shown = Table(title=escape(title))
    count = 0
    for table in tables:
        if not shown.columns:
            for field in table.schema:
                shown.add_column(escape(field.name), justify="right" if _numeric(field) else "left")
        for row in table.to_pylist():
            shown.add_row(*(_cell(v) for v in row.values()))
            count += 1
    shown.caption = f"{count:,} row{'' if count == 1 else 's'}"
    state.out.print(shown)


def _numeric(field: pa.Field) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(field.type) or pa.types.is_floating(field.type))


def _cell(value: Any) -> str:
    if value is None:
        return "[dim]null[/]"
    if isinstance(value, bytes):
        return f"[dim]<{len(value):,} bytes>[/]"
    return escape(str(value))


def _print_csv(tables: Iterable[pa.Table]) -> None:
    import pyarrow.csv as pa_csv

    sys.stdout.flush()
    first = True
    for table in tables:
        buf = io.BytesIO()
        pa_csv.write_csv(table, buf, write_options=pa_csv.WriteOptions(include_header=first))
        sys.stdout.buffer.write(buf.getvalue())
        first = False
    sys.stdout.buffer.flush()


def _print_json(tables: Iterable[pa.Table]) -> None:
    for table in tables:
        for row in table.to_pylist():
            print(json.dumps(row, default=_json_value, ensure_ascii=False))


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# ---------------------------------------------------------------------- download


def data_download(
    ctx: typer.Context,
    name: NameArg,
    dest: Annotated[Path, typer.Argument(help="Directory to write the files into.")],
    version: VersionOpt = "",
    view: ViewOpt = ViewChoice.deidentified,
    purpose: Annotated[
        str, typer.Option("--purpose", help="Why you read it (recorded in the audit log).")
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download the files of a files dataset's version into DEST."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with governance_client(settings) as client:
        pinned = client.get_version(name, version)
        with transfer_progress(state, f"downloading {name}", pinned.bytes or None) as advance:
            paths = client.download_files(
                name, dest, version=pinned.id, view=view.value, purpose=purpose, progress=advance
            )
    total = sum(p.stat().st_size for p in paths)
    state.out.print(
        f"downloaded {len(paths):,} files ({size_text(total)}) of {name} @ {pinned.id[:12]} "
        f"to {dest}",
        markup=False,
    )


# ---------------------------------------------------------------------- view policy

policy_app = typer.Typer(
    help="The view policy: how the de-identified view transforms columns.", no_args_is_help=True
)


@policy_app.command("show")
def policy_show(
    ctx: typer.Context,
    name: NameArg,
    as_yaml: Annotated[
        bool, typer.Option("--yaml", help="As a policy file that 'policy set' reads back.")
    ] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show the dataset's current view policy."""
    from gantry.client.specs import dump_policy

    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        policy = client.get_view_policy(name)
    if as_yaml:
        sys.stdout.write(dump_policy(policy.rules))
        return
    title = f"View policy of {escape(name)}: version {policy.version}"
    if policy.author:
        title += f", set by {escape(policy.author)} at {fmt_ms(policy.created_ms)} UTC"
    table = Table(title=title)
    for col in ("applies to", "transform", "params"):
        table.add_column(col)
    for r in policy.rules:
        target = f"column {r.column}" if r.column else f"class {r.classification}"
        params = ", ".join(f"{k}={v}" for k, v in sorted(r.params.items()))
        table.add_row(escape(target), r.transform, escape(params))
    state_of(ctx).out.print(table)


@policy_app.command("set")
def policy_set(
    ctx: typer.Context,
    name: NameArg,
    policy_file: Annotated[
        Path, typer.Argument(help="YAML: rules: [{class: pii, transform: hash}, ...].")
    ],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Replace the dataset's view policy with the rules in POLICY_FILE."""
    from gantry.client.specs import load_policy

    rules = load_policy(policy_file)
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        policy = client.set_view_policy(name, rules)
    state_of(ctx).out.print(
        f"view policy of {name} is now version {policy.version} ({len(policy.rules)} rules)",
        markup=False,
    )
