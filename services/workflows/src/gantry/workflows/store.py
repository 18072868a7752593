"""The workflows database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Pipelines keep every revision (a run carries on with the revision it started with, however the
pipeline is edited meanwhile); a run is one row holding its whole state as a JSON document,
written in one transaction with the events its change causes (the outbox), so a restart finds
every run exactly as the last completed change left it. ``wf_step_jobs`` maps a job back to
its run and step, for the job events the service consumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core.database import connect_database, migrate_schema
from gantry.events import Outbox, inbox_table, outbox_table
from gantry.workflows.runs import Artifact, Attempt, Run, StepRun

SOURCE = "gantry/workflows"

metadata = sa.MetaData()

pipelines = sa.Table(
    "wf_pipelines",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("roles_json", sa.Text, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False, default=False),
)

revisions = sa.Table(
    "wf_pipeline_revisions",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("author", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

schedules = sa.Table(
    "wf_schedules",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("next_ms", sa.BigInteger, nullable=False),
    sa.Column("last_fire_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("missed", sa.Integer, nullable=False, default=0),
)

runs = sa.Table(
    "wf_runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("pipeline", sa.String(64), nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("trigger", sa.String(16), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=True, unique=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("scheduled_ms", sa.BigInteger, nullable=False),
    sa.Column("doc_json", sa.Text, nullable=False),
    sa.Index("ix_wf_runs_pipeline", "pipeline", "created_ms"),
    sa.Index("ix_wf_runs_state", "state"),
)

step_jobs = sa.Table(
    "wf_step_jobs",
    metadata,
    sa.Column("job_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("step", sa.String(64), nullable=False),
)

experiments = sa.Table(
    "wf_experiments",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("roles_json", sa.Text, nullable=False),
    sa.Column("spec_json", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("study", sa.String(160), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False, default=""),
    sa.Column("best_trial", sa.Integer, nullable=False, default=-1),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("finished_ms", sa.BigInteger, nullable=False, default=0),
    sa.Index("ix_wf_experiments_state", "state"),
)

trials = sa.Table(
    "wf_trials",
    metadata,
    sa.Column("experiment", sa.String(128), primary_key=True),
    sa.Column("number", sa.Integer, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("job_id", sa.String(64), nullable=False, default=""),
    sa.Column("values_json", sa.Text, nullable=False),
    sa.Column("value", sa.Float, nullable=True),
    sa.Column("curve_json", sa.Text, nullable=False, default="[]"),
    sa.Column("metrics_json", sa.Text, nullable=False, default="{}"),
    sa.Column("model", sa.String(256), nullable=False, default=""),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("device_s", sa.Float, nullable=False, default=0.0),
    sa.Column("started_ms", sa.BigInteger, nullable=False),
    sa.Column("finished_ms", sa.BigInteger, nullable=False, default=0),
    sa.Index("ix_wf_trials_job", "job_id"),
)

sessions = sa.Table(
    "wf_sessions",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("roles_json", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("token", sa.String(128), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("job_id", sa.String(64), nullable=False),
    sa.Column("endpoint", sa.String(256), nullable=False, default=""),
    sa.Column("active_s", sa.Float, nullable=False, default=0.0),
    sa.Column("history_json", sa.Text, nullable=False, default="[]"),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("started_ms", sa.BigInteger, nullable=False, default=0),
    sa.Column("ended_ms", sa.BigInteger, nullable=False, default=0),
    sa.Index("ix_wf_sessions_state", "state"),
)

schema_version = sa.Table(
    "wf_schema_version", metadata, sa.Column("version", sa.Integer, primary_key=True)
)
outbox = outbox_table(metadata, "wf_outbox")
inbox = inbox_table(metadata, "wf_inbox")
_OUTBOX = Outbox(outbox, source=SOURCE)

record = _OUTBOX.record
"""Queue one event in a transaction: ``record(conn, type_, data, *, actor, subject)``."""


def _migrate_v1(conn: sa.Connection) -> None:
    for table in (pipelines, revisions, schedules, runs, step_jobs, outbox, inbox, schema_version):
        table.create(conn, checkfirst=True)


def _migrate_v2(conn: sa.Connection) -> None:
    experiments.create(conn, checkfirst=True)
    trials.create(conn, checkfirst=True)


def _migrate_v3(conn: sa.Connection) -> None:
    sessions.create(conn, checkfirst=True)


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2, 3: _migrate_v3}


def connect(url: str) -> sa.Engine:
    """An engine for the workflows database at ``url``."""
    return connect_database(url, example="workflows.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema up to date; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def run_doc(run: Run) -> str:
    """``run`` as the JSON document stored in ``wf_runs.doc_json``."""
    return dumps(
        {
            "id": run.id,
            "pipeline": run.pipeline,
            "revision": run.revision,
            "owner": run.owner,
            "roles": list(run.roles),
            "state": run.state,
            "reason": run.reason,
            "trigger": run.trigger,
            "params": run.params,
            "scheduled_ms": run.scheduled_ms,
            "created_ms": run.created_ms,
            "started_ms": run.started_ms,
            "finished_ms": run.finished_ms,
            "steps": [_step_doc(s) for s in run.steps.values()],
        }
    )


def _step_doc(s: StepRun) -> dict[str, Any]:
    return {
        "name": s.name,
        "kind": s.kind,
        "state": s.state,
        "reason": s.reason,
        "attempt": s.attempt,
        "job_id": s.job_id,
        "outputs": s.outputs,
        "metrics": s.metrics,
        "inputs": [[a.kind, a.name, a.version] for a in s.inputs],
        "produced": [[a.kind, a.name, a.version] for a in s.produced],
        "attempts": [
            [a.number, a.job_id, a.state, a.reason, a.started_ms, a.finished_ms] for a in s.attempts
        ],
        "started_ms": s.started_ms,
        "finished_ms": s.finished_ms,
    }


def load_run(text: str) -> Run:
    """The :class:`Run` stored as ``text``."""
    d = orjson.loads(text)
    steps = {}
    for s in d["steps"]:
        steps[s["name"]] = StepRun(
            name=s["name"],
            kind=s["kind"],
            state=s["state"],
            reason=s["reason"],
            attempt=s["attempt"],
            job_id=s["job_id"],
            outputs=dict(s["outputs"]),
            metrics={k: float(v) for k, v in s["metrics"].items()},
            inputs=[Artifact(*a) for a in s["inputs"]],
            produced=[Artifact(*a) for a in s["produced"]],
            attempts=[Attempt(*a) for a in s["attempts"]],
            started_ms=s["started_ms"],
            finished_ms=s["finished_ms"],
        )
    return Run(
        id=d["id"],
        pipeline=d["pipeline"],
        revision=d["revision"],
        owner=d["owner"],
        roles=tuple(d["roles"]),
        state=d["state"],
        reason=d["reason"],
        trigger=d["trigger"],
        params=dict(d["params"]),
        steps=steps,
        scheduled_ms=d["scheduled_ms"],
        created_ms=d["created_ms"],
        started_ms=d["started_ms"],
        finished_ms=d["finished_ms"],
    )


def save_run(conn: sa.Connection, run: Run, *, request_id: str | None = None) -> None:
    """Insert or update ``run`` (and its jobs' index rows)."""
    values = {
        "pipeline": run.pipeline,
        "revision": run.revision,
        "owner": run.owner,
        "state": run.state,
        "trigger": run.trigger,
        "created_ms": run.created_ms,
        "scheduled_ms": run.scheduled_ms,
        "doc_json": run_doc(run),
    }
    updated = conn.execute(runs.update().where(runs.c.id == run.id).values(**values)).rowcount
    if not updated:
        conn.execute(runs.insert().values(id=run.id, request_id=request_id, **values))
    for s in run.steps.values():
        for job_id in {s.job_id, *(a.job_id for a in s.attempts)} - {""}:
            exists = conn.execute(
                sa.select(step_jobs.c.job_id).where(step_jobs.c.job_id == job_id)
            ).first()
            if exists is None:
                conn.execute(step_jobs.insert().values(job_id=job_id, run_id=run.id, step=s.name))


def get_run(conn: sa.Connection, run_id: str) -> Run | None:
    row = conn.execute(sa.select(runs.c.doc_json).where(runs.c.id == run_id)).first()
    return load_run(row.doc_json) if row is not None else None


def run_by_request(conn: sa.Connection, request_id: str) -> Run | None:
    row = conn.execute(sa.select(runs.c.doc_json).where(runs.c.request_id == request_id)).first()
    return load_run(row.doc_json) if row is not None else None


def run_ids(conn: sa.Connection, states: Sequence[str]) -> list[str]:
    rows = conn.execute(
        sa.select(runs.c.id).where(runs.c.state.in_(states)).order_by(runs.c.created_ms)
    ).all()
    return [r.id for r in rows]


def list_runs(
    conn: sa.Connection, *, pipeline: str = "", state: str = "", limit: int = 100
) -> list[Run]:
    query = sa.select(runs.c.doc_json)
    if pipeline:
        query = query.where(runs.c.pipeline == pipeline)
    if state:
        query = query.where(runs.c.state == state)
    rows = conn.execute(query.order_by(runs.c.created_ms.desc()).limit(limit)).all()
    return [load_run(r.doc_json) for r in rows]


def run_of_job(conn: sa.Connection, job_id: str) -> tuple[str, str] | None:
    row = conn.execute(sa.select(step_jobs).where(step_jobs.c.job_id == job_id)).first()
    return (row.run_id, row.step) if row is not None else None


__all__ = [
    "SOURCE",
    "connect",
    "dumps",
    "get_run",
    "list_runs",
    "load_run",
    "migrate",
    "pipelines",
    "record",
    "revisions",
    "run_by_request",
    "run_doc",
    "run_ids",
    "run_of_job",
    "runs",
    "save_run",
    "schedules",
    "step_jobs",
]
