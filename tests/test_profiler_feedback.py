"""End to end through NATS: the profiler marks a throttling node degraded, and the scheduler
places the next gang elsewhere; when the node recovers it takes work again."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import grpc

from gantry.core import NatsSettings
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import GpuDevice, GpuUsage, NodeHeartbeat, NodeRegistered
from gantry.profiler.app import ProfilerService
from gantry.profiler.settings import ProfilerOptions, ProfilerSettings
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.scheduler.app import SchedulerService
from gantry.scheduler.settings import SchedulerOptions, SchedulerSettings
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap

JOB = """apiVersion: gantry/v1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: 1
  resources: {{gpus: 8, cpus: 1, memory: 1Gi}}
  entrypoint: {{command: [python, -c, 'print(1)']}}
"""


async def _started(service: SchedulerService | ProfilerService, data_dir: Path, name: str) -> None:
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or not (data_dir / "run" / f"{name}.json").exists():
            await asyncio.sleep(0.05)


async def test_a_degraded_node_is_avoided_for_the_next_gang(tmp_path: Path, nats_url: str) -> None:
    data = tmp_path / "data"
    nats_settings = NatsSettings(url=nats_url, reconnect_wait_s=0.1)
    keyring = Keyring(data / "keys")
    issuer = TokenIssuer(keyring.issuer(create=True))
    scheduler = SchedulerService(
        SchedulerSettings(
            data_dir=data,
            nats=nats_settings,
            scheduler=SchedulerOptions(grpc_port=0, metrics_port=0, pass_interval_s=0.1),
        )
    )
    profiler = ProfilerService(
        ProfilerSettings(
            data_dir=data,
            nats=nats_settings,
            profiler=ProfilerOptions(grpc_port=0, metrics_port=0),
        )
    )
    tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(profiler.run())]
    bus = await Bus.connect(nats_settings, name="test-agents")
    tap = await EventTap().start(nats_url, "gantry.>")
    channel = None
    try:
        await _started(scheduler, data, "scheduler")
        await _started(profiler, data, "profiler")
        agent = Publisher(bus, signer=keyring.service_key("training-agent"))

        async def send(type_: str, payload: NodeRegistered | NodeHeartbeat, node: str) -> None:
            await agent.publish(
                EventEnvelope(
                    type=type_,
                    source="gantry/training-agent",
                    actor="svc-training-agent",
                    subject=node,
                    data=payload.model_dump(mode="json"),
                )
            )

        for node in ("hot", "cool"):
            await send(
                "gantry.node.registered",
                NodeRegistered(
                    node=node,
                    cpu_milli=64_000,
                    memory_mib=512 * 1024,
                    gpus=[GpuDevice(index=i, model="A100", memory_mib=81920) for i in range(8)],
                    heartbeat_s=0.5,
                    agent=f"test/{node}",
                ),
                node,
            )
        hot_throttled = True

        async def heartbeats() -> None:
            seq = 0
            while True:
                for node in ("hot", "cool"):
                    seq += 1
                    throttled = hot_throttled and node == "hot"
                    gpus = [GpuUsage(index=i, util=0.5, throttled=throttled) for i in range(8)]
                    await send(
                        "gantry.metrics.node.heartbeat",
                        NodeHeartbeat(node=node, seq=seq, gpus=gpus, gpu_util=0.5),
                        node,
                    )
                await asyncio.sleep(0.2)

        tasks.append(asyncio.create_task(heartbeats()))
        degraded = await tap.wait_for("gantry.node.degraded", node="hot", timeout=15)
        assert degraded[0].source == "gantry/profiler"
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{scheduler.grpc_port}")
        stub = pb_grpc.SchedulerServiceStub(channel)
        token = issuer.issue("ann", ["ml-developer"], dt.timedelta(minutes=5))
        md = [("authorization", f"Bearer {token}")]
        async with asyncio.timeout(15):
            while True:  # the scheduler read the profiler's event
                nodes = await stub.ListNodes(pb.ListNodesRequest(), metadata=md)
                if {n.name: n.state for n in nodes.nodes}.get("hot") == "degraded":
                    break
                await asyncio.sleep(0.1)
        first = await stub.SubmitJob(
            pb.SubmitJobRequest(spec_yaml=JOB.format(name="first")), metadata=md
        )
        async with asyncio.timeout(15):
            while not (
                got := await stub.GetJob(pb.GetJobRequest(id=first.job.id), metadata=md)
            ).placements:
                await asyncio.sleep(0.1)
        assert [p.node for p in got.placements] == ["cool"]  # the healthy node
        second = await stub.SubmitJob(
            pb.SubmitJobRequest(spec_yaml=JOB.format(name="second")), metadata=md
        )
        await asyncio.sleep(2.0)  # several scheduling passes
        got = await stub.GetJob(pb.GetJobRequest(id=second.job.id), metadata=md)
        # cool is full: the gang waits rather than land on the degraded node
        assert got.state == "pending" and not got.placements
        hot_throttled = False
        await tap.wait_for("gantry.node.recovered", node="hot", timeout=15)
        async with asyncio.timeout(15):
            while not (
                got := await stub.GetJob(pb.GetJobRequest(id=second.job.id), metadata=md)
            ).placements:
                await asyncio.sleep(0.1)  # recovered: the waiting gang is placed there now
        assert [p.node for p in got.placements] == ["hot"]
    finally:
        if channel is not None:
            await channel.close()
        await tap.close()
        scheduler.stop()
        profiler.stop()
        for extra in tasks[2:]:
            extra.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await bus.close()
