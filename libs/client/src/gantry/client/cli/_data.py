"""``gantry data``: create datasets, upload and commit versions, browse and roll back history.

Reading, downloading and governing access (``read``, ``download``, ``grant``, ``lineage``,
``policy``) live in :mod:`gantry.client.cli._data_access` and are registered on
:data:`data_app` below, after the commands that change a dataset; data-subject requests
(``subject find | erase | erasures``) in :mod:`gantry.client.cli._data_subjects`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.filesize import decimal
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
from gantry.client.cli._data_access import data_download, data_read, policy_app
from gantry.client.cli._data_grants import data_grant, data_grants, data_lineage, data_revoke
from gantry.client.cli._data_subjects import subject_app
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.governance import Diff, GovernanceClient, Shard, UploadResult, Version
    from gantry.client.specs import ColumnSpec

data_app = typer.Typer(
    help="Datasets: versions, de-identified views, grants and lineage.", no_args_is_help=True
)

NameArg = Annotated[str, typer.Argument(help="Dataset name.", show_default=False)]
MessageOpt = Annotated[
    str, typer.Option("--message", "-m", help="What changed and why.", show_default=False)
]


def short(version_id: str) -> str:
    """A version id as tables show it: its first 12 characters."""
    return version_id[:12]


# ---------------------------------------------------------------------- datasets


@data_app.command("create")
def data_create(
    ctx: typer.Context,
    name: NameArg,
    schema: Annotated[
        Path | None,
        typer.Option(
            "--schema",
            help="YAML file: columns: [{name, type, class, nullable}].",
            show_default=False,
        ),
    ] = None,
    column: Annotated[
        list[str] | None,
        typer.Option(
            "--column",
            "-c",
            help="name:type:class[:required], e.g. email:string:pii (repeatable).",
            show_default=False,
        ),
    ] = None,
    files: Annotated[
        bool, typer.Option("--files", help="A dataset of files (images, documents) not rows.")
    ] = False,
    files_class: Annotated[
        str,
        typer.Option(
            "--class",
            help="With --files: the classification of the files (default: internal).",
            show_default=False,
        ),
    ] = "",
    description: Annotated[str, typer.Option("--description", help="What it holds.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create an empty dataset: a table with classified columns, or a set of files."""
    from gantry.client.specs import ColumnSpec, load_schema

    settings = command_settings(ctx, data_dir, token)
    columns: list[ColumnSpec] = load_schema(schema) if schema is not None else []
    columns += [ColumnSpec.parse(text) for text in column or ()]
    if files and columns:
        raise InvalidInput(
            "a files dataset has no columns: drop --schema/--column or --files",
            hint="classify the files with --class, e.g. --files --class sensitive",
        )
    if files_class and not files:
        raise InvalidInput("--class classifies the files of a --files dataset")
    if not files and not columns:
        raise InvalidInput(
            f"table dataset {name!r} needs columns",
            hint="give --schema schema.yaml or --column name:type:class (e.g. email:string:pii), "
            "or --files for a dataset of files",
        )
    with governance_client(settings) as client:
        dataset = client.create_dataset(
            name,
            format="files" if files else "table",
            columns=columns,
            files_classification=files_class,
            description=description,
        )
    what = (
        f"files, {dataset.columns[0].classification if dataset.columns else 'internal'}"
        if files
        else f"table, {len(dataset.columns)} columns"
    )
    state_of(ctx).out.print(f"created dataset {dataset.name} ({what})", markup=False)


@data_app.command("list")
def data_list(ctx: typer.Context, data_dir: DataDirOpt = None, token: TokenOpt = None) -> None:
    """List the datasets you may see."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        datasets = client.list_datasets()
    table = Table(title=f"{len(datasets)} dataset{'' if len(datasets) == 1 else 's'}")
    for col in ("name", "format", "owner", "versions", "head", "created (UTC)", "description"):
        table.add_column(col, justify="right" if col == "versions" else "left")
    for d in datasets:
        table.add_row(
            escape(d.name),
            d.format,
            escape(d.owner),
            f"{d.versions:,}",
            short(d.head),
            fmt_ms(d.created_ms),
            escape(d.description),
        )
    state_of(ctx).out.print(table)


@data_app.command("show")
def data_show(
    ctx: typer.Context, name: NameArg, data_dir: DataDirOpt = None, token: TokenOpt = None
) -> None:
    """Show a dataset: owner, head version and its columns with their classes."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        d = client.get_dataset(name)
    out = state_of(ctx).out
    out.print(f"dataset {d.name} ({d.format}) owned by {d.owner}", markup=False)
    if d.description:
        out.print(d.description, markup=False)
    head = d.head or "(none yet)"
    out.print(
        f"{d.versions:,} versions, head {head}, view policy v{d.policy_version}", markup=False
    )
    if d.columns:
        out.print(columns_table(d.columns))


