"""Datasets and their immutable versions (domain): create, commit, log, diff, rollback.

Content arrives through :mod:`gantry.governance.uploads` as encrypted shard objects; a commit
turns finished uploads into a version in ONE database transaction (the version row, its shard
index, the new head and the ``data.version.committed`` event), so a crash leaves either the
whole version or nothing. Versions are never changed or removed: a rollback commits a new
version whose content is an older one's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import AlreadyExists, Conflict, InvalidInput, NotFound
from gantry.events.catalog import VERSION_COMMITTED, DatasetCreated, VersionCommitted
from gantry.governance import store as db
from gantry.governance.changes import record
from gantry.governance.lineage import add_edge, dataset_node
from gantry.governance.manifest import Manifest, ManifestDiff, ShardEntry, diff_manifests
from gantry.governance.schema import (
    Column,
    ColumnClass,
    DatasetSchema,
    check_dataset_name,
    schema_diff,
)

FORMATS = ("table", "files")


def now_ms() -> int:
    """Wall-clock time in Unix milliseconds."""
    return time.time_ns() // 1_000_000


def columns_to_json(columns: Sequence[Column]) -> list[dict[str, Any]]:
    """Columns as JSON objects (the manifest and catalog form)."""
    return [
        {
            "name": c.name,
            "type": str(c.type),
            "classification": str(c.classification),
            "nullable": c.nullable,
        }
        for c in columns
    ]


def columns_from_json(items: Sequence[dict[str, Any]]) -> list[Column]:
    """Columns from :func:`columns_to_json`'s output."""
    return [
        Column(d["name"], d["type"], d["classification"], bool(d.get("nullable", True)))
        for d in items
    ]


@dataclass(frozen=True)
class DatasetRecord:
    """A dataset as the catalog knows it."""

    name: str
    owner: str
    format: str
    columns: tuple[Column, ...]
    files_classification: ColumnClass
    description: str
    created_ms: int
    head: str
    versions: int
    policy_version: int

    @property
    def schema(self) -> DatasetSchema:
        """The table schema; :class:`InvalidInput` for a files dataset."""
        if self.format != "table":
            raise InvalidInput(f"dataset {self.name!r} holds files, not a table")
        return DatasetSchema(self.columns)


@dataclass(frozen=True)
class VersionRecord:
    """One committed version."""

    id: str
    seq: int
    manifest: Manifest
    event_id: str = ""  #: the gantry.data.version.committed event ("" when not known here)


def _dataset(row: Any) -> DatasetRecord:
    schema = orjson.loads(row.schema_json)
    return DatasetRecord(
        name=row.name,
        owner=row.owner,
        format=row.format,
        columns=tuple(columns_from_json(schema.get("columns", []))),
        files_classification=ColumnClass(schema.get("files_classification", "internal")),
        description=row.description,
        created_ms=row.created_ms,
        head=row.head,
        versions=row.versions,
        policy_version=row.policy_version,
    )


