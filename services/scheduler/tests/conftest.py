"""Fixtures: a real scheduler service (in this event loop) on a real nats-server, per test.

:class:`Agents` plays node agents in-process: it publishes real, signed ``gantry.node.*`` and
``gantry.job.workers`` events over NATS exactly as the training agent does, so tests control
every report's timing. End-to-end tests also run the real agent processes
(:mod:`gantry.training_agent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.core import NatsSettings
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import (
    GpuDevice,
    JobProgress,
    JobWorkersReported,
    NodeHeartbeat,
    NodeRegistered,
)
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.scheduler.app import SchedulerService
from gantry.scheduler.settings import SchedulerOptions, SchedulerSettings
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap

AGENT = "gantry/training-agent"


def job_yaml(
    name: str = "train",
    *,
    replicas: int = 1,
    gpus: int = 1,
    queue: str = "default",
    priority: str | int = "normal",
    extra_spec: str = "",
    extra_resources: str = "",
    min_replicas: int | None = None,
    topology: str = "pack",
    request_id: str = "",
) -> str:
    """A TrainingJob document."""
    lines = [
        "apiVersion: gantry/v1",
        "kind: TrainingJob",
        f"metadata: {{name: {name}, queue: {queue}, priority: {priority}"
        + (f", requestId: {request_id}" if request_id else "")
        + "}",
        "spec:",
        f"  replicas: {replicas}",
    ]
    if min_replicas is not None:
        lines.append(f"  minReplicas: {min_replicas}")
    lines += [
        f"  topology: {topology}",
        f"  resources: {{gpus: {gpus}, cpus: 1, memory: 1Gi{extra_resources}}}",
        "  entrypoint: {command: [python, -c, 'print(1)']}",
    ]
    if extra_spec:
        lines.append(extra_spec)
    return "\n".join(lines) + "\n"


@dataclass
class Agents:
    """In-process stand-ins for node agents, publishing signed events over real NATS."""

    publisher: Publisher
    bus: Bus
    seq: int = 0
    nodes: list[str] = field(default_factory=list)

    async def send(self, type_: str, data: Any, subject: str = "") -> None:
        await self.publisher.publish(
            EventEnvelope(
                type=type_,
                source=AGENT,
                actor="svc-training-agent",
                subject=subject or None,
                data=data.model_dump(mode="json"),
            )
        )

    async def register(
        self,
        node: str,
        *,
        gpus: int = 8,
        model: str = "A100",
        pool: str = "default",
        rack: str = "",
        cpus: int = 64,
        boot: str = "boot-1",
        address: str = "",
        worker_slots: str = "gpu",
    ) -> None:
        self.nodes.append(node)
        await self.send(
            "gantry.node.registered",
            NodeRegistered(
                node=node,
                pool=pool,
                cpu_milli=cpus * 1000,
                memory_mib=512 * 1024,
                gpus=[GpuDevice(index=i, model=model, memory_mib=81920) for i in range(gpus)],
                labels={"rack": rack} if rack else {},
                heartbeat_s=0.2,
                agent=f"test-agent/{boot}",
                address=address,
                worker_slots=worker_slots,
            ),
            node,
        )

    async def heartbeat(self, *nodes: str) -> None:
        for node in nodes or tuple(self.nodes):
            self.seq += 1
            await self.send(
                "gantry.metrics.node.heartbeat", NodeHeartbeat(node=node, seq=self.seq), node
            )

    async def report(
        self, job: pb.Job, status: str, *, node: str = "", workers: list[int] | None = None,
        exit_code: int = 0, message: str = "", step: int = 0, restarts: int = 0, model: str = "",
        metrics: dict[str, float] | None = None, dataset_version: str = "",
    ) -> None:  # fmt: skip
        """Report ``status`` for the job's workers, per node (all its nodes by default)."""
        by_node: dict[str, list[int]] = {}
        for p in job.placements:
            if (not node or p.node == node) and (workers is None or p.worker in workers):
                by_node.setdefault(p.node, []).append(p.worker)
        for n, ranks in by_node.items():
            await self.send(
                "gantry.job.workers",
                JobWorkersReported(
                    job_id=job.id,
                    attempt=job.attempt,
                    node=n,
                    workers=ranks,
                    status=status,  # type: ignore[arg-type]
                    exit_code=exit_code,
                    message=message,
                    step=step,
                    restarts=restarts,
                    model=model,
                    metrics=metrics or {},
                    dataset_version=dataset_version,
                ),
                job.id,
            )

    async def progress(self, job: pb.Job, step: int, *, attempt: int = 0, **fields: Any) -> None:
        """Report the training's progress as rank 0's agent does (current attempt by default)."""
        await self.send(
            "gantry.metrics.job.progress",
            JobProgress(job_id=job.id, attempt=attempt or job.attempt, step=step, **fields),
            job.id,
        )


