"""Unit tests: envelope, canonical bytes, catalog validation."""

from __future__ import annotations

import datetime as dt

import pytest

from gantry.core import InvalidInput
from gantry.events import EventEnvelope, stream_for_type, validate_event


def _decision(**data: object) -> EventEnvelope:
    base = {
        "principal": "alice",
        "roles": ["auditor"],
        "action": "query",
        "resource_kind": "audit_log",
        "decision": "allow",
        "reason": "allowed by role auditor",
    }
    base.update(data)
    return EventEnvelope(
        type="gantry.authz.decision", source="gantry/test", actor="alice", data=base
    )


def test_canonical_bytes_are_stable_and_sorted() -> None:
    event = _decision()
    raw = event.canonical_bytes()
    again = EventEnvelope.from_bytes(raw)
    assert again == event
    assert again.canonical_bytes() == raw
    assert raw.index(b'"actor"') < raw.index(b'"correlation_id"') < raw.index(b'"data"')
    assert b" " not in raw.split(b'"reason"')[0]


def test_times_are_normalised_to_utc() -> None:
    naive = dt.datetime(2026, 5, 1, 12, 0, 0)
    event = EventEnvelope(type="ext.shop.sale", source="shop", actor="svc", time=naive)
    assert event.time.tzinfo is dt.UTC
    plus2 = dt.datetime(2026, 5, 1, 14, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert EventEnvelope(
        type="ext.shop.sale", source="s", actor="a", time=plus2
    ).time == naive.replace(tzinfo=dt.UTC)


def test_ids_are_uuid7_and_ordered() -> None:
    a = EventEnvelope(type="ext.shop.sale", source="s", actor="a")
    b = EventEnvelope(type="ext.shop.sale", source="s", actor="a")
    assert a.id[14] == "7"
    assert a.id < b.id


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"not json", "malformed event envelope"),
        (b'{"type": "gantry.job.x"}', "source"),
        (b'{"type": "Bad Type", "source": "s", "actor": "a"}', "event type must look like"),
        (b'{"type": "ext.a.b", "source": "s", "actor": "a", "surprise": 1}', "surprise"),
    ],
)
def test_malformed_envelopes_say_what_is_wrong(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        EventEnvelope.from_bytes(raw)
    assert needle in str(info.value)


def test_catalog_checks_data_of_known_types() -> None:
    validate_event(_decision())
    with pytest.raises(InvalidInput, match=r"data\.decision"):
        validate_event(_decision(decision="maybe"))


def test_unknown_gantry_type_is_refused_with_the_known_list() -> None:
    event = EventEnvelope(type="gantry.job.exploded", source="s", actor="a")
    with pytest.raises(InvalidInput) as info:
        validate_event(event)
    assert "unknown event type gantry.job.exploded" in str(info.value)
    assert "gantry.authz.decision" in str(info.value)


def test_ext_types_need_only_an_object() -> None:
    event = EventEnvelope(
        type="ext.billing.invoice-paid", source="billing", actor="svc", data={"x": 1}
    )
    assert validate_event(event) == {"x": 1}
    assert stream_for_type(event.type) == "EXTERNAL"
    assert stream_for_type("gantry.authz.decision") == "AUTHZ"
    with pytest.raises(InvalidInput, match="no stream"):
        stream_for_type("gantry.unknown.thing")
