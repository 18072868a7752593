"""Anomalies (application): the detector fed with what the ledger appends, its findings kept
and published, and compliance staff's acknowledgements and dismissals.

Each anomaly is one row of ``audit_anomalies`` written in the same transaction as its
``gantry.audit.anomaly`` event (the outbox), which the audit log then records like any other
event — so raising, acknowledging and dismissing are themselves audited. At start the model
is primed from the log's last ``history_days`` of events, so a restart judges exactly as the
running service did (findings already raised are not raised again: their ids are derived from
the event that raised them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.audit.behaviour import Anomaly, AnomalySettings, BehaviourModel
from gantry.audit.ledger import SOURCE
from gantry.audit.store import anomalies, events
from gantry.core import Conflict, InvalidInput, NotFound, get_logger
from gantry.events import EventEnvelope, Outbox
from gantry.events.catalog import AuditAnomaly

_log = get_logger("gantry.audit.anomalies")
STATES = ("raised", "acknowledged", "dismissed")
_JUDGED = ("gantry.data.accessed", "gantry.authz.decision", "gantry.data.dataset.created")


@dataclass(frozen=True)
class AnomalyRecord:
    """An anomaly as stored: what was found, and what compliance staff said of it."""

    anomaly_id: str
    kind: str
    principal: str
    state: str
    severity: float
    reason: str
    evidence: dict[str, Any]
    event_ids: tuple[str, ...]
    time_ms: int
    updated_ms: int
    by: str
    note: str


class AnomalyWatch:
    """Judges appended events and keeps the anomalies; safe to call from any thread."""

    def __init__(
        self,
        engine: sa.Engine,
        outbox: Outbox,
        settings: AnomalySettings | None = None,
        *,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.engine = engine
        self.outbox = outbox
        self.settings = settings or AnomalySettings()
        self.model = BehaviourModel(self.settings)
        self.now_ms = now_ms
        self.on_change: Callable[[], None] = lambda: None
        self._lock = threading.Lock()

    def prime(self) -> int:
        """Learn from the log's recent history (what a restart must remember); events read."""
        since = self.now_ms() - self.settings.history_days * 86_400_000
        query = (
            sa.select(events.c.canonical)
            .where(
                events.c.time_ms >= since,
                events.c.type.in_(_JUDGED),
                events.c.state == "live",  # archived and purged rows hold no bytes here
            )
            .order_by(events.c.seq)
            .execution_options(yield_per=5000)
        )
        n = 0
        with self._lock, self.engine.connect() as conn:
            for (canonical,) in conn.execute(query):
                self.model.observe(EventEnvelope.model_validate_json(bytes(canonical)))
                n += 1
        _log.info("anomaly model primed", events=n, principals=len(self.model.profiles))
        return n

    def observe(self, appended: Iterable[EventEnvelope]) -> list[Anomaly]:
        """Judge newly appended events; store and publish what they show."""
        if not self.settings.enabled:
            return []
        with self._lock:
            found = [a for e in appended if e.type in _JUDGED for a in self.model.observe(e)]
            if not found:
                return []
            with self.engine.begin() as conn:
                known = set(
                    conn.execute(
                        sa.select(anomalies.c.anomaly_id).where(
                            anomalies.c.anomaly_id.in_([a.id for a in found])
                        )
                    ).scalars()
                )
                fresh = [a for a in found if a.id not in known]
                for a in fresh:
                    conn.execute(
                        anomalies.insert().values(
                            anomaly_id=a.id,
                            kind=a.kind,
                            principal=a.principal,
                            state="raised",
                            severity=a.severity,
                            reason=a.reason,
                            evidence_json=orjson.dumps(a.evidence).decode(),
                            event_ids_json=orjson.dumps(list(a.event_ids)).decode(),
                            time_ms=a.time_ms,
                            updated_ms=self.now_ms(),
                            by="",
                            note="",
                        )
                    )
                    self.outbox.add(conn, _event(a, "raised", by="", note=""))
        for a in fresh:
            _log.warning("anomaly raised", kind=a.kind, principal=a.principal, reason=a.reason)
        if fresh:
            self.on_change()
        return fresh

    def list(
        self,
        *,
        state: str = "",
        principal: str = "",
        kind: str = "",
        since_ms: int = 0,
        until_ms: int = 0,
        limit: int = 100,
    ) -> list[AnomalyRecord]:
        """Anomalies, newest first, filtered."""
        if state and state not in STATES:
            raise InvalidInput(f"unknown anomaly state {state!r}", hint=f"use {', '.join(STATES)}")
        query = sa.select(anomalies).order_by(anomalies.c.time_ms.desc()).limit(limit)
        for column, value in (
            (anomalies.c.state, state),
            (anomalies.c.principal, principal),
            (anomalies.c.kind, kind),
        ):
            if value:
                query = query.where(column == value)
        if since_ms:
            query = query.where(anomalies.c.time_ms >= since_ms)
        if until_ms:
            query = query.where(anomalies.c.time_ms < until_ms)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query)]

    def get(self, anomaly_id: str) -> AnomalyRecord:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(anomalies).where(anomalies.c.anomaly_id == anomaly_id)
            ).first()
        if row is None:
            raise NotFound("anomaly", anomaly_id, hint="list them with `gantry audit anomalies`")
        return _record(row)

    def resolve(self, anomaly_id: str, state: str, *, by: str, note: str) -> AnomalyRecord:
        """Acknowledge (it is real, being handled) or dismiss (not a problem) an anomaly."""
        if state not in ("acknowledged", "dismissed"):
            raise InvalidInput(
                f"an anomaly can be acknowledged or dismissed, not {state!r}",
                hint="use acknowledged or dismissed",
            )
        if state == "dismissed" and not note.strip():
            raise InvalidInput(
                "say why the anomaly is dismissed", hint="give a note (it is audited)"
            )
        with self._lock, self.engine.begin() as conn:
            row = conn.execute(
                sa.select(anomalies).where(anomalies.c.anomaly_id == anomaly_id)
            ).first()
            if row is None:
                raise NotFound("anomaly", anomaly_id)
            if row.state == "dismissed" or row.state == state:
                raise Conflict(f"anomaly {anomaly_id} is already {row.state}")
            conn.execute(
                anomalies.update()
                .where(anomalies.c.anomaly_id == anomaly_id)
                .values(state=state, by=by, note=note, updated_ms=self.now_ms())
            )
            record = _record(row)
            self.outbox.add(
                conn,
                _event(
                    Anomaly(
                        record.anomaly_id,
                        record.kind,
                        record.principal,
                        record.time_ms,
                        record.severity,
                        record.reason,
                        record.evidence,
                        record.event_ids,
                    ),
                    state,
                    by=by,
                    note=note,
                ),
            )
        self.on_change()
        return self.get(anomaly_id)


def _event(a: Anomaly, state: str, *, by: str, note: str) -> EventEnvelope:
    data = AuditAnomaly(
        anomaly_id=a.id,
        kind=a.kind,
        principal=a.principal,
        state=state,  # type: ignore[arg-type]
        severity=a.severity,
        reason=a.reason,
        evidence=a.evidence,
        event_ids=list(a.event_ids),
        by=by,
        note=note,
    )
    return EventEnvelope(
        type="gantry.audit.anomaly",
        source=SOURCE,
        actor=by or "audit",
        subject=f"anomaly/{a.id}",
        data=data.model_dump(mode="json"),
    )


def _record(row: Any) -> AnomalyRecord:
    return AnomalyRecord(
        anomaly_id=row.anomaly_id,
        kind=row.kind,
        principal=row.principal,
        state=row.state,
        severity=row.severity,
        reason=row.reason,
        evidence=orjson.loads(row.evidence_json),
        event_ids=tuple(orjson.loads(row.event_ids_json)),
        time_ms=row.time_ms,
        updated_ms=row.updated_ms,
        by=row.by,
        note=row.note,
    )


__all__ = ["STATES", "AnomalyRecord", "AnomalyWatch"]
