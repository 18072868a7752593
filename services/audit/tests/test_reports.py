"""Unit tests of compliance reports (no NATS): figures, renderings, signing, storage, verifying,
periods and the schedule — on a real ledger in a temporary SQLite database and a local,
encrypted object store."""

from __future__ import annotations

import base64
import copy
import csv
import datetime as dt
import hashlib
import io
import json
import re
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pydantic
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gantry.audit.ledger import Ledger
from gantry.audit.report_figures import compute_figures, summary_of
from gantry.audit.report_render import render_csv, render_pdf
from gantry.audit.reports import (
    Reports,
    ReportSettings,
    due_reports,
    parse_report,
    period_bounds,
    request_bounds,
)
from gantry.audit.store import Store, connect, events, migrate, outbox, reports
from gantry.core import InvalidInput, ManualClock, NotFound
from gantry.events import EventEnvelope
from gantry.security import SigningKey, TrustStore
from gantry.security.treehead import TreeHead
from gantry.storage import ObjectStore, StorageSettings, open_store

pytestmark = pytest.mark.timeout(60)

UTC = dt.UTC
DAY = dt.datetime(2026, 3, 10, tzinfo=UTC)  # a Tuesday
SINCE = int(DAY.timestamp() * 1000)
UNTIL = SINCE + 86_400_000


def at(hour: float, day: dt.datetime = DAY) -> dt.datetime:
    return day + dt.timedelta(hours=hour)


def event(type_: str, actor: str, data: dict[str, Any], when: dt.datetime) -> EventEnvelope:
    return EventEnvelope(type=type_, source="test/reports", actor=actor, time=when, data=data)


def read(actor: str, dataset: str, rows: int, when: dt.datetime, **extra: Any) -> EventEnvelope:
    return event("gantry.data.accessed", actor, {"dataset": dataset, "rows": rows, **extra}, when)


def authz(
    principal: str, action: str, kind: str, name: str, decision: str, when: dt.datetime
) -> EventEnvelope:
    data = {
        "principal": principal,
        "action": action,
        "resource_kind": kind,
        "resource_name": name,
        "decision": decision,
        "reason": "policy",
    }
    return event("gantry.authz.decision", "svc-governance", data, when)


def anomaly(
    aid: str, kind: str, who: str, state: str, when: dt.datetime, **extra: Any
) -> EventEnvelope:
    data = {
        "anomaly_id": aid,
        "kind": kind,
        "principal": who,
        "state": state,
        "severity": 2.5,
        "reason": f"{who} did {kind}",
        **extra,
    }
    return event("gantry.audit.anomaly", "svc-audit", data, when)


def day_events() -> list[EventEnvelope]:
    """A day of audited activity, and one event the day before (outside the period)."""
    return [
        read("alice", "orders", 999, at(-2)),  # the day before
        read("alice", "customers", 100, at(9)),
        read("alice", "customers", 50, at(10), view="raw"),
        read("bob", "customers", 7, at(11)),
        read("mallory", "customers", 0, at(12), view="raw", decision="deny", reason="no grant"),
        read("bob", "orders", 3, at(13)),
        authz("mallory", "read", "dataset", "customers", "deny", at(12.1)),
        authz("mallory", "read", "dataset", "customers", "deny", at(12.2)),
        authz("alice", "read", "dataset", "customers", "allow", at(8.9)),
        authz("eve", "cancel", "job", "j1", "deny", at(14)),
        anomaly("a1", "bulk_read", "alice", "raised", at(15)),
        anomaly("a1", "bulk_read", "alice", "acknowledged", at(16), by="carol", note="SEC-12"),
        anomaly("a2", "denial_storm", "mallory", "raised", at(17)),
        event(
            "gantry.data.keys.rotated",
            "svc-governance",
            {"active_version": 2, "rewrapped": 10, "retired": [1]},
            at(18),
        ),
        event(
            "gantry.serving.deployment.changed",
            "dave",
            {
                "deployment": "fraud",
                "model": "fraud-model",
                "action": "promoted",
                "versions": [{"version": 2, "weight": 100, "role": "stable"}],
                "detail": "canary passed",
            },
            at(19),
        ),
        event(
            "gantry.data.subject.erased",
            "carol",
            {
                "erasure_id": "e1",
                "subject_ref": "ref-1",
                "requested_by": "carol",
                "datasets": [{"dataset": "customers", "new_version": "v2", "rows_removed": 4}],
                "models_to_retrain": ["fraud-model:2"],
            },
            at(20),
        ),
    ]


