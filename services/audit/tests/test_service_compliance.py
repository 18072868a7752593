"""The compliance API of the running audit service (real nats-server, SQLite and PostgreSQL):
retention rules, legal holds, purges, archival and signed reports for auditors — and none of it
for anyone else. Every change is itself logged."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pytest

from gantry.audit.store import RecordFilter
from gantry.client.audit import AuditClient
from gantry.client.errors import RemotePermissionDenied
from gantry.core import GantryError
from gantry.events import Emitter

from .conftest import Running, wait_for

pytestmark = pytest.mark.timeout(120)
OLD = dt.datetime.now(dt.UTC) - dt.timedelta(days=400)


async def _emit_old_reads(audit: Running, n: int, actor: str) -> None:
    key = audit.keyring.service_key("governance")
    async with await Emitter.connect(
        audit.settings.nats.url, source="gantry/governance", actor="governance", signer=key
    ) as em:
        await em.emit_many(
            [
                em.build(
                    "gantry.data.accessed",
                    {"dataset": "churn", "rows": 10 + i, "view": "deidentified"},
                    actor=actor,
                    subject="dataset/churn",
                ).model_copy(update={"time": OLD + dt.timedelta(minutes=i)})
                for i in range(n)
            ]
        )


def _logged(audit: Running, type_: str) -> int:
    return len(audit.service.ledger.store.query(RecordFilter(types=(type_,)), -1, 1000))


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def test_retention_holds_purge_and_reports_for_auditors(audit: Running) -> None:
    await _emit_old_reads(audit, 6, "dana")
    await _emit_old_reads(audit, 4, "erin")
    await wait_for(lambda: audit.service.ledger.size >= 10)
    await wait_for(lambda: audit.service.ledger.last_checkpoint_size >= 10)
    with audit.client() as auditor:
        rule = await _call(auditor.set_retention, "gantry.data.accessed", 365)
        assert (rule.event_type, rule.keep_days, rule.updated_by) == (
            "gantry.data.accessed", 365, "carol",
        )  # fmt: skip
        hold = await _call(auditor.place_hold, "case-7", reason="litigation", principals=["dana"])
        assert hold.state == "active" and list(hold.principals) == ["dana"]
        dry = await _call(auditor.purge, dry_run=True)
        assert (dry.events, dry.held_back, dry.purge_id) == (4, 6, "")
        done = await _call(auditor.purge)
        assert (done.events, done.held_back) == (4, 6) and done.purge_id
        assert dict(done.by_type) == {"gantry.data.accessed": 4}
        released = await _call(auditor.release_hold, "case-7", note="case closed")
        assert (released.state, released.released_by) == ("released", "carol")
        assert (await _call(auditor.purge)).events == 6
        assert [h.name for h in await _call(auditor.holds, include_released=True)] == ["case-7"]
        # the log still verifies, and the purges and hold changes are in it
        await wait_for(lambda: _logged(audit, "gantry.audit.purged") >= 2)
        await wait_for(lambda: _logged(audit, "gantry.audit.hold.changed") >= 2)
        await wait_for(
            lambda: audit.service.ledger.last_checkpoint_size == audit.service.ledger.size
        )
        assert (await _call(auditor.verify)).ok
        # nothing is old enough to archive with the default 90 days
        assert (await _call(auditor.archive, dry_run=True)).events == 0

        since = int((OLD - dt.timedelta(days=1)).timestamp() * 1000)
        until = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        report = await _call(auditor.generate_report, "custom", since_ms=since, until_ms=until)
        assert report.created_by == "carol" and set(report.formats) == {"json", "csv", "pdf"}
        assert report.report_id in [r.report_id for r in await _call(auditor.reports)]
        pdf = await _call(auditor.download_report, report.report_id, "pdf")
        assert pdf.startswith(b"%PDF")
        document = await _call(auditor.download_report, report.report_id, "json")
        assert json.loads(document)["report"]["tree_head"]["tree_size"] == (
            report.tree_head.tree_size
        )
        checked = await _call(auditor.verify_report, report_id=report.report_id)
        assert checked.ok and checked.signature_ok and checked.consistent and checked.figures_match
        forged = json.loads(document)
        forged["report"]["figures"]["totals"]["events"] += 1
        refused = await _call(auditor.verify_report, report_json=json.dumps(forged).encode())
        assert not refused.ok and not refused.signature_ok
        await wait_for(lambda: _logged(audit, "gantry.audit.report.ready") >= 1)


CALLS: list[tuple[str, Callable[[AuditClient], Any]]] = [
    ("set retention", lambda c: c.set_retention("*", 30)),
    ("list retention", lambda c: c.retention()),
    ("place hold", lambda c: c.place_hold("h", reason="r", principals=["x"])),
    ("release hold", lambda c: c.release_hold("h", note="n")),
    ("list holds", lambda c: c.holds()),
    ("archive", lambda c: c.archive(dry_run=True)),
    ("segments", lambda c: c.segments()),
    ("verify segment", lambda c: c.verify_segment(0)),
    ("purge", lambda c: c.purge(dry_run=True)),
    ("generate report", lambda c: c.generate_report("daily")),
    ("list reports", lambda c: c.reports()),
    ("download report", lambda c: c.download_report("r", "pdf")),
    ("verify report", lambda c: c.verify_report(report_id="r")),
    ("subject report", lambda c: c.subject_report("a@example.com", reason="x")),
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_only_auditors_may_use_any_of_it(audit: Running) -> None:
    for role in ("ml-developer", "data-steward", "service", "annotator"):
        with audit.client("mallory", role) as other:
            for what, call in CALLS:
                with pytest.raises(RemotePermissionDenied):
                    await _call(call, other)
                    pytest.fail(f"{role} could {what}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_bad_requests_get_clear_errors(audit: Running) -> None:
    with audit.client() as auditor:
        with pytest.raises(GantryError, match="note"):
            await _call(auditor.release_hold, "nothing", note="")
        with pytest.raises(GantryError) as bad_rule:
            await _call(auditor.set_retention, "gantry.data.*x", 10)
        assert "gantry.data.*x" in str(bad_rule.value)
        with pytest.raises(GantryError, match=r"not found|no report"):
            await _call(auditor.download_report, "nope", "pdf")
        # without a governance service to ask, a subject report says what is missing
        with pytest.raises(GantryError, match="governance"):
            await _call(auditor.subject_report, "a@example.com", reason="DSAR-1")
