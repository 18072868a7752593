"""Uploads (domain): stream rows or files in, shard them, encrypt every shard into the store.

An upload is a staging area: it becomes visible only when a commit names it, and only if it
finished (the client sent its end marker). Each shard is recorded in the database *before* its
object is written, so garbage collection never mistakes a shard being uploaded for garbage; an
upload that never finishes stays ``open`` and is collected after ``upload_ttl_s``.

A table shard's pii values are entered in the subject index in the transaction that finishes
its slot, and rows holding a subject erased from the dataset are dropped (and counted) before
they reach a shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa

from gantry.core import Conflict, InvalidInput, new_id
from gantry.governance import store as db
from gantry.governance.catalog import Catalog, DatasetRecord, now_ms
from gantry.governance.dataset_keys import DatasetKeys
from gantry.governance.deid import KeyedDigests
from gantry.governance.manifest import ShardEntry
from gantry.governance.schema import Column
from gantry.governance.subjects import (
    IndexEntry,
    erased_digests,
    matching_rows,
    pii_columns,
    record_shard,
    shard_entries,
)
from gantry.governance.tables import ArrowStreamDecoder, Shard, ShardWriter
from gantry.storage import ObjectStore, ObjectWriter

_MAX_PATH = 1024


def check_file_path(path: str) -> str:
    """A file's path inside a dataset: relative, '/'-separated, no '..' or empty segments."""
    bad = (
        not path
        or len(path) > _MAX_PATH
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or any(seg in ("", ".", "..") for seg in path.split("/"))
    )
    if bad:
        raise InvalidInput(
            f"file path {path!r} is not allowed",
            hint="use a relative path like images/0001.png: no leading '/', no '..', no '\\', "
            f"at most {_MAX_PATH} characters",
        )
    return path


def shard_object(dataset: str, upload_id: str, seq: int) -> str:
    """The object-store name of one uploaded shard or file."""
    return f"datasets/{dataset}/uploads/{upload_id}/{seq:06d}"


@dataclass
class UploadTotals:
    """What one upload holds so far."""

    upload_id: str
    rows: int = 0
    bytes: int = 0
    shards: int = 0
    files: int = 0
    rows_erased: int = 0  #: rows dropped because they hold a subject erased from the dataset


@dataclass(frozen=True)
class SubjectIndexing:
    """What a table upload needs for the subject index: the dataset's pii columns, its keyed
    digests, and the digests of the subjects erased from it."""

    pii: tuple[Column, ...]
    digests: KeyedDigests
    erased: frozenset[bytes]