@dataclass
class Running:
    """A running scheduler service and what a test needs to talk to it."""

    service: SchedulerService
    settings: SchedulerSettings
    keyring: Keyring
    issuer: TokenIssuer
    channel: grpc.aio.Channel
    stub: pb_grpc.SchedulerServiceStub
    agents: Agents
    nats_url: str

    def md(self, user: str = "mia", role: str = "ml-developer") -> Any:
        token = self.issuer.issue(user, [role], dt.timedelta(minutes=10))
        return (("authorization", f"Bearer {token}"),)

    async def submit(self, spec: str, user: str = "mia", **kw: Any) -> pb.Job:
        reply = await self.stub.SubmitJob(
            pb.SubmitJobRequest(spec_yaml=spec, **kw), metadata=self.md(user)
        )
        return reply.job

    async def get(self, job_id: str) -> pb.Job:
        return await self.stub.GetJob(
            pb.GetJobRequest(id=job_id), metadata=self.md("admin", "platform-admin")
        )

    async def wait(
        self, job_id: str, predicate: Callable[[pb.Job], bool], timeout: float = 10.0
    ) -> pb.Job:
        """Poll the job until ``predicate`` holds."""
        job = await self.get(job_id)
        async with asyncio.timeout(timeout):
            while not predicate(job):
                await asyncio.sleep(0.03)
                job = await self.get(job_id)
        return job

    async def wait_state(self, job_id: str, state: str, timeout: float = 10.0) -> pb.Job:
        return await self.wait(job_id, lambda j: j.state == state, timeout)


def scheduler_settings(
    data_dir: Path, nats_url: str, database_url: str | None = None, **options: Any
) -> SchedulerSettings:
    return SchedulerSettings(
        data_dir=data_dir,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        scheduler=SchedulerOptions(
            database_url=database_url,
            grpc_port=0,
            metrics_port=0,
            pass_interval_s=0.1,
            **options,
        ),
    )


async def start(settings: SchedulerSettings) -> tuple[SchedulerService, asyncio.Task[None]]:
    service = SchedulerService(settings)
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or not (settings.data_dir / "run" / "scheduler.json").exists():
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    return service, task


@contextlib.asynccontextmanager
async def running(settings: SchedulerSettings) -> AsyncIterator[Running]:
    """Keys, a started service, agents, a channel to it, and a clean stop afterwards."""
    keyring = Keyring(settings.keys_dir)
    issuer = TokenIssuer(keyring.issuer(create=True))
    bus = await Bus.connect(settings.nats, name="test-agents")
    await bus.ensure_streams()
    agents = Agents(Publisher(bus, signer=keyring.service_key("training-agent")), bus)
    try:
        async with incarnation(settings, keyring, issuer, agents) as r:
            yield r
    finally:
        await bus.close()


@contextlib.asynccontextmanager
async def incarnation(
    settings: SchedulerSettings, keyring: Keyring, issuer: TokenIssuer, agents: Agents
) -> AsyncIterator[Running]:
    """One scheduler process lifetime: a fresh SchedulerService on the settings' data and DB."""
    service, task = await start(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
    try:
        yield Running(
            service,
            settings,
            keyring,
            issuer,
            channel,
            pb_grpc.SchedulerServiceStub(channel),
            agents,
            settings.nats.url,
        )
    finally:
        await channel.close()
        service.stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def sched(tmp_path: Path, nats_url: str) -> AsyncIterator[Running]:
    """The service on SQLite."""
    async with running(scheduler_settings(tmp_path / "data", nats_url)) as r:
        yield r


@pytest.fixture
async def tap(nats_url: str) -> AsyncIterator[EventTap]:
    t = await EventTap().start(nats_url, "gantry.>")
    yield t
    await t.close()
