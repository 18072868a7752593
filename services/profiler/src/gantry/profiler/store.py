"""The profiler database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Step windows and node samples are kept at full resolution for ``raw_retention_s`` (an hour by
default); :func:`compact` then folds each rank's (each node's) older rows into one row per
minute and deletes rows past ``rollup_retention_s``, so disk use is bounded by the number of
ranks and nodes, not by how long jobs run. Jobs, findings, node health and traces are kept
with the outbox that carries their events out in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core.database import connect_database, migrate_schema
from gantry.events import Outbox, inbox_table, outbox_table
from gantry.profiler.windows import Window

SOURCE = "gantry/profiler"
MINUTE_MS = 60_000

metadata = sa.MetaData()

windows = sa.Table(
    "profiler_windows",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("node", sa.String(64), nullable=False),
    sa.Column("first_step", sa.Integer, nullable=False),
    sa.Column("last_step", sa.Integer, nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("step_ms", sa.Float, nullable=False),
    sa.Column("step_ms_max", sa.Float, nullable=False),
    sa.Column("data_ms", sa.Float, nullable=False),
    sa.Column("forward_ms", sa.Float, nullable=False),
    sa.Column("backward_ms", sa.Float, nullable=False),
    sa.Column("comm_ms", sa.Float, nullable=False),
    sa.Column("optimizer_ms", sa.Float, nullable=False),
    sa.Column("samples", sa.BigInteger, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    sa.Column("loss", sa.Float, nullable=True),
    sa.Column("memory_mib", sa.Integer, nullable=False),
    sa.Column("rollup", sa.Boolean, nullable=False, default=False),
    sa.Index("ix_profiler_windows_job", "job_id", "attempt", "rank", "last_step"),
    sa.Index("ix_profiler_windows_at", "rollup", "at_ms"),
)

node_samples = sa.Table(
    "profiler_node_samples",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("node", sa.String(64), nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("cpu_util", sa.Float, nullable=False),
    sa.Column("gpu_util", sa.Float, nullable=False),
    sa.Column("memory_used_mib", sa.Integer, nullable=False),
    sa.Column("net_rx_bytes_per_s", sa.Float, nullable=False),
    sa.Column("net_tx_bytes_per_s", sa.Float, nullable=False),
    sa.Column("temperature_c", sa.Float, nullable=False),
    sa.Column("power_w", sa.Float, nullable=False),
    sa.Column("throttled", sa.Boolean, nullable=False),
    sa.Column("samples", sa.Integer, nullable=False, default=1),
    sa.Column("rollup", sa.Boolean, nullable=False, default=False),
    sa.Index("ix_profiler_node_samples", "node", "at_ms"),
    sa.Index("ix_profiler_node_samples_at", "rollup", "at_ms"),
)

jobs = sa.Table(
    "profiler_jobs",
    metadata,
    sa.Column("job_id", sa.String(64), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("placements_json", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("started_ms", sa.BigInteger, nullable=False),
    sa.Column("ended_ms", sa.BigInteger, nullable=False),
    sa.Column("last_step", sa.Integer, nullable=False, default=0),
    sa.Index("ix_profiler_jobs_name", "name"),
)

findings = sa.Table(
    "profiler_findings",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),  # -1: the whole gang
    sa.Column("node", sa.String(64), nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("cause", sa.String(32), nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("evidence_json", sa.Text, nullable=False),
    sa.Column("raised_step", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("raised_ms", sa.BigInteger, nullable=False),
    sa.Column("cleared_ms", sa.BigInteger, nullable=False, default=0),
    sa.Index("ix_profiler_findings_job", "job_id", "attempt"),
)

nodes = sa.Table(
    "profiler_nodes",
    metadata,
    sa.Column("node", sa.String(64), primary_key=True),
    sa.Column("degraded", sa.Boolean, nullable=False),
    sa.Column("degraded_for", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("evidence_json", sa.Text, nullable=False),
    sa.Column("since_ms", sa.BigInteger, nullable=False),
)

traces = sa.Table(
    "profiler_traces",
    metadata,
    sa.Column("trace_id", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.String(64), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("steps", sa.Integer, nullable=False),
    sa.Column("ranks_json", sa.Text, nullable=False),
    sa.Column("requested_by", sa.String(256), nullable=False),
    sa.Column("requested_ms", sa.BigInteger, nullable=False),
)

trace_files = sa.Table(
    "profiler_trace_files",
    metadata,
    sa.Column("trace_id", sa.String(64), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("node", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("first_step", sa.Integer, nullable=False),
    sa.Column("steps", sa.Integer, nullable=False),
    sa.Column("object_key", sa.String(256), nullable=False),
    sa.Column("stored_ms", sa.BigInteger, nullable=False),
)

schema_version = sa.Table(
    "profiler_schema_version", metadata, sa.Column("version", sa.Integer, primary_key=True)
)
outbox = outbox_table(metadata, "profiler_outbox")
inbox = inbox_table(metadata, "profiler_inbox")
_OUTBOX = Outbox(outbox, source=SOURCE)

record = _OUTBOX.record
"""Queue one event in a transaction: ``record(conn, type_, data, *, actor, subject)``."""


def _migrate_v1(conn: sa.Connection) -> None:
    metadata.create_all(conn)


MIGRATIONS = {1: _migrate_v1}


def connect(url: str) -> sa.Engine:
    """An engine for the profiler database at ``url``."""
    return connect_database(url, example="profiler.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema up to date; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def window_row(w: Window, *, rollup: bool = False) -> dict[str, Any]:
    return {
        "job_id": w.job_id,
        "attempt": w.attempt,
        "rank": w.rank,
        "node": w.node,
        "first_step": w.first_step,
        "last_step": w.last_step,
        "at_ms": w.at_ms,
        "step_ms": w.step_ms,
        "step_ms_max": w.step_ms_max,
        "data_ms": w.data_ms,
        "forward_ms": w.forward_ms,
        "backward_ms": w.backward_ms,
        "comm_ms": w.comm_ms,
        "optimizer_ms": w.optimizer_ms,
        "samples": w.samples,
        "tokens": w.tokens,
        "loss": w.loss,
        "memory_mib": w.memory_mib,
        "rollup": rollup,
    }


def row_window(row: Any) -> Window:
    return Window(
        job_id=row.job_id,
        attempt=row.attempt,
        rank=row.rank,
        node=row.node,
        first_step=row.first_step,
        last_step=row.last_step,
        step_ms=row.step_ms,
        step_ms_max=row.step_ms_max,
        data_ms=row.data_ms,
        forward_ms=row.forward_ms,
        backward_ms=row.backward_ms,
        comm_ms=row.comm_ms,
        optimizer_ms=row.optimizer_ms,
        samples=row.samples,
        tokens=row.tokens,
        loss=row.loss,
        memory_mib=row.memory_mib,
        at_ms=row.at_ms,
    )


def job_windows(
    conn: sa.Connection, job_id: str, attempt: int, rank: int | None = None
) -> list[Window]:
    """The stored windows of one attempt (of one rank), in step order."""
    query = sa.select(windows).where(windows.c.job_id == job_id, windows.c.attempt == attempt)
    if rank is not None:
        query = query.where(windows.c.rank == rank)
    rows = conn.execute(query.order_by(windows.c.rank, windows.c.first_step)).all()
    return [row_window(r) for r in rows]


def compact(engine: sa.Engine, *, now_ms: int, raw_s: float, keep_s: float) -> tuple[int, int]:
    """Fold rows older than ``raw_s`` into per-minute rows; delete rows older than ``keep_s``.

    Returns (rows folded away, rows deleted).
    """
    from gantry.profiler.windows import merge

    cutoff = now_ms - int(raw_s * 1000)
    expired = now_ms - int(keep_s * 1000)
    folded = deleted = 0
    with engine.begin() as conn:
        deleted += conn.execute(windows.delete().where(windows.c.at_ms < expired)).rowcount or 0
        deleted += (
            conn.execute(node_samples.delete().where(node_samples.c.at_ms < expired)).rowcount or 0
        )
        rows = conn.execute(
            sa.select(windows)
            .where(windows.c.rollup.is_(False), windows.c.at_ms < cutoff)
            .order_by(windows.c.job_id, windows.c.attempt, windows.c.rank, windows.c.first_step)
        ).all()
        groups: dict[tuple[str, int, int, int], list[Any]] = {}
        for row in rows:
            groups.setdefault(
                (row.job_id, row.attempt, row.rank, row.at_ms // MINUTE_MS), []
            ).append(row)
        for group in groups.values():
            merged = row_window(group[0])
            for row in group[1:]:
                merged = merge(merged, row_window(row))
            conn.execute(windows.delete().where(windows.c.id.in_([r.id for r in group])))
            conn.execute(windows.insert().values(**window_row(merged, rollup=True)))
            folded += len(group) - 1
        samples = conn.execute(
            sa.select(node_samples)
            .where(node_samples.c.rollup.is_(False), node_samples.c.at_ms < cutoff)
            .order_by(node_samples.c.node, node_samples.c.at_ms)
        ).all()
        buckets: dict[tuple[str, int], list[Any]] = {}
        for s in samples:
            buckets.setdefault((s.node, s.at_ms // MINUTE_MS), []).append(s)
        for (node, minute), group in buckets.items():
            n = sum(s.samples for s in group)

            def mean(column: str, group: Sequence[Any] = group, n: int = n) -> float:
                return float(sum(getattr(s, column) * s.samples for s in group)) / n

            conn.execute(node_samples.delete().where(node_samples.c.id.in_([s.id for s in group])))
            conn.execute(
                node_samples.insert().values(
                    node=node,
                    at_ms=minute * MINUTE_MS,
                    cpu_util=mean("cpu_util"),
                    gpu_util=mean("gpu_util"),
                    memory_used_mib=int(mean("memory_used_mib")),
                    net_rx_bytes_per_s=mean("net_rx_bytes_per_s"),
                    net_tx_bytes_per_s=mean("net_tx_bytes_per_s"),
                    temperature_c=max(s.temperature_c for s in group),
                    power_w=mean("power_w"),
                    throttled=any(s.throttled for s in group),
                    samples=n,
                    rollup=True,
                )
            )
            folded += len(group) - 1
    return folded, deleted


__all__ = [
    "SOURCE",
    "compact",
    "connect",
    "dumps",
    "findings",
    "inbox",
    "job_windows",
    "jobs",
    "metadata",
    "migrate",
    "node_samples",
    "nodes",
    "outbox",
    "record",
    "row_window",
    "trace_files",
    "traces",
    "window_row",
    "windows",
]
