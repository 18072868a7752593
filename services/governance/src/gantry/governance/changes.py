"""Events that record governance changes, queued in the outbox inside the change's transaction.

A change and its event commit together or not at all (the outbox relay publishes them after
the commit), so the audit never misses a committed version and never sees one that was not.
"""

from __future__ import annotations

from typing import Any

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
    extra: dict[str, Any] = {"correlation_id": correlation_id} if correlation_id else {}
    event = EventEnvelope(
        type=type_,
        source=SOURCE,
        actor=actor or "anonymous",
        subject=subject,
        data=data.model_dump(mode="json"),
        **extra,
    )
    _OUTBOX.add(conn, event)
    return event


__all__ = ["SOURCE", "record"]