def columns_table(columns: tuple[ColumnSpec, ...]) -> Table:
    """Columns as a table: name, type, class, nullable."""
    table = Table()
    for col in ("column", "type", "class", "nullable"):
        table.add_column(col)
    for c in columns:
        klass = (
            f"[red]{c.classification}[/]"
            if c.classification in ("pii", "sensitive")
            else (c.classification)
        )
        table.add_row(escape(c.name), c.type, klass, "yes" if c.nullable else "no")
    return table


# ---------------------------------------------------------------------- upload and commit


@data_app.command("upload")
def data_upload(
    ctx: typer.Context,
    name: NameArg,
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="CSV/Parquet files for a table; files or directories for a files dataset.",
            show_default=False,
        ),
    ],
    shard_mb: Annotated[
        int, typer.Option("--shard-mb", min=0, help="Shard size in MB; 0 = the service default.")
    ] = 0,
    commit: Annotated[
        bool, typer.Option("--commit", help="Commit the upload(s) as a new version (needs -m).")
    ] = False,
    message: Annotated[
        str | None,
        typer.Option("--message", "-m", help="Commit message (with --commit).", show_default=False),
    ] = None,
    append: Annotated[
        bool, typer.Option("--append", help="With --commit: add to the head, don't replace it.")
    ] = False,
    root: Annotated[
        Path | None,
        typer.Option(
            "--root",
            help="Files datasets: store paths relative to this directory.",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Upload rows or files; print each upload id, and commit them with --commit -m MSG."""
    if commit and not (message and message.strip()):
        raise InvalidInput("--commit needs a message", hint="add -m 'what changed and why'")
    if message is not None and not commit:
        raise InvalidInput("-m is the commit message: add --commit to commit the upload")
    if append and not commit:
        raise InvalidInput("--append applies to the commit: add --commit -m MSG")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with governance_client(settings) as client:
        dataset = client.get_dataset(name)
        if dataset.format == "files":
            results = [_upload_files(state, client, name, paths, root)]
        else:
            if root is not None:
                raise InvalidInput("--root is for files datasets; this one is a table")
            results = [_upload_table(state, client, name, p, shard_mb) for p in paths]
        if commit:
            version = client.commit(
                name, [r.upload_id for r in results], message or "", append=append
            )
            print_committed(state, version)


def _upload_table(
    state: State, client: GovernanceClient, name: str, path: Path, shard_mb: int
) -> UploadResult:
    size = path.stat().st_size if path.is_file() else None
    with transfer_progress(state, f"uploading {path.name}", size) as advance:
        result = client.upload_table(name, path, shard_bytes=shard_mb * 1_000_000, progress=advance)
    state.out.print(
        f"uploaded {path}: {result.rows:,} rows in {result.shards} shard"
        f"{'' if result.shards == 1 else 's'} ({decimal(result.bytes)}), "
        f"upload id {result.upload_id}",
        markup=False,
    )
    if result.rows_erased:
        state.out.print(
            f"  {result.rows_erased:,} rows dropped: they hold data subjects erased from {name}",
            markup=False,
        )
    return result


def _upload_files(
    state: State, client: GovernanceClient, name: str, paths: list[Path], root: Path | None
) -> UploadResult:
    from gantry.client.governance import collect_files

    files = collect_files(paths, root=root)
    total = sum(p.stat().st_size for _, p in files)
    with transfer_progress(state, f"uploading {len(files):,} files", total) as advance:
        result = client.upload_files(name, paths, root=root, progress=advance)
    state.out.print(
        f"uploaded {result.files:,} files ({decimal(result.bytes)}), upload id {result.upload_id}",
        markup=False,
    )
    return result


def print_committed(state: State, version: Version) -> None:
    """One line about a new version: its full id, and its rows (or files) and size."""
    files = sum(1 for s in version.shards if s.path)
    content = (
        f"{files:,} files" if files else f"{version.rows:,} rows in {len(version.shards)} shards"
    )
    state.out.print(
        f"committed version {version.id} to {version.dataset}: {content} "
        f"({decimal(version.bytes)})",
        markup=False,
    )


@data_app.command("commit")
def data_commit(
    ctx: typer.Context,
    name: NameArg,
    upload_ids: Annotated[
        list[str], typer.Argument(help="Upload ids printed by 'gantry data upload'.")
    ],
    message: MessageOpt,
    parent: Annotated[
        str,
        typer.Option("--parent", help="The head you expect; refused if another commit landed."),
    ] = "",
    append: Annotated[
        bool, typer.Option("--append", help="Add to the head's content instead of replacing it.")
    ] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Commit uploads as a new version of the dataset."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        version = client.commit(name, upload_ids, message, parent=parent, append=append)
    print_committed(state_of(ctx), version)


# ---------------------------------------------------------------------- history


@data_app.command("log")
def data_log(
    ctx: typer.Context,
    name: NameArg,
    limit: Annotated[int, typer.Option("--limit", min=0, help="At most N versions; 0 = all.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, for scripts.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """The dataset's versions, newest first."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        versions = client.log(name, limit)
    if as_json:
        keys = ("id", "parents", "author", "created_ms", "rows", "bytes", "message", "rollback_of")
        print(json.dumps([{k: getattr(v, k) for k in keys} for v in versions], default=list))
        return
    table = Table(
        title=f"{escape(name)}: {len(versions)} version{'' if len(versions) == 1 else 's'}"
    )
    for col in ("version", "time (UTC)", "author", "rows", "message", "note"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for v in versions:
        note = f"rollback of {short(v.rollback_of)}" if v.rollback_of else ""
        table.add_row(
            short(v.id),
            fmt_ms(v.created_ms),
            escape(v.author),
            f"{v.rows:,}",
            escape(v.message),
            note,
        )
    state_of(ctx).out.print(table)


@data_app.command("diff")
def data_diff(
    ctx: typer.Context,
    name: NameArg,
    a: Annotated[str, typer.Argument(help="The older version (id or prefix).")],
    b: Annotated[str, typer.Argument(help="The newer version (id or prefix).")],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """What changed from version A to version B: rows, shards, schema."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        diff = client.diff(name, a, b)
    print_diff(state_of(ctx), name, diff)


def print_diff(state: State, name: str, diff: Diff) -> None:
    """A diff as a summary line, schema changes, and the shards added and removed."""
    out = state.out
    out.print(f"{name}: {short(diff.from_version)} → {short(diff.to_version)}", markup=False)
    out.print(
        f"rows: +{diff.rows_added:,} -{diff.rows_removed:,}; "
        f"shards: +{len(diff.added)} -{len(diff.removed)}",
        markup=False,
    )
    for change in diff.schema_changes:
        out.print(f"schema: {change}", markup=False)
    if diff.added or diff.removed:
        out.print(_shards_table([("+", s) for s in diff.added] + [("-", s) for s in diff.removed]))


def _shards_table(rows: list[tuple[str, Shard]]) -> Table:
    table = Table()
    for col in ("", "shard", "rows", "bytes", "path"):
        table.add_column(col, justify="right" if col in ("rows", "bytes") else "left")
    for sign, s in rows:
        color = "green" if sign == "+" else "red"
        table.add_row(
            f"[{color}]{sign}[/]", short(s.id), f"{s.rows:,}", f"{s.bytes:,}", escape(s.path)
        )
    return table


@data_app.command("rollback")
def data_rollback(
    ctx: typer.Context,
    name: NameArg,
    version: Annotated[str, typer.Argument(help="The version to restore (id or prefix).")],
    message: MessageOpt,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Make a new head version with the content of VERSION (history is kept)."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        restored = client.rollback(name, version, message)
    state_of(ctx).out.print(
        f"version {restored.id} of {name} restores {restored.rollback_of or version} "
        f"({restored.rows:,} rows)",
        markup=False,
    )


# Registered last so that ``gantry data --help`` lists the commands in this order.
data_app.command("read")(data_read)
data_app.command("download")(data_download)
data_app.command("grant")(data_grant)
data_app.command("grants")(data_grants)
data_app.command("revoke")(data_revoke)
data_app.command("lineage")(data_lineage)
data_app.add_typer(policy_app, name="policy")
data_app.add_typer(subject_app, name="subject")
