"""The harness of the node agent's tests: a real nats-server (the gantry-testing plugin), a
watch on everything published under ``gantry.>``, the scheduler's part played by the test
(signed ``gantry.job.scheduled`` / ``gantry.job.stop.requested``), and an agent for node
``n1`` in the test's event loop."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from gantry.core import NatsSettings, new_id
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import (
    JOB_SCHEDULED,
    JOB_STOP_REQUESTED,
    EventData,
    JobScheduled,
    JobStopRequested,
    WorkerPlacement,
)
from gantry.security.keyring import Keyring
from gantry.training_agent.agent import SCHEDULER_SOURCE, NodeAgent
from gantry.training_agent.inventory import NodeInventory, declared_gpus
from gantry.training_agent.settings import AgentOptions, AgentSettings

HEARTBEAT_S = 0.2
NODE = "n1"


# -- watching the bus and playing the scheduler ----------------------------------------------


@dataclass
class Seen:
    subject: str
    headers: dict[str, str]
    event: EventEnvelope
    at: float


@dataclass
class Watch:
    """Everything published under ``gantry.>``, as it arrives."""

    seen: list[Seen] = field(default_factory=list)
    new: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_msg(self, msg: Any) -> None:
        event = EventEnvelope.from_bytes(msg.data)
        self.seen.append(Seen(msg.subject, dict(msg.headers or {}), event, time.monotonic()))
        self.new.set()

    def of(self, subject: str, **where: Any) -> list[EventEnvelope]:
        return [
            s.event
            for s in self.seen
            if s.subject == subject and all(s.event.data.get(k) == v for k, v in where.items())
        ]

    def reports(self, job_id: str) -> list[dict[str, Any]]:
        return [e.data for e in self.of("gantry.job.workers", job_id=job_id)]

    def statuses(self, job_id: str) -> list[str]:
        return [r["status"] for r in self.reports(job_id)]

    def log_lines(self, job_id: str, stream: str = "stdout") -> list[str]:
        return [
            line for e in self.of("gantry.log.job", job_id=job_id, stream=stream)
            for line in e.data["lines"]
        ]  # fmt: skip

    async def until(
        self, subject: str, n: int = 1, *, wait_s: float = 10.0, **where: Any
    ) -> list[EventEnvelope]:
        async with asyncio.timeout(wait_s):
            while len(found := self.of(subject, **where)) < n:
                self.new.clear()
                await self.new.wait()
        return found

    async def report(self, job_id: str, status: str, *, wait_s: float = 10.0) -> dict[str, Any]:
        return (
            await self.until("gantry.job.workers", job_id=job_id, status=status, wait_s=wait_s)
        )[0].data


@dataclass
class Scheduler:
    """Publishes what the scheduler would, signed with its service key."""

    bus: Bus
    keyring: Keyring

    def envelope(
        self, type_: str, data: EventData, source: str = SCHEDULER_SOURCE
    ) -> EventEnvelope:
        return EventEnvelope(
            type=type_, source=source, actor="svc-scheduler", data=data.model_dump(mode="json")
        )

    async def publish(self, event: EventEnvelope, signer: Any = "scheduler") -> None:
        key = self.keyring.service_key(signer) if isinstance(signer, str) else signer
        await Publisher(self.bus, signer=key).publish(event)

    def job(
        self,
        script: str,
        *,
        job_id: str | None = None,
        workers: int = 1,
        elsewhere: int = 0,
        attempt: int = 1,
        resume: bool = False,
        node: str = NODE,
    ) -> JobScheduled:
        placements = [
            WorkerPlacement(worker=r, node=node, gpus=[(r, 1000)]) for r in range(workers)
        ] + [WorkerPlacement(worker=workers + r, node="n-other") for r in range(elsewhere)]
        return JobScheduled(
            job_id=job_id or new_id(),
            attempt=attempt,
            resume=resume,
            nodes=sorted({p.node for p in placements}),
            placements=placements,
            spec={"entrypoint": {"command": [sys.executable, "-c", script]}},
        )

    async def schedule(self, job: JobScheduled, **kw: Any) -> EventEnvelope:
        event = self.envelope(JOB_SCHEDULED.type, job, **kw)
        await self.publish(event)
        return event

    async def stop(self, job: JobScheduled, *, grace_s: float = 5.0, **kw: Any) -> None:
        request = JobStopRequested(
            job_id=job.job_id, attempt=job.attempt, reason="preempted", grace_s=grace_s, **kw
        )
        await self.publish(self.envelope(JOB_STOP_REQUESTED.type, request))


@dataclass
class Env:
    data_dir: Path
    nats_url: str
    keyring: Keyring
    watch: Watch
    scheduler: Scheduler

    def settings(self) -> AgentSettings:
        return AgentSettings(
            data_dir=self.data_dir,
            nats=NatsSettings(url=self.nats_url, reconnect_wait_s=0.1),
            agent=AgentOptions(
                heartbeat_s=HEARTBEAT_S,
                log_flush_s=0.1,
                shutdown_grace_s=5,
                progress_interval_s=0.2,
                restart_backoff_s=0.2,
            ),
        )

    def checkpoint_dir(self, job: JobScheduled) -> Path:
        return self.settings().checkpoint_root / job.job_id


@pytest.fixture
async def env(tmp_path: Path, nats_url: str) -> AsyncIterator[Env]:
    """Keys, the streams, a watch on the bus and the scheduler's publisher."""
    data_dir = tmp_path / "data"
    keyring = Keyring(data_dir / "keys")
    keyring.service_key("scheduler")
    watch = Watch()
    nc = await nats.connect(nats_url, reconnect_time_wait=0.1)
    await nc.subscribe("gantry.>", cb=watch.on_msg)
    await nc.flush()
    bus = await Bus.connect(NatsSettings(url=nats_url, reconnect_wait_s=0.1), name="scheduler")
    await bus.ensure_streams()
    try:
        yield Env(data_dir, nats_url, keyring, watch, Scheduler(bus, keyring))
    finally:
        await bus.close()
        await nc.close()


@pytest.fixture
async def agent(env: Env) -> AsyncIterator[NodeAgent]:
    """An agent for node n1 (8 CPUs, 16 GiB, two declared A100s) in this event loop."""
    inventory = NodeInventory(
        node=NODE,
        pool="onprem",
        cpu_milli=8000,
        memory_mib=16384,
        gpus=declared_gpus(2, "A100", 81920),
        labels={"rack": "r1"},
    )
    node = NodeAgent(env.settings(), inventory, keyring=env.keyring)
    task = asyncio.create_task(node.run())
    async with asyncio.timeout(10):
        while not node.ready.is_set():
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
    try:
        yield node
    finally:
        node.stop()
        await asyncio.wait_for(task, 20)
