"""The simulated month of audit events (gantry.testing.access_month): deterministic, valid,
realistic, and the injected anomalies are there with the properties they claim."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from gantry.events import EventEnvelope
from gantry.events.catalog import validate_event
from gantry.testing.access_month import INJECTED_KINDS, Injected, Month, simulate_month

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def ms_of(event: EventEnvelope) -> int:
    return (event.time - EPOCH) // MS


def principal_of(event: EventEnvelope) -> str:
    if event.type == "gantry.authz.decision":
        return str(event.data["principal"])
    return event.actor


def reads(events: Iterable[EventEnvelope]) -> list[EventEnvelope]:
    return [e for e in events if e.type == "gantry.data.accessed"]


@functools.cache
def simulated(seed: int, inject: bool = True) -> Month:
    return simulate_month(seed, inject=inject)


@pytest.fixture(params=[0, 1, 7])
def month(request: pytest.FixtureRequest) -> Month:
    return simulated(request.param)


@pytest.fixture
def quiet() -> Month:
    return simulated(0, inject=False)


class View:
    """A month indexed for the checks: events by id, injected ids, normal events."""

    def __init__(self, month: Month) -> None:
        self.month = month
        self.by_id = {e.id: e for e in month.events}
        self.injected_ids = {i for inj in month.injected for i in inj.event_ids}
        self.normal = [e for e in month.events if e.id not in self.injected_ids]
        self.start_ms = (month.start - EPOCH) // MS

    def of(self, injected: Injected) -> list[EventEnvelope]:
        return [self.by_id[i] for i in injected.event_ids]

    def kind(self, kind: str) -> list[Injected]:
        found = [i for i in self.month.injected if i.kind == kind]
        assert found, f"no {kind} injected"
        return found

    def day(self, ms: int) -> int:
        return (ms - self.start_ms) // DAY_MS


# -- determinism, validity, order ---------------------------------------------------------------


def test_same_seed_gives_the_same_month_ids_included() -> None:
    a, b = simulate_month(5), simulate_month(5)
    assert [e.canonical_bytes() for e in a.events] == [e.canonical_bytes() for e in b.events]
    assert a.injected == b.injected
    assert dict(a.principals) == dict(b.principals)
    assert dict(a.datasets) == dict(b.datasets)
    other = simulate_month(6)
    assert [e.id for e in other.events] != [e.id for e in a.events]


def test_every_event_fits_the_catalog(month: Month, quiet: Month) -> None:
    for event in (*month.events, *quiet.events):
        validate_event(event)
        assert event.time.tzinfo is not None
    assert len({e.id for e in month.events}) == len(month.events)


def test_events_are_sorted_by_time_and_inside_the_month(month: Month) -> None:
    times = [e.time for e in month.events]
    assert times == sorted(times)
    assert month.start <= times[0]
    assert times[-1] < month.start + timedelta(days=month.days)


def test_the_month_is_realistic_in_size_and_cast(month: Month) -> None:
    assert 20_000 <= len(month.events) <= 60_000
    levels = list(month.datasets.values())
    assert len(levels) == 12
    assert levels.count("pii") == 3
    assert levels.count("sensitive") == 2
    created = [e for e in month.events if e.type == "gantry.data.dataset.created"]
    assert sorted(e.data["dataset"] for e in created) == sorted(month.datasets)
    stewards = {p for p, roles in month.principals.items() if "data-steward" in roles}
    assert len(stewards) == 2
    assert {e.actor for e in created} <= stewards
    roles = [r for rs in month.principals.values() for r in rs]
    assert roles.count("ml-developer") >= 10
    assert roles.count("annotator") == 1
    assert roles.count("auditor") == 1
    humans = [p for p, rs in month.principals.items() if "service" not in rs]
    assert 14 <= len(humans) <= 16
    auditor = next(p for p, rs in month.principals.items() if "auditor" in rs)
    for e in month.events:
        if principal_of(e) == auditor:
            assert e.type == "gantry.authz.decision"
            assert (e.data["action"], e.data["resource_kind"]) == ("query", "audit_log")


def test_normal_behaviour_is_stable(month: Month) -> None:
    view = View(month)
    addresses: dict[str, set[str]] = defaultdict(set)
    for e in view.normal:
        if e.type != "gantry.data.dataset.created":
            addresses[principal_of(e)].add(str(e.data["address"]))
    for who, seen in addresses.items():
        assert "" not in seen, who
        if "service" not in month.principals[who]:
            assert len(seen) == 1, (who, seen)
            assert next(iter(seen)).startswith("192.168."), who
    agent = addresses["training-agent"]
    assert 3 <= len(agent) <= 4
    assert all(a.startswith("10.0.1.") for a in agent)
    developers = {p for p, rs in month.principals.items() if "ml-developer" in rs}
    touched: dict[str, set[str]] = defaultdict(set)
    for e in reads(view.normal):
        if e.actor == "training-agent":
            assert e.data["job_id"]
            assert e.data["view"] == "deidentified"
        if e.actor in developers:
            assert 7 <= e.time.hour <= 21, e
            if e.data["decision"] == "allow":
                assert e.data["view"] == "deidentified"
                touched[e.actor].add(e.data["dataset"])
    for who, datasets in touched.items():  # a habitual 2-4, and now and then another
        assert 2 <= len(datasets) <= 7, (who, datasets)
    agent_hours = {e.time.hour for e in reads(view.normal) if e.actor == "training-agent"}
    assert len(agent_hours) == 24


def test_a_month_without_injections_is_the_same_month_less_them(quiet: Month) -> None:
    assert quiet.injected == ()
    full = simulated(0)
    assert [e.id for e in quiet.events] == [e.id for e in View(full).normal]
    assert quiet.events == tuple(View(full).normal)


def test_no_injections_means_no_raw_reads_by_ml_developers(quiet: Month) -> None:
    assert quiet.injected == ()
    developers = {p for p, rs in quiet.principals.items() if "ml-developer" in rs}
    raw = [
        e
        for e in reads(quiet.events)
        if e.actor in developers and e.data["view"] == "raw" and e.data["decision"] == "allow"
    ]
    assert raw == []
    refused = [e for e in reads(quiet.events) if e.actor in developers and e.data["view"] == "raw"]
    assert all(e.data["decision"] == "deny" for e in refused)


def test_too_short_a_month_for_injections_is_refused() -> None:
    with pytest.raises(ValueError, match="days"):
        simulate_month(0, days=10)
    assert len(simulate_month(0, days=10, inject=False).events) > 0


# -- the injected anomalies ---------------------------------------------------------------------


def test_every_kind_is_injected_in_the_last_ten_days(month: Month) -> None:
    view = View(month)
    assert {i.kind for i in month.injected} == set(INJECTED_KINDS)
    per_kind: dict[str, list[str]] = defaultdict(list)
    for inj in month.injected:
        per_kind[inj.kind].append(inj.principal)
        assert inj.event_ids
        assert all(i in view.by_id for i in inj.event_ids)
        events = view.of(inj)
        assert inj.time_ms == min(ms_of(e) for e in events)
        assert view.day(inj.time_ms) >= month.days - 10
        assert all(principal_of(e) == inj.principal for e in events)
    for principals in per_kind.values():
        assert 1 <= len(principals) <= 2
        assert len(set(principals)) == len(principals)
    people = [i.principal for i in month.injected if i.kind != "unusual_place"]
    assert len(set(people)) == len(people)


def test_bulk_read_is_twenty_times_the_daily_median_in_an_hour(month: Month) -> None:
    view = View(month)
    for inj in view.kind("bulk_read"):
        assert "ml-developer" in month.principals[inj.principal]
        events = view.of(inj)
        times = [ms_of(e) for e in events]
        assert max(times) - min(times) <= HOUR_MS
        done = reads(events)
        assert all(e.data["decision"] == "allow" for e in done)
        daily: dict[int, int] = defaultdict(int)
        first_day = view.day(inj.time_ms)
        for e in reads(view.normal):
            day = view.day(ms_of(e))
            if e.actor == inj.principal and e.data["decision"] == "allow" and day < first_day:
                daily[day] += e.data["rows"]
        assert len(daily) >= 5
        median = statistics.median(daily.values())
        assert sum(e.data["rows"] for e in done) >= 20 * median


def test_unusual_hour_is_at_night_for_someone_who_never_works_then(month: Month) -> None:
    view = View(month)
    for inj in view.kind("unusual_hour"):
        assert "ml-developer" in month.principals[inj.principal]
        events = view.of(inj)
        assert reads(events)
        assert all(1 <= e.time.hour < 5 for e in events)
        before = [e for e in month.events if principal_of(e) == inj.principal]
        assert len(before) > 50
        assert not any(1 <= e.time.hour < 5 for e in before if e.id not in inj.event_ids), (
            "the principal was active at night before"
        )


def test_denial_storm_is_a_dozen_denials_within_three_minutes(month: Month) -> None:
    view = View(month)
    storms = view.kind("denial_storm")
    for inj in storms:
        events = view.of(inj)
        assert len(events) >= 12
        assert all(e.type == "gantry.authz.decision" for e in events)
        assert all(e.data["decision"] == "deny" for e in events)
        assert {e.data["principal"] for e in events} == {inj.principal}
        times = sorted(ms_of(e) for e in events)
        assert any(times[i + 11] - times[i] <= 180_000 for i in range(len(times) - 11))


def test_raw_view_read_is_an_allowed_raw_read_by_an_ml_developer(month: Month) -> None:
    view = View(month)
    for inj in view.kind("raw_view_read"):
        assert "ml-developer" in month.principals[inj.principal]
        done = reads(view.of(inj))
        assert done
        assert all(e.data["view"] == "raw" and e.data["decision"] == "allow" for e in done)
        assert all(e.data["rows"] > 0 for e in done)


def test_first_sensitive_access_is_a_first_read_of_a_sensitive_dataset(month: Month) -> None:
    view = View(month)
    for inj in view.kind("first_sensitive_access"):
        assert "ml-developer" in month.principals[inj.principal]
        done = reads(view.of(inj))
        assert done
        (dataset,) = {e.data["dataset"] for e in done}
        assert month.datasets[dataset] == "sensitive"
        assert all(e.data["decision"] == "allow" and not e.data["job_id"] for e in done)
        for e in month.events:
            if principal_of(e) == inj.principal and ms_of(e) < inj.time_ms:
                assert dataset not in (e.data.get("dataset"), e.data.get("resource_name"))


def test_unusual_place_is_the_training_agent_at_a_new_address(month: Month) -> None:
    view = View(month)
    for inj in view.kind("unusual_place"):
        assert inj.principal == "training-agent"
        done = reads(view.of(inj))
        assert done
        places = {e.data["address"] for e in done}
        assert len(places) == 1
        seen = {
            e.data["address"]
            for e in month.events
            if principal_of(e) == "training-agent" and ms_of(e) < inj.time_ms
        }
        assert seen
        assert not places & seen
        assert all(e.data["job_id"] and e.data["decision"] == "allow" for e in done)
