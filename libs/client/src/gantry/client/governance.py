"""The data-governance SDK: datasets, versions, views, grants and lineage; models alongside.

::

    from gantry.client.governance import ColumnSpec, GovernanceClient

    with GovernanceClient("127.0.0.1:7032", token) as gov:
        gov.create_dataset("customers", columns=[ColumnSpec("email", "string", "pii")])
        up = gov.upload_table("customers", "customers.csv")
        v = gov.commit("customers", [up.upload_id], "first load")
        table = gov.read("customers", view="deidentified")

:class:`DataClient` holds the dataset calls and :class:`~gantry.client.model_registry.ModelsClient`
the model registry; :class:`GovernanceClient` is both over one channel. Every call returns
plain frozen dataclasses, never protocol messages, and raises Gantry's typed errors. Uploads,
reads and downloads stream: memory stays around one batch or 1 MiB chunk, whatever the size.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pyarrow as pa

from gantry.client._connection import CHUNK_BYTES, GovernanceConnection, Progress
from gantry.client._files import PartFile, read_chunks
from gantry.client.model_registry import ModelsClient, ModelVersion
from gantry.client.specs import FORMATS, VIEWS, ColumnRule, ColumnSpec, VersionRef
from gantry.client.tables import (
    arrow_type,
    conform_batch,
    declared_schema,
    decode_ipc,
    encode_arrow_stream,
    open_table_file,
    table_batches,
)
from gantry.core import IntegrityError, InvalidInput
from gantry.protos.v1 import governance_pb2 as pb

# ---------------------------------------------------------------------- records


@dataclass(frozen=True)
class Dataset:
    """A dataset: its format (table or files), columns, owner and latest version."""

    name: str
    owner: str
    format: str
    columns: tuple[ColumnSpec, ...]
    description: str
    head: str  #: the latest version id; "" before the first commit
    created_ms: int
    versions: int
    policy_version: int  #: the current view policy's version

    @classmethod
    def from_pb(cls, m: pb.Dataset) -> Dataset:
        """From the protocol message."""
        return cls(
            m.name,
            m.owner,
            m.format,
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
            m.description,
            m.head,
            m.created_ms,
            m.versions,
            m.policy_version,
        )


@dataclass(frozen=True)
class Shard:
    """A piece of a version: a run of rows, or one file (``path``). ``id`` is its sha256."""

    id: str
    rows: int
    bytes: int
    path: str = ""

    @classmethod
    def from_pb(cls, m: pb.Shard) -> Shard:
        """From the protocol message."""
        return cls(m.id, m.rows, m.bytes, m.path)


@dataclass(frozen=True)
class Version:
    """An immutable dataset version; ``id`` is the sha256 of its manifest."""

    id: str
    dataset: str
    parents: tuple[str, ...]
    message: str
    author: str
    created_ms: int
    rows: int
    bytes: int
    shards: tuple[Shard, ...]
    columns: tuple[ColumnSpec, ...]
    rollback_of: str = ""  #: set when this version restores an earlier one

    @property
    def short_id(self) -> str:
        """The first 12 characters of the id, as the CLI shows it (any unique prefix works)."""
        return self.id[:12]

    @classmethod
    def from_pb(cls, m: pb.Version) -> Version:
        """From the protocol message."""
        return cls(
            m.id,
            m.dataset,
            tuple(m.parents),
            m.message,
            m.author,
            m.created_ms,
            m.rows,
            m.bytes,
            tuple(Shard.from_pb(s) for s in m.shards),
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
            m.rollback_of,
        )


@dataclass(frozen=True)
class Diff:
    """What changed between two versions: shards and rows added and removed, schema changes."""

    from_version: str
    to_version: str
    added: tuple[Shard, ...]
    removed: tuple[Shard, ...]
    rows_added: int
    rows_removed: int
    schema_changes: tuple[str, ...]

    @classmethod
    def from_pb(cls, m: pb.DiffResponse) -> Diff:
        """From the protocol message."""
        return cls(
            m.from_version,
            m.to_version,
            tuple(Shard.from_pb(s) for s in m.added),
            tuple(Shard.from_pb(s) for s in m.removed),
            m.rows_added,
            m.rows_removed,
            tuple(m.schema_changes),
        )


@dataclass(frozen=True)
class ShardList:
    """The shards of a version and its columns as the caller's view shows them."""

    version: str
    view: str
    shards: tuple[Shard, ...]
    columns: tuple[ColumnSpec, ...]

    @classmethod
    def from_pb(cls, m: pb.ListShardsResponse) -> ShardList:
        """From the protocol message."""
        return cls(
            m.version,
            m.view,
            tuple(Shard.from_pb(s) for s in m.shards),
            tuple(ColumnSpec.from_pb(c) for c in m.columns),
        )