@dataclass
class Env:
    ledger: Ledger
    store: Store
    engine: sa.Engine
    objects: ObjectStore
    signer: SigningKey
    trust: TrustStore
    reports: Reports
    clock: ManualClock
    data_dir: Path

    def append(self, evs: list[EventEnvelope]) -> None:
        self.ledger.append([(e, e.canonical_bytes()) for e in evs])
        assert self.ledger.checkpoint() is not None

    def make(self, **kwargs: Any) -> Reports:
        return Reports(
            self.engine,
            self.store,
            self.objects,
            self.signer,
            kwargs.pop("tree_heads", lambda: self.ledger.tree_head()),
            self.store.live_events,
            kwargs.pop("settings", ReportSettings()),
            clock=self.clock,
        )

    def verify(self, doc: dict[str, Any]) -> Any:
        return self.reports.verify(doc, self.trust, self.store.live_events, self.ledger.consistency)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
    migrate(engine)
    store = Store(engine)
    signer = SigningKey.generate(kid="svc-audit")
    trust = TrustStore({signer.kid: signer.public_key_bytes()})
    ledger = Ledger(store, seal_key=secrets.token_bytes(32), signer=signer)
    ledger.open()
    objects = open_store(StorageSettings(), data_dir=tmp_path)
    clock = ManualClock(at(25))
    made = Reports(engine, store, objects, signer, ledger.tree_head, store.live_events, clock=clock)
    e = Env(ledger, store, engine, objects, signer, trust, made, clock, tmp_path)
    e.append(day_events())
    yield e
    engine.dispose()


def figures_of(env: Env) -> dict[str, Any]:
    size = env.ledger.tree_head().tree_size
    return compute_figures(env.store.live_events(SINCE, UNTIL, size), SINCE, UNTIL)


# -- figures ----------------------------------------------------------------------------------


def test_figures_count_the_period(env: Env) -> None:
    f = figures_of(env)
    assert f["totals"]["events"] == 15  # the read of the day before is not in the period
    assert f["totals"]["by_type"]["gantry.data.accessed"] == 5
    assert f["totals"]["by_type"]["gantry.authz.decision"] == 4
    assert f["totals"]["purged_events"] == 0

    assert [d["dataset"] for d in f["datasets"]] == ["customers", "orders"]
    by_name = {d["dataset"]: d for d in f["datasets"]}
    customers, orders = by_name["customers"], by_name["orders"]
    assert customers == {
        "dataset": "customers",
        "reads_allowed": 3,
        "reads_denied": 1,
        "rows_read": 157,
        "raw_reads": 1,
        "deidentified_reads": 2,
        "principals": 2,
        "readers": ["alice", "bob"],
        "authz_allowed": 1,
        "authz_denied": 2,
    }
    assert orders["rows_read"] == 3 and orders["reads_allowed"] == 1  # 999 was the day before

    # a denied read and the denied API calls on the same dataset are one (principal, action,
    # resource); the job cancel is another
    assert f["denials"] == {
        "total": 4,
        "distinct": 2,
        "top": [
            {"principal": "mallory", "action": "read", "resource": "dataset/customers", "count": 3},
            {"principal": "eve", "action": "cancel", "resource": "job/j1", "count": 1},
        ],
    }

    an = f["anomalies"]
    assert an["by_state"] == {"acknowledged": 1, "raised": 1}
    assert an["by_kind"] == {"bulk_read": {"acknowledged": 1}, "denial_storm": {"raised": 1}}
    a1 = an["items"][0]
    assert (a1["anomaly_id"], a1["state"], a1["by"], a1["note"], a1["events"]) == (
        "a1", "acknowledged", "carol", "SEC-12", 2,
    )  # fmt: skip
    assert a1["time_ms"] == int(at(15).timestamp() * 1000)

    assert [r["data"]["active_version"] for r in f["key_rotations"]] == [2]
    assert f["key_rotations"][0]["actor"] == "svc-governance"
    dep = f["deployments"][0]
    assert (dep["deployment"], dep["action"], dep["actor"], dep["versions"][0]["version"]) == (
        "fraud", "promoted", "dave", 2,
    )  # fmt: skip
    assert f["erasures"][0]["rows_removed"] == 4
    assert f["erasures"][0]["models_to_retrain"] == ["fraud-model:2"]
    assert f["holds"] == f["retention"] == f["purges"] == f["archives"] == []

    s = summary_of(f)
    assert (s["events"], s["rows_read"], s["denials"], s["anomalies_open"]) == (15, 160, 4, 1)


