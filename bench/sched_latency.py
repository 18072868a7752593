"""Benchmark: submit → scheduled latency through the real scheduler service, NATS in the loop.

    python bench/sched_latency.py [--quick]

Starts a real nats-server (JetStream, port 0) and the scheduler service (SQLite, its gRPC API,
its consumers and outbox relay, in this process), registers a cluster of node agents over NATS
(signed ``gantry.node.registered`` events: 64 nodes x 8 A100), then submits jobs one at a
time through the gRPC API as an ML engineer and measures, per job, the time from the submit
call until the ``gantry.job.scheduled`` event for it arrives on a NATS subscription — the
moment a node agent would learn of the placement. Each placed job is reported finished by the
agents so the cluster never fills. A second pass submits bursts of 20 at once (the queue
depth a busy scheduler sees).

Figures: ``submit_to_scheduled_p50_ms`` / ``_p99_ms`` (one at a time),
``burst_submit_to_scheduled_p50_ms`` / ``_p99_ms``, ``submit_rpc_p50_ms`` (the gRPC call
alone), and in the same run the baseline ``nats_roundtrip_p50_ms`` (a JetStream publish seen
by a subscriber: the floor any event-driven design pays) with ``ratio_p50_vs_nats``.
Target: ``submit_to_scheduled_p99_ms`` < 50 on this machine. Jobs: 400 (``--quick``: 120).
Prints one JSON object as its LAST line and writes it to bench/results/sched_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import nats
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit_result, median, percentile

from gantry.core import NatsSettings
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import GpuDevice, JobWorkersReported, NodeRegistered
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.scheduler.app import SchedulerService
from gantry.scheduler.settings import SchedulerOptions, SchedulerSettings
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.supervisor import NatsServer

NODES = 64
SPEC = """apiVersion: gantry/v1
kind: TrainingJob
metadata: {{name: bench-{i}, queue: default}}
spec:
  replicas: {replicas}
  resources: {{gpus: 1, cpus: 2, memory: 8Gi}}
  entrypoint: {{command: [python, train.py]}}
"""


class Agents:
    """Signed agent events: registrations and 'succeeded' reports."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    async def send(self, type_: str, data: Any) -> None:
        await self.publisher.publish(
            EventEnvelope(
                type=type_,
                source="gantry/training-agent",
                actor="svc-training-agent",
                data=data.model_dump(mode="json"),
            )
        )

    async def register(self, node: str) -> None:
        await self.send(
            "gantry.node.registered",
            NodeRegistered(
                node=node,
                cpu_milli=128_000,
                memory_mib=1 << 20,
                gpus=[GpuDevice(index=i, model="A100", memory_mib=81920) for i in range(8)],
                heartbeat_s=60,
            ),
        )

    async def finish(self, scheduled: dict[str, Any]) -> None:
        by_node: dict[str, list[int]] = {}
        for p in scheduled["placements"]:
            by_node.setdefault(p["node"], []).append(p["worker"])
        for status in ("started", "succeeded"):
            for node, workers in by_node.items():
                await self.send(
                    "gantry.job.workers",
                    JobWorkersReported(
                        job_id=scheduled["job_id"],
                        attempt=scheduled["attempt"],
                        node=node,
                        workers=workers,
                        status=status,  # type: ignore[arg-type]
                    ),
                )