@dataclass(frozen=True)
class UploadResult:
    """An upload the service has stored, ready to be committed by ``upload_id``."""

    upload_id: str
    rows: int
    bytes: int
    shards: int
    files: int = 0

    @classmethod
    def from_pb(cls, m: pb.UploadResponse) -> UploadResult:
        """From the protocol message."""
        return cls(m.upload_id, m.rows, m.bytes, m.shards, m.files)


@dataclass(frozen=True)
class ViewPolicy:
    """How the de-identified view transforms a dataset's columns, and who set it when."""

    dataset: str
    version: int
    rules: tuple[ColumnRule, ...]
    author: str
    created_ms: int

    @classmethod
    def from_pb(cls, m: pb.ViewPolicy) -> ViewPolicy:
        """From the protocol message."""
        return cls(
            m.dataset,
            m.version,
            tuple(ColumnRule.from_pb(r) for r in m.rules),
            m.author,
            m.created_ms,
        )


@dataclass(frozen=True)
class Grant:
    """A job's right to read given dataset versions in one view until ``expires_ms``.

    ``token`` is a secret, returned only when the grant is issued; it is left out of ``repr``.
    """

    id: str
    token: str = field(repr=False)
    job_id: str = ""
    versions: tuple[VersionRef, ...] = ()
    view: str = ""
    expires_ms: int = 0
    issued_by: str = ""

    @classmethod
    def from_pb(cls, m: pb.Grant) -> Grant:
        """From the protocol message."""
        return cls(
            m.id,
            m.token,
            m.job_id,
            tuple(VersionRef(v.dataset, v.version) for v in m.versions),
            m.view,
            m.expires_ms,
            m.issued_by,
        )


@dataclass(frozen=True)
class LineageEdge:
    """One step of lineage: ``from`` (kind, id) fed ``to`` (kind, id) at ``time_ms``.

    Kinds are ``dataset_version`` (id ``NAME@VERSION``), ``job`` and ``model_version``.
    """

    from_kind: str
    from_id: str
    to_kind: str
    to_id: str
    time_ms: int

    @classmethod
    def from_pb(cls, m: pb.LineageEdge) -> LineageEdge:
        """From the protocol message."""
        return cls(m.from_kind, m.from_id, m.to_kind, m.to_id, m.time_ms)


# ---------------------------------------------------------------------- the client


