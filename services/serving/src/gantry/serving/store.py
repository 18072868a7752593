"""The serving database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Deployments (their spec, versions and weights, canary state) and their history live here with
the outbox that carries every change's event out in the same transaction. After a restart the
service loads every deployment again and serves the weights it had.
"""

from __future__ import annotations

import orjson
import sqlalchemy as sa

from gantry.core.database import connect_database, migrate_schema
from gantry.events import Outbox, inbox_table, outbox_table
from gantry.serving.deployments import MAX_HISTORY, Deployment, HistoryEntry

SOURCE = "gantry/serving"

metadata = sa.MetaData()

deployments = sa.Table(
    "serving_deployments",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("state_json", sa.Text, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
)

history = sa.Table(
    "serving_history",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("deployment", sa.String(64), nullable=False, index=True),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("actor", sa.String(256), nullable=False),
)

schema_version = sa.Table(
    "serving_schema_version", metadata, sa.Column("version", sa.Integer, primary_key=True)
)
outbox = outbox_table(metadata, "serving_outbox")
inbox = inbox_table(metadata, "serving_inbox")
_OUTBOX = Outbox(outbox, source=SOURCE)


def _migrate_v1(conn: sa.Connection) -> None:
    metadata.create_all(conn)


MIGRATIONS = {1: _migrate_v1}


def connect(url: str) -> sa.Engine:
    """An engine for the serving database at ``url``."""
    return connect_database(url, example="serving.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema up to date; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


def load_all(engine: sa.Engine) -> list[Deployment]:
    """Every deployment with its recent history."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(deployments).order_by(deployments.c.name)).all()
        found = []
        for row in rows:
            deployment = Deployment.from_json(
                row.name, row.model, orjson.loads(row.state_json), row.created_ms, row.updated_ms
            )
            deployment.history = _history(conn, row.name)
            found.append(deployment)
    return found


def _history(conn: sa.Connection, name: str) -> list[HistoryEntry]:
    rows = conn.execute(
        sa.select(history)
        .where(history.c.deployment == name)
        .order_by(history.c.id.desc())
        .limit(MAX_HISTORY)
    ).all()
    return [HistoryEntry(r.at_ms, r.action, r.detail, r.actor) for r in reversed(rows)]


def save(conn: sa.Connection, deployment: Deployment, entry: HistoryEntry | None = None) -> None:
    """Upsert ``deployment`` (and append ``entry`` to its history) in ``conn``'s transaction."""
    state = orjson.dumps(deployment.to_json()).decode()
    updated = conn.execute(
        deployments.update()
        .where(deployments.c.name == deployment.name)
        .values(model=deployment.model, state_json=state, updated_ms=deployment.updated_ms)
    )
    if updated.rowcount == 0:
        conn.execute(
            deployments.insert().values(
                name=deployment.name,
                model=deployment.model,
                state_json=state,
                created_ms=deployment.created_ms,
                updated_ms=deployment.updated_ms,
            )
        )
    if entry is not None:
        conn.execute(
            history.insert().values(
                deployment=deployment.name,
                at_ms=entry.at_ms,
                action=entry.action[:32],
                detail=entry.detail,
                actor=entry.actor,
            )
        )


def delete(conn: sa.Connection, name: str, entry: HistoryEntry) -> None:
    """Remove a deployment; its history stays (and gains ``entry``)."""
    conn.execute(deployments.delete().where(deployments.c.name == name))
    conn.execute(
        history.insert().values(
            deployment=name, at_ms=entry.at_ms, action=entry.action[:32],
            detail=entry.detail, actor=entry.actor,
        )
    )  # fmt: skip


record = _OUTBOX.record
"""Queue one event (checked against the catalog) in a transaction: ``record(conn, type_, data,
*, actor, subject, correlation_id=None)``; returns it."""


__all__ = [
    "SOURCE",
    "connect",
    "delete",
    "deployments",
    "history",
    "inbox",
    "load_all",
    "metadata",
    "migrate",
    "outbox",
    "record",
    "save",
]
