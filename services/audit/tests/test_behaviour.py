"""The access-behaviour detector on hand-made histories: each behaviour flagged with its reason
and evidence, nothing during the warm-up, one alert per principal, kind and key a day."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gantry.audit.behaviour import AnomalySettings, BehaviourModel
from gantry.events import EventEnvelope

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)  # a Monday


def _at(day: int, hour: float) -> dt.datetime:
    return START + dt.timedelta(days=day, hours=hour)


def read(
    who: str,
    when: dt.datetime,
    dataset: str = "churn",
    rows: int = 1000,
    *,
    view: str = "deidentified",
    address: str = "192.168.1.10",
    job_id: str = "",
    decision: str = "allow",
) -> EventEnvelope:
    return EventEnvelope(
        type="gantry.data.accessed",
        source="gantry/governance",
        actor=who,
        subject=f"dataset/{dataset}",
        time=when,
        data={
            "dataset": dataset,
            "view": view,
            "rows": rows,
            "decision": decision,
            "address": address,
            "job_id": job_id,
        },
    )


def decision(
    who: str, when: dt.datetime, allowed: bool, roles: tuple[str, ...] = ("ml-developer",)
) -> EventEnvelope:
    return EventEnvelope(
        type="gantry.authz.decision",
        source="gantry/governance",
        actor=who,
        time=when,
        data={
            "principal": who,
            "roles": list(roles),
            "action": "read",
            "resource_kind": "dataset",
            "resource_name": "churn",
            "decision": "allow" if allowed else "deny",
            "reason": "test",
            "address": "192.168.1.10",
        },
    )


def created(name: str, sensitivity: str) -> EventEnvelope:
    return EventEnvelope(
        type="gantry.data.dataset.created",
        source="gantry/governance",
        actor="sam",
        time=START,
        data={"dataset": name, "format": "table", "owner": "sam", "sensitivity": sensitivity},
    )


def _history(model: BehaviourModel, who: str = "dev", days: int = 14, **kw: Any) -> None:
    """Two reads a working day, at 10:00 and 15:00, about 1000 rows each."""
    for day in range(days):
        if day % 7 in (5, 6):
            continue
        for hour, rows in ((10, 900 + 20 * (day % 5)), (15, 1100)):
            assert model.observe(read(who, _at(day, hour), rows=rows, **kw)) == []


def test_a_bulk_read_is_flagged_with_its_figures_once_a_day() -> None:
    model = BehaviourModel()
    _history(model)
    assert model.observe(read("dev", _at(14, 11), rows=5_000)) == []  # a busy day is not bulk
    found = model.observe(read("dev", _at(14, 12), rows=60_000))
    assert [a.kind for a in found] == ["bulk_read"]
    bulk = found[0]
    assert bulk.evidence["rows_today"] == 65_000
    assert 1900 <= bulk.evidence["median_rows_per_day"] <= 2100
    assert bulk.severity > 1 and "65,000 rows today" in bulk.reason
    assert len(bulk.event_ids) == 2  # today's reads
    assert model.observe(read("dev", _at(14, 13), rows=60_000)) == []  # once a day
    assert [a.kind for a in model.observe(read("dev", _at(15, 12), rows=90_000))] == ["bulk_read"]


def test_nothing_is_judged_during_the_warmup() -> None:
    model = BehaviourModel(AnomalySettings(warmup_days=7))
    _history(model, days=3)
    assert model.observe(read("dev", _at(3, 3), rows=500_000, view="raw")) == []


def test_a_night_read_by_a_day_worker_is_flagged() -> None:
    model = BehaviourModel()
    _history(model, days=40)
    found = model.observe(read("dev", _at(42, 3.2)))
    assert [a.kind for a in found] == ["unusual_hour"]
    assert "03:00" in found[0].reason and found[0].evidence["share"] == 0.0
    assert found[0].evidence["usual_hours"] == [10, 15]


def test_a_denial_storm_is_flagged_and_an_allow_ends_a_run() -> None:
    model = BehaviourModel(AnomalySettings(denial_run=5, denial_window_s=60))
    base = _at(0, 10)
    for i in range(4):
        assert model.observe(decision("eve", base + dt.timedelta(seconds=i), False)) == []
    assert model.observe(decision("eve", base + dt.timedelta(seconds=5), True)) == []
    for i in range(4):  # the run starts again
        assert model.observe(decision("eve", base + dt.timedelta(seconds=10 + i), False)) == []
    found = model.observe(decision("eve", base + dt.timedelta(seconds=15), False))
    assert [a.kind for a in found] == ["denial_storm"]
    assert found[0].evidence["denials"] == 5 and len(found[0].event_ids) == 5
    assert "denied 5 times in a row within 5 s" in found[0].reason


def test_an_earlier_allow_ingested_late_does_not_end_a_run() -> None:
    """Streams are ingested side by side: an allowed read's event may arrive after the
    denials that followed it. Only an allow later than the run's last denial ends it."""
    model = BehaviourModel(AnomalySettings(denial_run=5, denial_window_s=60))
    base = _at(0, 10)
    for i in range(3):
        assert model.observe(decision("eve", base + dt.timedelta(seconds=10 + i), False)) == []
    assert model.observe(read("eve", base + dt.timedelta(seconds=1))) == []  # older, late
    for i in range(3, 5):
        found = model.observe(decision("eve", base + dt.timedelta(seconds=10 + i), False))
    assert [a.kind for a in found] == ["denial_storm"]