class Catalog:
    """Datasets and versions over the catalog database."""

    def __init__(self, engine: sa.Engine, *, upload_ttl_s: int = 24 * 3600) -> None:
        self.engine = engine
        self.upload_ttl_s = upload_ttl_s

    # ------------------------------------------------------------------ datasets

    def create_dataset(
        self,
        name: str,
        fmt: str,
        columns: Sequence[Column],
        *,
        owner: str,
        description: str = "",
        correlation_id: str | None = None,
    ) -> DatasetRecord:
        """Register a dataset; its view policy starts as the default (version 1)."""
        check_dataset_name(name)
        if fmt not in FORMATS:
            raise InvalidInput(f"format {fmt!r} is not known", hint="use 'table' or 'files'")
        schema: dict[str, Any]
        if fmt == "table":
            schema = {"columns": columns_to_json(DatasetSchema(columns).columns)}
            classes = [c.classification for c in columns]
        else:
            if len(columns) > 1:
                raise InvalidInput(
                    "a files dataset takes at most one column: the classification of its files",
                    hint="e.g. --column content:binary:sensitive",
                )
            cls = columns[0].classification if columns else ColumnClass.INTERNAL
            schema = {"files_classification": str(cls)}
            classes = [cls]
        order = list(ColumnClass)
        sensitivity = max(classes, key=order.index)
        created = now_ms()
        with self.engine.begin() as conn:
            exists = conn.execute(
                sa.select(db.datasets.c.name).where(db.datasets.c.name == name)
            ).first()
            if exists:
                raise AlreadyExists(f"dataset {name!r} already exists", hint="pick another name")
            conn.execute(
                db.datasets.insert().values(
                    name=name,
                    owner=owner,
                    format=fmt,
                    schema_json=orjson.dumps(schema).decode(),
                    description=description,
                    created_ms=created,
                    head="",
                    versions=0,
                    policy_version=0,
                )
            )
            record(
                conn,
                "gantry.data.dataset.created",
                DatasetCreated(
                    dataset=name,
                    format="table" if fmt == "table" else "files",
                    owner=owner,
                    columns=schema.get("columns", []),
                    sensitivity=str(sensitivity),  # type: ignore[arg-type]
                ),
                actor=owner,
                subject=f"dataset/{name}",
                correlation_id=correlation_id,
            )
        return self.get_dataset(name)

    def get_dataset(self, name: str, conn: sa.Connection | None = None) -> DatasetRecord:
        """The dataset called ``name``; :class:`NotFound` names the known ones."""
        query = sa.select(db.datasets).where(db.datasets.c.name == name)
        if conn is None:
            with self.engine.connect() as c:
                row = c.execute(query).first()
        else:
            row = conn.execute(query).first()
        if row is None:
            raise NotFound("dataset", name, hint="list datasets with `gantry data list`")
        return _dataset(row)

    def list_datasets(self) -> list[DatasetRecord]:
        """Every dataset, by name."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(db.datasets).order_by(db.datasets.c.name)).all()
        return [_dataset(r) for r in rows]

    # ------------------------------------------------------------------ versions

    def commit(
        self,
        dataset: str,
        upload_ids: Sequence[str],
        *,
        author: str,
        message: str,
        parent: str = "",
        append: bool = False,
        correlation_id: str | None = None,
        produced_by: str = "",
        inputs: Sequence[tuple[str, str]] = (),
    ) -> VersionRecord:
        """Make the finished uploads a new version, atomically; return it.

        ``produced_by`` names the job that made the data: lineage then links each of its
        ``inputs`` (dataset, version id) to the job and the job to the new version, in the
        same transaction."""
        if not message.strip():
            raise InvalidInput(
                "a commit needs a message", hint="say what changed, e.g. -m 'add May'"
            )
        if not upload_ids:
            raise InvalidInput("nothing to commit: no upload ids given", hint="upload first")
        if len(set(upload_ids)) != len(upload_ids):
            raise InvalidInput("an upload id is given twice")
        with self.engine.begin() as conn:
            ds = self.get_dataset(dataset, conn)
            head = self._check_parent(ds, parent)
            shards: list[ShardEntry] = []
            if append and head:
                shards.extend(self._manifest(conn, dataset, head).shards)
            for upload_id in upload_ids:
                shards.extend(self._upload_shards(conn, dataset, upload_id))
            conn.execute(
                db.uploads.update()
                .where(db.uploads.c.id.in_(list(upload_ids)))
                .values(state="committed")
            )
            version = self._insert_version(
                conn, ds, shards, author=author, message=message,
                correlation_id=correlation_id,
            )  # fmt: skip
            if produced_by:
                at = now_ms()
                made_by = {"event_id": version.event_id, "event_type": VERSION_COMMITTED.type}
                for name, vid in inputs:
                    add_edge(
                        conn, "dataset_version", dataset_node(name, vid), "job", produced_by, at,
                        **made_by,
                    )  # fmt: skip
                new = dataset_node(dataset, version.id)
                add_edge(conn, "job", produced_by, "dataset_version", new, at, **made_by)
            return version

    def commit_in(
        self,
        conn: sa.Connection,
        dataset: str,
        shards: Sequence[ShardEntry],
        *,
        upload_ids: Sequence[str],
        author: str,
        message: str,
        parent: str,
        columns: list[dict[str, Any]] | None = None,
        correlation_id: str | None = None,
    ) -> VersionRecord:
        """Commit ``shards`` as the dataset's next version inside ``conn``'s transaction.

        For callers that assemble a version's content themselves (an erasure keeps most of the
        head's shards and rewrites a few): ``upload_ids`` name the finished uploads that wrote
        the new shards, which become committed; ``parent`` must still be the head. The version
        row, shard index, head and event are written exactly as :meth:`commit` writes them.
        """
        ds = self.get_dataset(dataset, conn)
        head = self._check_parent(ds, parent)
        if not head:
            raise Conflict(f"dataset {dataset!r} has no version to follow yet")
        for upload_id in upload_ids:
            self._upload_shards(conn, dataset, upload_id)  # finished and not expired
        if upload_ids:
            conn.execute(
                db.uploads.update()
                .where(db.uploads.c.id.in_(list(upload_ids)))
                .values(state="committed")
            )
        return self._insert_version(
            conn, ds, list(shards), author=author, message=message, columns=columns,
            correlation_id=correlation_id,
        )  # fmt: skip

    def manifest(self, conn: sa.Connection, dataset: str, vid: str) -> Manifest:
        """The manifest of version ``vid`` (a full id) of ``dataset``."""
        return self._manifest(conn, dataset, vid)

    def rollback(
        self,
        dataset: str,
        to_version: str,
        *,
        author: str,
        message: str = "",
        correlation_id: str | None = None,
    ) -> VersionRecord:
        """Commit a NEW version whose content is ``to_version``'s (history is kept)."""
        with self.engine.begin() as conn:
            ds = self.get_dataset(dataset, conn)
            target = self._resolve(conn, dataset, to_version)
            old = self._manifest(conn, dataset, target)
            if target == ds.head:
                raise Conflict(
                    f"version {target[:12]} is already the head of {dataset!r}",
                    hint="roll back to an earlier version (see `gantry data log`)",
                )
            return self._insert_version(
                conn,
                ds,
                list(old.shards),
                author=author,
                message=message or f"rollback to {target[:12]}",
                rollback_of=target,
                columns=old.columns,
                correlation_id=correlation_id,
            )

    def _check_parent(self, ds: DatasetRecord, parent: str) -> str:
        if parent and parent != ds.head and len(parent) < 6:
            raise InvalidInput(
                f"parent {parent!r} is too short to name a version",
                hint="give the id or at least its first 6 hex digits",
            )
        if parent and parent != ds.head and not ds.head.startswith(parent):
            raise Conflict(
                f"dataset {ds.name!r} has moved on: its head is {ds.head[:12] or '(none)'}, "
                f"not {parent[:12]}",
                hint="someone committed meanwhile; look at `gantry data log` and commit again",
            )
        return ds.head

    def _upload_shards(self, conn: sa.Connection, dataset: str, upload_id: str) -> list[ShardEntry]:
        row = conn.execute(sa.select(db.uploads).where(db.uploads.c.id == upload_id)).first()
        if row is None or row.dataset != dataset:
            raise NotFound(f"upload of dataset {dataset!r}", upload_id)
        if row.state == "complete" and row.active_ms < now_ms() - self.upload_ttl_s * 1000:
            raise Conflict(
                f"upload {upload_id} finished more than {self.upload_ttl_s} s ago and has "
                "expired (its content may already be collected)",
                hint="upload the data again and commit the new upload id promptly",
            )
        if row.state != "complete":
            state = {
                "open": "still in progress or was interrupted (never finished)",
                "committed": "already committed",
                "aborted": "was aborted",
            }.get(row.state, row.state)
            raise Conflict(
                f"upload {upload_id} {state}, so it cannot be committed",
                hint="upload the data again and commit the new upload id",
            )
        parts = conn.execute(
            sa.select(db.upload_shards)
            .where(db.upload_shards.c.upload_id == upload_id)
            .order_by(db.upload_shards.c.seq)
        ).all()
        return [ShardEntry(p.shard_id, p.rows, p.bytes, p.object_name, p.path) for p in parts]

    def _insert_version(
        self,
        conn: sa.Connection,
        ds: DatasetRecord,
        shards: list[ShardEntry],
        *,
        author: str,
        message: str,
        rollback_of: str = "",
        columns: list[dict[str, Any]] | None = None,
        correlation_id: str | None = None,
    ) -> VersionRecord:
        if ds.format == "files":
            paths = [s.path for s in shards]
            dupes = sorted({p for p in paths if paths.count(p) > 1})
            if dupes:
                raise InvalidInput(
                    f"the version would hold more than one file at {', '.join(dupes[:5])}",
                    hint="upload each path once, or commit without --append to replace",
                )
        manifest = Manifest(
            dataset=ds.name,
            format=ds.format,
            columns=columns if columns is not None else columns_to_json(ds.columns),
            shards=tuple(shards),
            parents=(ds.head,) if ds.head else (),
            message=message,
            author=author,
            created_ms=now_ms(),
            rollback_of=rollback_of,
        )
        vid = manifest.version_id
        moved = conn.execute(
            db.datasets.update()
            .where(db.datasets.c.name == ds.name, db.datasets.c.head == ds.head)
            .values(head=vid, versions=db.datasets.c.versions + 1)
        )
        if moved.rowcount != 1:
            raise Conflict(
                f"dataset {ds.name!r} changed during the commit",
                hint="commit again",
            )
        event = record(
            conn,
            VERSION_COMMITTED.type,
            VersionCommitted(
                dataset=ds.name,
                version=vid,
                parents=list(manifest.parents),
                rows=manifest.rows,
                bytes=manifest.size,
                shards=len(shards),
                message=message,
                rollback_of=rollback_of,
            ),
            actor=author,
            subject=f"dataset/{ds.name}",
            correlation_id=correlation_id,
        )
        conn.execute(
            db.versions.insert().values(
                id=vid,
                dataset=ds.name,
                seq=ds.versions + 1,
                parents_json=orjson.dumps(list(manifest.parents)).decode(),
                message=message,
                author=author,
                created_ms=manifest.created_ms,
                rows=manifest.rows,
                bytes=manifest.size,
                rollback_of=rollback_of,
                manifest=manifest.canonical(),
                event_id=event.id,
            )
        )
        unique = sorted({s.id for s in shards})
        if unique:
            conn.execute(
                db.version_shards.insert(),
                [{"version_id": vid, "shard_id": s, "dataset": ds.name} for s in unique],
            )
        return VersionRecord(vid, ds.versions + 1, manifest, event.id)

    def log(self, dataset: str, limit: int = 50) -> list[VersionRecord]:
        """The newest ``limit`` versions, newest first."""
        self.get_dataset(dataset)
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(db.versions.c.id, db.versions.c.seq, db.versions.c.manifest)
                .where(db.versions.c.dataset == dataset)
                .order_by(db.versions.c.seq.desc())
                .limit(max(1, min(limit or 50, 1000)))
            ).all()
        return [
            VersionRecord(r.id, r.seq, Manifest.parse(r.manifest, expected_id=r.id)) for r in rows
        ]

    def get_version(self, dataset: str, ref: str = "") -> VersionRecord:
        """A version by id, unique id prefix (6+ hex digits), or the head when ``ref`` is ''."""
        with self.engine.connect() as conn:
            vid = self._resolve(conn, dataset, ref)
            row = conn.execute(
                sa.select(db.versions.c.seq, db.versions.c.manifest).where(db.versions.c.id == vid)
            ).one()
        return VersionRecord(vid, row.seq, Manifest.parse(row.manifest, expected_id=vid))

    def diff(self, dataset: str, a: str, b: str) -> tuple[str, str, ManifestDiff]:
        """What changed from version ``a`` to version ``b``."""
        va, vb = self.get_version(dataset, a), self.get_version(dataset, b)
        changes: list[str] = []
        if va.manifest.columns != vb.manifest.columns and va.manifest.format == "table":
            changes = schema_diff(
                DatasetSchema(columns_from_json(va.manifest.columns)),
                DatasetSchema(columns_from_json(vb.manifest.columns)),
            )
        return va.id, vb.id, diff_manifests(va.manifest, vb.manifest, changes)

    def _resolve(self, conn: sa.Connection, dataset: str, ref: str) -> str:
        ds = self.get_dataset(dataset, conn)
        if not ref or ref in ("head", "latest"):
            if not ds.head:
                raise NotFound(
                    f"version of dataset {dataset!r}",
                    "head",
                    hint="nothing is committed yet: upload and commit first",
                )
            return ds.head
        ref = ref.lower()
        if len(ref) < 6 or any(ch not in "0123456789abcdef" for ch in ref):
            raise InvalidInput(
                f"version {ref!r} is not a version id",
                hint="give the id or at least its first 6 hex digits (see `gantry data log`)",
            )
        rows = conn.execute(
            sa.select(db.versions.c.id)
            .where(db.versions.c.dataset == dataset, db.versions.c.id.startswith(ref))
            .limit(2)
        ).all()
        if not rows:
            raise NotFound(f"version of dataset {dataset!r}", ref, hint="see `gantry data log`")
        if len(rows) > 1:
            raise InvalidInput(f"version prefix {ref!r} is ambiguous", hint="give more digits")
        return str(rows[0].id)

    def _manifest(self, conn: sa.Connection, dataset: str, vid: str) -> Manifest:
        row = conn.execute(
            sa.select(db.versions.c.manifest).where(
                db.versions.c.id == vid, db.versions.c.dataset == dataset
            )
        ).first()
        if row is None:
            raise NotFound(f"version of dataset {dataset!r}", vid)
        return Manifest.parse(row.manifest, expected_id=vid)


__all__ = [
    "FORMATS",
    "Catalog",
    "DatasetRecord",
    "VersionRecord",
    "columns_from_json",
    "columns_to_json",
    "now_ms",
]