def test_figures_are_deterministic_and_count_purged_events_only(env: Env) -> None:
    first = figures_of(env)
    assert orjson.dumps(first, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        figures_of(env), option=orjson.OPT_SORT_KEYS
    )
    with env.engine.begin() as conn:  # what a purge leaves: the row, without its bytes
        conn.execute(events.update().where(events.c.seq == 1).values(state="purged"))
    after = figures_of(env)
    assert after["totals"]["purged_events"] == 1
    assert after["totals"]["events"] == 14
    by_name = {d["dataset"]: d for d in after["datasets"]}
    assert by_name["customers"]["rows_read"] == 57


# -- generating, storing, rendering -----------------------------------------------------------


def test_generate_signs_stores_encrypted_and_announces(env: Env) -> None:
    rec = env.reports.generate("daily", SINCE, UNTIL, by="carol")
    head = env.ledger.tree_head()
    assert rec.tree_head == head  # the full signed head, also when read back
    assert env.reports.get(rec.report_id) == rec
    assert rec.formats == ("json", "csv", "pdf")
    assert rec.summary["rows_read"] == 160

    raw = env.reports.download(rec.report_id, "json")
    doc = parse_report(raw)
    assert doc["digest"] == rec.digest
    assert hashlib.sha256(orjson.dumps(doc["report"], option=orjson.OPT_SORT_KEYS)).hexdigest() == (
        rec.digest
    )
    assert doc["report"]["tree_head"]["root_hash"] == head.root_hash.hex()
    assert doc["report"]["created_by"] == "carol"

    with env.engine.connect() as conn:
        payloads = [orjson.loads(p) for p in conn.execute(sa.select(outbox.c.payload)).scalars()]
    ready = [p for p in payloads if p["type"] == "gantry.audit.report.ready"]
    assert len(ready) == 1
    assert ready[0]["data"]["report_id"] == rec.report_id
    assert ready[0]["data"]["digest"] == rec.digest
    assert ready[0]["data"]["formats"] == ["json", "csv", "pdf"]

    # every stored byte is encrypted: no figure, name or digest is readable on disk
    files = [p for p in (env.data_dir / "objects").rglob("*") if p.is_file()]
    assert files
    for path in files:
        blob = path.read_bytes()
        assert rec.digest.encode() not in blob
        assert b"fraud-model" not in blob
        assert b"mallory" not in blob


def test_csv_has_every_section(env: Env) -> None:
    rec = env.reports.generate("daily", SINCE, UNTIL)
    text = env.reports.download(rec.report_id, "csv").decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert next(iter(csv.reader(io.StringIO(text))))[0] == "section"
    sections = {r["section"] for r in rows}
    assert {
        "report", "totals", "events_by_type", "datasets", "denials", "anomalies",
        "key_rotations", "deployments", "erasures",
    } <= sections  # fmt: skip
    customers = next(r for r in rows if r["section"] == "datasets" and r["dataset"] == "customers")
    assert customers["rows_read"] == "157"
    assert customers["readers"] == "alice bob"
    report = {r["field"]: r["value"] for r in rows if r["section"] == "report"}
    assert report["digest"] == rec.digest
    assert report["root_hash"] == rec.tree_head.root_hash.hex()
    # the section order is fixed
    order = [r["section"] for r in rows]
    assert order.index("report") < order.index("datasets") < order.index("erasures")