class DataClient(GovernanceConnection):
    """Datasets on the governance service: create, upload, commit, read, govern.

    ``progress`` callbacks receive the number of bytes just processed (add them up for a
    total); they may be called from a gRPC thread.
    """

    # ------------------------------------------------------------------ datasets

    def create_dataset(
        self,
        name: str,
        *,
        format: str = "table",
        columns: Sequence[ColumnSpec] = (),
        description: str = "",
    ) -> Dataset:
        """Create an empty dataset; a table needs ``columns``, a files dataset takes none."""
        if format not in FORMATS:
            raise InvalidInput(f"unknown format {format!r}", hint="use 'table' or 'files'")
        if format == "table" and not columns:
            raise InvalidInput(
                f"table dataset {name!r} needs columns",
                hint="declare them, e.g. ColumnSpec('email', 'string', 'pii')",
            )
        if format == "files" and columns:
            raise InvalidInput(f"files dataset {name!r} takes no columns")
        for c in columns:
            c.check()
        reply = self._call(
            "CreateDataset",
            pb.CreateDatasetRequest(
                name=name,
                format=format,
                columns=[c.to_pb() for c in columns],
                description=description,
            ),
        )
        return Dataset.from_pb(reply)

    def get_dataset(self, name: str) -> Dataset:
        """One dataset."""
        return Dataset.from_pb(self._call("GetDataset", pb.GetDatasetRequest(name=name)))

    def list_datasets(self) -> list[Dataset]:
        """Every dataset the caller may see."""
        reply = self._call("ListDatasets", pb.ListDatasetsRequest())
        return [Dataset.from_pb(d) for d in reply.datasets]

    # ------------------------------------------------------------------ uploads

    def upload_table(
        self,
        dataset: str,
        source: str | Path | pa.Table,
        *,
        shard_bytes: int = 0,
        progress: Progress | None = None,
        fragment_bytes: int = CHUNK_BYTES,
    ) -> UploadResult:
        """Upload rows from a .csv / .parquet file or a pyarrow Table as one Arrow IPC stream.

        Columns are parsed or cast to the dataset's declared types first (see
        :func:`gantry.client.tables.open_table_file`). ``shard_bytes`` asks the service for
        shards of about that size (0: its default). ``progress`` receives file bytes read for
        a file, Arrow stream bytes sent for a Table. Nothing is visible until committed.
        """
        if shard_bytes < 0:
            raise InvalidInput(f"shard_bytes must be 0 or more, not {shard_bytes}")
        info = self.get_dataset(dataset)
        if info.format != "table":
            raise InvalidInput(
                f"dataset {dataset!r} holds files, not a table",
                hint="upload them with upload_files (gantry data upload NAME FILE_OR_DIR)",
            )
        sent_progress = None
        if isinstance(source, pa.Table):
            schema = declared_schema(source.schema, info.columns)
            batches: Iterator[pa.RecordBatch] = (
                conform_batch(b, schema, where="the table") for b in table_batches(source)
            )
            sent_progress = progress
        else:
            opened = open_table_file(source, columns=info.columns)
            schema = opened.schema
            batches = _counted(opened.batches(), progress)

        def messages() -> Iterator[pb.UploadRequest]:
            start = pb.UploadStart(dataset=dataset, source_format="arrow", shard_bytes=shard_bytes)
            yield pb.UploadRequest(start=start)
            for fragment in encode_arrow_stream(schema, batches, fragment_bytes):
                yield pb.UploadRequest(arrow_ipc=fragment)
                if sent_progress is not None:
                    sent_progress(len(fragment))

        return UploadResult.from_pb(self._send_stream("Upload", messages()))

    def upload_files(
        self,
        dataset: str,
        paths: str | Path | Sequence[str | Path],
        *,
        root: str | Path | None = None,
        progress: Progress | None = None,
    ) -> UploadResult:
        """Upload files (and every file under directories) to a files dataset, 1 MiB at a time.

        A file is stored under its path relative to ``root`` when given; otherwise a file
        given by itself under its name, and a file found in a directory under its path
        relative to that directory. ``progress`` receives file bytes sent.
        """
        files = collect_files(paths, root=root)
        info = self.get_dataset(dataset)
        if info.format != "files":
            raise InvalidInput(
                f"dataset {dataset!r} is a table",
                hint="upload .csv or .parquet files with upload_table (gantry data upload)",
            )

        def messages() -> Iterator[pb.UploadRequest]:
            yield pb.UploadRequest(start=pb.UploadStart(dataset=dataset, source_format="files"))
            for name, path in files:
                for chunk in read_chunks(path):
                    yield pb.UploadRequest(file_chunk=pb.FileChunk(path=name, data=chunk))
                    if progress is not None:
                        progress(len(chunk))

        return UploadResult.from_pb(self._send_stream("Upload", messages()))

    # ------------------------------------------------------------------ versions

    def commit(
        self,
        dataset: str,
        upload_ids: Sequence[str],
        message: str,
        *,
        parent: str = "",
        append: bool = False,
    ) -> Version:
        """Make uploads a new version.

        It replaces the parent's content, or adds to it with ``append``. ``parent`` is the head
        you expect (the commit is refused if another one landed first); "" means the current.
        """
        if not upload_ids:
            raise InvalidInput("nothing to commit: give at least one upload id")
        if not message.strip():
            raise InvalidInput("a commit needs a message saying what changed")
        request = pb.CommitRequest(
            dataset=dataset,
            upload_ids=list(upload_ids),
            message=message,
            parent=parent,
            append=append,
        )
        return Version.from_pb(self._call("Commit", request))

    def log(self, dataset: str, limit: int = 0) -> list[Version]:
        """The dataset's versions, newest first; at most ``limit`` (0: the service default)."""
        reply = self._call("Log", pb.LogRequest(dataset=dataset, limit=limit))
        return [Version.from_pb(v) for v in reply.versions]

    def get_version(self, dataset: str, version: str = "") -> Version:
        """A version by id or unique id prefix; the head for ""."""
        request = pb.GetVersionRequest(dataset=dataset, version=version)
        return Version.from_pb(self._call("GetVersion", request))

    def diff(self, dataset: str, a: str, b: str) -> Diff:
        """What changed from version ``a`` to version ``b``."""
        request = pb.DiffRequest(dataset=dataset, from_version=a, to_version=b)
        return Diff.from_pb(self._call("Diff", request))

    def rollback(self, dataset: str, to_version: str, message: str) -> Version:
        """A new head version with the content of ``to_version``; history is kept."""
        if not message.strip():
            raise InvalidInput("a rollback needs a message saying why")
        request = pb.RollbackRequest(dataset=dataset, to_version=to_version, message=message)
        return Version.from_pb(self._call("Rollback", request))

    # ------------------------------------------------------------------ reading

    def read_batches(
        self,
        dataset: str,
        version: str = "",
        view: str = "deidentified",
        shards: Sequence[str] = (),
        purpose: str = "",
        grant: str = "",
    ) -> Iterator[tuple[str, pa.Table]]:
        """Each shard of a table version as (shard id, rows in the view), one at a time.

        ``purpose`` is recorded in the audit log; ``grant`` is a job's grant token (workers
        read with it instead of their own rights). Stopping early cancels the read.
        """
        request = _read_request(dataset, version, view, shards, purpose, grant)
        with contextlib.closing(self._receive_stream("Read", request)) as replies:
            for reply in replies:
                if reply.HasField("file_chunk"):
                    raise InvalidInput(
                        f"dataset {dataset!r} holds files, not a table",
                        hint="download them with download_files (gantry data download)",
                    )
                if not reply.arrow_ipc:
                    continue
                try:
                    table = decode_ipc(reply.arrow_ipc)
                except InvalidInput as exc:
                    raise IntegrityError(f"shard {reply.shard}: {exc.message}") from None
                if reply.rows and table.num_rows != reply.rows:
                    raise IntegrityError(
                        f"shard {reply.shard}: the service announced {reply.rows} rows "
                        f"and sent {table.num_rows}"
                    )
                yield reply.shard, table

    def read(
        self,
        dataset: str,
        version: str = "",
        view: str = "deidentified",
        shards: Sequence[str] = (),
        purpose: str = "",
        grant: str = "",
    ) -> pa.Table:
        """A table version (or some of its shards) in one view, as one pyarrow Table.

        This holds the whole result in memory; use :meth:`read_batches` for large versions.
        """
        tables = [t for _, t in self.read_batches(dataset, version, view, shards, purpose, grant)]
        if not tables:
            listing = self.list_shards(dataset, version, grant=grant)
            schema = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in listing.columns])
            return schema.empty_table()
        try:
            return pa.concat_tables(tables, promote_options="default")
        except pa.ArrowException as exc:
            raise IntegrityError(f"the shards of {dataset!r} do not share a schema: {exc}") from None

    def download_files(
        self,
        dataset: str,
        dest_dir: str | Path,
        *,
        version: str = "",
        view: str = "deidentified",
        shards: Sequence[str] = (),
        purpose: str = "",
        grant: str = "",
        progress: Progress | None = None,
    ) -> list[Path]:
        """Download a files version into ``dest_dir`` (created if missing); the paths written.

        Each file is written beside its target and renamed when complete, so no partial
        file is left behind; a path the service sends that would land outside ``dest_dir``
        is refused with :class:`IntegrityError` before anything is written for it.
        """
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        request = _read_request(dataset, version, view, shards, purpose, grant)
        written: list[Path] = []
        current: PartFile | None = None
        try:
            with contextlib.closing(self._receive_stream("Read", request)) as replies:
                for reply in replies:
                    if not reply.HasField("file_chunk"):
                        if reply.arrow_ipc:
                            raise InvalidInput(
                                f"dataset {dataset!r} is a table",
                                hint="read it with read (gantry data read NAME --output FILE)",
                            )
                        continue
                    chunk = reply.file_chunk
                    if current is None or chunk.path != current.name:
                        if current is not None:
                            written.append(current.finish())
                        current = PartFile(safe_target(dest, chunk.path), name=chunk.path)
                    current.write(chunk.data)
                    if progress is not None:
                        progress(len(chunk.data))
            if current is not None:
                written.append(current.finish())
                current = None
        finally:
            if current is not None:
                current.discard()
        return written

    def list_shards(self, dataset: str, version: str = "", *, grant: str = "") -> ShardList:
        """The shards of a version (the head for "") and its columns as the view shows them."""
        request = pb.ListShardsRequest(dataset=dataset, version=version, grant=grant)
        return ShardList.from_pb(self._call("ListShards", request))

    # ------------------------------------------------------------------ views and grants

    def set_view_policy(self, dataset: str, rules: Sequence[ColumnRule]) -> ViewPolicy:
        """Replace the dataset's view policy with ``rules``; the new policy is returned."""
        request = pb.SetViewPolicyRequest(
            dataset=dataset, rules=[r.check().to_pb() for r in rules]
        )
        return ViewPolicy.from_pb(self._call("SetViewPolicy", request))

    def get_view_policy(self, dataset: str) -> ViewPolicy:
        """The dataset's current view policy."""
        request = pb.GetViewPolicyRequest(dataset=dataset)
        return ViewPolicy.from_pb(self._call("GetViewPolicy", request))

    def issue_grant(
        self,
        job_id: str,
        versions: Sequence[tuple[str, str]],
        view: str = "deidentified",
        ttl_s: int = 0,
    ) -> Grant:
        """Let job ``job_id`` read (dataset, version) pairs in ``view`` for ``ttl_s`` seconds.

        ``ttl_s`` 0 takes the service's default. The grant's token is returned only here.
        """
        _check_view(view)
        if not versions:
            raise InvalidInput("a grant needs at least one dataset version")
        if ttl_s < 0:
            raise InvalidInput(f"ttl_s must be 0 or more, not {ttl_s}")
        request = pb.IssueGrantRequest(
            job_id=job_id,
            versions=[pb.GrantedVersion(dataset=d, version=v) for d, v in versions],
            view=view,
            ttl_s=ttl_s,
        )
        return Grant.from_pb(self._call("IssueGrant", request))

    def lineage(
        self,
        *,
        dataset: str = "",
        version: str = "",
        job_id: str = "",
        model: str = "",
        model_version: int | str = "",
    ) -> list[LineageEdge]:
        """Lineage edges around one thing: a dataset version, a job, or a model version.

        A dataset version gives the jobs that read it and the models they made; a job the
        versions it read and the models it produced; a model version where it came from.
        """
        modes = [bool(dataset or version), bool(job_id), bool(model or str(model_version))]
        if sum(modes) != 1:
            raise InvalidInput(
                "ask about exactly one thing: a dataset version, a job or a model version"
            )
        if modes[0] and not (dataset and version):
            raise InvalidInput("lineage of a dataset needs both the dataset and the version")
        if modes[2] and not (model and str(model_version)):
            raise InvalidInput("lineage of a model needs both the model and its version")
        request = pb.LineageRequest(
            dataset=dataset,
            version=version,
            job_id=job_id,
            model=model,
            model_version=str(model_version),
        )
        return [LineageEdge.from_pb(e) for e in self._call("GetLineage", request).edges]


