"""Pytest fixtures: a real nats-server per test on port 0, PostgreSQL databases, S3 servers.

Installed as a pytest plugin by the gantry-testing package, so every package's tests (and
users' own tests) get the same harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.supervisor import NatsServer
from gantry.testing.postgres import admin_url, reachable, temporary_database
from gantry.testing.s3 import S3Endpoint, docker_unreachable_reason, minio_server, moto_s3_server


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


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Endpoint]:
    """moto's S3 server on a free port, one per test module; each test should use its own
    bucket (e.g. ``f"t-{uuid.uuid4().hex[:12]}"``)."""
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def minio_container() -> Iterator[S3Endpoint]:
    """A MinIO server in Docker (testcontainers), one per test module; skipped, with the
    reason, when no Docker engine is reachable."""
    reason = docker_unreachable_reason()
    if reason is not None:
        pytest.skip(reason)
    with minio_server() as endpoint:
        yield endpoint
