"""The scheduler database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Everything the scheduler must not forget lives here — jobs with their state, attempt and
placements, nodes with their inventory, queues and quotas, what it learnt of datasets'
classifications, usage records and log lines — together with the outbox that carries every
decision's event out in the same transaction. After a restart the scheduler rebuilds its
engine from these tables: no job is lost and none is placed twice.
"""

from __future__ import annotations

import sqlalchemy as sa

from gantry.core.database import connect_database, migrate_schema
from gantry.events import inbox_table, outbox_table

metadata = sa.MetaData()

jobs = sa.Table(
    "sched_jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("owner_roles", sa.Text, nullable=False),  # JSON list
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("spec_yaml", sa.Text, nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False, default=""),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("workers", sa.Integer, nullable=False, default=0),
    sa.Column("placements", sa.Text, nullable=False, default="[]"),  # JSON slots
    sa.Column("reports", sa.Text, nullable=False, default="{}"),  # JSON per node status
    sa.Column("stop_reason", sa.String(32), nullable=False, default=""),
    sa.Column("stop_ranks", sa.Text, nullable=False, default="[]"),
    sa.Column("deadline_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("pools", sa.Text, nullable=False, default=""),
    sa.Column("submitted_ms", sa.BigInteger, nullable=False),
    sa.Column("pending_since_ms", sa.BigInteger, nullable=False),
    sa.Column("attempt_start_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("started_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("finished_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("run_s", sa.Float, nullable=False, default=0.0),
    sa.Column("checkpoint_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("preempted_ms", sa.BigInteger, nullable=False, default=0),
    # v2: the training's latest progress (JSON, written at most every few seconds), the
    # workers' restarts from a checkpoint (in all, and in the current attempt), the model
    # registered on success
    sa.Column("progress", sa.Text, nullable=False, default="{}"),
    sa.Column("restarts", sa.Integer, nullable=False, default=0),
    sa.Column("attempt_restarts", sa.Integer, nullable=False, default=0),
    sa.Column("model", sa.String(256), nullable=False, default=""),
    # v3: what a successful job left besides a model: the metrics rank 0 wrote (JSON object of
    # finite numbers) and the dataset version it committed (dataset@version)
    sa.Column("metrics", sa.Text, nullable=False, default="{}"),
    sa.Column("dataset_version", sa.String(200), nullable=False, default=""),
    sa.Index("ix_sched_jobs_state", "state"),
    sa.Index("ix_sched_jobs_request", "owner", "request_id"),
)

job_history = sa.Table(
    "sched_job_history",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(32), nullable=False, index=True),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
)

nodes = sa.Table(
    "sched_nodes",
    metadata,
    sa.Column("name", sa.String(253), primary_key=True),
    sa.Column("pool", sa.String(64), nullable=False),
    sa.Column("inventory", sa.Text, nullable=False),  # JSON NodeRegistered data
    sa.Column("state", sa.String(16), nullable=False),  # ready | degraded | lost
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
    sa.Column("registered_ms", sa.BigInteger, nullable=False),
)

queues = sa.Table(
    "sched_queues",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("cohort", sa.String(64), nullable=False, default=""),
    sa.Column("quota", sa.Text, nullable=False),  # JSON [gpu_milli, cpu_milli, memory_mib]
    sa.Column("borrowing_limit", sa.Text, nullable=False),  # JSON, same shape
    sa.Column("weight", sa.Float, nullable=False, default=1.0),
)

datasets = sa.Table(
    "sched_datasets",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("sensitivity", sa.String(16), nullable=False),
)

usage = sa.Table(
    "sched_usage",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(32), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("queue", sa.String(64), nullable=False),
    sa.Column("pools", sa.Text, nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False, index=True),
    sa.Column("gpu_seconds", sa.Float, nullable=False),
    sa.Column("cpu_seconds", sa.Float, nullable=False),
    sa.Column("queueing_s", sa.Float, nullable=False),
    sa.Column("run_s", sa.Float, nullable=False),
    sa.UniqueConstraint("job_id", "attempt", name="uq_sched_usage_attempt"),
)

logs = sa.Table(
    "sched_logs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(32), nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("worker", sa.Integer, nullable=False),
    sa.Column("stream", sa.String(8), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Index("ix_sched_logs_job", "job_id", "id"),
)

schema_version = sa.Table(
    "sched_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
)

outbox = outbox_table(metadata, "sched_outbox")
inbox = inbox_table(metadata, "sched_inbox")

SCHEMA_VERSION = 3

#: Columns added to ``sched_jobs`` by version 2, with the DDL of each (their server default
#: fills the rows written before).
_V2_JOB_COLUMNS = {
    "progress": "TEXT NOT NULL DEFAULT '{}'",
    "restarts": "INTEGER NOT NULL DEFAULT 0",
    "attempt_restarts": "INTEGER NOT NULL DEFAULT 0",
    "model": "VARCHAR(256) NOT NULL DEFAULT ''",
}


#: Columns added to ``sched_jobs`` by version 3.
_V3_JOB_COLUMNS = {
    "metrics": "TEXT NOT NULL DEFAULT '{}'",
    "dataset_version": "VARCHAR(200) NOT NULL DEFAULT ''",
}


def _migrate_v1(conn: sa.Connection) -> None:
    metadata.create_all(conn)


def _add_job_columns(conn: sa.Connection, columns: dict[str, str]) -> None:
    # a database created at a later version got the columns from create_all in step 1
    present = {c["name"] for c in sa.inspect(conn).get_columns(jobs.name)}
    for name, ddl in columns.items():
        if name not in present:
            conn.execute(sa.text(f"ALTER TABLE {jobs.name} ADD COLUMN {name} {ddl}"))


def _migrate_v2(conn: sa.Connection) -> None:
    _add_job_columns(conn, _V2_JOB_COLUMNS)


def _migrate_v3(conn: sa.Connection) -> None:
    _add_job_columns(conn, _V3_JOB_COLUMNS)


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2, 3: _migrate_v3}


def connect(url: str) -> sa.Engine:
    """An engine for the scheduler database at ``url``."""
    return connect_database(url, example="scheduler.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


__all__ = [
    "SCHEMA_VERSION",
    "connect",
    "datasets",
    "inbox",
    "job_history",
    "jobs",
    "logs",
    "metadata",
    "migrate",
    "nodes",
    "outbox",
    "queues",
    "usage",
]
