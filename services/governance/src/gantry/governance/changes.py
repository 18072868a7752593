"""Events that record governance changes, queued in the outbox inside the change's transaction.

A change and its event commit together or not at all (the outbox relay publishes them after
the commit), so the audit never misses a committed version and never sees one that was not.
"""

from __future__ import annotations

import sqlalchemy as sa
from pydantic import BaseModel

from gantry.events import EventEnvelope, Outbox
from gantry.governance.store import outbox

SOURCE = "gantry/governance"

_OUTBOX = Outbox(outbox)


def record(
    conn: sa.Connection,
    type_: str,
    data: BaseModel,
    *,
    actor: str,
    subject: str,
    correlation_id: str | None = None,
) -> EventEnvelope:
    """Queue one event (checked against the catalog) in ``conn``'s transaction; return it."""
    return _OUTBOX.record(
        conn, type_, data, source=SOURCE, actor=actor, subject=subject,
        correlation_id=correlation_id,
    )  # fmt: skip


__all__ = ["SOURCE", "record"]
