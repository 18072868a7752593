"""The outbox: an event written in the same transaction as the change it describes.

A relay publishes unpublished rows in order and marks them; a crash between the two makes the
relay publish the row again, and ``Nats-Msg-Id`` (the event id) makes that harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

from gantry.core import GantryError, get_logger
from gantry.events.catalog import validate_event
from gantry.events.envelope import EventEnvelope
from gantry.events.publisher import Publisher

_log = get_logger("gantry.events.outbox")


def outbox_table(metadata: sa.MetaData, name: str = "event_outbox") -> sa.Table:
    """The outbox table (``event_outbox`` unless named), added to ``metadata``.

    Services that may share one database give their outbox a name of their own, so that each
    relay publishes only its own service's events, under its own key.
    """
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True, index=True),
    )


class Outbox:
    """Adds events to the outbox table inside the caller's transaction."""

    def __init__(self, table: sa.Table, *, source: str = "") -> None:
        """``source`` is the default source of the events :meth:`record` builds."""
        self.table = table
        self.source = source

    def record(
        self,
        conn: sa.Connection,
        type_: str,
        data: BaseModel,
        *,
        actor: str,
        subject: str,
        correlation_id: str | None = None,
        source: str = "",
    ) -> EventEnvelope:
        """Build an event of ``type_`` from ``data`` (checked against the catalog) and queue it
        in ``conn``'s transaction; return it. An empty ``actor`` is recorded as anonymous; an
        empty ``source`` is the outbox's own."""
        extra: dict[str, Any] = {"correlation_id": correlation_id} if correlation_id else {}
        event = EventEnvelope(
            type=type_,
            source=source or self.source,
            actor=actor or "anonymous",
            subject=subject,
            data=data.model_dump(mode="json"),
            **extra,
        )
        self.add(conn, event)
        return event

    def add(self, conn: sa.Connection, event: EventEnvelope) -> None:
        """Queue ``event`` for publishing; it leaves only if the transaction commits."""
        validate_event(event)
        conn.execute(
            self.table.insert().values(
                event_id=event.id,
                payload=event.canonical_bytes(),
                created_at=dt.datetime.now(dt.UTC),
            )
        )


class OutboxRelay:
    """Publishes outbox rows in insertion order; run it as a background task."""

    def __init__(
        self, engine: sa.Engine, table: sa.Table, publisher: Publisher, *, poll_s: float = 0.2
    ) -> None:
        self._engine = engine
        self._table = table
        self._publisher = publisher
        self._poll_s = poll_s
        self._wake = asyncio.Event()
        self._stopping = False
        self.published = 0

    def notify(self) -> None:
        """Wake the relay now (call after committing a transaction that added events)."""
        self._wake.set()

    def stop(self) -> None:
        """Finish the current pass and return from :meth:`run`."""
        self._stopping = True
        self._wake.set()

    def _pending(self, limit: int) -> list[tuple[int, bytes]]:
        t = self._table
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.id, t.c.payload)
                .where(t.c.published_at.is_(None))
                .order_by(t.c.id)
                .limit(limit)
            ).all()
        return [(int(r[0]), bytes(r[1])) for r in rows]

    def _mark(self, ids: list[int]) -> None:
        t = self._table
        with self._engine.begin() as conn:
            conn.execute(
                t.update().where(t.c.id.in_(ids)).values(published_at=dt.datetime.now(dt.UTC))
            )

    async def flush(self) -> int:
        """Publish everything pending now; return how many were published."""
        total = 0
        while True:
            pending = await asyncio.to_thread(self._pending, 200)
            if not pending:
                return total
            for row_id, payload in pending:
                try:
                    await self._publisher.publish(EventEnvelope.from_bytes(payload))
                except GantryError as exc:
                    if exc.temporary:
                        raise
                    # it can never leave (e.g. too large): mark it so it does not block the rest
                    _log.error("outbox event refused; not published", row=row_id, error=str(exc))
            await asyncio.to_thread(self._mark, [i for i, _ in pending])
            total += len(pending)
            self.published += len(pending)

    async def run(self) -> None:
        """Publish pending rows whenever notified or every ``poll_s`` seconds, until stopped."""
        while True:
            try:
                await self.flush()
            except GantryError as exc:
                _log.warning("outbox relay could not publish; will retry", error=str(exc))
            if self._stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._poll_s)
            self._wake.clear()


__all__ = ["Outbox", "OutboxRelay", "outbox_table"]
