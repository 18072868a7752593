"""Fixtures: a real audit service (in this event loop) on a real nats-server, per test."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.audit.app import AuditService
from gantry.audit.settings import AuditOptions, AuditSettings
from gantry.client.audit import AuditClient
from gantry.core import NatsSettings
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring


@dataclass
class Running:
    """A running audit service and what a test needs to talk to it."""

    service: AuditService
    settings: AuditSettings
    keyring: Keyring
    issuer: TokenIssuer

    def token(self, user: str = "carol", role: str = "auditor") -> str:
        return self.issuer.issue(user, [role], dt.timedelta(minutes=10))

    def client(self, user: str = "carol", role: str = "auditor") -> AuditClient:
        return AuditClient(f"127.0.0.1:{self.service.grpc_port}", self.token(user, role))


def audit_settings(data_dir: Path, nats_url: str, database_url: str | None = None) -> AuditSettings:
    return AuditSettings(
        data_dir=data_dir,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        audit=AuditOptions(
            database_url=database_url,
            grpc_port=0,
            metrics_port=0,
            checkpoint_every_events=100,
            checkpoint_every_s=0.5,
        ),
    )


async def start(settings: AuditSettings) -> tuple[AuditService, asyncio.Task[None]]:
    service = AuditService(settings)
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or not (settings.data_dir / "run" / "audit.json").exists():
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    return service, task


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


@contextlib.asynccontextmanager
async def running(settings: AuditSettings) -> AsyncIterator[Running]:
    """Keys, a started audit service, and a clean stop afterwards."""
    keyring = Keyring(settings.keys_dir)
    issuer = TokenIssuer(keyring.issuer(create=True))
    service, task = await start(settings)
    try:
        yield Running(service, settings, keyring, issuer)
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def audit(tmp_path: Path, nats_url: str, database_url: str | None) -> AsyncIterator[Running]:
    async with running(audit_settings(tmp_path / "data", nats_url, database_url)) as r:
        yield r


async def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)
