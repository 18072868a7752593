"""Data-subject search (domain): every version holding an identifier, and where it went.

The identifier is turned into each table dataset's keyed digest and looked up in the subject
index (:mod:`gantry.governance.subjects`): digest → shards → versions (``version_shards``) →
lineage edges to the jobs that read them and the model versions those jobs (or the versions
directly) produced. Every finding names the event that recorded it, so the audit can prove it
by that one event. Only shards the index has not seen yet (written before it existed) are read
and decrypted, once; otherwise a search is a handful of indexed queries per dataset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import sqlalchemy as sa

from gantry.governance import store as db
from gantry.governance.catalog import Catalog, DatasetRecord, now_ms
from gantry.governance.dataset_keys import DatasetKeys
from gantry.governance.deid import KeyedDigests
from gantry.governance.lineage import Edge, dataset_node, edge
from gantry.governance.schema import Column
from gantry.governance.subjects import (
    ErasureRecord,
    ShardHit,
    SubjectVersion,
    erasure_records,
    lookup,
    pii_columns,
    record_shard,
    shard_entries,
    subject_ref,
    subject_text,
    unindexed_shards,
)
from gantry.governance.tables import shard_to_table
from gantry.storage import ObjectStore

_T = TypeVar("_T")
_CHUNK = 500  # values per IN (...) list: far below every database's parameter limit


def _chunks(items: Sequence[_T]) -> Iterator[list[_T]]:
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])


def _model_key(node: str) -> tuple[str, int]:
    name, _, number = node.rpartition(":")
    return name, int(number) if number.isdigit() else 0


@dataclass(frozen=True)
class SubjectFindings:
    """What governance holds about one data subject.

    ``hits`` (per dataset, the shards holding the subject) and ``digests`` (per searched
    dataset, the subject's keyed digest) serve an erasure; they never leave the service.
    """

    subject_ref: str
    versions: tuple[SubjectVersion, ...]
    links: tuple[Edge, ...]
    jobs: tuple[str, ...]
    models: tuple[str, ...]
    datasets_searched: tuple[str, ...]
    datasets_not_searchable: tuple[str, ...]
    erasures: tuple[ErasureRecord, ...]
    searched_ms: int
    hits: Mapping[str, tuple[ShardHit, ...]] = field(default_factory=dict, repr=False)
    digests: Mapping[str, bytes] = field(default_factory=dict, repr=False)


class SubjectFinder:
    """Searches the table datasets for a data subject (``secret`` keys the subject reference)."""

    def __init__(
        self, catalog: Catalog, objects: ObjectStore, keys: DatasetKeys, *, secret: bytes
    ) -> None:
        self.catalog = catalog
        self.engine = catalog.engine
        self.objects = objects
        self.keys = keys
        self._secret = secret

    def reference(self, identifier: str) -> str:
        """The subject's keyed reference (what erasures and events carry)."""
        return subject_ref(self._secret, subject_text(identifier))

    def find(self, identifier: str) -> SubjectFindings:
        """Every version of every table dataset holding ``identifier`` in a pii column, the
        jobs and models linked to them, and the erasures already made for the subject."""
        text = subject_text(identifier)
        searched: list[tuple[DatasetRecord, list[Column]]] = []
        not_searchable: list[str] = []
        for ds in self.catalog.list_datasets():
            pii = pii_columns(ds.columns) if ds.format == "table" else []
            if pii:
                searched.append((ds, pii))
            else:
                not_searchable.append(ds.name)
        digests: dict[str, bytes] = {}
        for ds, pii in searched:
            keyed = KeyedDigests(self.keys.get(ds.name))
            digests[ds.name] = keyed.of(text.encode())
            self._index_missing(ds.name, pii, keyed)
        hits: dict[str, tuple[ShardHit, ...]] = {}
        versions: list[SubjectVersion] = []
        ref = subject_ref(self._secret, text)
        with self.engine.connect() as conn:
            for ds, _pii in searched:
                found = lookup(conn, ds.name, digests[ds.name])
                if found:
                    hits[ds.name] = tuple(found)
                    versions.extend(self._versions(conn, ds, found))
            if versions:
                made_by = {
                    v.version: e.erasure_id for e in erasure_records(conn) for v in e.new_versions
                }
                versions = [replace(v, erasure_id=made_by.get(v.version, "")) for v in versions]
            links = self._links(conn, versions)
            erasures = erasure_records(conn, subject=ref)
        jobs = sorted({e.to_id for e in links if e.to_kind == "job"})
        models = sorted({e.to_id for e in links if e.to_kind == "model_version"}, key=_model_key)
        return SubjectFindings(
            subject_ref=ref,
            versions=tuple(versions),
            links=tuple(links),
            jobs=tuple(jobs),
            models=tuple(models),
            datasets_searched=tuple(ds.name for ds, _ in searched),
            datasets_not_searchable=tuple(not_searchable),
            erasures=tuple(erasures),
            searched_ms=now_ms(),
            hits=hits,
            digests=digests,
        )

    # ------------------------------------------------------------------ the index

    def _index_missing(self, dataset: str, pii: Sequence[Column], keyed: KeyedDigests) -> None:
        """Index the dataset's shards written before the index existed (decrypts each once)."""
        with self.engine.connect() as conn:
            missing = unindexed_shards(conn, dataset)
            if not missing:
                return
            objects: dict[str, str] = {}
            vs = db.version_shards
            holders: set[str] = set()
            for part in _chunks(missing):
                holders.update(
                    str(r.version_id)
                    for r in conn.execute(
                        sa.select(vs.c.version_id).where(
                            vs.c.dataset == dataset, vs.c.shard_id.in_(part)
                        )
                    ).all()
                )
            wanted = set(missing)
            for vid in sorted(holders):
                for shard in self.catalog.manifest(conn, dataset, vid).shards:
                    if shard.id in wanted:
                        objects.setdefault(shard.id, shard.object)
                if len(objects) == len(wanted):
                    break
        for shard_id, name in objects.items():
            table = shard_to_table(self.objects.get(name))
            entries = shard_entries(table, pii, keyed)
            try:
                with self.engine.begin() as conn:
                    record_shard(conn, dataset, shard_id, entries)
            except sa.exc.IntegrityError:
                pass  # another search indexed it meanwhile

    # ------------------------------------------------------------------ versions and links

    def _versions(
        self, conn: sa.Connection, ds: DatasetRecord, found: Sequence[ShardHit]
    ) -> list[SubjectVersion]:
        by_shard = {h.shard_id: h for h in found}
        rows: dict[str, int] = {}
        columns: dict[str, set[str]] = {}
        vs = db.version_shards
        for part in _chunks(sorted(by_shard)):
            for r in conn.execute(
                sa.select(vs.c.version_id, vs.c.shard_id).where(
                    vs.c.dataset == ds.name, vs.c.shard_id.in_(part)
                )
            ).all():
                hit = by_shard[str(r.shard_id)]
                vid = str(r.version_id)
                rows[vid] = rows.get(vid, 0) + hit.rows
                columns.setdefault(vid, set()).update(hit.columns)
        v = db.versions
        out: list[SubjectVersion] = []
        for part in _chunks(sorted(rows)):
            out.extend(
                SubjectVersion(
                    dataset=ds.name,
                    version=str(r.id),
                    rows=rows[str(r.id)],
                    columns=tuple(sorted(columns[str(r.id)])),
                    created_ms=int(r.created_ms),
                    author=str(r.author),
                    event_id=str(r.event_id or ""),
                    is_head=r.id == ds.head,
                )
                for r in conn.execute(
                    sa.select(v.c.id, v.c.created_ms, v.c.author, v.c.event_id).where(
                        v.c.id.in_(part)
                    )
                ).all()
            )
        return sorted(out, key=lambda sv: (sv.created_ms, sv.version))

    @staticmethod
    def _links(conn: sa.Connection, versions: Iterable[SubjectVersion]) -> list[Edge]:
        """Edges from the versions to jobs and models, and from those jobs to models."""
        t = db.lineage
        nodes = sorted({dataset_node(v.dataset, v.version) for v in versions})
        found: list[Edge] = []
        for part in _chunks(nodes):
            found.extend(
                edge(r)
                for r in conn.execute(
                    sa.select(t).where(
                        t.c.from_kind == "dataset_version",
                        t.c.from_id.in_(part),
                        t.c.to_kind.in_(["job", "model_version"]),
                    )
                ).all()
            )
        jobs = sorted({e.to_id for e in found if e.to_kind == "job"})
        for part in _chunks(jobs):
            found.extend(
                edge(r)
                for r in conn.execute(
                    sa.select(t).where(
                        t.c.from_kind == "job",
                        t.c.from_id.in_(part),
                        t.c.to_kind == "model_version",
                    )
                ).all()
            )
        return sorted(found, key=lambda e: (e.time_ms, e.from_id, e.to_id))


__all__ = ["SubjectFinder", "SubjectFindings"]
