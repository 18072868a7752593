"""gantry.core: settings errors, the error tree, ids and clocks."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gantry.core import (
    CommonSettings,
    ConfigError,
    GantryError,
    InvalidInput,
    ManualClock,
    NotFound,
    PermissionDenied,
    Unavailable,
    is_uuid,
    load_settings,
    new_id,
    utc,
)


def test_settings_come_from_gantry_prefixed_env_with_nested_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANTRY_DATA_DIR", "/tmp/x")
    monkeypatch.setenv("GANTRY_NATS__URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("GANTRY_NATS__STREAM_REPLICAS", "3")
    settings = load_settings(CommonSettings)
    assert settings.data_dir == Path("/tmp/x")
    assert settings.nats.url == "nats://10.0.0.1:4222"
    assert settings.nats.stream_replicas == 3


def test_bad_settings_name_the_variable_and_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANTRY_NATS__STREAM_REPLICAS", "7")
    monkeypatch.setenv("GANTRY_LOG_JSON", "perhaps")
    with pytest.raises(ConfigError) as info:
        load_settings(CommonSettings)
    text = str(info.value)
    assert "GANTRY_NATS__STREAM_REPLICAS" in text
    assert "GANTRY_LOG_JSON" in text
    assert "docs/ops.md" in text


def test_every_settings_field_is_documented() -> None:
    from gantry.core import NatsSettings

    for model in (CommonSettings, NatsSettings):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def test_errors_carry_grpc_codes_and_hints() -> None:
    err = NotFound("dataset", "customers", hint="list datasets first")
    assert err.grpc_code == "NOT_FOUND"
    assert str(err) == "dataset 'customers' not found — list datasets first"
    denied = PermissionDenied("alice", "delete", "dataset x", reason="no rule")
    assert denied.grpc_code == "PERMISSION_DENIED"
    assert "'alice' may not delete dataset x: no rule" in str(denied)
    assert Unavailable("down").temporary and not InvalidInput("bad").temporary
    assert all(
        issubclass(c, GantryError) for c in (ConfigError, NotFound, PermissionDenied, Unavailable)
    )


def test_ids_are_time_ordered_uuid7() -> None:
    ids = [new_id() for _ in range(200)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 200
    assert all(is_uuid(i) and i[14] == "7" for i in ids)
    assert not is_uuid("not-a-uuid")
    assert not is_uuid(ids[0].upper())


def test_clocks() -> None:
    clock = ManualClock(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    clock.advance(90)
    assert clock.now() == dt.datetime(2026, 1, 1, 0, 1, 30, tzinfo=dt.UTC)
    assert utc(dt.datetime(2026, 1, 1, 12)).tzinfo is dt.UTC
