"""The inbox: remembers which events a consumer has handled, so a redelivery is a no-op.

Use it inside the same database transaction as the handler's own change::

    with engine.begin() as conn:
        if inbox.claim(conn, delivery.event.id):
            ...apply the change...
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError


def inbox_table(metadata: sa.MetaData) -> sa.Table:
    """The ``event_inbox`` table, added to ``metadata``."""
    return sa.Table(
        "event_inbox",
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
        """Record ``event_id`` as handled; False when it already was (skip the work)."""
        try:
            with conn.begin_nested():
                conn.execute(
                    self._table.insert().values(
                        consumer=self._consumer,
                        event_id=event_id,
                        handled_at=dt.datetime.now(dt.UTC),
                    )
                )
        except IntegrityError:
            return False
        return True


__all__ = ["Inbox", "inbox_table"]