def test_csv_cells_cannot_be_formulas() -> None:
    figures = compute_figures([], 0, 1)
    figures["denials"]["top"] = [
        {"principal": "=HYPERLINK(1)", "action": "read", "resource": "x", "count": 1}
    ]
    text = render_csv({"report": {"figures": figures}}).decode()
    assert "'=HYPERLINK(1)" in text


def pdf_text(pdf: bytes) -> bytes:
    """The PDF's content streams, inflated. Each deflate stream is read until it ends by
    itself: compressed bytes may contain anything, "endstream" included."""
    out = b""
    for m in re.finditer(rb"stream\r?\n", pdf):
        inflater = zlib.decompressobj()
        try:
            out += inflater.decompress(pdf[m.end() :])
        except zlib.error:
            continue
    return out


def test_pdf_shows_the_tree_head_and_digest(env: Env) -> None:
    rec = env.reports.generate("daily", SINCE, UNTIL)
    pdf = env.reports.download(rec.report_id, "pdf")
    assert pdf.startswith(b"%PDF")
    text = pdf_text(pdf)
    assert rec.tree_head.root_hash.hex().encode() in text
    assert b"Tree size: " + str(rec.tree_head.tree_size).encode() in text
    assert rec.digest[:40].encode() in text
    assert b"Dataset access" in text and b"customers" in text


def test_pdf_survives_text_outside_latin1() -> None:
    figures = compute_figures([], 0, 1)
    figures["anomalies"]["items"] = [
        {"anomaly_id": "x", "kind": "k", "principal": "李雷 — ✓", "state": "raised", "time_ms": 0}
    ]
    assert render_pdf({"report": {"figures": figures, "period": "custom"}}).startswith(b"%PDF")


def test_a_failed_generate_leaves_nothing(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(conn: Any, ev: Any) -> None:
        raise RuntimeError("database went away")

    monkeypatch.setattr(env.reports._outbox, "add", broken)
    with pytest.raises(RuntimeError):
        env.reports.generate("daily", SINCE, UNTIL)
    assert list(env.objects.names("audit/reports/")) == []
    with env.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(reports)).scalar() == 0


def test_list_get_download_errors(env: Env) -> None:
    daily = env.reports.generate("daily", SINCE, UNTIL)
    weekly_since, weekly_until = period_bounds("weekly", at(24), "UTC")
    weekly = env.reports.generate("weekly", weekly_since, weekly_until)
    assert [r.report_id for r in env.reports.list()] == [daily.report_id, weekly.report_id]
    assert [r.report_id for r in env.reports.list("weekly")] == [weekly.report_id]
    assert len(env.reports.list(limit=1)) == 1
    with pytest.raises(InvalidInput):
        env.reports.list("hourly")
    with pytest.raises(NotFound):
        env.reports.get("nope")
    with pytest.raises(InvalidInput):
        env.reports.download(daily.report_id, "xlsx")
    with pytest.raises(InvalidInput):
        env.reports.generate("daily", UNTIL, SINCE)

    json_only = env.make(settings=ReportSettings(formats=["json"]))
    rec = json_only.generate("custom", SINCE, UNTIL)
    assert rec.formats == ("json",)
    with pytest.raises(NotFound, match="stored as json"):
        json_only.download(rec.report_id, "pdf")


# -- verifying ---------------------------------------------------------------------------------


def test_a_report_verifies_and_still_does_after_the_log_grows(env: Env) -> None:
    rec = env.reports.generate("daily", SINCE, UNTIL)
    doc = env.reports.document(rec.report_id)
    result = env.verify(doc)
    assert result.ok, result.problems
    assert result.digest == rec.digest
    assert result.tree_head == rec.tree_head

    # late events of the same day and new ones: figures are read from the first tree_size only
    env.append([read("zed", "customers", 1000, at(21)), read("zed", "orders", 1, at(30))])
    result = env.verify(doc)
    assert result.ok, result.problems
    assert (result.signature_ok, result.consistent, result.figures_match) == (True, True, True)


