"""The subject index (domain): which table shards hold a data subject, found by keyed digest.

For every column classified ``pii``, each shard's distinct non-null values are indexed by their
keyed digest (:class:`~gantry.governance.deid.KeyedDigests`: 16 bytes of HMAC-SHA256 under the
dataset's hash key — the value the de-identified view's ``hash`` transform shows), with the pii
columns the value is in and the number of rows holding it. Values are never stored in clear,
and a digest means nothing without the dataset's key. A shard is indexed when an upload writes
it, in the transaction that records its slot; shards written before the index existed are
indexed on first search. Erased subjects' digests are kept per dataset, so later uploads drop
their rows; the erasures themselves are recorded here too (by keyed subject reference only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import sqlalchemy as sa

from gantry.core import InvalidInput
from gantry.governance import store as db
from gantry.governance.catalog import now_ms
from gantry.governance.deid import KeyedDigests
from gantry.governance.schema import Column, ColumnClass

#: The longest identifier accepted (an e-mail address is at most 254 characters).
MAX_IDENTIFIER = 1024


def subject_text(identifier: str) -> str:
    """The identifier as it is matched: surrounding whitespace stripped, nothing else changed
    (``Ann@Example.com`` and ``ann@example.com`` are different subjects, as stored)."""
    text = identifier.strip()
    if not text:
        raise InvalidInput(
            "no identifier given", hint="give the subject's e-mail, customer id or other pii value"
        )
    if len(text) > MAX_IDENTIFIER:
        raise InvalidInput(
            f"the identifier is {len(text)} characters long (at most {MAX_IDENTIFIER})",
            hint="give the value exactly as it is stored in a pii column",
        )
    return text


def subject_ref(secret: bytes, text: str) -> str:
    """A keyed, irreversible reference to the subject (32 hex digits), the same in every
    dataset: what erasures and events carry instead of the identifier."""
    return hmac.digest(secret, text.encode(), hashlib.sha256).hex()[:32]


def pii_columns(columns: Iterable[Column]) -> list[Column]:
    """The columns the index covers."""
    return [c for c in columns if c.classification == ColumnClass.PII]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One distinct pii value of a shard: its digest, the pii columns it is in, and the rows
    holding it in any of them."""

    digest: bytes
    columns: tuple[str, ...]
    rows: int


def shard_entries(
    table: pa.Table, columns: Sequence[Column], digests: KeyedDigests
) -> list[IndexEntry]:
    """The index entries of one shard's rows (``columns``: its pii columns), by digest."""
    ids: dict[bytes, int] = {}
    masks: list[tuple[np.ndarray[Any, Any], int]] = []  # per column j: its values, bit j
    row_parts: list[np.ndarray[Any, Any]] = []
    id_parts: list[np.ndarray[Any, Any]] = []
    for j, column in enumerate(columns):
        values, indices = digests.distinct(table.column(column.name), column.type)
        local = np.array([ids.setdefault(d, len(ids)) for d in values], dtype=np.int64)
        rows = np.flatnonzero(indices.is_valid().to_numpy(zero_copy_only=False))
        picked = local[indices.fill_null(0).to_numpy(zero_copy_only=False)[rows]]
        masks.append((np.unique(picked), 1 << j))
        row_parts.append(rows.astype(np.int64))
        id_parts.append(picked)
    if not ids:
        return []
    found_in = np.zeros(len(ids), dtype=np.int64)
    for present, bit in masks:
        found_in[present] |= bit
    # A row holding the value in two columns counts once.
    pairs = np.unique(np.concatenate(row_parts) * len(ids) + np.concatenate(id_parts))
    counts = np.bincount(pairs % len(ids), minlength=len(ids))
    names: dict[int, tuple[str, ...]] = {}
    for bits in np.unique(found_in).tolist():
        names[bits] = tuple(sorted(c.name for j, c in enumerate(columns) if bits >> j & 1))
    entries = [
        IndexEntry(digest, names[bits], count)
        for digest, bits, count in zip(ids, found_in.tolist(), counts.tolist(), strict=True)
    ]
    entries.sort(key=lambda e: e.digest)  # inserting in index order is several times faster
    return entries