class TableUpload:
    """Receives one Arrow IPC stream of rows and writes conformed, encrypted Parquet shards."""

    def __init__(
        self,
        uploads: Uploads,
        ds: DatasetRecord,
        upload_id: str,
        shard_bytes: int,
        indexing: SubjectIndexing | None = None,
    ) -> None:
        self._uploads = uploads
        self._ds = ds
        self.totals = UploadTotals(upload_id)
        self._decoder = ArrowStreamDecoder()
        self._indexing = indexing
        erased = indexing is not None and bool(indexing.erased)
        self._writer = ShardWriter(
            ds.schema, shard_bytes, row_filter=self._drop_erased if erased else None
        )

    def feed(self, fragment: bytes) -> None:
        """Take the next fragment of the Arrow stream; write shards as they fill."""
        for batch in self._decoder.feed(fragment):
            for shard in self._writer.add(batch):
                self._store(shard)

    def finish(self) -> UploadTotals:
        """The stream ended with the client's end marker: flush and mark the upload complete."""
        self._decoder.close()
        for shard in self._writer.finish():
            self._store(shard)
        self._uploads.complete(self.totals)
        return self.totals

    def write_table(self, table: pa.Table) -> list[ShardEntry]:
        """Write ``table``'s rows as shards of their own (not shared with other rows); return
        their entries, in order (none when no row is left)."""
        written = [self._store(shard) for shard in self._writer.add(table)]
        return written + [self._store(shard) for shard in self._writer.finish()]

    def _drop_erased(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        assert self._indexing is not None
        ix = self._indexing
        hit = matching_rows(batch, ix.pii, ix.digests, ix.erased)
        dropped = int(hit.sum())
        if not dropped:
            return batch
        self.totals.rows_erased += dropped
        return batch.filter(pa.array(~hit))

    def _store(self, shard: Shard) -> ShardEntry:
        index: list[IndexEntry] | None = None
        if self._indexing is not None and shard.table is not None:
            index = shard_entries(shard.table, self._indexing.pii, self._indexing.digests)
        return self._uploads.put_shard(
            self._ds.name, self.totals, shard.data, rows=shard.rows, digest=shard.digest,
            index=index,
        )  # fmt: skip


class FileUpload:
    """Receives files chunk by chunk (a new path starts a new file) and encrypts each."""

    def __init__(self, uploads: Uploads, ds: DatasetRecord, upload_id: str) -> None:
        self._uploads = uploads
        self._ds = ds
        self.totals = UploadTotals(upload_id)
        self._path = ""
        self._seen: set[str] = set()
        self._writer: ObjectWriter | None = None
        self._hash = hashlib.sha256()
        self._size = 0
        self._seq = 0

    def feed(self, path: str, data: bytes) -> None:
        """Append ``data`` to the file at ``path`` (starting it if it is a new path)."""
        if path != self._path:
            self._close_file()
            check_file_path(path)
            if path in self._seen:
                raise InvalidInput(
                    f"file {path!r} appears twice in the upload",
                    hint="send each file's chunks together, once",
                )
            self._seen.add(path)
            self._path = path
            self._seq = self._uploads.reserve(self.totals.upload_id, path)
            name = shard_object(self._ds.name, self.totals.upload_id, self._seq)
            self._writer = self._uploads.objects.writer(name, metadata={"path": path})
            self._writer.__enter__()
            self._hash = hashlib.sha256()
            self._size = 0
        assert self._writer is not None
        self._writer.write(data)
        self._hash.update(data)
        self._size += len(data)

    def _close_file(self) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        writer.__exit__(None, None, None)
        self._uploads.record_file(
            self.totals.upload_id, self._seq, self._hash.hexdigest(), self._size, self._path
        )
        self.totals.files += 1
        self.totals.shards += 1
        self.totals.rows += 1
        self.totals.bytes += self._size

    def abort(self) -> None:
        """Drop the file being written (nothing of it becomes visible)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def finish(self) -> UploadTotals:
        """The stream ended with the client's end marker."""
        self._close_file()
        if not self.totals.files:
            raise InvalidInput("the upload holds no files", hint="send at least one file")
        self._uploads.complete(self.totals)
        return self.totals


class Uploads:
    """Upload sessions over the catalog database and the encrypted object store."""

    def __init__(
        self, catalog: Catalog, objects: ObjectStore, keys: DatasetKeys | None = None
    ) -> None:
        self.catalog = catalog
        self.objects = objects
        self.engine = catalog.engine
        self.keys = keys or DatasetKeys(objects)

    def begin(
        self, dataset: str, principal: str, source_format: str, shard_bytes: int
    ) -> TableUpload | FileUpload:
        """Open an upload of ``dataset``; returns a :class:`TableUpload` or :class:`FileUpload`."""
        ds = self.catalog.get_dataset(dataset)
        want = "arrow" if ds.format == "table" else "files"
        if source_format and source_format != want:
            raise InvalidInput(
                f"dataset {dataset!r} holds {ds.format}s, so its uploads are {want!r}, "
                f"not {source_format!r}",
                hint="upload CSV/Parquet rows to table datasets and files to files datasets",
            )
        upload_id = new_id()
        pii = tuple(pii_columns(ds.columns)) if ds.format == "table" else ()
        indexing = None
        with self.engine.begin() as conn:
            if pii:
                erased = erased_digests(conn, dataset)
                indexing = SubjectIndexing(pii, KeyedDigests(self.keys.get(dataset)), erased)
            conn.execute(
                db.uploads.insert().values(
                    id=upload_id,
                    dataset=dataset,
                    principal=principal,
                    state="open",
                    created_ms=now_ms(),
                    active_ms=now_ms(),
                    rows=0,
                    bytes=0,
                )
            )
        if ds.format == "table":
            return TableUpload(self, ds, upload_id, shard_bytes, indexing)
        return FileUpload(self, ds, upload_id)

    def write_tables(
        self, dataset: str, principal: str, tables: Iterable[pa.Table], *, shard_bytes: int
    ) -> tuple[str, list[list[ShardEntry]]]:
        """Write each of ``tables`` as shards of its own in one new upload, and finish it.

        Returns the upload id (to commit) and, per table in order, the shards that hold its
        rows (none for a table left without rows). For callers that assemble a version
        themselves, e.g. an erasure replacing some shards of the head.
        """
        upload = self.begin(dataset, principal, "arrow", shard_bytes)
        if not isinstance(upload, TableUpload):
            raise InvalidInput(f"dataset {dataset!r} holds files, not a table")
        try:
            written = [upload.write_table(table) for table in tables]
        except BaseException:
            self.abort(upload.totals.upload_id)
            raise
        self.complete(upload.totals)
        return upload.totals.upload_id, written

    def reserve(self, upload_id: str, path: str = "") -> int:
        """Record the next shard slot of an upload before its object is written."""
        with self.engine.begin() as conn:
            seq = conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(db.upload_shards.c.seq), 0)).where(
                    db.upload_shards.c.upload_id == upload_id
                )
            ).scalar_one()
            ds = conn.execute(
                sa.select(db.uploads.c.dataset).where(db.uploads.c.id == upload_id)
            ).scalar_one()
            seq = int(seq) + 1
            conn.execute(
                db.uploads.update().where(db.uploads.c.id == upload_id).values(active_ms=now_ms())
            )
            conn.execute(
                db.upload_shards.insert().values(
                    upload_id=upload_id,
                    seq=seq,
                    shard_id="",
                    rows=0,
                    bytes=0,
                    object_name=shard_object(ds, upload_id, seq),
                    path=path,
                )
            )
        return seq

    def put_shard(
        self,
        dataset: str,
        totals: UploadTotals,
        data: bytes,
        *,
        rows: int,
        digest: str,
        index: Sequence[IndexEntry] | None = None,
    ) -> ShardEntry:
        """Encrypt one table shard into the store and record it in its upload; with ``index``
        (its subject-index entries), index it in the same transaction."""
        seq = self.reserve(totals.upload_id)
        name = shard_object(dataset, totals.upload_id, seq)
        self.objects.put(name, data, metadata={"digest": digest, "rows": str(rows)})
        self._finish_slot(totals.upload_id, seq, digest, rows, len(data), dataset, index)
        totals.rows += rows
        totals.bytes += len(data)
        totals.shards += 1
        return ShardEntry(digest, rows, len(data), name)

    def record_file(self, upload_id: str, seq: int, digest: str, size: int, path: str) -> None:
        """Record a finished file of an upload."""
        self._finish_slot(upload_id, seq, digest, 1, size)

    def _finish_slot(
        self,
        upload_id: str,
        seq: int,
        digest: str,
        rows: int,
        size: int,
        dataset: str = "",
        index: Sequence[IndexEntry] | None = None,
    ) -> None:
        for attempt in range(2):
            try:
                with self.engine.begin() as conn:
                    conn.execute(
                        db.upload_shards.update()
                        .where(
                            db.upload_shards.c.upload_id == upload_id,
                            db.upload_shards.c.seq == seq,
                        )
                        .values(shard_id=digest, rows=rows, bytes=size)
                    )
                    if index is not None:
                        record_shard(conn, dataset, digest, index)
                return
            except sa.exc.IntegrityError:
                # The same content was indexed by another upload at the same moment: the
                # second attempt finds it indexed.
                if attempt or index is None:
                    raise

    def complete(self, totals: UploadTotals) -> None:
        """Mark the upload finished (committable)."""
        with self.engine.begin() as conn:
            done = conn.execute(
                db.uploads.update()
                .where(db.uploads.c.id == totals.upload_id, db.uploads.c.state == "open")
                .values(state="complete", rows=totals.rows, bytes=totals.bytes, active_ms=now_ms())
            )
            if done.rowcount != 1:
                raise Conflict(f"upload {totals.upload_id} is no longer open")

    def abort(self, upload_id: str) -> None:
        """Mark the upload aborted; its objects are removed by garbage collection."""
        with self.engine.begin() as conn:
            conn.execute(
                db.uploads.update()
                .where(db.uploads.c.id == upload_id, db.uploads.c.state == "open")
                .values(state="aborted")
            )


__all__ = [
    "FileUpload",
    "TableUpload",
    "UploadTotals",
    "Uploads",
    "check_file_path",
    "shard_object",
]
