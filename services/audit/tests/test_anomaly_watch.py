"""The anomaly watch over a real ledger (no NATS): what the log appends is judged, findings are
stored with their outbox event once, and a restarted watch primed from the log remembers each
principal's behaviour."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import pytest
import sqlalchemy as sa

from gantry.audit.anomalies import AnomalyWatch
from gantry.audit.ledger import Ledger
from gantry.audit.store import Store, connect, migrate, outbox
from gantry.core import Conflict, InvalidInput, NotFound
from gantry.events import EventEnvelope, Outbox
from gantry.security import SigningKey
from gantry.testing.access_month import simulate_month

NOW = dt.datetime(2026, 4, 1, tzinfo=dt.UTC)


def _watch(engine: sa.Engine) -> AnomalyWatch:
    return AnomalyWatch(engine, Outbox(outbox), now_ms=lambda: int(NOW.timestamp() * 1000))


def _published(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(outbox)).scalar() or 0)


def test_a_month_through_the_ledger_and_a_restart(tmp_path: Path) -> None:
    engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
    migrate(engine)
    ledger = Ledger(
        Store(engine), seal_key=secrets.token_bytes(32), signer=SigningKey.generate("svc-audit")
    )
    ledger.open()
    month = simulate_month(0)
    cut = next(i for i, e in enumerate(month.events) if e.id == month.injected[0].event_ids[0])
    watch = _watch(engine)
    for start in range(0, cut, 500):
        batch = month.events[start : min(start + 500, cut)]
        watch.observe(ledger.append_new([(e, e.canonical_bytes()) for e in batch]))
    before = len(watch.list(limit=1000))
    assert _published(engine) >= before  # every finding went out with its event
    # a restart: a new watch primed from the log judges the rest as the first one would have
    again = _watch(engine)
    assert again.prime() == sum(
        1 for e in month.events[:cut] if e.type.startswith(("gantry.data", "gantry.authz"))
    )
    rest = month.events[cut:]
    for start in range(0, len(rest), 500):
        batch = rest[start : start + 500]
        again.observe(ledger.append_new([(e, e.canonical_bytes()) for e in batch]))
    found = again.list(limit=1000)
    kinds = {a.kind for a in found if set(a.event_ids) & set(month.injected[0].event_ids)}
    assert month.injected[0].kind in kinds
    caught = [
        inj for inj in month.injected if any(set(a.event_ids) & set(inj.event_ids) for a in found)
    ]
    assert len(caught) == len(month.injected)
    # replaying what is already logged raises nothing twice
    assert again.observe(ledger.append_new([(e, e.canonical_bytes()) for e in rest])) == []
    engine.dispose()


def test_resolving_an_anomaly(tmp_path: Path) -> None:
    engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
    migrate(engine)
    watch = _watch(engine)
    reads = [
        EventEnvelope(
            type="gantry.data.accessed",
            source="t",
            actor="eve",
            time=NOW - dt.timedelta(days=20 - d),
            data={"dataset": "churn", "rows": 100 if d < 19 else 90_000},
        )
        for d in range(20)
    ]
    [anomaly] = watch.observe(reads)
    with pytest.raises(InvalidInput, match="say why"):
        watch.resolve(anomaly.id, "dismissed", by="carol", note=" ")
    with pytest.raises(InvalidInput, match="acknowledged or dismissed"):
        watch.resolve(anomaly.id, "raised", by="carol", note="x")
    with pytest.raises(NotFound):
        watch.resolve("nope", "acknowledged", by="carol", note="")
    done = watch.resolve(anomaly.id, "dismissed", by="carol", note="a planned backfill")
    assert (done.state, done.by, done.note) == ("dismissed", "carol", "a planned backfill")
    with pytest.raises(Conflict):
        watch.resolve(anomaly.id, "acknowledged", by="carol", note="")
    assert [a.anomaly_id for a in watch.list(state="dismissed")] == [anomaly.id]
    assert _published(engine) == 2  # raised, dismissed
    engine.dispose()
