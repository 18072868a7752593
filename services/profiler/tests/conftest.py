"""Fixtures: a real profiler (in this event loop) on a real nats-server, per test."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.core import NatsSettings
from gantry.core.tls import nats_tls
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import JobScheduled, JobStepMetrics, WorkerPlacement
from gantry.profiler.app import ProfilerService
from gantry.profiler.settings import ProfilerOptions, ProfilerSettings
from gantry.protos.v1 import profiler_pb2_grpc
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap


def profiler_settings(data_dir: Path, nats_url: str, **options: Any) -> ProfilerSettings:
    return ProfilerSettings(
        data_dir=data_dir,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        profiler=ProfilerOptions(grpc_port=0, metrics_port=0, unknown_job_retry_s=0.2, **options),
    )


@dataclass
class Running:
    """A running profiler, publishers posing as the scheduler and an agent, and a stub."""

    service: ProfilerService
    settings: ProfilerSettings
    keyring: Keyring
    issuer: TokenIssuer
    scheduler: Publisher
    agent: Publisher
    channel: grpc.aio.Channel
    stub: profiler_pb2_grpc.ProfilerServiceStub

    def md(self, user: str = "ann", role: str = "ml-developer") -> list[tuple[str, str]]:
        token = self.issuer.issue(user, [role], dt.timedelta(minutes=10))
        return [("authorization", f"Bearer {token}")]

    async def schedule(
        self, job_id: str, nodes: list[str], *, attempt: int = 1, owner: str = "ann"
    ) -> None:
        data = JobScheduled(
            job_id=job_id,
            owner=owner,
            name=f"{job_id}-name",
            nodes=sorted(set(nodes)),
            attempt=attempt,
            placements=[WorkerPlacement(worker=i, node=n) for i, n in enumerate(nodes)],
        )
        await self.scheduler.publish(
            EventEnvelope(
                type="gantry.job.scheduled",
                source="gantry/scheduler",
                actor=owner,
                subject=job_id,
                data=data.model_dump(mode="json"),
            )
        )

    async def steps(self, metrics: JobStepMetrics) -> None:
        await self.agent.publish(
            EventEnvelope(
                type="gantry.metrics.job.step",
                source="gantry/training-agent",
                actor="svc-training-agent",
                subject=metrics.job_id,
                data=metrics.model_dump(mode="json"),
            )
        )


async def start(settings: ProfilerSettings) -> tuple[ProfilerService, asyncio.Task[None]]:
    service = ProfilerService(settings)
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or not (settings.data_dir / "run" / "profiler.json").exists():
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    return service, task


@contextlib.asynccontextmanager
async def running(settings: ProfilerSettings) -> AsyncIterator[Running]:
    keyring = Keyring(settings.keys_dir)
    issuer = TokenIssuer(keyring.issuer(create=True))
    bus = await Bus.connect(settings.nats, name="test-peers", tls=nats_tls(settings.tls))
    await bus.ensure_streams()
    service, task = await start(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
    try:
        yield Running(
            service,
            settings,
            keyring,
            issuer,
            Publisher(bus, signer=keyring.service_key("scheduler")),
            Publisher(bus, signer=keyring.service_key("training-agent")),
            channel,
            profiler_pb2_grpc.ProfilerServiceStub(channel),
        )
    finally:
        await channel.close()
        service.stop()
        await asyncio.wait_for(task, 30)
        await bus.close()


@pytest.fixture
async def profiler(tmp_path: Path, nats_url: str) -> AsyncIterator[Running]:
    async with running(profiler_settings(tmp_path / "data", nats_url)) as r:
        yield r


@pytest.fixture
async def tap(nats_url: str) -> AsyncIterator[EventTap]:
    t = await EventTap().start(nats_url, "gantry.>")
    yield t
    await t.close()
