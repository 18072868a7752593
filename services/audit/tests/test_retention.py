"""Retention rules, legal holds and the purge: only expired, unheld events are deleted, and the
log still verifies after they are."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gantry.audit.archive import segment_name
from gantry.audit.ledger import seal_of
from gantry.audit.retention import Retention, RetentionRule, RetentionSettings, rule_for
from gantry.audit.store import events, purged, segments
from gantry.core import AlreadyExists, Conflict, InvalidInput, NotFound
from gantry.events import EventEnvelope
from gantry.security.merkle import leaf_hash
from gantry.security.treehead import check_inclusion

from .test_archive import (
    DAY_MS,
    NOW_MS,
    Env,
    append,
    event,
    make_env,
    outbox_data,
    outbox_types,
    rows,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(tmp_path)
    yield e
    e.engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    url = str(request.getfixturevalue("postgres_url")) if request.param == "postgres" else None
    e = make_env(tmp_path, url)
    yield e
    e.engine.dispose()


def purged_seqs(env: Env) -> list[int]:
    return [r.seq for r in rows(env.engine) if r.state == "purged"]


def canonical(evs: Sequence[EventEnvelope]) -> list[bytes]:
    return [e.canonical_bytes() for e in evs]


def test_the_most_specific_rule_wins() -> None:
    def rule(pattern: str, days: int) -> RetentionRule:
        return RetentionRule(pattern, days, "carol", 0)

    rules = [
        rule("*", 3650),
        rule("gantry.*", 1000),
        rule("gantry.authz.*", 30),
        rule("gantry.authz.decision", 400),
        rule("gantry.data.*", 2000),
    ]
    assert rule_for("gantry.authz.decision", rules) == rules[3]  # exact beats any prefix
    assert rule_for("gantry.authz.other", rules) == rules[2]  # the longest prefix
    assert rule_for("gantry.data.accessed", rules) == rules[4]
    assert rule_for("gantry.job.succeeded", rules) == rules[1]
    assert rule_for("ext.hr.hired", rules) == rules[0]  # '*' last
    assert rule_for("ext.hr.hired", rules[1:]) is None  # no rule: kept for ever
    # order of the rules does not matter
    assert rule_for("gantry.authz.other", list(reversed(rules))) == rules[2]


def test_rules_are_validated_stored_replaced_and_removed(env: Env) -> None:
    r = env.retention
    for bad in ("Gantry.data.accessed", "gantry.*.accessed", "*gantry", "", "gantry data", "**"):
        with pytest.raises(InvalidInput, match="not an event type") as err:
            r.set_rule(bad, 30, "carol")
        assert err.value.hint and "prefix" in err.value.hint
    for days in (-1, 36_501):
        with pytest.raises(InvalidInput, match=r"keep_days must be 1\.\.36500"):
            r.set_rule("gantry.data.accessed", days, "carol")
    with pytest.raises(NotFound, match="retention rule"):
        r.set_rule("gantry.data.accessed", 0, "carol")
    assert r.rules() == []

    r.set_rule("gantry.authz.*", 30, "carol")
    r.set_rule("*", 36_500, "carol")
    assert r.set_rule("gantry.authz.*", 60, "dave") == RetentionRule(
        "gantry.authz.*", 60, "dave", NOW_MS
    )
    assert [(x.event_type, x.keep_days, x.updated_by) for x in r.rules()] == [
        ("*", 36_500, "carol"),
        ("gantry.authz.*", 60, "dave"),
    ]
    assert r.set_rule("*", 0, "dave").keep_days == 0
    assert [x.event_type for x in r.rules()] == ["gantry.authz.*"]
    changes = outbox_data(env.engine, "gantry.audit.retention.changed")
    assert changes[-1] == {"event_type": "*", "keep_days": 0, "by": "dave"}
    assert len(changes) == 4


def test_holds_are_validated(env: Env) -> None:
    r = env.retention
    with pytest.raises(InvalidInput, match="hold name"):
        r.place("Case 17", "litigation", principals=["bob"], by="carol")
    with pytest.raises(InvalidInput, match="hold name"):
        r.place("x" * 129, "litigation", principals=["bob"], by="carol")
    with pytest.raises(InvalidInput, match="reason is required"):
        r.place("case-17", "  ", principals=["bob"], by="carol")
    with pytest.raises(InvalidInput, match="names no principal, dataset or time range"):
        r.place("case-17", "litigation", by="carol")
    with pytest.raises(InvalidInput, match="must be before until"):
        r.place("case-17", "litigation", since_ms=20, until_ms=10, by="carol")
    with pytest.raises(InvalidInput, match="principal"):
        r.place("case-17", "litigation", principals=[""], by="carol")
    hold = r.place("case-17", "litigation", principals=["bob", "bob", "amy"], by="carol")
    assert (hold.state, hold.principals, hold.created_ms) == ("active", ("amy", "bob"), NOW_MS)
    with pytest.raises(AlreadyExists, match="case-17"):
        r.place("case-17", "again", datasets=["customers"], by="carol")
    with pytest.raises(InvalidInput, match="note is required"):
        r.release("case-17", "", by="carol")
    with pytest.raises(NotFound, match="legal hold"):
        r.release("case-99", "closed", by="carol")
    released = r.release("case-17", "case closed", by="dave")
    assert (released.state, released.released_by, released.release_note) == (
        "released",
        "dave",
        "case closed",
    )
    with pytest.raises(Conflict, match="already released by dave"):
        r.release("case-17", "again", by="carol")
    assert r.holds() == []
    assert r.holds(include_released=True) == [released]
    changed = outbox_data(env.engine, "gantry.audit.hold.changed")
    assert [(c["name"], c["state"], c["by"]) for c in changed] == [
        ("case-17", "active", "carol"),
        ("case-17", "released", "dave"),
    ]
    assert changed[0]["principals"] == ["amy", "bob"] and changed[0]["reason"] == "litigation"


def test_nothing_is_deleted_without_an_expired_rule(env: Env) -> None:
    append(env, [event(i, days_ago=400) for i in range(10)])
    assert env.retention.purge("carol").events == 0  # no rule: kept for ever
    env.retention.set_rule("gantry.data.accessed", 500, "carol")
    env.retention.set_rule("gantry.authz.*", 1, "carol")  # another type's rule
    result = env.retention.purge("carol")
    assert (result.events, result.held_back, result.purge_id) == (0, 0, "")
    assert purged_seqs(env) == []
    assert "gantry.audit.purged" not in outbox_types(env.engine)


def test_purge_deletes_expired_events_and_the_log_still_verifies(any_env: Env) -> None:
    env = any_env
    marker = f"SECRET-{uuid.uuid4().hex}"
    old = [event(i, days_ago=100, note=marker, dataset="customers") for i in range(6)]
    keep = [event(i, days_ago=100, type_="gantry.job.succeeded") for i in range(6, 9)]
    recent = [event(i, days_ago=10) for i in range(9, 12)]
    evs = [old[0], keep[0], old[1], old[2], keep[1], recent[0], old[3], old[4], old[5]]
    evs += [keep[2], recent[1], recent[2]]
    append(env, evs)
    before = {r.seq: r for r in rows(env.engine)}
    env.retention.set_rule("gantry.data.*", 30, "carol")
    if env.db_file is not None:
        data = b"".join(p.read_bytes() for p in env.db_file.parent.glob("audit.db*"))
        assert marker.encode() in data

    dry = env.retention.purge("carol", dry_run=True)
    assert (dry.events, dry.dry_run, dry.purge_id) == (6, True, "")
    assert purged_seqs(env) == []

    result = env.retention.purge("carol")
    assert result.events == 6 and result.held_back == 0 and not result.dry_run
    assert result.by_type == {"gantry.data.accessed": 6}
    assert result.ranges == [(0, 1), (2, 4), (6, 9)]
    assert purged_seqs(env) == [0, 2, 3, 6, 7, 8]
    for r in rows(env.engine):
        b = before[r.seq]
        assert bytes(r.leaf_hash) == bytes(b.leaf_hash) and r.position == r.seq
        if r.state != "purged":
            assert bytes(r.canonical) == bytes(b.canonical) and r.seal == b.seal
            continue
        assert bytes(r.canonical) == b""
        assert (r.actor, r.subject, r.resource, r.correlation_id, r.source) == ("",) * 5
        assert (r.type, r.time_ms, r.event_id) == (b.type, b.time_ms, b.event_id)
    with env.engine.connect() as conn:
        marks = conn.execute(sa.select(purged).order_by(purged.c.seq)).all()
    assert [(m.seq, m.purge_id, m.event_type) for m in marks] == [
        (s, result.purge_id, "gantry.data.accessed") for s in (0, 2, 3, 6, 7, 8)
    ]
    if env.db_file is not None:  # the bytes are gone from the database file itself
        data = b"".join(p.read_bytes() for p in env.db_file.parent.glob("audit.db*"))
        assert marker.encode() not in data
        assert keep[0].id.encode() in data  # (the search does see what is kept)

    # the log verifies with the purged rows' leaf hashes, and their proofs still hold
    report = env.ledger.verify(env.trust)
    assert report.ok, report.problems
    assert report.events_checked == 12
    index, path, leaf, raw, head = env.ledger.inclusion(index=2)
    assert raw == b"" and leaf == leaf_hash(old[1].canonical_bytes())
    check_inclusion(head, env.trust, leaf_hash=leaf, index=index, proof=path)
    assert env.ledger.inclusion(index=1)[3] == keep[0].canonical_bytes()
    got = {e.seq: e.canonical for e in env.ledger.events(0, NOW_MS, 100)}
    assert got[0] is None and got[1] == keep[0].canonical_bytes()

    # a second purge finds nothing more; the purge was recorded
    assert env.retention.purge("carol").events == 0
    (recorded,) = outbox_data(env.engine, "gantry.audit.purged")
    assert recorded == {
        "purge_id": result.purge_id,
        "by": "carol",
        "events": 6,
        "ranges": [[0, 1], [2, 4], [6, 9]],
        "by_type": {"gantry.data.accessed": 6},
        "held_back": 0,
    }
    # later, the recent ones expire too
    later = env.retention.purge("carol", now_ms=NOW_MS + 25 * DAY_MS)
    assert later.ranges == [(5, 6), (10, 12)]


def tamper(env: Env, seq: int, **values: Any) -> None:
    with env.engine.begin() as conn:
        conn.execute(events.update().where(events.c.seq == seq).values(**values))


def test_tampering_with_purged_rows_is_reported(env: Env) -> None:
    append(env, [event(i, days_ago=100) for i in range(10)])
    env.retention.set_rule("*", 30, "carol")
    assert env.retention.purge("carol").events == 10
    assert env.ledger.verify(env.trust).ok

    # a purged row's leaf hash replaced: its purge seal no longer matches
    tamper(env, 3, leaf_hash=leaf_hash(b"forged"))
    report = env.ledger.verify(env.trust)
    kinds = [(p.index, p.kind) for p in report.problems]
    assert kinds[0] == (3, "altered") and "purge seal" in report.problems[0].detail
    assert (9, "checkpoint") in kinds

    # a purged row's seal replaced (by a seal under another key)
    tamper(env, 3, leaf_hash=env.ledger.tree.leaf(3))
    tamper(env, 5, seal=seal_of(b"k" * 32, 5, env.ledger.tree.leaf(5), b"purged:x"))
    report = env.ledger.verify(env.trust)
    assert [(p.index, p.kind) for p in report.problems] == [(5, "altered")]

    # a row marked purged without a purge, and a purge record removed
    tamper(env, 5, seal=env.ledger.purge_seal(5, env.ledger.tree.leaf(5), "made-up"))
    with env.engine.begin() as conn:
        conn.execute(purged.delete().where(purged.c.seq == 7))
    report = env.ledger.verify(env.trust)
    assert [(p.index, p.kind) for p in report.problems] == [(5, "altered"), (7, "altered")]
    assert "by no purge" in report.problems[1].detail

    # a live row made to look purged (bytes dropped) is found as well
    append(env, [event(10, days_ago=1)])
    tamper(env, 10, canonical=b"", state="purged")
    assert (10, "altered") in [(p.index, p.kind) for p in env.ledger.verify(env.trust).problems]


def test_a_hold_by_principal_keeps_exactly_their_expired_events(env: Env) -> None:
    evs = [event(i, days_ago=100, actor=("bob" if i % 3 == 0 else "amy")) for i in range(9)]
    evs.append(event(9, days_ago=1, actor="bob"))
    append(env, evs)
    env.retention.set_rule("gantry.data.accessed", 30, "carol")
    env.retention.place("case-1", "litigation", principals=["bob"], by="carol")
    result = env.retention.purge("carol")
    assert (result.events, result.held_back) == (6, 3)
    assert purged_seqs(env) == [1, 2, 4, 5, 7, 8]
    env.retention.release("case-1", "settled", by="carol")
    again = env.retention.purge("carol")
    assert (again.events, again.held_back) == (3, 0)
    assert purged_seqs(env) == list(range(9))
    assert env.ledger.verify(env.trust).ok


def test_a_hold_by_dataset_matches_resource_and_data(env: Env) -> None:
    evs = [
        event(0, days_ago=100, dataset="customers"),  # resource dataset/customers
        event(1, days_ago=100, dataset="orders"),
        event(2, days_ago=100, type_="ext.trainer.finished", dataset_version="customers@v3"),
        event(3, days_ago=100, type_="ext.trainer.finished", dataset_version="orders@v1"),
        event(4, days_ago=100, type_="ext.trainer.started", dataset="customers"),  # data.dataset
        event(5, days_ago=100, type_="ext.trainer.started", job="j1"),
        event(6, days_ago=100, type_="ext.trainer.started", dataset_version="customers-eu@v1"),
    ]
    append(env, evs)
    env.retention.set_rule("*", 30, "carol")
    env.retention.place("case-2", "regulator", datasets=["customers"], by="carol")
    result = env.retention.purge("carol")
    assert (result.events, result.held_back) == (4, 3)
    assert purged_seqs(env) == [1, 3, 5, 6]
    assert env.retention.purge("carol").held_back == 3  # still held, counted again


def test_a_hold_by_time_range_and_combined_criteria(env: Env) -> None:
    evs = [event(i, days_ago=100 - i, actor="bob" if i % 2 else "amy") for i in range(10)]
    append(env, evs)
    env.retention.set_rule("*", 30, "carol")
    t = [int(e.time.timestamp() * 1000) for e in evs]
    # events 2..5 by time; and bob's events from 7 on (both criteria must match)
    env.retention.place("window", "audit of Q3", since_ms=t[2], until_ms=t[6], by="carol")
    env.retention.place("bob-late", "inquiry", principals=["bob"], since_ms=t[7], by="carol")
    result = env.retention.purge("carol")
    assert result.held_back == 4 + 2  # 2, 3, 4, 5 and bob's 7, 9
    assert purged_seqs(env) == [0, 1, 6, 8]
    env.retention.release("window", "done", by="carol")
    assert purged_seqs(env) == [0, 1, 6, 8]  # releasing deletes nothing by itself
    assert env.retention.purge("carol").events == 4
    assert purged_seqs(env) == [0, 1, 2, 3, 4, 5, 6, 8]


def test_purging_archived_events_deletes_a_segment_once_all_of_it_is_purged(env: Env) -> None:
    evs = [event(i, days_ago=200, actor="bob" if i < 4 else "amy") for i in range(24)]
    evs += [event(24 + i, days_ago=200, type_="gantry.job.succeeded") for i in range(4)]
    evs += [event(28 + i, days_ago=200) for i in range(4)]
    append(env, evs)
    assert env.archiver.archive("carol").events == 32
    env.retention.set_rule("gantry.data.*", 100, "carol")
    env.retention.place("bob", "inquiry", principals=["bob"], datasets=["customers"], by="carol")
    result = env.retention.purge("carol")
    # bob's 0..3 are held (their data is read from the segment); [24, 28) has no rule
    assert (result.events, result.held_back) == (24, 4)
    assert result.segments_deleted == [segment_name(8, 16), segment_name(16, 24)]
    assert sorted(env.objects.names("audit/segments/")) == [
        segment_name(0, 8),
        segment_name(24, 32),
    ]
    with env.engine.connect() as conn:
        names = dict(conn.execute(sa.select(segments.c.first_seq, segments.c.object_name)).all())
    assert names[8] == "" and names[0].endswith(".gz")
    assert env.ledger.verify(env.trust).ok
    for first in (0, 8, 16, 24):
        check = env.archiver.verify_segment(first, env.trust)
        assert check.ok, check.detail
    assert "purged" in env.archiver.verify_segment(8, env.trust).detail
    got = {e.seq: e.canonical for e in env.ledger.events(0, NOW_MS, 100)}
    assert got[0] == evs[0].canonical_bytes() and got[4] is None and got[9] is None
    assert got[25] == evs[25].canonical_bytes()
    assert env.ledger.inclusion(index=9)[3] == b""


def test_segments_with_purged_events_are_archived_and_verify(env: Env) -> None:
    evs = [event(i, days_ago=200, type_="gantry.authz.decision") for i in range(0, 16, 2)]
    evs = [x for i in range(8) for x in (evs[i], event(2 * i + 1, days_ago=200))]
    append(env, evs)
    env.retention.set_rule("gantry.authz.*", 30, "carol")
    assert env.retention.purge("carol").events == 8
    done = env.archiver.archive("carol")
    assert [s.first_seq for s in done.segments] == [0, 8] and done.events == 8
    assert env.ledger.verify(env.trust).ok
    assert env.archiver.verify_segment(0, env.trust).ok
    assert env.archiver.segment_events(0)[:2] == [(0, None), (1, evs[1].canonical_bytes())]
    index, path, leaf, raw, head = env.ledger.inclusion(index=3)
    assert raw == evs[3].canonical_bytes()
    check_inclusion(head, env.trust, leaf_hash=leaf, index=index, proof=path)
    # a segment whose events are all purged is not archived at all
    append(env, [event(16 + i, days_ago=200, type_="gantry.authz.decision") for i in range(8)])
    env.retention.purge("carol")
    assert env.archiver.archive("carol").segments == []


def test_a_large_purge_is_recorded_in_bounded_parts(env: Env) -> None:
    evs = [
        event(i, days_ago=100, type_="gantry.authz.decision" if i % 2 else "gantry.job.done")
        for i in range(21)
    ]
    evs.append(event(21, days_ago=100, type_="gantry.authz.decision", actor="bob"))
    append(env, evs)
    env.retention.set_rule("gantry.authz.*", 30, "carol")
    env.retention.place("bob", "inquiry", principals=["bob"], by="carol")
    small = Retention(env.ledger, chunk=2, part_events=4, part_ranges=3)
    result = small.purge("carol")
    assert (result.events, result.held_back) == (10, 1)
    assert result.ranges == [(i, i + 1) for i in range(1, 21, 2)]
    parts = outbox_data(env.engine, "gantry.audit.purged")
    assert [p["ranges"] for p in parts] == [
        [[1, 2], [3, 4], [5, 6]],
        [[7, 8], [9, 10], [11, 12]],
        [[13, 14], [15, 16], [17, 18]],
        [[19, 20]],
    ]
    assert {p["purge_id"] for p in parts} == {result.purge_id}
    assert [p["held_back"] for p in parts] == [1, 0, 0, 0]
    assert sum(p["by_type"]["gantry.authz.decision"] for p in parts) == 10
    assert env.ledger.verify(env.trust).ok


def test_settings_defaults_and_bounds() -> None:
    s = RetentionSettings()
    assert (s.segment_level, s.archive_after_days, s.auto, s.every_s) == (12, 90, True, 3600.0)
    with pytest.raises(ValueError, match="segment_level"):
        RetentionSettings(segment_level=3)
    with pytest.raises(ValueError, match="archive_after_days"):
        RetentionSettings(archive_after_days=0)