def matching_rows(
    table: pa.Table | pa.RecordBatch,
    columns: Sequence[Column],
    digests: KeyedDigests,
    wanted: Collection[bytes],
) -> np.ndarray[Any, Any]:
    """A boolean mask of the rows whose value in any of ``columns`` has a digest in ``wanted``."""
    mask = np.zeros(table.num_rows, dtype=bool)
    for column in columns:
        values, indices = digests.distinct(table.column(column.name), column.type)
        hit = np.array([d in wanted for d in values], dtype=bool)
        if not hit.any():
            continue
        valid = indices.is_valid().to_numpy(zero_copy_only=False)
        mask |= valid & hit[indices.fill_null(0).to_numpy(zero_copy_only=False)]
    return mask


# ---------------------------------------------------------------------- the index tables


def record_shard(
    conn: sa.Connection, dataset: str, shard_id: str, entries: Sequence[IndexEntry]
) -> None:
    """Index one shard in ``conn``'s transaction; a shard indexed before (the same content
    uploaded again) is left as it is."""
    t = db.indexed_shards
    done = conn.execute(
        sa.select(t.c.shard_id).where(t.c.dataset == dataset, t.c.shard_id == shard_id)
    ).first()
    if done is not None:
        return
    conn.execute(t.insert().values(dataset=dataset, shard_id=shard_id, indexed_ms=now_ms()))
    if entries:
        _insert_many(
            conn,
            db.subject_index,
            [(dataset, shard_id, e.digest, ",".join(e.columns), e.rows) for e in entries],
        )


def _insert_many(conn: sa.Connection, table: sa.Table, rows: list[tuple[Any, ...]]) -> None:
    """``executemany`` straight to the driver, values in the table's column order.

    A shard has a row per distinct pii value (100,000s), and SQLAlchemy's per-row parameter
    handling would cost more than the inserts themselves.
    """
    prep = conn.dialect.identifier_preparer
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    names = ", ".join(prep.quote(c.name) for c in table.columns)
    marks = ", ".join([mark] * len(table.columns))
    conn.exec_driver_sql(f"INSERT INTO {prep.format_table(table)} ({names}) VALUES ({marks})", rows)


def prune_index(conn: sa.Connection, *, live_since_ms: int) -> int:
    """Forget the index of shards that no version and no live upload (open or finished and
    active since ``live_since_ms``) holds any more; return how many shards were forgotten."""
    vs, us, u, done = db.version_shards, db.upload_shards, db.uploads, db.indexed_shards
    held: set[tuple[str, str]] = set()
    held.update(
        (str(r.dataset), str(r.shard_id))
        for r in conn.execute(sa.select(vs.c.dataset, vs.c.shard_id).distinct()).all()
    )
    held.update(
        (str(r.dataset), str(r.shard_id))
        for r in conn.execute(
            sa.select(u.c.dataset, us.c.shard_id)
            .join(u, u.c.id == us.c.upload_id)
            .where(u.c.state.in_(["open", "complete"]), u.c.active_ms >= live_since_ms)
        ).all()
    )
    indexed = conn.execute(sa.select(done.c.dataset, done.c.shard_id)).all()
    dead = [(str(r.dataset), str(r.shard_id)) for r in indexed]
    dead = [key for key in dead if key not in held]
    for dataset, shard_id in dead:
        for t in (db.subject_index, done):
            conn.execute(t.delete().where(t.c.dataset == dataset, t.c.shard_id == shard_id))
    return len(dead)


def unindexed_shards(conn: sa.Connection, dataset: str) -> list[str]:
    """Shards of the dataset's versions that are not indexed yet (written before the index)."""
    vs, done = db.version_shards, db.indexed_shards
    indexed = sa.exists().where(done.c.dataset == vs.c.dataset, done.c.shard_id == vs.c.shard_id)
    rows = conn.execute(
        sa.select(vs.c.shard_id).where(vs.c.dataset == dataset, ~indexed).distinct()
    ).all()
    return [str(r.shard_id) for r in rows]


@dataclass(frozen=True, slots=True)
class ShardHit:
    """A shard holding the subject: the pii columns it is in and the rows holding it."""

    shard_id: str
    columns: tuple[str, ...]
    rows: int


def lookup(conn: sa.Connection, dataset: str, digest: bytes) -> list[ShardHit]:
    """The dataset's shards holding the value with ``digest`` (uncommitted ones included)."""
    t = db.subject_index
    rows = conn.execute(
        sa.select(t.c.shard_id, t.c.columns, t.c.rows).where(
            t.c.dataset == dataset, t.c.digest == digest
        )
    ).all()
    return [ShardHit(str(r.shard_id), tuple(str(r.columns).split(",")), int(r.rows)) for r in rows]


