"""The audit log's database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Rows are only ever inserted. ``seq`` is the leaf index in the Merkle log; ``leaf_hash`` is
SHA-256(0x00 ‖ canonical) and ``seal`` an HMAC over (seq, leaf_hash) with a key that is not in
the database, so the verifier can name the exact row that was altered or moved.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from gantry.core import get_logger
from gantry.core.database import add_column, connect_database, migrate_schema
from gantry.events import outbox_table

_log = get_logger("gantry.audit.store")

metadata = sa.MetaData()
_BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("seq", _BigInt, primary_key=True, autoincrement=False),
    sa.Column("event_id", sa.String(64), nullable=False, unique=True),
    sa.Column("type", sa.String(128), nullable=False),
    sa.Column("source", sa.String(256), nullable=False),
    sa.Column("actor", sa.String(256), nullable=False),
    sa.Column("subject", sa.String(512), nullable=True),
    sa.Column("resource", sa.String(512), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("decision", sa.String(8), nullable=False),
    sa.Column("correlation_id", sa.String(128), nullable=False),
    sa.Column("time_ms", sa.BigInteger, nullable=False),
    sa.Column("canonical", sa.LargeBinary, nullable=False),
    sa.Column("leaf_hash", sa.LargeBinary(32), nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("seal", sa.LargeBinary(32), nullable=False),
    sa.Column("state", sa.String(8), nullable=False, default="live", server_default="live"),
    sa.Index("ix_audit_resource_time", "resource", "time_ms"),
    sa.Index("ix_audit_actor_time", "actor", "time_ms"),
    sa.Index("ix_audit_type_time", "type", "time_ms"),
    sa.Index("ix_audit_correlation", "correlation_id"),
    sa.Index("ix_audit_time", "time_ms"),
)

checkpoints = sa.Table(
    "audit_checkpoints",
    metadata,
    sa.Column("tree_size", _BigInt, primary_key=True, autoincrement=False),
    sa.Column("root_hash", sa.LargeBinary(32), nullable=False),
    sa.Column("timestamp_ms", sa.BigInteger, nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("signature", sa.LargeBinary(64), nullable=False),
)

schema_version = sa.Table(
    "audit_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
)

outbox = outbox_table(metadata)

anomalies = sa.Table(
    "audit_anomalies",
    metadata,
    sa.Column("anomaly_id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("principal", sa.String(256), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("severity", sa.Float, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("evidence_json", sa.Text, nullable=False),
    sa.Column("event_ids_json", sa.Text, nullable=False),
    sa.Column("time_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
    sa.Column("by", sa.String(256), nullable=False, default=""),
    sa.Column("note", sa.Text, nullable=False, default=""),
    sa.Index("ix_audit_anomalies_time", "time_ms"),
    sa.Index("ix_audit_anomalies_state", "state", "time_ms"),
)

# Retention, archival and legal holds (schema v3). An event row's ``state`` is ``live`` (its
# bytes are here), ``archived`` (its bytes are in an object-store segment; ``canonical`` is
# empty) or ``purged`` (deleted after its retention, under no hold; only the leaf hash, the
# position and a purge seal remain). Leaf hashes are never removed, so the tree verifies.
segments = sa.Table(
    "audit_segments",
    metadata,
    sa.Column("first_seq", _BigInt, primary_key=True, autoincrement=False),
    sa.Column("end_seq", sa.BigInteger, nullable=False),
    sa.Column("level", sa.Integer, nullable=False),
    sa.Column("object_name", sa.String(512), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("segment_root", sa.LargeBinary(32), nullable=False),
    sa.Column("tree_size", sa.BigInteger, nullable=False),
    sa.Column("from_ms", sa.BigInteger, nullable=False),
    sa.Column("to_ms", sa.BigInteger, nullable=False),
    sa.Column("archived_ms", sa.BigInteger, nullable=False),
    sa.Column("archived_by", sa.String(256), nullable=False),
)

retention_rules = sa.Table(
    "audit_retention",
    metadata,
    sa.Column("event_type", sa.String(128), primary_key=True),
    sa.Column("keep_days", sa.Integer, nullable=False),
    sa.Column("updated_by", sa.String(256), nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
)

holds = sa.Table(
    "audit_holds",
    metadata,
    sa.Column("hold_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("principals_json", sa.Text, nullable=False),
    sa.Column("datasets_json", sa.Text, nullable=False),
    sa.Column("since_ms", sa.BigInteger, nullable=False),
    sa.Column("until_ms", sa.BigInteger, nullable=False),
    sa.Column("created_by", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("released_by", sa.String(256), nullable=False, default=""),
    sa.Column("released_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("release_note", sa.Text, nullable=False, default=""),
)

purged = sa.Table(
    "audit_purged",
    metadata,
    sa.Column("seq", _BigInt, primary_key=True, autoincrement=False),
    sa.Column("purge_id", sa.String(64), nullable=False),
    sa.Column("event_type", sa.String(128), nullable=False),
    sa.Column("purged_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_audit_purged_purge", "purge_id"),
)

reports = sa.Table(
    "audit_reports",
    metadata,
    sa.Column("report_id", sa.String(64), primary_key=True),
    sa.Column("period", sa.String(16), nullable=False),  # daily | weekly | monthly | custom
    sa.Column("since_ms", sa.BigInteger, nullable=False),
    sa.Column("until_ms", sa.BigInteger, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("created_by", sa.String(256), nullable=False),
    sa.Column("tree_size", sa.BigInteger, nullable=False),
    sa.Column("root_hash", sa.LargeBinary(32), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("signature", sa.LargeBinary(64), nullable=False),
    sa.Column("objects_json", sa.Text, nullable=False),  # format -> object name
    sa.Column("summary_json", sa.Text, nullable=False),
    sa.Index("ix_audit_reports_period", "period", "since_ms"),
)

SCHEMA_VERSION = 3


def _migrate_v1(conn: sa.Connection) -> None:
    metadata.create_all(conn, tables=[events, checkpoints, outbox, schema_version])


def _migrate_v2(conn: sa.Connection) -> None:
    metadata.create_all(conn, tables=[anomalies])


def _migrate_v3(conn: sa.Connection) -> None:
    add_column(conn, events.c.state)
    metadata.create_all(conn, tables=[segments, retention_rules, holds, purged, reports])


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2, 3: _migrate_v3}


def connect(url: str) -> sa.Engine:
    """An engine for the audit database at ``url``."""
    return connect_database(url, example="audit.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


@dataclass(frozen=True)
class RecordFilter:
    """Which records a query or export selects (all fields AND together)."""

    actors: Sequence[str] = ()
    types: Sequence[str] = ()
    resource: str = ""
    action: str = ""
    decision: str = ""
    correlation_id: str = ""
    since_ms: int = 0
    until_ms: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def where(self) -> list[sa.ColumnElement[bool]]:
        """SQL conditions for this filter."""
        c = events.c
        conds: list[sa.ColumnElement[bool]] = []
        if self.actors:
            conds.append(c.actor.in_(list(self.actors)))
        if self.types:
            conds.append(c.type.in_(list(self.types)))
        if self.resource:
            conds.append(c.resource == self.resource)
        if self.action:
            conds.append(c.action == self.action)
        if self.decision:
            conds.append(c.decision == self.decision)
        if self.correlation_id:
            conds.append(c.correlation_id == self.correlation_id)
        if self.since_ms:
            conds.append(c.time_ms >= self.since_ms)
        if self.until_ms:
            conds.append(c.time_ms < self.until_ms)
        return conds

    def as_dict(self) -> dict[str, Any]:
        """The non-empty fields (for the audit record of the query itself)."""
        out: dict[str, Any] = {}
        for name in ("actors", "types"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        for name in ("resource", "action", "decision", "correlation_id", "since_ms", "until_ms"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of the log as stored: its indexed columns and, unless it was purged, its
    canonical bytes (an archived event's bytes come from its object-store segment)."""

    seq: int
    event_id: str
    type: str
    actor: str
    resource: str
    action: str
    decision: str
    time_ms: int
    state: str  # live | archived | purged
    canonical: bytes | None


