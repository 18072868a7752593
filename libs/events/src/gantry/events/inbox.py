"""The inbox: remembers which events a consumer has handled, so a redelivery is a no-op.

Use it inside the same database transaction as the handler's own change::

    with engine.begin() as conn:
        if inbox.claim(conn, delivery.event.id):
            ...apply the change...
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite


def inbox_table(metadata: sa.MetaData, name: str = "event_inbox") -> sa.Table:
    """The inbox table (``event_inbox`` unless named), added to ``metadata``."""
    return sa.Table(
        name,
        metadata,
        sa.Column("consumer", sa.String(128), primary_key=True),
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("handled_at", sa.DateTime(timezone=True), nullable=False),
    )


class Inbox:
    """Exactly-once handling per (consumer, event id)."""

    def __init__(self, table: sa.Table, consumer: str) -> None:
        self._table = table
        self._consumer = consumer

    def claim(self, conn: sa.Connection, event_id: str) -> bool:
        """Record ``event_id`` as handled; False when it already was (skip the work).

        An ``INSERT ... ON CONFLICT DO NOTHING`` rather than a savepoint: it is one statement,
        and it rolls back with the caller's transaction on every backend.
        """
        values = {
            "consumer": self._consumer,
            "event_id": event_id,
            "handled_at": dt.datetime.now(dt.UTC),
        }
        dialect = conn.dialect.name
        if dialect in ("postgresql", "sqlite"):
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            stmt = (
                insert(self._table)
                .values(**values)
                .on_conflict_do_nothing()
                .returning(self._table.c.event_id)
            )
            return conn.execute(stmt).first() is not None
        else:
            exists = conn.execute(
                sa.select(self._table.c.event_id).where(
                    self._table.c.consumer == self._consumer, self._table.c.event_id == event_id
                )
            ).first()
            if exists:
                return False
            conn.execute(self._table.insert().values(**values))
            return True


__all__ = ["Inbox", "inbox_table"]