def test_allowed_listings_between_refused_reads_do_not_end_the_storm() -> None:
    """Each refused read is preceded by an allowed listing of the shards (as the SDK does):
    the refused reads still make a storm."""
    model = BehaviourModel(AnomalySettings(denial_run=5, denial_window_s=60))
    base = _at(0, 10)
    found: list[Any] = []
    for i in range(5):
        listing = decision("eve", base + dt.timedelta(seconds=2 * i), True)
        listing = listing.model_copy(update={"data": {**listing.data, "action": "list"}})
        assert model.observe(listing) == []
        found = model.observe(decision("eve", base + dt.timedelta(seconds=2 * i + 1), False))
    assert [a.kind for a in found] == ["denial_storm"]


def test_a_raw_read_by_a_deidentified_reader_and_by_a_deidentified_role() -> None:
    model = BehaviourModel()
    model.observe(decision("dev", START, True))  # dev is an ml-developer
    _history(model)
    found = model.observe(read("dev", _at(14, 11), view="raw"))
    assert [a.kind for a in found] == ["raw_view_read"]
    assert "0.0% of its 20 earlier reads were raw" in found[0].reason
    # a new ml-developer with no history of its own: its role's reads were de-identified
    for i in range(120):
        model.observe(read("dev", _at(15 + i // 10, 10), rows=10))
    model.observe(decision("newbie", _at(30, 9), True))
    found = model.observe(read("newbie", _at(30, 10), view="raw"))
    assert [a.kind for a in found] == ["raw_view_read"]
    assert found[0].evidence["role"] == "ml-developer"
    # a steward who reads raw every day is not flagged
    _history(model, who="steward", view="raw")
    assert model.observe(read("steward", _at(14, 11), view="raw")) == []


def test_the_first_read_of_a_sensitive_dataset_is_flagged_not_of_others() -> None:
    model = BehaviourModel()
    model.observe(created("salaries", "sensitive"))
    model.observe(created("weather", "public"))
    _history(model)
    assert model.observe(read("dev", _at(14, 11), "weather")) == []
    found = model.observe(read("dev", _at(14, 12), "salaries"))
    assert [a.kind for a in found] == ["first_sensitive_access"]
    assert "salaries (sensitive) for the first time" in found[0].reason
    assert model.observe(read("dev", _at(16, 12), "salaries")) == []  # known now
    # a job's read through its grant is the job's business, not the agent's
    _history(model, who="training-agent", address="10.0.1.1")
    by_job = read("training-agent", _at(14, 11), "salaries", job_id="j-1", address="10.0.1.1")
    assert model.observe(by_job) == []


def test_a_service_identity_from_a_new_address_is_flagged_a_person_is_not() -> None:
    model = BehaviourModel()
    _history(model, who="training-agent", address="10.0.1.1")
    _history(model, who="dev")
    found = model.observe(read("training-agent", _at(14, 10), address="203.0.113.7"))
    assert [a.kind for a in found] == ["unusual_place"]
    assert "203.0.113.7" in found[0].reason and found[0].evidence["known"] == ["10.0.1.1"]
    assert model.observe(read("dev", _at(14, 10), address="172.16.0.9")) == []
