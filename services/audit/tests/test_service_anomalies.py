"""Anomaly detection in the running audit service (real nats-server): reads emitted by a
service are judged as they are logged, the anomaly is published and logged itself, auditors
list and resolve it (audited), others may not, and a restart remembers what it learned."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from gantry.audit.store import RecordFilter
from gantry.client.audit import Filter
from gantry.events import Emitter

from .conftest import Running, wait_for

pytestmark = pytest.mark.timeout(90)
START = dt.datetime.now(dt.UTC).replace(hour=10, minute=0, second=0, microsecond=0) - dt.timedelta(
    days=15
)


async def _emit(audit: Running, reads: list[tuple[dt.datetime, int]]) -> list[str]:
    key = audit.keyring.service_key("governance")
    async with await Emitter.connect(
        audit.settings.nats.url, source="gantry/governance", actor="governance", signer=key
    ) as em:
        events = [
            em.build(
                "gantry.data.accessed",
                {"dataset": "churn", "rows": rows, "view": "deidentified"},
                actor="dana",
                subject="dataset/churn",
            ).model_copy(update={"time": when})
            for when, rows in reads
        ]
        await em.emit_many(events)
    return [e.id for e in events]


async def test_a_bulk_read_is_raised_listed_and_resolved_by_an_auditor(audit: Running) -> None:
    history = [(START + dt.timedelta(days=d, hours=h), 1000) for d in range(14) for h in (0, 5)]
    await _emit(audit, history)
    await wait_for(lambda: audit.service.ledger.size >= len(history))
    [bulk] = await _emit(audit, [(START + dt.timedelta(days=14, hours=1), 250_000)])
    await wait_for(lambda: bool(audit.service.anomalies.list()))
    with audit.client() as auditor:
        [found] = await asyncio.to_thread(auditor.anomalies)
        assert (found.kind, found.principal, found.state) == ("bulk_read", "dana", "raised")
        assert bulk in found.event_ids and "250,000 rows today" in found.reason
        # the anomaly was published and is in the log itself
        await wait_for(lambda: _logged(audit, "gantry.audit.anomaly") >= 1)
        with audit.client("dave", "ml-developer") as developer:
            with pytest.raises(Exception, match="may not list anomaly"):
                await asyncio.to_thread(developer.anomalies)
        with pytest.raises(Exception, match="say why"):
            await asyncio.to_thread(auditor.resolve_anomaly, found.anomaly_id, "dismissed")
        done = await asyncio.to_thread(
            auditor.resolve_anomaly, found.anomaly_id, "acknowledged", "asked dana"
        )
        assert (done.state, done.by, done.note) == ("acknowledged", "carol", "asked dana")
        assert [
            a.anomaly_id for a in await asyncio.to_thread(auditor.anomalies, state="raised")
        ] == []
        await wait_for(lambda: _logged(audit, "gantry.audit.anomaly") >= 2)
        records = await asyncio.to_thread(
            lambda: list(auditor.query(Filter(types=["gantry.audit.anomaly"])))
        )
        assert {r.actor for r in records} == {"audit", "carol"}


def _logged(audit: Running, type_: str) -> int:
    return len(audit.service.ledger.store.query(RecordFilter(types=(type_,)), -1, 100))
