"""Pytest fixtures: a real nats-server per test on port 0, PostgreSQL databases.

Installed as a pytest plugin by the gantry-testing package, so every package's tests (and
users' own tests) get the same harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.supervisor import NatsServer
from gantry.testing.postgres import admin_url, reachable, temporary_database


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream on a free port and a temporary store."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """URL of the per-test nats-server."""
    return nats_server.url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database for this test; skipped only when no server is reachable."""
    import sqlalchemy as sa

    url = sa.make_url(admin_url())
    if not reachable(url.host or "127.0.0.1", url.port or 5432):
        pytest.skip(f"no PostgreSQL reachable at {url.host}:{url.port}")
    with temporary_database() as db_url:
        yield db_url
