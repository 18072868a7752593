"""Cron schedules: the expression, fires due, missed fires, and the three concurrency policies
driven by a manual clock."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from gantry.workflows.cron import CronError, check_cron, due, next_fire

from .conftest import CHURN, DEV, Rig

UTC = dt.UTC


def test_next_fire_follows_the_time_zone_across_a_dst_change() -> None:
    # 03:00 in Paris is 01:00 UTC in winter and 02:00 UTC in summer... wait for the change
    before = dt.datetime(2026, 3, 28, 12, tzinfo=UTC)
    first = next_fire("0 3 * * *", "Europe/Paris", before)
    second = next_fire("0 3 * * *", "Europe/Paris", first)
    assert first == dt.datetime(2026, 3, 29, 1, tzinfo=UTC)  # CEST starts at 02:00 that day
    assert second == dt.datetime(2026, 3, 30, 1, tzinfo=UTC)
    winter = next_fire("0 3 * * *", "Europe/Paris", dt.datetime(2026, 1, 10, tzinfo=UTC))
    assert winter == dt.datetime(2026, 1, 10, 2, tzinfo=UTC)
    assert next_fire("@hourly", "UTC", before) == dt.datetime(2026, 3, 28, 13, tzinfo=UTC)
    assert next_fire("*/10 * * * * *", "UTC", before) == before + dt.timedelta(seconds=10)


def test_bad_schedules_say_what_is_wrong() -> None:
    with pytest.raises(CronError, match="five"):
        check_cron("* * *")
    with pytest.raises(CronError, match="Bad minute"):
        check_cron("61 * * * *")
    with pytest.raises(CronError, match="unknown time zone 'Mars/Olympus'"):
        check_cron("0 3 * * *", "Mars/Olympus")


def test_only_the_latest_fire_within_the_deadline_runs() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    now = start + dt.timedelta(minutes=30, seconds=20)
    d = due("*/10 * * * *", "UTC", start, now, deadline=dt.timedelta(minutes=5))
    assert d.fire == start + dt.timedelta(minutes=30)
    assert d.missed == 3 and d.first_missed == start
    assert d.next == start + dt.timedelta(minutes=40)
    late = due("*/10 * * * *", "UTC", start, now, deadline=dt.timedelta(seconds=10))
    assert late.fire is None and late.missed == 4


def _cron(policy: str, expr: str = "*/5 * * * *") -> str:
    doc = yaml.safe_load(CHURN)
    doc["kind"] = "CronPipeline"
    doc["spec"]["schedule"] = {"cron": expr, "concurrency": policy}
    return yaml.safe_dump(doc, sort_keys=False)


def _runs(rig: Rig) -> list[tuple[str, str]]:
    return [(r.state, r.trigger) for r in reversed(rig.controller.list(pipeline="churn"))]


def test_skip_policy_records_the_skipped_fire(rig: Rig) -> None:
    rig.registry.submit(_cron("skip"), owner=DEV.subject, roles=DEV.roles)
    rig.controller.tick()
    assert _runs(rig) == []  # 00:00:00 is not after itself: the first fire is 00:05
    rig.clock.advance(300)
    rig.controller.tick()
    assert _runs(rig) == [("running", "schedule")]
    rig.clock.advance(300)
    rig.controller.tick()
    runs = rig.controller.list(pipeline="churn")
    assert [r.state for r in reversed(runs)] == ["running", "skipped"]
    assert "is still running (concurrency: skip)" in runs[0].reason
    assert runs[0].scheduled_ms == int(rig.clock.now().timestamp() * 1000)
    # the owner's identity and the pipeline's defaults run the scheduled runs
    assert runs[1].owner == "dev" and runs[1].params["epochs"] == 3


def test_queue_policy_starts_the_next_run_when_the_first_ends(rig: Rig) -> None:
    rig.registry.submit(_cron("queue"), owner=DEV.subject, roles=DEV.roles)
    rig.clock.advance(300)
    rig.controller.tick()
    rig.clock.advance(300)
    rig.controller.tick()
    first, second = reversed(rig.controller.list(pipeline="churn"))
    assert (first.state, second.state) == ("running", "queued")
    rig.controller.cancel(first.id, "enough", caller=DEV)
    rig.controller.tick()
    assert rig.controller.get(second.id).state == "running"
    assert rig.platform.job_of("preprocess")  # the queued run's first step started


def test_replace_policy_cancels_the_running_run(rig: Rig) -> None:
    rig.registry.submit(_cron("replace"), owner=DEV.subject, roles=DEV.roles)
    rig.clock.advance(300)
    rig.controller.tick()
    first_job = rig.platform.job_of("preprocess")
    rig.clock.advance(300)
    rig.controller.tick()
    first, second = reversed(rig.controller.list(pipeline="churn"))
    assert first.state == "cancelled" and "replaced by the run scheduled for" in first.reason
    assert second.state == "running"
    assert rig.platform.cancelled == [first_job]


def test_fires_missed_while_the_service_was_down_are_recorded(rig: Rig) -> None:
    rig.registry.submit(_cron("skip"), owner=DEV.subject, roles=DEV.roles)
    rig.clock.advance(3600 + 30)  # 12 fires passed; the 01:00 one is 30 s old (deadline 300 s)
    rig.controller.tick()
    runs = list(reversed(rig.controller.list(pipeline="churn")))
    assert [r.state for r in runs] == ["skipped", "running"]
    assert runs[0].reason.startswith("missed 11 fire(s) from 2026-01-01T00:05:00+00:00")
    assert rig.registry.get("churn").missed == 11
    rig.controller.tick()  # nothing more is due: no duplicate run
    assert len(rig.controller.list(pipeline="churn")) == 2


def test_a_suspended_schedule_does_not_fire(rig: Rig) -> None:
    doc = yaml.safe_load(_cron("skip"))
    doc["spec"]["schedule"]["suspend"] = True
    rig.registry.submit(yaml.safe_dump(doc), owner=DEV.subject, roles=DEV.roles)
    rig.clock.advance(900)
    rig.controller.tick()
    assert _runs(rig) == []