class GovernanceClient(DataClient, ModelsClient):
    """The whole governance API, datasets and models, over one channel."""


# ---------------------------------------------------------------------- helpers


def collect_files(
    paths: str | Path | Sequence[str | Path], *, root: str | Path | None = None
) -> list[tuple[str, Path]]:
    """(name in the dataset, local path) for each file to upload, in a stable order.

    Directories are walked (symbolic links to directories are not followed). Names use ``/``.
    Raises :class:`InvalidInput` for a missing path, a file outside ``root``, a name given
    twice, or nothing to upload.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    base = Path(os.path.abspath(root)) if root is not None else None
    found: list[tuple[str, Path]] = []
    for given in map(Path, paths):
        if given.is_dir():
            walk_base = base or Path(os.path.abspath(given))
            for dirpath, dirnames, filenames in os.walk(given):
                dirnames.sort()
                for filename in sorted(filenames):
                    path = Path(dirpath) / filename
                    if path.is_file():
                        found.append((_relative_name(path, walk_base, root), path))
        elif given.is_file():
            name = _relative_name(given, base, root) if base else given.name
            found.append((name, given))
        else:
            raise InvalidInput(f"{given}: no such file or directory")
    if not found:
        raise InvalidInput("no files to upload", hint="give files or directories that hold some")
    seen: dict[str, Path] = {}
    for name, path in found:
        if name in seen:
            raise InvalidInput(
                f"two files would be stored as {name!r}: {seen[name]} and {path}",
                hint="upload them separately, or pass a --root above both",
            )
        seen[name] = path
    return found


def _relative_name(path: Path, base: Path, root: str | Path | None) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(base).as_posix()
    except ValueError:
        raise InvalidInput(f"{path} is not under the root {root}") from None


def safe_target(dest: Path, name: str) -> Path:
    """Where the file ``name`` (a relative ``/`` path from the service) goes under ``dest``.

    Raises :class:`IntegrityError` for an absolute path, a ``..`` step, or any other path that
    would land outside ``dest``.
    """
    relative = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or relative.is_absolute()
        or any(part in ("..", "") for part in relative.parts)
    ):
        raise IntegrityError(f"refusing to write {name!r}: the path escapes {dest}")
    target = dest.joinpath(*relative.parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise IntegrityError(f"refusing to write {name!r}: the path escapes {dest}")
    return target


def _counted(
    batches: Iterator[tuple[pa.RecordBatch, int]], progress: Progress | None
) -> Iterator[pa.RecordBatch]:
    for batch, consumed in batches:
        yield batch
        if progress is not None and consumed:
            progress(consumed)


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise InvalidInput(f"unknown view {view!r}", hint="use 'raw' or 'deidentified'")


def _read_request(
    dataset: str, version: str, view: str, shards: Sequence[str], purpose: str, grant: str
) -> pb.ReadRequest:
    _check_view(view)
    return pb.ReadRequest(
        dataset=dataset,
        version=version,
        view=view,
        shards=list(shards),
        purpose=purpose,
        grant=grant,
    )


__all__ = [
    "ColumnRule",
    "ColumnSpec",
    "DataClient",
    "Dataset",
    "Diff",
    "GovernanceClient",
    "Grant",
    "LineageEdge",
    "ModelVersion",
    "ModelsClient",
    "Shard",
    "ShardList",
    "UploadResult",
    "Version",
    "VersionRef",
    "ViewPolicy",
    "collect_files",
    "safe_target",
]