def erased_digests(conn: sa.Connection, dataset: str) -> frozenset[bytes]:
    """Digests of the subjects erased from the dataset: later uploads drop their rows."""
    t = db.erasure_digests
    rows = conn.execute(sa.select(t.c.digest).where(t.c.dataset == dataset)).all()
    return frozenset(bytes(r.digest) for r in rows)


# ---------------------------------------------------------------------- erasure records


@dataclass(frozen=True)
class SubjectVersion:
    """A dataset version as a subject request sees it: the rows holding the subject, the pii
    columns they were found in, and who committed it when (with the audited event)."""

    dataset: str
    version: str
    rows: int
    columns: tuple[str, ...]
    created_ms: int
    author: str
    event_id: str
    is_head: bool
    erasure_id: str = ""

    def to_json(self) -> dict[str, Any]:
        """As a JSON object (the erasure record's form)."""
        return {**dataclasses.asdict(self), "columns": list(self.columns)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SubjectVersion:
        """From :meth:`to_json`'s output."""
        return cls(
            str(d["dataset"]), str(d["version"]), int(d["rows"]), tuple(d.get("columns", ())),
            int(d["created_ms"]), str(d["author"]), str(d.get("event_id", "")),
            bool(d.get("is_head", False)), str(d.get("erasure_id", "")),
        )  # fmt: skip


@dataclass(frozen=True)
class ErasureRecord:
    """One erasure: for whom (keyed reference), by whom, why, the versions it committed (with
    the rows each removed, in the same order) and the models named for retraining."""

    erasure_id: str
    subject_ref: str
    requested_by: str
    requested_ms: int
    reason: str
    new_versions: tuple[SubjectVersion, ...] = ()
    rows_removed: tuple[int, ...] = ()
    models_to_retrain: tuple[str, ...] = ()
    event_id: str = ""

    def result_json(self) -> str:
        """What the erasure did, as the JSON kept in its row."""
        return orjson.dumps(
            {
                "new_versions": [v.to_json() for v in self.new_versions],
                "rows_removed": list(self.rows_removed),
                "models_to_retrain": list(self.models_to_retrain),
                "event_id": self.event_id,
            }
        ).decode()


def _erasure(row: Any) -> ErasureRecord:
    result = orjson.loads(row.result_json)
    return ErasureRecord(
        erasure_id=str(row.erasure_id),
        subject_ref=str(row.subject_ref),
        requested_by=str(row.requested_by),
        requested_ms=int(row.requested_ms),
        reason=str(row.reason),
        new_versions=tuple(SubjectVersion.from_json(v) for v in result.get("new_versions", [])),
        rows_removed=tuple(int(n) for n in result.get("rows_removed", [])),
        models_to_retrain=tuple(str(m) for m in result.get("models_to_retrain", [])),
        event_id=str(result.get("event_id", "")),
    )


def erasure_records(
    conn: sa.Connection, *, subject: str = "", limit: int = 0
) -> list[ErasureRecord]:
    """Erasures, newest first: those of one subject reference, or all; at most ``limit``."""
    t = db.erasures
    query = sa.select(t).order_by(t.c.requested_ms.desc(), t.c.erasure_id.desc())
    if subject:
        query = query.where(t.c.subject_ref == subject)
    if limit:
        query = query.limit(limit)
    return [_erasure(r) for r in conn.execute(query).all()]


def insert_erasure(conn: sa.Connection, erasure: ErasureRecord, digests: dict[str, bytes]) -> None:
    """Record ``erasure`` and, per dataset, the subject's digest that later uploads drop."""
    conn.execute(
        db.erasures.insert().values(
            erasure_id=erasure.erasure_id,
            subject_ref=erasure.subject_ref,
            requested_by=erasure.requested_by,
            requested_ms=erasure.requested_ms,
            reason=erasure.reason,
            result_json=erasure.result_json(),
        )
    )
    if digests:
        conn.execute(
            db.erasure_digests.insert(),
            [
                {"dataset": d, "digest": digest, "erasure_id": erasure.erasure_id}
                for d, digest in sorted(digests.items())
            ],
        )


__all__ = [
    "MAX_IDENTIFIER",
    "ErasureRecord",
    "IndexEntry",
    "ShardHit",
    "SubjectVersion",
    "erased_digests",
    "erasure_records",
    "insert_erasure",
    "lookup",
    "matching_rows",
    "pii_columns",
    "prune_index",
    "record_shard",
    "shard_entries",
    "subject_ref",
    "subject_text",
    "unindexed_shards",
]
