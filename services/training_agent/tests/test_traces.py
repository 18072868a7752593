"""Deep traces through the agent: the request reaches the workers' directory, what they record
is streamed to a real grpc.aio ``ProfilerService`` (a fake servicer that keeps every stream),
with the agent's service token; failures are uploaded too, uploads are retried, files removed.
The last test runs the whole path: a real agent on NATS, real workers with the training
runtime's tracer, a profiler-signed request."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import stat
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from gantry.core import NatsSettings, new_id
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import (
    JOB_SCHEDULED,
    TRACE_REQUESTED,
    JobScheduled,
    TraceRequested,
    WorkerPlacement,
)
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.protos.v1 import profiler_pb2_grpc as pb_grpc
from gantry.security.keyring import Keyring
from gantry.training.tracing import REQUEST_FILE, done_file, trace_file
from gantry.training_agent.agent import SCHEDULER_SOURCE, NodeAgent
from gantry.training_agent.governance import GovernanceLink
from gantry.training_agent.inventory import NodeInventory
from gantry.training_agent.launch import worker_environment
from gantry.training_agent.settings import AgentOptions, AgentSettings
from gantry.training_agent.traces import (
    CHUNK_BYTES,
    PROFILER_SOURCE,
    ProfilerLink,
    TraceRelay,
    prepare_trace_dir,
    trace_dir,
)

NODE = "n1"
MIB = 1 << 20


@dataclass
class Upload:
    first: pb.UploadTraceRequest
    chunks: list[int]
    data: bytes
    metadata: dict[str, str]


@dataclass
class FakeProfiler(pb_grpc.ProfilerServiceServicer):
    """A ProfilerService that keeps each UploadTrace stream (the only call the agent makes)
    and fails the next calls with the ``failures`` codes."""

    uploads: list[Upload] = field(default_factory=list)
    calls: int = 0
    failures: list[grpc.StatusCode] = field(default_factory=list)
    new: asyncio.Event = field(default_factory=asyncio.Event)

    async def UploadTrace(self, request_iterator: Any, context: Any) -> pb.UploadTraceResponse:
        self.calls += 1
        messages = [m async for m in request_iterator]
        if self.failures:
            await context.abort(self.failures.pop(0), "profiler says no")
        first, rest = messages[0], messages[1:]
        data = b"".join(m.data for m in rest)
        metadata = {k: str(v) for k, v in context.invocation_metadata()}
        self.uploads.append(Upload(first, [len(m.data) for m in rest], data, metadata))
        self.new.set()
        return pb.UploadTraceResponse(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    def of(self, rank: int) -> Upload:
        [upload] = [u for u in self.uploads if u.first.rank == rank]
        return upload

    async def until(self, n: int, wait_s: float = 30.0) -> None:
        async with asyncio.timeout(wait_s):
            while len(self.uploads) < n:
                self.new.clear()
                await self.new.wait()


@pytest.fixture
async def profiler() -> AsyncIterator[tuple[FakeProfiler, str]]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 * MIB)])
    fake = FakeProfiler()  # type: ignore[abstract]  # the stubs' other calls are unused
    pb_grpc.add_ProfilerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@dataclass
class Setup:
    settings: AgentSettings
    governance: GovernanceLink
    relay: TraceRelay
    directory: Path
    fake: FakeProfiler


@pytest.fixture
def setup(tmp_path: Path, profiler: tuple[FakeProfiler, str]) -> Setup:
    fake, address = profiler
    keyring = Keyring(tmp_path / "keys")
    keyring.issuer(create=True)  # the embedded platform: the agent issues its own token
    settings = AgentSettings(data_dir=tmp_path, agent=AgentOptions(profiler_addr=address))
    governance = GovernanceLink(settings, keyring)
    relay = TraceRelay(
        ProfilerLink(settings, governance.token), NODE, poll_s=0.02, retry_delays_s=(0.01, 0.01)
    )
    return Setup(settings, governance, relay, prepare_trace_dir(tmp_path / "job", 2), fake)


def asked(trace_id: str = "tr-1", steps: int = 3, ranks: list[int] | None = None) -> TraceRequested:
    return TraceRequested(
        trace_id=trace_id, job_id="job-1", attempt=2, steps=steps, ranks=ranks or []
    )


def finished(directory: Path, trace_id: str, rank: int, data: bytes | None, **fields: Any) -> None:
    """What a worker leaves: the trace (if any), then the done file."""
    if data is not None:
        trace_file(directory, trace_id, rank).write_bytes(data)
    record = {"trace_id": trace_id, "rank": rank, "first_step": 11, "steps": 3, "bytes": 0}
    record |= {"failed_reason": ""} | fields
    done_file(directory, trace_id, rank).write_text(json.dumps(record))


def always(value: bool) -> Callable[[], bool]:
    return lambda: value


# -- the relay against a real gRPC server ----------------------------------------------------


async def test_traces_stream_as_a_first_message_then_exact_chunks_and_files_go(
    setup: Setup,
) -> None:
    data = os.urandom(2 * MIB + 12345)  # two full chunks and a short one
    finished(setup.directory, "tr-1", 0, data)
    finished(setup.directory, "tr-1", 3, None, failed_reason="profiler could not start: boom")

    await setup.relay.relay(asked(), setup.directory, [0, 3], always(True))

    ok, failed = setup.fake.of(0), setup.fake.of(3)
    assert ok.first == pb.UploadTraceRequest(
        trace_id="tr-1", job_id="job-1", attempt=2, rank=0, node=NODE, first_step=11, steps=3
    )  # the first message names the trace and carries no data
    assert ok.chunks == [CHUNK_BYTES, CHUNK_BYTES, 12345]
    assert ok.data == data
    assert failed.first.failed_reason == "profiler could not start: boom"
    assert failed.first.node == NODE and failed.first.trace_id == "tr-1"
    assert failed.chunks == []
    # authenticated as the agent authenticates to governance: its service token as bearer
    token = setup.governance.token()
    assert token.count(".") == 2  # an issued JWT, not an empty string
    assert ok.metadata["authorization"] == failed.metadata["authorization"] == f"Bearer {token}"
    # everything is gone: the traces, the done files and the request
    assert list(setup.directory.iterdir()) == []


async def test_the_request_reaches_the_workers_and_traces_follow_as_they_finish(
    setup: Setup,
) -> None:
    task = asyncio.create_task(
        setup.relay.relay(asked(ranks=[1, 2]), setup.directory, [1, 2], always(True))
    )
    request = setup.directory / REQUEST_FILE
    async with asyncio.timeout(5):
        while not request.exists():
            await asyncio.sleep(0.01)
    assert json.loads(request.read_text()) == {"trace_id": "tr-1", "steps": 3, "ranks": [1, 2]}
    assert stat.S_IMODE(request.stat().st_mode) == 0o600
    assert stat.S_IMODE(setup.directory.stat().st_mode) == 0o700

    finished(setup.directory, "tr-1", 2, b"two")
    await setup.fake.until(1)
    assert [u.first.rank for u in setup.fake.uploads] == [2]
    async with asyncio.timeout(5):  # removed once the profiler has answered
        while done_file(setup.directory, "tr-1", 2).exists():
            await asyncio.sleep(0.01)
    assert not trace_file(setup.directory, "tr-1", 2).exists()
    assert request.exists()  # rank 1 is still recording
    assert not task.done()

    finished(setup.directory, "tr-1", 1, b"one")
    await asyncio.wait_for(task, 5)
    assert [(u.first.rank, u.data) for u in setup.fake.uploads] == [(2, b"two"), (1, b"one")]
    assert not request.exists()


async def test_ranks_without_a_trace_are_uploaded_failed_when_the_attempt_ends(
    setup: Setup,
) -> None:
    running = [True]
    task = asyncio.create_task(
        setup.relay.relay(asked(), setup.directory, [0, 1], lambda: running[0])
    )
    await asyncio.sleep(0.1)
    finished(setup.directory, "tr-1", 0, b"zero")
    # a stale file of rank 1 from another trace must not count
    finished(setup.directory, "tr-old", 1, b"old")
    running[0] = False
    await asyncio.wait_for(task, 5)
    assert setup.fake.of(0).data == b"zero"
    assert setup.fake.of(1).first.failed_reason == (
        "the workers ended before the trace was recorded"
    )


async def test_ranks_without_a_trace_are_given_up_after_the_wait(setup: Setup) -> None:
    setup.relay.wait_s = 0.2
    await asyncio.wait_for(
        setup.relay.relay(asked(steps=50), setup.directory, [4], always(True)), 5
    )
    upload = setup.fake.of(4)
    assert upload.first.failed_reason == "the worker recorded no trace within 0.2 s"
    assert upload.chunks == []


async def test_an_upload_that_fails_on_the_way_is_retried(setup: Setup) -> None:
    setup.fake.failures = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL]
    finished(setup.directory, "tr-1", 0, b"payload")
    await setup.relay.relay(asked(), setup.directory, [0], always(True))
    assert setup.fake.calls == 3
    assert setup.fake.of(0).data == b"payload"
    assert list(setup.directory.iterdir()) == []


async def test_an_upload_failing_every_time_is_logged_and_its_files_removed(
    setup: Setup,
) -> None:
    setup.fake.failures = [grpc.StatusCode.UNAVAILABLE] * 10
    finished(setup.directory, "tr-1", 0, b"payload")
    await setup.relay.relay(asked(), setup.directory, [0], always(True))
    assert setup.fake.calls == 3  # the first try and two retries
    assert setup.fake.uploads == []
    assert setup.relay.retries == 2
    [(trace_id, rank, tries, error)] = setup.relay.failures
    assert (trace_id, rank, tries) == ("tr-1", 0, 3)
    assert "UNAVAILABLE: profiler says no" in error
    assert list(setup.directory.iterdir()) == []


async def test_a_refused_upload_is_not_retried(setup: Setup) -> None:
    setup.fake.failures = [grpc.StatusCode.PERMISSION_DENIED]
    finished(setup.directory, "tr-1", 0, b"payload")
    await setup.relay.relay(asked(), setup.directory, [0], always(True))
    assert setup.fake.calls == 1
    assert [f[3] for f in setup.relay.failures] == ["PERMISSION_DENIED: profiler says no"]
    assert setup.relay.retries == 0


async def test_no_profiler_address_is_logged_not_raised(tmp_path: Path, setup: Setup) -> None:
    settings = AgentSettings(data_dir=tmp_path / "elsewhere")
    relay = TraceRelay(ProfilerLink(settings, setup.governance.token), NODE, retry_delays_s=(0.01,))
    finished(setup.directory, "tr-1", 0, b"payload")
    await relay.relay(asked(), setup.directory, [0], always(True))
    [(_, _, _, error)] = relay.failures
    assert "GANTRY_AGENT__PROFILER_ADDR" in error
    assert setup.fake.calls == 0


async def test_a_redelivered_request_is_relayed_once(setup: Setup) -> None:
    assert setup.relay.claim("tr-1")
    assert not setup.relay.claim("tr-1")
    assert setup.relay.claim("tr-2")


def test_workers_get_the_attempts_trace_directory(tmp_path: Path) -> None:
    job = JobScheduled(
        job_id="j", attempt=3, placements=[WorkerPlacement(worker=0, node=NODE)], spec={}
    )
    directory = prepare_trace_dir(tmp_path / "j", 3)
    assert directory == trace_dir(tmp_path / "j", 3) == tmp_path / "j" / "traces-3"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    def env(**kw: Any) -> dict[str, str]:
        return worker_environment(
            job,
            job.placements[0],
            local_rank=0,
            local_world_size=1,
            job_dir=tmp_path / "j",
            output_dir=tmp_path / "out",
            resume=False,
            base={"GANTRY_TRACE_DIR": "/somewhere/else"},
            **kw,
        )

    assert env(trace_dir=directory)["GANTRY_TRACE_DIR"] == str(directory)
    assert "GANTRY_TRACE_DIR" not in env()  # never inherited from the agent's own environment


# -- the whole path: agent on NATS, real workers, profiler-signed request --------------------

#: Steps until told to stop, with the training runtime's tracer as its callback.
TRACED_WORKER = textwrap.dedent(
    """
    import os, pathlib, time, types
    from gantry.training.tracing import TraceOnRequest
    ckpt = pathlib.Path(os.environ["GANTRY_CHECKPOINT_DIR"])
    rank = int(os.environ["RANK"])
    tracer = TraceOnRequest(pathlib.Path(os.environ["GANTRY_TRACE_DIR"]), check_s=0.05)
    print("trace dir", os.environ["GANTRY_TRACE_DIR"], flush=True)
    step = 0
    while not (ckpt / "go").exists():
        step += 1
        sum(i * i for i in range(5000))
        tracer(types.SimpleNamespace(step=step, rank=rank, total_steps=0))
        time.sleep(0.01)
    tracer.close()
    """
)


async def test_an_agent_relays_a_profiler_request_from_nats_to_the_profiler(
    tmp_path: Path, nats_url: str, profiler: tuple[FakeProfiler, str]
) -> None:
    fake, address = profiler
    data_dir = tmp_path / "data"
    keyring = Keyring(data_dir / "keys")
    keyring.issuer(create=True)
    nc = await nats.connect(nats_url)
    dead: list[str] = []

    async def on_dead(msg: Any) -> None:
        dead.append((msg.headers or {}).get("Gantry-Dead-Reason", ""))

    await nc.subscribe("gantry.deadletter.>", cb=on_dead)
    bus = await Bus.connect(NatsSettings(url=nats_url), name="test")
    await bus.ensure_streams()
    settings = AgentSettings(
        data_dir=data_dir,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        agent=AgentOptions(heartbeat_s=0.5, log_flush_s=0.1, profiler_addr=address),
    )
    inventory = NodeInventory(node=NODE, pool="p", cpu_milli=8000, memory_mib=8192)
    agent = NodeAgent(settings, inventory, keyring=keyring)
    running = asyncio.create_task(agent.run())

    async def publish(data: Any, type_: str, source: str, signer: str) -> None:
        ev = EventEnvelope(
            type=type_, source=source, actor=f"svc-{signer}", data=data.model_dump(mode="json")
        )
        await Publisher(bus, signer=keyring.service_key(signer)).publish(ev)

    job = JobScheduled(
        job_id=new_id(),
        attempt=1,
        nodes=[NODE, "n-other"],
        placements=[
            WorkerPlacement(worker=0, node=NODE),
            WorkerPlacement(worker=1, node=NODE),
            WorkerPlacement(worker=2, node="n-other"),
        ],
        spec={"entrypoint": {"command": [sys.executable, "-c", TRACED_WORKER]}},
    )
    job_dir = settings.checkpoint_root / job.job_id
    try:
        async with asyncio.timeout(10):
            await agent.ready.wait()
        await publish(job, JOB_SCHEDULED.type, SCHEDULER_SOURCE, "scheduler")
        async with asyncio.timeout(10):
            while len(list(job_dir.glob("traces-1"))) < 1 or not agent.running_jobs():
                await asyncio.sleep(0.05)
        directory = trace_dir(job_dir, 1)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700

        # not the profiler: refused, dead-lettered, nothing asked of the workers
        forged = TraceRequested(trace_id="forged", job_id=job.job_id, steps=2, ranks=[0])
        await publish(forged, TRACE_REQUESTED.type, SCHEDULER_SOURCE, "scheduler")
        # the profiler, for another attempt: not ours; then for ranks 1 and 2 (2 runs elsewhere)
        stale = TraceRequested(trace_id="stale", job_id=job.job_id, attempt=2, steps=2)
        await publish(stale, TRACE_REQUESTED.type, PROFILER_SOURCE, "profiler")
        request = TraceRequested(trace_id="tr-e2e", job_id=job.job_id, steps=3, ranks=[1, 2])
        await publish(request, TRACE_REQUESTED.type, PROFILER_SOURCE, "profiler")

        await fake.until(1, wait_s=60)
        await asyncio.sleep(0.5)  # nothing more comes: rank 0 was not asked, rank 2 is not here
        assert [u.first.rank for u in fake.uploads] == [1]
        upload = fake.uploads[0]
        assert (upload.first.trace_id, upload.first.job_id, upload.first.attempt) == (
            "tr-e2e",
            job.job_id,
            1,
        )
        assert (upload.first.node, upload.first.steps, upload.first.failed_reason) == (
            NODE,
            3,
            "",
        )
        assert upload.first.first_step >= 2
        trace = json.loads(gzip.decompress(upload.data))
        assert trace["traceEvents"]
        assert upload.metadata["authorization"] == f"Bearer {agent.governance.token()}"
        async with asyncio.timeout(5):
            while any(directory.iterdir()):  # the relay cleans up after itself
                await asyncio.sleep(0.05)
        assert any("only the profiler" in reason for reason in dead)

        (job_dir / "go").touch()
        async with asyncio.timeout(20):
            while agent.running_jobs():
                await asyncio.sleep(0.05)
    finally:
        agent.stop()
        await asyncio.wait_for(running, 30)
        await bus.close()
        await nc.close()