async def measure(jobs: int, data_dir: Path) -> dict[str, Any]:
    server = NatsServer(data_dir / "nats").start()
    try:
        settings = SchedulerSettings(
            data_dir=data_dir / "gantry",
            log_level="WARNING",
            nats=NatsSettings(url=server.url, reconnect_wait_s=0.1),
            scheduler=SchedulerOptions(
                grpc_port=0, metrics_port=0, heartbeat_timeout_s=3600, pass_interval_s=1.0
            ),
        )
        keyring = Keyring(settings.keys_dir)
        token = TokenIssuer(keyring.issuer(create=True)).issue(
            "mia", ["ml-developer"], dt.timedelta(hours=1)
        )
        md = (("authorization", f"Bearer {token}"),)
        bus = await Bus.connect(settings.nats, name="bench-agents")
        await bus.ensure_streams()
        agents = Agents(Publisher(bus, signer=keyring.service_key("training-agent")))
        service = SchedulerService(settings)
        task = asyncio.create_task(service.run())
        while service.grpc_port == 0:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        stub = pb_grpc.SchedulerServiceStub(channel)
        nc = await nats.connect(server.url)
        arrived: dict[str, float] = {}
        events: dict[str, dict[str, Any]] = {}
        waiters: dict[str, asyncio.Event] = {}

        async def on_scheduled(msg: Any) -> None:
            data = orjson.loads(msg.data)["data"]
            arrived[data["job_id"]] = time.perf_counter()
            events[data["job_id"]] = data
            waiter = waiters.get(data["job_id"])
            if waiter is not None:
                waiter.set()

        await nc.subscribe("gantry.job.scheduled", cb=on_scheduled)
        for n in range(NODES):
            await agents.register(f"node-{n:03d}")
        async with asyncio.timeout(30):
            while len((await stub.ListNodes(pb.ListNodesRequest(), metadata=md)).nodes) < NODES:
                await asyncio.sleep(0.1)

        async def one(i: int, replicas: int) -> tuple[float, float]:
            start = time.perf_counter()
            reply = await stub.SubmitJob(
                pb.SubmitJobRequest(spec_yaml=SPEC.format(i=i, replicas=replicas)), metadata=md
            )
            rpc = time.perf_counter() - start
            job_id = reply.job.id
            if job_id not in arrived:
                waiter = waiters[job_id] = asyncio.Event()
                async with asyncio.timeout(10):
                    await waiter.wait()
            return rpc, arrived[job_id] - start

        for i in range(20):  # warm-up: connections, caches, the policy's score table
            await one(-1 - i, 1)
        latency: list[float] = []
        rpc: list[float] = []
        for i in range(jobs):
            r, total = await one(i, 1 + i % 4)
            rpc.append(r * 1000)
            latency.append(total * 1000)
            await agents.finish(events[reply_id(events, i)])
        burst: list[float] = []
        for b in range(max(jobs // 20, 1)):
            results = await asyncio.gather(*(one(10_000 + b * 20 + k, 1) for k in range(20)))
            burst.extend(total * 1000 for _, total in results)
            for data in list(events.values()):
                if data.get("_done"):
                    continue
                data["_done"] = True
                await agents.finish(data)

        # baseline: a JetStream publish seen by a core subscriber
        js = nc.jetstream()
        seen: dict[str, float] = {}
        got = asyncio.Event()

        async def on_ping(msg: Any) -> None:
            seen["t"] = time.perf_counter()
            got.set()

        await nc.subscribe("gantry.job.ping", cb=on_ping)
        baseline: list[float] = []
        for _ in range(200):
            got.clear()
            start = time.perf_counter()
            await js.publish("gantry.job.ping", b"{}")
            await got.wait()
            baseline.append((seen["t"] - start) * 1000)
        await nc.close()
        await channel.close()
        service.stop()
        await asyncio.wait_for(task, 30)
        await bus.close()
    finally:
        server.stop()
    p50 = percentile(latency, 50)
    base = median(baseline)
    return {
        "benchmark": "sched_latency",
        "jobs": jobs,
        "nodes": NODES,
        "submit_to_scheduled_p50_ms": round(p50, 2),
        "submit_to_scheduled_p99_ms": round(percentile(latency, 99), 2),
        "submit_to_scheduled_max_ms": round(max(latency), 2),
        "burst_submit_to_scheduled_p50_ms": round(percentile(burst, 50), 2),
        "burst_submit_to_scheduled_p99_ms": round(percentile(burst, 99), 2),
        "submit_rpc_p50_ms": round(percentile(rpc, 50), 2),
        "nats_roundtrip_p50_ms": round(base, 3),
        "ratio_p50_vs_nats": round(p50 / base, 1) if base else None,
        "target_p99_ms": 50,
    }


def reply_id(events: dict[str, dict[str, Any]], i: int) -> str:
    """The job id of benchmark job ``i`` (by its name)."""
    name = f"bench-{i}"
    for job_id, data in events.items():
        if data["name"] == name:
            data["_done"] = True
            return job_id
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120 jobs (under a minute)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="gantry-sched-latency-") as tmp:
        figures = asyncio.run(measure(120 if args.quick else 400, Path(tmp)))
    figures["quick"] = args.quick
    emit_result("sched_latency", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
