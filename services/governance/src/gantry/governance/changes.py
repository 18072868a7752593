"""Events that record governance changes, queued in the outbox inside the change's transaction.

A change and its event commit together or not at all (the outbox relay publishes them after
the commit), so the audit never misses a committed version and never sees one that was not.
"""

from __future__ import annotations

from gantry.events import Outbox
from gantry.governance.store import outbox

SOURCE = "gantry/governance"

_OUTBOX = Outbox(outbox, source=SOURCE)


record = _OUTBOX.record
"""Queue one event (checked against the catalog) in a transaction: ``record(conn, type_, data,
*, actor, subject, correlation_id=None)``; returns it."""


__all__ = ["SOURCE", "record"]
