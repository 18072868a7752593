"""Dev sessions through the workflows service's gRPC API, behind RBAC, against a real
nats-server (the scheduler is conftest's in-process FakePlatform): only the owner ever gets the
token, others may look but not stop, raw data is refused, and every change is an event."""

from __future__ import annotations

import asyncio
import datetime as dt
import textwrap
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from gantry.core import NatsSettings
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap
from gantry.workflows.app import WorkflowService
from gantry.workflows.devsessions import token_hash
from gantry.workflows.settings import WorkflowOptions, WorkflowSettings

from .conftest import FakePlatform

SESSION = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: DevSession
    metadata: {name: ana-scratch}
    spec:
      resources: {gpuMilli: 250, cpus: 1, memory: 2Gi}
      data: [{dataset: churn, version: "v1"}]
      idleTimeout: 10m
      lifetime: 2h
    """
)
CHANGED = "gantry.workflow.session.changed"


def _service(data: Path, nats_url: str, platform: FakePlatform) -> WorkflowService:
    settings = WorkflowSettings(
        data_dir=data,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        workflows=WorkflowOptions(grpc_port=0, metrics_port=0, tick_s=0.1, resync_s=60, poll_s=60),
    )
    return WorkflowService(settings, platform=platform)


async def _code(call: Awaitable[object]) -> grpc.StatusCode:
    """The status code a call that must fail failed with."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    return failed.value.code()


async def test_only_the_owner_gets_the_token_and_others_may_not_stop_it(
    tmp_path: Path, nats_url: str
) -> None:
    data = tmp_path / "data"
    issuer = TokenIssuer(Keyring(data / "keys").issuer(create=True))
    platform = FakePlatform()
    service = _service(data, nats_url, platform)
    task = asyncio.create_task(service.run())
    tap = await EventTap().start(nats_url, "gantry.>")
    channel = None

    def md(who: str, *roles: str) -> list[tuple[str, str]]:
        token = issuer.issue(who, list(roles), dt.timedelta(minutes=5))
        return [("authorization", f"Bearer {token}")]

    ana, ben = md("ana", "ml-developer"), md("ben", "ml-developer")
    auditor, admin = md("audrey", "auditor"), md("root", "platform-admin")
    try:
        async with asyncio.timeout(20):
            while service.grpc_port == 0 or service.intake is None:
                await asyncio.sleep(0.05)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        stub = pb_grpc.WorkflowServiceStub(channel)
        name = pb.DevSessionRequest(name="ana-scratch")

        raw = SESSION.replace('version: "v1"}', 'version: "v1", view: raw}')
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.StartDevSession(pb.StartDevSessionRequest(spec_yaml=raw), metadata=ana)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reads de-identified data only" in (refused.value.details() or "")
        assert platform.jobs == {}  # nothing was submitted

        started = await stub.StartDevSession(
            pb.StartDevSessionRequest(spec_yaml=SESSION), metadata=ana
        )
        assert started.state == "starting" and started.owner == "ana"
        assert started.token and started.job_id and started.generation == 1
        assert (started.gpus, started.dataset) == (0.25, "churn")
        job = platform.jobs[started.job_id]
        assert job["owner"].subject == "ana"  # the job runs as its owner
        args = job["doc"]["spec"]["entrypoint"]["args"]
        assert args[args.index("--token-sha256") + 1] == token_hash(started.token)

        platform.jobs[started.job_id]["rendezvous"] = "10.0.0.5:21234"
        await tap.wait_for(CHANGED, session="ana-scratch", state="running", timeout=10)
        mine = await stub.GetDevSession(name, metadata=ana)
        assert (mine.state, mine.url) == ("running", "http://10.0.0.5:21234/")
        assert mine.token == started.token

        theirs = await stub.GetDevSession(name, metadata=ben)
        assert theirs.state == "running" and theirs.token == ""
        listed = await stub.ListDevSessions(pb.ListDevSessionsRequest(), metadata=ben)
        assert [(s.name, s.token) for s in listed.sessions] == [("ana-scratch", "")]
        assert await _code(stub.GetDevSession(name, metadata=auditor)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await _code(stub.StopDevSession(name, metadata=ben)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert platform.cancelled == []
        assert (await stub.GetDevSession(name, metadata=ana)).state == "running"

        stopped = await stub.StopDevSession(name, metadata=admin)
        assert stopped.state == "stopped" and stopped.reason == "stopped by root"
        assert stopped.token == ""  # the admin is not its owner
        assert platform.cancelled == [started.job_id]
        assert [g.how for g in stopped.history] == ["stopped"]
        assert await _code(stub.ResumeDevSession(name, metadata=ben)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )

        resumed = await stub.ResumeDevSession(name, metadata=ana)
        assert resumed.generation == 2 and resumed.state == "starting"
        assert resumed.token and resumed.token != started.token
        assert resumed.job_id != started.job_id

        events = await tap.wait_for(CHANGED, 4, session="ana-scratch", timeout=10)
        assert [(e.data["previous"], e.data["state"]) for e in events] == [
            ("", "starting"),
            ("starting", "running"),
            ("running", "stopped"),
            ("stopped", "starting"),
        ]
        assert {e.source for e in events} == {"gantry/workflows"}
        assert all(started.token not in e.model_dump_json() for e in events)
        assert events[1].data["endpoint"] == "10.0.0.5:21234"
    finally:
        if channel is not None:
            await channel.close()
        service.stop()
        await asyncio.wait_for(task, 20)
        await tap.close()