class Store:
    """Reads and appends of the audit tables."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def existing_ids(self, conn: sa.Connection, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` are already stored."""
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            found.update(
                conn.execute(sa.select(events.c.event_id).where(events.c.event_id.in_(chunk)))
                .scalars()
                .all()
            )
        return found

    def insert(self, conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert event rows: one executemany straight to the driver (this is the hot path;
        SQLAlchemy's per-value bind processing cost more than SQLite's own work)."""
        if not rows:
            return
        names = [c.name for c in events.columns]
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        sql = (
            f"INSERT INTO {events.name} ({', '.join(names)}) "
            f"VALUES ({', '.join([mark] * len(names))})"
        )
        conn.exec_driver_sql(sql, [tuple(row[n] for n in names) for row in rows])

    def size(self) -> int:
        """Number of stored events (the next seq)."""
        with self.engine.connect() as conn:
            last = conn.execute(sa.select(sa.func.max(events.c.seq))).scalar()
        return 0 if last is None else int(last) + 1

    def iter_rows(self, columns: Sequence[str], chunk: int = 20_000) -> Iterator[Any]:
        """Every event row in seq order, selected columns only, fetched in chunks."""
        cols = [events.c[name] for name in columns]
        last = -1
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(*cols).where(events.c.seq > last).order_by(events.c.seq).limit(chunk)
                ).all()
            if not rows:
                return
            yield from rows
            last = int(rows[-1][0])

    def live_events(
        self, since_ms: int, until_ms: int, below_seq: int, chunk: int = 20_000
    ) -> Iterator[StoredEvent]:
        """Events with ``since_ms <= time < until_ms`` and ``seq < below_seq``, in seq order,
        as stored in this database (archived events come without their bytes)."""
        c = events.c
        cols = [c.seq, c.event_id, c.type, c.actor, c.resource, c.action, c.decision, c.time_ms]
        last = -1
        while True:
            stmt = (
                sa.select(*cols, c.state, c.canonical)
                .where(
                    c.seq > last,
                    c.seq < below_seq,
                    c.time_ms >= since_ms,
                    c.time_ms < until_ms,
                )
                .order_by(c.seq)
                .limit(chunk)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
            if not rows:
                return
            for r in rows:
                body = bytes(r.canonical) if r.state == "live" else None
                yield StoredEvent(
                    int(r.seq), r.event_id, r.type, r.actor, r.resource, r.action,
                    r.decision, int(r.time_ms), r.state, body,
                )  # fmt: skip
            last = int(rows[-1].seq)

    def query(self, flt: RecordFilter, after_seq: int, limit: int) -> list[Any]:
        """Up to ``limit`` rows matching ``flt`` with seq > ``after_seq``, in seq order."""
        stmt = (
            sa.select(events)
            .where(events.c.seq > after_seq, *flt.where())
            .order_by(events.c.seq)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).all())

    def access_report(self, resource: str, since_ms: int, until_ms: int) -> list[Any]:
        """Per (actor, action): allowed and denied counts, first and last time."""
        c = events.c
        conds = [c.resource == resource]
        if since_ms:
            conds.append(c.time_ms >= since_ms)
        if until_ms:
            conds.append(c.time_ms < until_ms)
        stmt = (
            sa.select(
                c.actor,
                c.action,
                sa.func.sum(sa.case((c.decision == "allow", 1), else_=0)).label("allowed"),
                sa.func.sum(sa.case((c.decision == "deny", 1), else_=0)).label("denied"),
                sa.func.min(c.time_ms).label("first_ms"),
                sa.func.max(c.time_ms).label("last_ms"),
            )
            .where(*conds)
            .group_by(c.actor, c.action)
            .order_by(c.actor, c.action)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).all())

    def row(self, *, index: int | None = None, event_id: str | None = None) -> Any | None:
        """One event row by leaf index or event id."""
        cond = events.c.seq == index if index is not None else events.c.event_id == event_id
        with self.engine.connect() as conn:
            return conn.execute(sa.select(events).where(cond)).first()

    def add_checkpoint(self, conn: sa.Connection, head: dict[str, Any]) -> None:
        """Store one signed tree head."""
        conn.execute(checkpoints.insert().values(**head))

    def checkpoint(self, tree_size: int | None = None) -> Any | None:
        """The checkpoint of ``tree_size``, or the latest one."""
        stmt = sa.select(checkpoints)
        if tree_size:
            stmt = stmt.where(checkpoints.c.tree_size == tree_size)
        else:
            stmt = stmt.order_by(checkpoints.c.tree_size.desc()).limit(1)
        with self.engine.connect() as conn:
            return conn.execute(stmt).first()

    def all_checkpoints(self) -> list[Any]:
        """Every checkpoint, smallest tree first."""
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(checkpoints).order_by(checkpoints.c.tree_size)))


__all__ = [
    "SCHEMA_VERSION",
    "RecordFilter",
    "Store",
    "StoredEvent",
    "anomalies",
    "checkpoints",
    "connect",
    "events",
    "holds",
    "metadata",
    "migrate",
    "outbox",
    "purged",
    "reports",
    "retention_rules",
    "segments",
]
