"""The workflows service as a process would run it, against a real nats-server: the gRPC API
behind RBAC, a job event from the scheduler waking its run, the run's events on the WORKFLOWS
stream, and a restart finding the run where it was. The other services are the in-process
platform of conftest (the full platform runs in tests/test_pipelines_e2e.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import grpc
import pytest

from gantry.core import NatsSettings
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import JobStateChanged
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap
from gantry.testing.probes import readyz

from .conftest import CHURN, FakePlatform, serving, workflow_service


async def test_the_service_runs_a_pipeline_woken_by_job_events(
    tmp_path: Path, nats_url: str
) -> None:
    data = tmp_path / "data"
    keyring = Keyring(data / "keys")
    issuer = TokenIssuer(keyring.issuer(create=True))
    platform = FakePlatform()
    service = workflow_service(data, nats_url, platform)
    task = asyncio.create_task(service.run())
    tap = await EventTap().start(nats_url, "gantry.>")
    bus = await Bus.connect(NatsSettings(url=nats_url), name="test-scheduler")
    scheduler = Publisher(bus, signer=keyring.service_key("scheduler"))
    channel = None
    try:
        await serving(service)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        stub = pb_grpc.WorkflowServiceStub(channel)
        dev = issuer.issue("dev", ["ml-developer", "data-steward"], dt.timedelta(minutes=5))
        auditor = issuer.issue("audrey", ["auditor"], dt.timedelta(minutes=5))
        md = [("authorization", f"Bearer {dev}")]

        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.SubmitPipeline(
                pb.SubmitPipelineRequest(spec_yaml=CHURN),
                metadata=[("authorization", f"Bearer {auditor}")],
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED

        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.SubmitPipeline(
                pb.SubmitPipelineRequest(spec_yaml=CHURN.replace("outputs.version", "outputs.v")),
                metadata=md,
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no output 'v'" in (bad.value.details() or "")

        submitted = await stub.SubmitPipeline(
            pb.SubmitPipelineRequest(spec_yaml=CHURN), metadata=md
        )
        assert list(submitted.pipeline.steps) == ["preprocess", "train", "evaluate", "deploy"]
        started = await stub.StartRun(
            pb.StartRunRequest(pipeline="churn", params={"epochs": "2"}), metadata=md
        )
        run_id = started.run.id
        job = platform.job_of("preprocess")
        assert platform.jobs[job]["owner"].subject == "dev"

        async def job_ended(job_id: str) -> None:
            change = JobStateChanged(job_id=job_id, state="succeeded", previous="running")
            await scheduler.publish(
                EventEnvelope(
                    type="gantry.job.state",
                    source="gantry/scheduler",
                    actor="svc-scheduler",
                    subject=job_id,
                    data=change.model_dump(mode="json"),
                )
            )

        platform.finish(job, dataset_version="v-1")
        await job_ended(job)  # resync is a minute away: only the event can move the run now
        async with asyncio.timeout(10):
            while not platform.submitted("train"):
                await asyncio.sleep(0.05)
        await tap.wait_for(
            "gantry.workflow.step.changed", step="preprocess", state="succeeded", timeout=10
        )
        run = await stub.GetRun(pb.RunRequest(id=run_id), metadata=md)
        steps = {s.name: s for s in run.steps}
        assert steps["preprocess"].outputs["version"] == "v-1"
        assert steps["train"].state == "running"
        assert list(steps["train"].depends_on) == ["preprocess"]
        changed = tap.of("gantry.workflow.run.changed", run_id=run_id)
        assert changed and changed[0].source == "gantry/workflows"
    finally:
        if channel is not None:
            await channel.close()
        service.stop()
        await asyncio.wait_for(task, 20)
        await bus.close()
        await tap.close()

    # a restart: the run is where it was, and carries on
    again = workflow_service(data, nats_url, platform)
    task = asyncio.create_task(again.run())
    try:
        await serving(again)
        platform.finish(platform.job_of("train"), model="churn:1")
        again.controller.job_changed(platform.job_of("train"))
        again.wake()
        async with asyncio.timeout(10):
            while not platform.submitted("evaluate"):
                await asyncio.sleep(0.05)
        assert again.controller.get(run_id).steps["train"].outputs["model"] == "churn:1"
    finally:
        again.stop()
        await asyncio.wait_for(task, 20)


async def test_readyz_answers_once_the_service_is_up(tmp_path: Path, nats_url: str) -> None:
    data = tmp_path / "data"
    Keyring(data / "keys").issuer(create=True)
    service = workflow_service(data, nats_url, FakePlatform())
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(20):  # the run file is written once the service is ready
            while not (data / "run" / "workflows.json").exists():
                await asyncio.sleep(0.05)
        assert await readyz(service.metrics_port) == "200 ready\n"
    finally:
        service.stop()
        await asyncio.wait_for(task, 20)
