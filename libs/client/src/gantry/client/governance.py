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
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from gantry.client._connection import GovernanceConnection, Progress
from gantry.client._files import CHUNK_BYTES, PartFile, collect_files, read_chunks, safe_target
from gantry.client._records import (
    Dataset,
    Diff,
    Grant,
    LineageEdge,
    Shard,
    ShardList,
    UploadResult,
    Version,
    ViewPolicy,
)
from gantry.client._subject_records import Erasure, SubjectFindings, SubjectLink, SubjectVersion
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
        files_classification: str = "",
        description: str = "",
    ) -> Dataset:
        """Create an empty dataset: a table with ``columns``, or files of one classification.

        A files dataset's ``files_classification`` (default: the service's, ``internal``)
        decides its de-identified view: files cannot be de-identified, so pii and sensitive
        files can only be read raw. The service reports it as the single column ``content``.
        """
        if format not in FORMATS:
            raise InvalidInput(f"unknown format {format!r}", hint="use 'table' or 'files'")
        if format == "table":
            if not columns:
                raise InvalidInput(
                    f"table dataset {name!r} needs columns",
                    hint="declare them, e.g. ColumnSpec('email', 'string', 'pii')",
                )
            if files_classification:
                raise InvalidInput("files_classification is for files datasets")
        else:
            if columns:
                raise InvalidInput(
                    f"files dataset {name!r} takes no columns",
                    hint="give the classification of its files as files_classification",
                )
            if files_classification:
                columns = [ColumnSpec("content", "binary", files_classification)]
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
        job_id: str = "",
    ) -> UploadResult:
        """Upload rows from a .csv / .parquet file or a pyarrow Table as one Arrow IPC stream.

        Columns are parsed or cast to the dataset's declared types first (see
        :func:`gantry.client.tables.open_table_file`). ``shard_bytes`` asks the service for
        shards of about that size (0: its default). ``progress`` receives file bytes read for
        a file, Arrow stream bytes sent for a Table. Nothing is visible until committed.
        ``job_id``: a service (a node agent) uploads a job's ``spec.output`` for the job's
        owner (see :meth:`commit`).
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
            start = pb.UploadStart(
                dataset=dataset, source_format="arrow", shard_bytes=shard_bytes, job_id=job_id
            )
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
        job_id: str = "",
    ) -> Version:
        """Make uploads a new version.

        It replaces the parent's content, or adds to it with ``append``. ``parent`` is the head
        you expect (the commit is refused if another one landed first); "" means the current.
        ``job_id``: a service (a node agent) commits only a job's ``spec.output``, for a job
        the scheduler placed whose owner may update the dataset; the version's author is the
        owner, its message names the job, and lineage links the job's inputs to it.
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
            job_id=job_id,
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

        The service may send a large shard in several messages; they are joined, so memory
        holds one shard. ``purpose`` is recorded in the audit log; ``grant`` is a job's grant
        token (workers read with it instead of their own rights). Stopping early cancels the
        read.
        """
        request = _read_request(dataset, version, view, shards, purpose, grant)
        shard, parts = "", list[pa.Table]()
        with contextlib.closing(self._receive_stream("Read", request)) as replies:
            for reply in replies:
                if reply.HasField("file_chunk"):
                    raise InvalidInput(
                        f"dataset {dataset!r} holds files, not a table",
                        hint="download them with download_files (gantry data download)",
                    )
                if parts and reply.shard != shard:
                    yield shard, _joined(shard, parts)
                    parts = []
                shard = reply.shard
                if reply.arrow_ipc:
                    parts.append(_decoded(reply))
        if parts:
            yield shard, _joined(shard, parts)

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
            raise IntegrityError(
                f"the shards of {dataset!r} do not share a schema: {exc}"
            ) from None

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
        request = pb.SetViewPolicyRequest(dataset=dataset, rules=[r.check().to_pb() for r in rules])
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

    def revoke_grant(self, grant_id: str, reason: str = "") -> Grant:
        """Revoke a grant now; its token opens nothing afterwards (idempotent)."""
        request = pb.RevokeGrantRequest(grant_id=grant_id, reason=reason)
        return Grant.from_pb(self._call("RevokeGrant", request))

    def list_grants(self, job_id: str = "", *, include_expired: bool = False) -> list[Grant]:
        """Grants (of one job when given), newest first; tokens are never listed."""
        request = pb.ListGrantsRequest(job_id=job_id, include_expired=include_expired)
        reply: pb.ListGrantsResponse = self._call("ListGrants", request)
        return [Grant.from_pb(g) for g in reply.grants]

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

    # ------------------------------------------------------------------ data subjects

    def find_subject(self, identifier: str) -> SubjectFindings:
        """Every dataset version holding ``identifier`` in a pii column, the jobs that read
        them and the model versions made from them, and the erasures made for the person.

        The identifier is matched as stored, surrounding whitespace aside (e-mail addresses
        are case-sensitive). Auditors (and platform admins) only.
        """
        _check_identifier(identifier)
        request = pb.FindSubjectRequest(identifier=identifier)
        return SubjectFindings.from_pb(self._call("FindSubject", request))

    def erase_subject(self, identifier: str, reason: str, dry_run: bool = False) -> Erasure:
        """Commit new versions of the datasets whose head holds ``identifier``, without those
        rows; later uploads drop them too. ``dry_run`` says what would change and changes
        nothing. Old versions stay as they are; the answer names the models to retrain."""
        _check_identifier(identifier)
        if not reason.strip():
            raise InvalidInput(
                "an erasure needs a reason", hint="say why, e.g. the request's ticket"
            )
        request = pb.EraseSubjectRequest(identifier=identifier, reason=reason, dry_run=dry_run)
        return Erasure.from_pb(self._call("EraseSubject", request))

    def erasures(self, limit: int = 0) -> list[Erasure]:
        """Erasures made, newest first; at most ``limit`` (0: the service default, 50)."""
        if limit < 0:
            raise InvalidInput(f"limit must be 0 or more, not {limit}")
        reply = self._call("ListErasures", pb.ListErasuresRequest(limit=limit))
        return [Erasure.from_pb(e) for e in reply.erasures]


class GovernanceClient(DataClient, ModelsClient):
    """The whole governance API, datasets and models, over one channel."""


# ---------------------------------------------------------------------- helpers


def _counted(
    batches: Iterator[tuple[pa.RecordBatch, int]], progress: Progress | None
) -> Iterator[pa.RecordBatch]:
    for batch, consumed in batches:
        yield batch
        if progress is not None and consumed:
            progress(consumed)


def _decoded(reply: pb.ReadResponse) -> pa.Table:
    try:
        table = decode_ipc(reply.arrow_ipc)
    except InvalidInput as exc:
        raise IntegrityError(f"shard {reply.shard}: {exc.message}") from None
    if reply.rows and table.num_rows != reply.rows:
        raise IntegrityError(
            f"shard {reply.shard}: the service announced {reply.rows} rows and sent "
            f"{table.num_rows}"
        )
    return table


def _joined(shard: str, parts: list[pa.Table]) -> pa.Table:
    if len(parts) == 1:
        return parts[0]
    try:
        return pa.concat_tables(parts)
    except pa.ArrowException as exc:
        raise IntegrityError(f"shard {shard}: its parts do not share a schema: {exc}") from None


def _check_identifier(identifier: str) -> None:
    if not identifier.strip():
        raise InvalidInput(
            "no identifier given", hint="give the person's e-mail, customer id or other pii value"
        )


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
    "Erasure",
    "GovernanceClient",
    "Grant",
    "LineageEdge",
    "ModelVersion",
    "ModelsClient",
    "Shard",
    "ShardList",
    "SubjectFindings",
    "SubjectLink",
    "SubjectVersion",
    "UploadResult",
    "Version",
    "VersionRef",
    "ViewPolicy",
    "collect_files",
    "safe_target",
]
