"""The profiler on a real nats-server: findings from step windows, refused and flooded input,
node health from heartbeats, the API and its authorisation, traces."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from gantry.events import EventEnvelope
from gantry.events.catalog import (
    GpuUsage,
    JobStateChanged,
    JobStepMetrics,
    NodeHeartbeat,
    NodeRegistered,
)
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.testing.events import EventTap, dead_letter_reasons
from gantry.testing.probes import readyz

from .conftest import Running, profiler_settings, running


def window(
    job: str,
    rank: int,
    node: str,
    first: int,
    last: int,
    *,
    data: float = 1.0,
    comm: float = 0.5,
    forward: float = 2.0,
    backward: float = 3.0,
    tokens: int = 0,
) -> JobStepMetrics:
    step = data + comm + forward + backward + 0.5
    steps = last - first + 1
    return JobStepMetrics(
        job_id=job,
        node=node,
        worker=rank,
        first_step=first,
        last_step=last,
        step_ms=step,
        step_ms_max=step * 1.2,
        data_ms=data,
        compute_ms=forward + backward,
        forward_ms=forward,
        backward_ms=backward,
        comm_ms=comm,
        optimizer_ms=0.5,
        samples=16 * steps,
        tokens=tokens * steps,
        loss=1.0 / last,
        memory_mib=300,
        at_ms=1_000 + last,
    )


async def slow_rank_one(p: Running, job: str, steps: int, per_window: int) -> None:
    """Rank 1's data loader takes 20 ms more per step; rank 0 waits for it."""
    for first in range(1, steps + 1, per_window):
        last = first + per_window - 1
        await p.steps(window(job, 0, "n0", first, last, comm=20.5))
        await p.steps(window(job, 1, "n1", first, last, data=21.0))


async def test_a_straggler_is_found_reported_and_shown(profiler: Running, tap: EventTap) -> None:
    await profiler.schedule("job-a", ["n0", "n1"])
    await asyncio.sleep(0.3)
    await slow_rank_one(profiler, "job-a", 60, 10)
    found = await tap.wait_for("gantry.job.profile.finding", kind="straggler", timeout=15)
    data = found[0].data
    assert (data["rank"], data["node"], data["phase"], data["cause"]) == (
        1,
        "n1",
        "data",
        "slow_data_loading",
    )
    assert found[0].source == "gantry/profiler" and found[0].subject == "job-a"
    assert "rank 1 on n1 is a straggler" in data["summary"]
    profile = await profiler.stub.GetJobProfile(
        pb.GetJobProfileRequest(job_id="job-a-name"), metadata=profiler.md()
    )
    assert profile.job_id == "job-a" and profile.world_size == 2
    assert [r.node for r in profile.ranks] == ["n0", "n1"]
    slow = profile.ranks[1]
    assert slow.recent.data_ms == pytest.approx(21.0)
    assert profile.ranks[0].recent.comm_ms == pytest.approx(20.5)
    # the rate limit merged windows, but every step is still counted
    for rank in profile.ranks:
        steps = sum(p.last_step - p.first_step + 1 for p in rank.timeline)
        assert steps == 60
    straggler = [f for f in profile.findings if f.kind == "straggler"]
    assert straggler and straggler[0].state == "raised"
    assert orjson.loads(straggler[0].evidence_json)["ratio"] > 2
    metrics = await asyncio.to_thread(scrape, profiler.service.metrics_port)
    assert 'gantry_profiler_finding_active{attempt="1",cause="slow_data_loading"' in metrics
    phase = 'gantry_profiler_rank_phase_ms{attempt="1",job_id="job-a",node="n1",phase="data"'
    assert phase + ',rank="1"} 21.0' in metrics
    # the job ends: its standing findings end with it, each with its event
    await end_job(profiler, "job-a", "succeeded")
    cleared = await tap.wait_for("gantry.job.profile.finding", state="cleared", job_id="job-a")
    assert cleared[0].data["summary"].startswith("cleared: the job ended (succeeded)")
    metrics = await asyncio.to_thread(scrape, profiler.service.metrics_port)
    assert 'job_id="job-a"' not in metrics  # no stale series of an ended job


