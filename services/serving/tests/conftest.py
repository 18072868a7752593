"""Shared fixtures of the serving tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gantry.client.admin import create_token
from gantry.supervisor.platform import Platform

from .fake_backend import FakeBackend


@pytest.fixture
def fake_backend() -> FakeBackend:
    """A fresh in-memory inference backend (see :mod:`fake_backend`)."""
    return FakeBackend()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The platform as `gantry up` runs it, with the services serving needs (one per module)."""
    data = tmp_path_factory.mktemp("serving-platform") / "data"
    running = Platform(
        data,
        services=("audit", "governance", "serving"),
        nats_port=0,
        service_env={
            "GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.3",
            "GANTRY_SERVING__AUTOSCALE_INTERVAL_S": "0.5",
            "GANTRY_SERVING__TORCH_THREADS": "1",
        },
        log_sink=lambda line: None,
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def admin(platform: Platform) -> str:
    """A platform-admin token for ``platform``."""
    return create_token(platform.data_dir, "admin", ["platform-admin"])
