"""The scheduler service end to end over gRPC and real NATS: lifecycle, validation, quotas,
duplicates, preemption, cancel, watch, logs, usage, pools, degraded nodes, RBAC."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gantry.events.catalog import DatasetCreated, JobLogLines, NodeHealth
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.testing.events import EventTap
from gantry.testing.probes import readyz

from .conftest import Running, job_yaml


async def test_a_job_goes_pending_scheduled_running_succeeded_with_events_and_usage(
    sched: Running, tap: EventTap
) -> None:
    job = await sched.submit(job_yaml("resnet", replicas=2, gpus=2))
    assert job.state == "pending" and "no node" in job.reason
    await sched.agents.register("gpu-1")
    job = await sched.wait_state(job.id, "scheduled")
    assert job.attempt == 1 and len(job.placements) == 2
    assert {p.node for p in job.placements} == {"gpu-1"}  # pack: one node has room for both
    (scheduled,) = await tap.wait_for("gantry.job.scheduled", job_id=job.id)
    assert scheduled.source == "gantry/scheduler"
    assert scheduled.data["owner"] == "mia" and scheduled.data["spec"]["replicas"] == 2
    assert [p["worker"] for p in scheduled.data["placements"]] == [0, 1]
    await sched.agents.report(job, "started")
    job = await sched.wait_state(job.id, "running")
    await sched.agents.report(job, "succeeded")
    job = await sched.wait_state(job.id, "succeeded")
    states = [h.state for h in job.history]
    assert states == ["pending", "scheduled", "running", "succeeded"]
    usage = await tap.wait_for("gantry.job.usage", job_id=job.id)
    assert usage[0].data["gpu_seconds"] >= 0 and usage[0].data["queue"] == "default"
    report = await sched.stub.Usage(pb.UsageRequest(group_by="user"), metadata=sched.md())
    assert [r.key for r in report.rows] == ["mia"] and report.rows[0].jobs == 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (job_yaml(gpus=-1), "spec.resources.gpus"),
        (job_yaml(extra_resources=", gpuModels: [H900]"), "no node has H900"),
        (job_yaml(gpus=16, topology="same-node"), "can never run"),
        (job_yaml(replicas=9, gpus=8), "can never run"),
        (job_yaml(queue="nope"), "no queue 'nope'"),
        ("kind: TrainingJob\n", "apiVersion"),
        ("", "empty"),
    ],
)
async def test_invalid_specs_are_rejected_at_submit_with_the_reason(
    sched: Running, spec: str, expected: str
) -> None:
    await sched.agents.register("gpu-1")
    await sched.agents.register("gpu-2")
    await asyncio.sleep(0.3)  # let the registrations land
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.submit(spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (err.value.details() or "")
    listing = await sched.stub.ListJobs(pb.ListJobsRequest(), metadata=sched.md())
    assert len(listing.jobs) == 0  # nothing left pending forever


async def test_over_quota_waits_with_the_reason_and_is_admitted_later(sched: Running) -> None:
    admin = sched.md("root", "platform-admin")
    await sched.stub.SetQuota(
        pb.SetQuotaRequest(queue="small", quota=pb.Resources(gpus=2, cpus=16, memory_mib=65536)),
        metadata=admin,
    )
    await sched.agents.register("gpu-1")
    first = await sched.submit(job_yaml("a", gpus=2, queue="small"))
    second = await sched.submit(job_yaml("b", gpus=2, queue="small"))
    first = await sched.wait_state(first.id, "scheduled")
    second = await sched.wait(second.id, lambda j: "quota" in j.reason)
    assert second.state == "pending" and "small" in second.reason
    queues = await sched.stub.ListQueues(pb.ListQueuesRequest(), metadata=sched.md())
    small = next(q for q in queues.queues if q.name == "small")
    assert small.used.gpus == 2 and small.pending == 1 and small.running == 1
    await sched.agents.report(first, "started")
    await sched.agents.report(first, "succeeded")
    await sched.wait_state(second.id, "scheduled")


async def test_duplicate_submit_with_the_same_request_id_is_one_job(sched: Running) -> None:
    spec = job_yaml("dup")
    one = await sched.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec, request_id="req-1"), metadata=sched.md()
    )
    two = await sched.stub.SubmitJob(
        pb.SubmitJobRequest(spec_yaml=spec, request_id="req-1"), metadata=sched.md()
    )
    assert two.duplicate and not one.duplicate and two.job.id == one.job.id
    three = await sched.submit(job_yaml("dup", request_id="req-2"))
    four = await sched.submit(job_yaml("dup", request_id="req-2"))
    assert three.id == four.id != one.job.id
    listing = await sched.stub.ListJobs(pb.ListJobsRequest(), metadata=sched.md())
    assert len(listing.jobs) == 2


async def test_preemption_checkpoints_and_requeues_the_victim(
    sched: Running, tap: EventTap
) -> None:
    await sched.agents.register("gpu-1", gpus=4)
    low = await sched.submit(job_yaml("low", gpus=4, priority="low"))
    low = await sched.wait_state(low.id, "scheduled")
    await sched.agents.report(low, "started")
    await sched.wait_state(low.id, "running")
    high = await sched.submit(job_yaml("high", gpus=4, priority="high"))
    low = await sched.wait_state(low.id, "stopping")
    assert "preempted for " + high.id in low.reason
    (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=low.id)
    assert stop.data["reason"] == "preempted" and stop.data["nodes"] == ["gpu-1"]
    await sched.agents.report(low, "checkpointed")
    await sched.agents.report(low, "stopped")
    await sched.wait_state(high.id, "scheduled")
    low = await sched.get(low.id)
    assert low.state == "pending" and low.attempt == 1
    assert any("resumes from its last checkpoint" in h.reason for h in low.history)


async def test_cancel_stops_workers_then_cancels_and_watch_streams_it(sched: Running) -> None:
    await sched.agents.register("gpu-1")
    job = await sched.submit(job_yaml("c"))
    job = await sched.wait_state(job.id, "scheduled")
    seen: list[str] = []

    async def watch() -> None:
        call = sched.stub.WatchJobs(
            pb.WatchJobsRequest(id=job.id, include_current=True), metadata=sched.md()
        )
        async for change in call:
            seen.append(change.state)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    await sched.agents.report(job, "started")
    await sched.wait_state(job.id, "running")
    cancelled = await sched.stub.CancelJob(pb.CancelJobRequest(id=job.id), metadata=sched.md())
    assert cancelled.state == "stopping"
    await sched.agents.report(job, "stopped")
    await sched.wait_state(job.id, "cancelled")
    await asyncio.wait_for(watcher, 5)  # the stream ends at the terminal state
    assert seen[0] == "scheduled" and seen[-1] == "cancelled" and "running" in seen
    pending = await sched.submit(job_yaml("p", gpus=8))
    pending2 = await sched.submit(job_yaml("p2", gpus=8))
    gone = await sched.stub.CancelJob(pb.CancelJobRequest(id=pending2.id), metadata=sched.md())
    assert gone.state == "cancelled"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.stub.CancelJob(pb.CancelJobRequest(id=pending2.id), metadata=sched.md())
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    del pending


async def test_logs_are_kept_and_followed(sched: Running) -> None:
    await sched.agents.register("gpu-1")
    job = await sched.submit(job_yaml("l"))
    job = await sched.wait_state(job.id, "scheduled")
    lines = JobLogLines(job_id=job.id, node="gpu-1", worker=0, lines=["epoch 1", "epoch 2"])
    await sched.agents.send("gantry.log.job", lines, job.id)
    got: list[str] = []

    async def follow() -> None:
        call = sched.stub.JobLogs(pb.JobLogsRequest(id=job.id, follow=True), metadata=sched.md())
        async for line in call:
            got.append(line.text)
            if len(got) == 3:
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.3)
    more = JobLogLines(job_id=job.id, node="gpu-1", worker=0, lines=["done"])
    await sched.agents.send("gantry.log.job", more, job.id)
    await asyncio.wait_for(follower, 5)
    assert got == ["epoch 1", "epoch 2", "done"]
    tail = [
        line.text
        async for line in sched.stub.JobLogs(
            pb.JobLogsRequest(id=job.id, tail=1), metadata=sched.md()
        )
    ]
    assert tail == ["done"]
    with pytest.raises(grpc.aio.AioRpcError) as err:  # someone else's job
        async for _ in sched.stub.JobLogs(pb.JobLogsRequest(id=job.id), metadata=sched.md("bo")):
            pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_sensitive_data_stays_on_trusted_pools_and_degraded_nodes_are_avoided(
    tmp_path: object, nats_url: str
) -> None:
    from pathlib import Path

    from gantry.events import EventEnvelope, Publisher

    from .conftest import running, scheduler_settings

    settings = scheduler_settings(
        Path(str(tmp_path)) / "d", nats_url, pools={"onprem": True, "cloud": False}
    )
    async with running(settings) as s:
        await s.agents.register("cloud-1", pool="cloud")
        await s.agents.register("onprem-1", pool="onprem")
        await s.agents.register("onprem-2", pool="onprem")
        gov = Publisher(s.agents.bus, signer=s.keyring.service_key("governance"))
        await gov.publish(
            EventEnvelope(
                type="gantry.data.dataset.created",
                source="gantry/governance",
                actor="sam",
                data=DatasetCreated(
                    dataset="patients", format="table", owner="sam", sensitivity="pii"
                ).model_dump(mode="json"),
            )
        )
        profiler = Publisher(s.agents.bus, signer=s.keyring.service_key("profiler"))
        await profiler.publish(
            EventEnvelope(
                type="gantry.node.degraded",
                source="gantry/profiler",
                actor="svc-profiler",
                data=NodeHealth(node="onprem-1", reason="slow").model_dump(mode="json"),
            )
        )
        await asyncio.sleep(0.5)
        data = "  data: [{dataset: patients, version: v1}]"
        job = await s.submit(job_yaml("private", extra_spec=data))
        job = await s.wait_state(job.id, "scheduled")
        assert [p.node for p in job.placements] == ["onprem-2"]
        public = await s.submit(job_yaml("public", gpus=8))
        public = await s.wait_state(public.id, "scheduled")
        assert [p.node for p in public.placements] == ["cloud-1"]
        nodes = await s.stub.ListNodes(pb.ListNodesRequest(), metadata=s.md())
        states = {n.name: n.state for n in nodes.nodes}
        assert states == {"cloud-1": "ready", "onprem-1": "degraded", "onprem-2": "ready"}


async def test_rbac_denies_by_default(sched: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.stub.SubmitJob(
            pb.SubmitJobRequest(spec_yaml=job_yaml()), metadata=sched.md("al", "auditor")
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.stub.SetQuota(
            pb.SetQuotaRequest(queue="x", quota=pb.Resources(gpus=1)), metadata=sched.md()
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    job = await sched.submit(job_yaml("mine"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.stub.CancelJob(pb.CancelJobRequest(id=job.id), metadata=sched.md("bo"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sched.stub.ListJobs(pb.ListJobsRequest())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_readyz_answers_once_the_service_is_up(sched: Running) -> None:
    assert await readyz(sched.service.metrics_port) == "200 ready\n"


async def test_a_cpu_only_cluster_keeps_scheduling_after_its_nodes_change(sched: Running) -> None:
    """Only CPU jobs ran so far, then the node set changed (a node joined or was lost): the
    placement policy is rebuilt without any GPU task in its recent workload, and must still
    place jobs (it once failed every scheduling pass from then on)."""
    await sched.agents.register("cpu-1", gpus=0)
    first = await sched.submit(job_yaml("first", gpus=0))
    first = await sched.wait_state(first.id, "scheduled")
    await sched.agents.report(first, "started")
    await sched.agents.report(first, "succeeded")
    await sched.wait_state(first.id, "succeeded")
    await sched.agents.register("cpu-2", gpus=0)  # the cluster is rebuilt
    second = await sched.submit(job_yaml("second", gpus=0))
    second = await sched.wait_state(second.id, "scheduled")
    assert len(second.placements) == 1