async def end_job(p: Running, job: str, state: str) -> None:
    await p.scheduler.publish(
        EventEnvelope(
            type="gantry.job.state",
            source="gantry/scheduler",
            actor="ann",
            subject=job,
            data=JobStateChanged(job_id=job, state=state, attempt=1).model_dump(mode="json"),
        )
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def test_a_flood_of_windows_is_merged_without_losing_the_verdict(
    profiler: Running, tap: EventTap
) -> None:
    await profiler.schedule("job-f", ["n0", "n1"])
    await asyncio.sleep(0.3)
    await slow_rank_one(profiler, "job-f", 300, 1)  # one message per step: a flood
    await tap.wait_for("gantry.job.profile.finding", kind="straggler", timeout=20)
    recorder = profiler.service.recorder
    assert recorder.profiles.merged > 100
    async with asyncio.timeout(10):
        while True:
            profile = await profiler.stub.GetJobProfile(
                pb.GetJobProfileRequest(job_id="job-f"), metadata=profiler.md()
            )
            steps = [sum(p.last_step - p.first_step + 1 for p in r.timeline) for r in profile.ranks]
            if steps == [300, 300]:
                break
            await asyncio.sleep(0.2)
    assert len(profile.ranks[0].timeline) < 300


async def test_bad_metrics_are_dead_lettered_with_the_reason(
    profiler: Running, nats_url: str, tap: EventTap
) -> None:
    await profiler.schedule("job-b", ["n0", "n1"])
    await asyncio.sleep(0.3)
    lying = window("job-b", 0, "n0", 1, 10).model_copy(update={"data_ms": 500.0})
    await profiler.steps(lying)
    await profiler.steps(window("job-nope", 0, "n0", 1, 10))
    await profiler.steps(window("job-b", 1, "n7", 1, 10))
    await profiler.steps(window("job-b", 5, "n0", 1, 10))
    reasons = await dead_letter_reasons(nats_url, "gantry.deadletter.profiler-steps", 4)
    text = "\n".join(reasons)
    assert "phases add up to" in text
    assert "not a job the profiler saw scheduled" in text
    assert "does not run" in text or "runs on n1, not on n7" in text
    assert "has no rank 5" in text
    # good windows of the same job are still taken
    await profiler.steps(window("job-b", 0, "n0", 1, 10))
    await profiler.steps(window("job-b", 1, "n1", 1, 10))
    async with asyncio.timeout(10):
        while profiler.service.recorder.profiles.jobs["job-b"].last_step < 10:
            await asyncio.sleep(0.05)


async def test_throttling_degrades_a_node_and_clean_heartbeats_recover_it(
    profiler: Running, tap: EventTap
) -> None:
    async def beat(seq: int, throttled: bool) -> None:
        hb = NodeHeartbeat(
            node="gpu-1",
            seq=seq,
            gpu_util=0.9,
            cpu_util=0.2,
            gpus=[GpuUsage(index=0, util=0.9, temperature_c=91.0, throttled=throttled)],
        )
        await profiler.agent.publish(
            EventEnvelope(
                type="gantry.metrics.node.heartbeat",
                source="gantry/training-agent",
                actor="svc-training-agent",
                subject="gpu-1",
                data=hb.model_dump(mode="json"),
            )
        )

    for seq in range(1, 3):
        await beat(seq, True)
    await asyncio.sleep(0.5)
    assert not tap.of("gantry.node.degraded")  # two throttled heartbeats are not enough
    await beat(3, True)
    degraded = await tap.wait_for("gantry.node.degraded", node="gpu-1")
    assert degraded[0].data["evidence"]["throttled_gpus"] == [0]
    nodes = await profiler.stub.ListNodes(pb.ListNodesRequest(), metadata=profiler.md())
    (node,) = nodes.nodes
    assert node.state == "degraded" and node.throttled and node.temperature_c == 91.0
    assert nodes.cluster.degraded == 1
    for seq in range(4, 10):
        await beat(seq, False)
    await tap.wait_for("gantry.node.recovered", node="gpu-1")


async def test_operators_mark_nodes_and_developers_may_not(
    profiler: Running, tap: EventTap
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await profiler.stub.SetNodeHealth(
            pb.SetNodeHealthRequest(node="n9", degraded=True), metadata=profiler.md()
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin = profiler.md("pat", "platform-admin")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await profiler.stub.SetNodeHealth(
            pb.SetNodeHealthRequest(node="n9", degraded=True), metadata=admin
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # no such node: nothing invented
    await profiler.agent.publish(
        EventEnvelope(
            type="gantry.node.registered",
            source="gantry/training-agent",
            actor="svc-training-agent",
            subject="n9",
            data=NodeRegistered(node="n9", cpu_milli=8000, memory_mib=1024).model_dump(mode="json"),
        )
    )
    async with asyncio.timeout(10):
        while "n9" not in profiler.service.recorder.profiles.tracker.nodes:
            await asyncio.sleep(0.05)
    node = await profiler.stub.SetNodeHealth(
        pb.SetNodeHealthRequest(node="n9", degraded=True, reason="bad DIMM"), metadata=admin
    )
    assert node.state == "degraded" and node.reason == "bad DIMM"
    events = await tap.wait_for("gantry.node.degraded", node="n9")
    assert events[0].actor == "pat"
    # the node comes back (its agent restarted): the profiler says again that it is degraded,
    # for a scheduler that would otherwise take it as ready
    await profiler.agent.publish(
        EventEnvelope(
            type="gantry.node.registered",
            source="gantry/training-agent",
            actor="svc-training-agent",
            subject="n9",
            data=NodeRegistered(node="n9", cpu_milli=8000, memory_mib=1024).model_dump(mode="json"),
        )
    )
    again = await tap.wait_for("gantry.node.degraded", count=2, node="n9")
    assert again[1].data["reason"] == "bad DIMM"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await profiler.stub.GetJobProfile(pb.GetJobProfileRequest(job_id="nope"))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await profiler.stub.GetJobProfile(
            pb.GetJobProfileRequest(job_id="nope"), metadata=profiler.md()
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "gantry jobs list" in (err.value.details() or "")


async def test_traces_are_requested_uploaded_encrypted_and_downloaded(
    profiler: Running, tap: EventTap
) -> None:
    from gantry.security.tokens import ServiceToken

    await profiler.schedule("job-t", ["n0", "n1"], owner="ann")
    await asyncio.sleep(0.3)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # even with no trace yet: not bo's job
        await profiler.stub.ListTraces(
            pb.ListTracesRequest(job_id="job-t"), metadata=profiler.md("bo")
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "read traces of" in (err.value.details() or "")
    listed = await profiler.stub.ListTraces(
        pb.ListTracesRequest(job_id="job-t"), metadata=profiler.md("ann")
    )
    assert list(listed.traces) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await profiler.stub.StartTrace(
            pb.StartTraceRequest(job_id="job-t", steps=5), metadata=profiler.md("bo")
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    trace = await profiler.stub.StartTrace(
        pb.StartTraceRequest(job_id="job-t", steps=5, ranks=[1]), metadata=profiler.md("ann")
    )
    assert trace.state == "pending" and trace.steps == 5
    asked = await tap.wait_for("gantry.job.trace.requested", job_id="job-t")
    assert asked[0].data["ranks"] == [1] and asked[0].data["trace_id"] == trace.trace_id
    token = ServiceToken("training-agent", lambda: profiler.keyring.issuer()).get()
    agent_md = [("authorization", f"Bearer {token}")]
    payload = b"\x1f\x8b" + bytes(range(256)) * 9000  # a few MB-ish of "gzip"

    def upload(node: str, md: Any = agent_md) -> Any:
        async def messages() -> Any:
            yield pb.UploadTraceRequest(
                trace_id=trace.trace_id, job_id="job-t", attempt=1, rank=1, node=node,
                first_step=12, steps=5,
            )  # fmt: skip
            for i in range(0, len(payload), 1 << 20):
                yield pb.UploadTraceRequest(data=payload[i : i + (1 << 20)])

        return profiler.stub.UploadTrace(messages(), metadata=md)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload("n0")  # rank 1 does not run there
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    serving = ServiceToken("serving", lambda: profiler.keyring.issuer()).get()
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a service, but not a node agent
        await upload("n1", [("authorization", f"Bearer {serving}")])
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only the node agents" in (err.value.details() or "")
    stored = await upload("n1")
    assert stored.bytes == len(payload)
    ready = await tap.wait_for("gantry.job.trace.ready", job_id="job-t")
    assert ready[0].data["sha256"] == stored.sha256
    got = await profiler.stub.GetTrace(
        pb.GetTraceRequest(trace_id=trace.trace_id), metadata=profiler.md()
    )
    assert got.state == "ready" and got.files[0].first_step == 12
    with pytest.raises(grpc.aio.AioRpcError) as err:  # another developer: not their job
        async for _ in profiler.stub.DownloadTrace(
            pb.DownloadTraceRequest(trace_id=trace.trace_id, rank=1), metadata=profiler.md("bo")
        ):
            pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    chunks = [
        c.data
        async for c in profiler.stub.DownloadTrace(
            pb.DownloadTraceRequest(trace_id=trace.trace_id, rank=1), metadata=profiler.md()
        )
    ]
    assert b"".join(chunks) == payload
    # stored encrypted: the plaintext is nowhere under the data directory
    root = Path(profiler.settings.data_dir)
    assert await asyncio.to_thread(files_holding, root, payload[:4096]) == []


async def test_running_jobs_and_findings_survive_a_restart(tmp_path: Path, nats_url: str) -> None:
    settings = profiler_settings(tmp_path / "d", nats_url)
    async with running(settings) as p:
        await p.schedule("job-r", ["n0", "n1"])
        await asyncio.sleep(0.3)
        await slow_rank_one(p, "job-r", 60, 10)
        async with asyncio.timeout(10):
            while not p.service.recorder.profiles.standing("job-r"):
                await asyncio.sleep(0.05)
    async with running(settings) as p:
        standing = p.service.recorder.profiles.standing("job-r")
        assert [f.kind for f in standing] == ["straggler"]
        await slow_rank_one(p, "job-r", 0, 10)
        profile = await p.stub.GetJobProfile(
            pb.GetJobProfileRequest(job_id="job-r"), metadata=p.md()
        )
        assert profile.state == "running" and profile.last_step == 60


async def test_readyz_answers_once_the_service_is_up(profiler: Running) -> None:
    assert await readyz(profiler.service.metrics_port) == "200 ready\n"