def test_the_digest_and_signature_check_with_the_standard_library(env: Env) -> None:
    """The recipe in docs/compliance.md#verifying-a-report-independently."""
    env.append([anomaly("a3", "unusual_hour", "jörg", "dismissed", at(22), note="geprüft — ok")])
    raw = env.reports.download(env.reports.generate("daily", SINCE, UNTIL).report_id, "json")
    signed = json.loads(raw.decode("utf-8"))
    body = json.dumps(signed["report"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    assert digest == signed["digest"]
    public = Ed25519PublicKey.from_public_bytes(env.signer.public_key_bytes())
    public.verify(
        base64.b64decode(signed["signature"]), b"gantry.audit.report.v1\n" + digest.encode()
    )


def test_a_tampered_figure_breaks_the_signature(env: Env) -> None:
    doc = env.reports.document(env.reports.generate("daily", SINCE, UNTIL).report_id)
    forged = copy.deepcopy(doc)
    forged["report"]["figures"]["datasets"][0]["rows_read"] -= 100
    result = env.verify(forged)
    assert not result.ok
    assert not result.signature_ok
    assert result.consistent
    assert not result.figures_match
    text = " ".join(result.problems)
    assert "altered after it was signed" in text
    assert "rows_read: report 57, log 157" in text


def test_a_report_from_another_log_is_not_consistent(env: Env) -> None:
    real = env.ledger.tree_head()
    fork = TreeHead(real.tree_size, hashlib.sha256(b"fork").digest(), real.timestamp_ms)
    forked = env.make(tree_heads=lambda: fork.signed(env.signer))
    doc = forked.document(forked.generate("daily", SINCE, UNTIL).report_id)
    result = env.verify(doc)
    assert result.signature_ok  # signed with the right key...
    assert result.figures_match
    assert not result.consistent  # ...but its tree head is not this log's
    assert not result.ok
    assert any("not a prefix" in p for p in result.problems)


def test_purged_events_are_explained(env: Env) -> None:
    doc = env.reports.document(env.reports.generate("daily", SINCE, UNTIL).report_id)
    with env.engine.begin() as conn:
        conn.execute(events.update().where(events.c.seq.in_([2, 3])).values(state="purged"))
    result = env.verify(doc)
    assert result.signature_ok and result.consistent
    assert not result.figures_match
    assert result.problems[0].startswith("2 events in the period were purged since the report")


def test_garbage_is_not_a_report(env: Env) -> None:
    with pytest.raises(InvalidInput, match="not a signed compliance report"):
        env.verify({"report": {"since_ms": 1}})
    with pytest.raises(InvalidInput):
        parse_report(b"%PDF-1.3")


# -- periods and the schedule -------------------------------------------------------------------


def ms(year: int, month: int, day: int, hour: int = 0) -> int:
    """Unix milliseconds of a UTC time."""
    return int(dt.datetime(year, month, day, hour, tzinfo=UTC).timestamp() * 1000)


def test_period_bounds_in_utc() -> None:
    now = at(15)  # Tuesday 2026-03-10 15:00
    assert period_bounds("daily", now, "UTC") == (ms(2026, 3, 9), ms(2026, 3, 10))
    assert period_bounds("weekly", now, "UTC") == (ms(2026, 3, 2), ms(2026, 3, 9))
    assert period_bounds("monthly", now, "UTC") == (ms(2026, 2, 1), ms(2026, 3, 1))
    assert period_bounds("monthly", dt.datetime(2026, 1, 15, tzinfo=UTC), "UTC") == (
        ms(2025, 12, 1), ms(2026, 1, 1),
    )  # fmt: skip
    # exactly at midnight the day that just ended is the last whole one
    assert period_bounds("daily", DAY, "UTC") == (ms(2026, 3, 9), ms(2026, 3, 10))
    with pytest.raises(InvalidInput):
        period_bounds("hourly", now, "UTC")
    with pytest.raises(InvalidInput):
        period_bounds("daily", dt.datetime(2026, 3, 10), "UTC")
    with pytest.raises(InvalidInput, match="time zone"):
        period_bounds("daily", now, "Mars/Olympus")


def test_period_bounds_across_dst_in_berlin() -> None:
    hour = 3_600_000
    # clocks went forward on Sunday 2026-03-29 (02:00 -> 03:00)
    since, until = period_bounds("daily", dt.datetime(2026, 3, 30, 8, tzinfo=UTC), "Europe/Berlin")
    assert (since, until) == (ms(2026, 3, 28, 23), ms(2026, 3, 29, 22))
    assert until - since == 23 * hour
    since, until = period_bounds("weekly", dt.datetime(2026, 3, 30, 8, tzinfo=UTC), "Europe/Berlin")
    assert (since, until) == (ms(2026, 3, 22, 23), ms(2026, 3, 29, 22))  # Monday 00:00 local
    since, until = period_bounds("monthly", dt.datetime(2026, 4, 2, tzinfo=UTC), "Europe/Berlin")
    assert (since, until) == (ms(2026, 2, 28, 23), ms(2026, 3, 31, 22))
    assert until - since == 31 * 24 * hour - hour
    # and back on Sunday 2026-10-25: a 25-hour day
    since, until = period_bounds("daily", dt.datetime(2026, 10, 26, 8, tzinfo=UTC), "Europe/Berlin")
    assert until - since == 25 * hour
    # 00:30 Berlin on the 30th is still the 29th in UTC: the day is Berlin's
    since, _ = period_bounds("daily", dt.datetime(2026, 3, 29, 22, 30, tzinfo=UTC), "Europe/Berlin")
    assert since == ms(2026, 3, 28, 23)


def test_request_bounds() -> None:
    now = at(15)
    assert request_bounds("weekly", 0, 0, now, "UTC") == period_bounds("weekly", now, "UTC")
    assert request_bounds("custom", 5, 10, now, "UTC") == (5, 10)
    with pytest.raises(InvalidInput):
        request_bounds("custom", 10, 5, now, "UTC")
    with pytest.raises(InvalidInput, match="future"):
        request_bounds("custom", 0, ms(2030, 1, 1), now, "UTC")


def test_due_reports_skips_existing_and_waits_for_the_delay() -> None:
    now = dt.datetime(2026, 3, 10, 0, 10, tzinfo=UTC)  # just after Monday ended
    existing = {("daily", ms(2026, 3, 9))}
    assert due_reports(now, "UTC", ["daily", "weekly", "monthly"], existing) == [
        ("weekly", ms(2026, 3, 2), ms(2026, 3, 9)),
        ("monthly", ms(2026, 2, 1), ms(2026, 3, 1)),
    ]
    assert due_reports(now, "UTC", ["daily"], set()) == [("daily", ms(2026, 3, 9), ms(2026, 3, 10))]
    assert due_reports(now, "UTC", [], set()) == []
    # ten minutes after midnight, with a 15-minute delay, yesterday is not due yet
    early = due_reports(now, "UTC", ["daily"], {("daily", ms(2026, 3, 8))}, delay_s=900)
    assert early == []


def test_generate_due_makes_each_report_once(env: Env) -> None:
    env.clock._now = dt.datetime(2026, 3, 11, 0, 10, tzinfo=UTC)
    made = env.reports.generate_due()
    # the log began on 10 March: last week and February ended before it, nothing to report
    assert sorted(r.period for r in made) == ["daily"]
    daily = next(r for r in made if r.period == "daily")
    assert (daily.since_ms, daily.until_ms, daily.created_by) == (SINCE, UNTIL, "")
    assert env.reports.generate_due() == []
    env.clock._now = dt.datetime(2026, 4, 1, 0, 10, tzinfo=UTC)  # March and its weeks ended
    assert sorted(r.period for r in env.reports.generate_due()) == ["daily", "monthly", "weekly"]
    off = env.make(settings=ReportSettings(enabled=False))
    env.clock._now += dt.timedelta(days=1)
    assert off.generate_due() == []


def test_report_settings_validate() -> None:
    s = ReportSettings()
    assert s.schedule == ["daily", "weekly", "monthly"]
    assert s.formats == ["json", "csv", "pdf"]
    assert ReportSettings(formats=["pdf"]).formats == ["json", "pdf"]  # json is always kept
    assert ReportSettings.model_validate({"schedule": "monthly,daily"}).schedule == [
        "daily", "monthly",
    ]  # fmt: skip
    with pytest.raises(pydantic.ValidationError, match="IANA"):
        ReportSettings(timezone="Europe/Nowhere")
    with pytest.raises(pydantic.ValidationError):
        ReportSettings.model_validate({"schedule": ["hourly"]})
