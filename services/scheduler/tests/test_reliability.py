"""Bad input and reliability: the scheduler restarted mid-run, a node lost under a running gang,
a gang that never fully starts, an elastic job shrunk for a more urgent one, max runtime, a
failed worker, and events from sources the scheduler must not believe.

Node agents are the in-process :class:`~.conftest.Agents` (real signed events over real NATS),
so each report lands exactly when the test says; the real agent processes are exercised in
``test_agents_e2e.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import GpuDevice, JobWorkersReported, NodeRegistered
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.scheduler.control import Control
from gantry.scheduler.settings import SchedulerOptions, SchedulerSettings
from gantry.scheduler.store import connect, migrate
from gantry.security import TokenIssuer
from gantry.security.keyring import Keyring
from gantry.testing.events import EventTap, dead_letter_reasons

from .conftest import (
    AGENT,
    Agents,
    Running,
    incarnation,
    job_yaml,
    running,
    scheduler_settings,
)

# ---------------------------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def _cluster(
    settings: SchedulerSettings,
) -> AsyncIterator[tuple[Keyring, TokenIssuer, Agents]]:
    """Keys and in-process agents without a service, so services can come and go under them."""
    keyring = Keyring(settings.keys_dir)
    issuer = TokenIssuer(keyring.issuer(create=True))
    bus = await Bus.connect(settings.nats, name="test-agents")
    await bus.ensure_streams()
    try:
        yield (
            keyring,
            issuer,
            Agents(Publisher(bus, signer=keyring.service_key("training-agent")), bus),
        )
    finally:
        await bus.close()


@contextlib.asynccontextmanager
async def _heartbeating(
    agents: Agents, alive: set[str], every_s: float = 0.2
) -> AsyncIterator[None]:
    """Heartbeat the nodes in ``alive`` (a set the test may change) until the block ends."""

    async def beat() -> None:
        while True:
            if alive:
                await agents.heartbeat(*sorted(alive))
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat(), name="heartbeats")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _register(r: Running, *nodes: str, gpus: int) -> None:
    """Register ``nodes`` and wait until the scheduler knows them (submits check the cluster)."""
    for node in nodes:
        await r.agents.register(node, gpus=gpus)
    async with asyncio.timeout(10):
        while not set(nodes) <= set(await _node_states(r)):
            await asyncio.sleep(0.05)


async def _node_states(r: Running) -> dict[str, str]:
    nodes = await r.stub.ListNodes(pb.ListNodesRequest(), metadata=r.md())
    return {n.name: n.state for n in nodes.nodes}


async def _wait_node(r: Running, node: str, state: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while (await _node_states(r)).get(node) != state:
            await asyncio.sleep(0.05)


def _snapshot(job: pb.Job) -> tuple[str, int, list[tuple[int, str, list[int]]]]:
    return (
        job.state,
        job.attempt,
        sorted((p.worker, p.node, list(p.gpu_index)) for p in job.placements),
    )


async def _running_gang(r: Running, name: str, nodes: int = 2) -> pb.Job:
    """A ``nodes``-worker gang spread one worker per node, all started (running)."""
    job = await r.submit(job_yaml(name, replicas=nodes, gpus=1, topology="spread"))
    job = await r.wait_state(job.id, "scheduled")
    assert len({p.node for p in job.placements}) == nodes
    await r.agents.report(job, "started")
    return await r.wait_state(job.id, "running")


# ---------------------------------------------------------------------------------- restart


async def test_a_restarted_scheduler_recovers_every_job_and_places_nothing_twice(
    tmp_path: Path, nats_url: str, database_url: str | None, tap: EventTap
) -> None:
    """On SQLite and PostgreSQL: jobs come back from the database as they were, the reports
    sent while no scheduler ran are applied from JetStream, and nothing is placed again."""
    settings = scheduler_settings(tmp_path / "data", nats_url, database_url)
    async with _cluster(settings) as (keyring, issuer, agents):
        async with incarnation(settings, keyring, issuer, agents) as r:
            await _register(r, "gpu-1", gpus=8)
            running_job = await r.submit(job_yaml("runs", gpus=2))
            running_job = await r.wait_state(running_job.id, "scheduled")
            await agents.report(running_job, "started")
            running_job = await r.wait_state(running_job.id, "running")
            placed = await r.wait_state(
                (await r.submit(job_yaml("placed", gpus=2))).id, "scheduled"
            )
            stopping = await r.wait_state(
                (await r.submit(job_yaml("stops", gpus=2))).id, "scheduled"
            )
            await agents.report(stopping, "started")
            await r.wait_state(stopping.id, "running")
            await r.stub.CancelJob(pb.CancelJobRequest(id=stopping.id), metadata=r.md())
            stopping = await r.wait_state(stopping.id, "stopping")
            waiting = await r.submit(job_yaml("waits", gpus=8))
            waiting = await r.wait(waiting.id, lambda j: "capacity" in j.reason)
            jobs = (running_job, placed, stopping, waiting)
            before = {j.id: _snapshot(await r.get(j.id)) for j in jobs}
            assert [before[j.id][0] for j in jobs] == [
                "running",
                "scheduled",
                "stopping",
                "pending",
            ]
            await tap.wait_for("gantry.job.stop.requested", job_id=stopping.id)
        # down: a worker finishes meanwhile; JetStream keeps the report for the next scheduler
        await agents.report(running_job, "succeeded")
        async with incarnation(settings, keyring, issuer, agents) as r:
            for job in (placed, stopping, waiting):
                assert _snapshot(await r.get(job.id)) == before[job.id], job.name
            done = await r.wait_state(running_job.id, "succeeded")
            assert done.attempt == 1
            assert [h.state for h in done.history] == [
                "pending",
                "scheduled",
                "running",
                "succeeded",
            ]
            assert await _node_states(r) == {"gpu-1": "ready"}
            await agents.report(stopping, "stopped")
            await r.wait_state(stopping.id, "cancelled")
            await agents.report(placed, "started")
            await r.wait_state(placed.id, "running")
            await agents.report(placed, "succeeded")
            await r.wait_state(placed.id, "succeeded")
            waiting = await r.wait_state(waiting.id, "scheduled")  # capacity freed: placed now
            assert waiting.attempt == 1 and len(waiting.placements) == 1
            listing = await r.stub.ListJobs(pb.ListJobsRequest(), metadata=r.md())
            assert len(listing.jobs) == 4
            await tap.wait_for("gantry.job.scheduled", job_id=waiting.id)
            await asyncio.sleep(0.6)  # an outbox poll: a stray second placement would show now
    for job in jobs:
        scheduled = tap.of("gantry.job.scheduled", job_id=job.id)
        assert [e.data["attempt"] for e in scheduled] == [1], job.name


# ---------------------------------------------------------------------------------- nodes


async def test_a_lost_node_requeues_its_gang_which_resumes_elsewhere(
    tmp_path: Path, nats_url: str, tap: EventTap
) -> None:
    settings = scheduler_settings(tmp_path / "data", nats_url, heartbeat_timeout_s=1.0)
    async with running(settings) as r:
        alive = {"gpu-1", "gpu-2", "gpu-3"}
        await _register(r, *sorted(alive), gpus=1)
        async with _heartbeating(r.agents, alive):
            job = await _running_gang(r, "gang")
            await r.agents.report(job, "checkpointed")
            lost, survivor = job.placements[1].node, job.placements[0].node
            alive.discard(lost)  # the node goes silent
            (gone,) = await tap.wait_for("gantry.node.lost", node=lost)
            assert gone.data["requeued"] == [job.id]
            (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=job.id)
            assert stop.data["reason"] == "node-lost" and stop.data["attempt"] == 1
            # the survivor stops its rank; the lost node too, should it only have been cut off
            assert stop.data["nodes"] == sorted([survivor, lost])
            again = await r.wait(job.id, lambda j: j.attempt == 2 and j.state == "scheduled")
            assert lost not in {p.node for p in again.placements}
            assert [h.state for h in again.history] == [
                "pending", "scheduled", "running", "pending", "scheduled"
            ]  # fmt: skip
            assert f"node {lost} was lost" in again.history[3].reason
            (placed,) = await tap.wait_for("gantry.job.scheduled", job_id=job.id, attempt=2)
            assert placed.data["resume"] is True and lost not in placed.data["nodes"]
            nodes = await r.stub.ListNodes(pb.ListNodesRequest(), metadata=r.md())
            state = {n.name: (n.state, n.reason) for n in nodes.nodes}
            assert state[lost] == ("lost", "no heartbeat for 1 s")
            await r.agents.register(lost, gpus=1)  # the agent comes back
            alive.add(lost)
            await _wait_node(r, lost, "ready")
            assert await _node_states(r) == dict.fromkeys(("gpu-1", "gpu-2", "gpu-3"), "ready")


async def test_a_node_that_was_only_silent_is_taken_back_when_it_heartbeats_again(
    tmp_path: Path, nats_url: str, tap: EventTap
) -> None:
    """A stall (a paused VM, a scheduler that fell behind on heartbeats) must not take a node
    out of the cluster for good: its agent re-registers only after a NATS reconnect."""
    settings = scheduler_settings(tmp_path / "data", nats_url, heartbeat_timeout_s=1.0)
    async with running(settings) as r:
        alive: set[str] = set()
        await _register(r, "gpu-1", gpus=1)
        async with _heartbeating(r.agents, alive):
            await tap.wait_for("gantry.node.lost", node="gpu-1")
            assert await _node_states(r) == {"gpu-1": "lost"}
            alive.add("gpu-1")
            await _wait_node(r, "gpu-1", "ready")
            job = await r.submit(job_yaml("after", gpus=1))
            job = await r.wait_state(job.id, "scheduled")
            assert [p.node for p in job.placements] == ["gpu-1"]


async def test_an_agent_that_stops_its_workers_unasked_requeues_the_whole_gang(
    sched: Running, tap: EventTap
) -> None:
    """An agent shutting down reports its workers "stopped" without a stop request: the job is
    requeued, and the gang's other nodes are told to stop their ranks of that attempt."""
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running_gang(sched, "gang")
    leaving, staying = job.placements[1].node, job.placements[0].node
    await sched.agents.report(job, "stopped", node=leaving, message="shutdown")
    (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=job.id)
    assert stop.data["reason"] == "node-lost" and stop.data["attempt"] == 1
    assert stop.data["nodes"] == [staying]
    job = await sched.wait(job.id, lambda j: j.attempt == 2)
    requeued = job.history[3]
    assert requeued.state == "pending" and requeued.attempt == 1
    assert f"worker(s) [1] on {leaving} stopped: shutdown" in requeued.reason


async def test_an_agent_restarted_within_the_heartbeat_timeout_requeues_its_jobs(
    sched: Running, tap: EventTap
) -> None:
    """A new boot id in a registration means the agent restarted: the workers it ran are gone,
    even though the node never missed a heartbeat. The same boot re-registering (after a NATS
    reconnect) changes nothing."""
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running_gang(sched, "gang")
    node = job.placements[1].node
    await sched.agents.register(node, gpus=1)  # same boot: a reconnect
    await asyncio.sleep(0.5)
    assert (await sched.get(job.id)).state == "running"
    await sched.agents.register(node, gpus=1, boot="boot-2")
    job = await sched.wait(job.id, lambda j: j.attempt == 2)
    reasons = [h.reason for h in job.history]
    assert any(f"the node agent on {node} restarted" in r for r in reasons)
    (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=job.id)
    assert stop.data["reason"] == "node-lost" and node not in stop.data["nodes"]
    (again,) = await tap.wait_for("gantry.job.scheduled", job_id=job.id, attempt=2)
    assert again.data["resume"] is True  # attempt 1 ran


async def test_a_gang_that_does_not_fully_start_in_time_is_requeued(
    tmp_path: Path, nats_url: str, tap: EventTap
) -> None:
    settings = scheduler_settings(tmp_path / "data", nats_url, gang_timeout_s=1.5)
    async with running(settings) as r:
        await _register(r, "gpu-1", "gpu-2", gpus=1)
        job = await r.submit(job_yaml("gang", replicas=2, gpus=1, topology="spread"))
        job = await r.wait_state(job.id, "scheduled")
        started = time.monotonic()
        await r.agents.report(job, "started", workers=[0])  # rank 1 never comes up
        (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=job.id)
        assert time.monotonic() - started >= 1.0  # not before the gang timeout
        assert stop.data["reason"] == "gang-timeout" and stop.data["attempt"] == 1
        assert stop.data["nodes"] == ["gpu-1", "gpu-2"]
        job = await r.wait(job.id, lambda j: any(h.state == "pending" for h in j.history[1:]))
        requeued = next(h for h in job.history[1:] if h.state == "pending")
        assert "gang timeout: worker(s) [1] did not start within 1.5 s" in requeued.reason
        assert requeued.attempt == 1
        assert "running" not in [h.state for h in job.history]
        # it never ran, so the next attempt has nothing to resume from
        (again,) = await tap.wait_for("gantry.job.scheduled", job_id=job.id, attempt=2)
        assert again.data["resume"] is False


# ---------------------------------------------------------------------------------- elastic


async def test_an_elastic_job_shrinks_its_top_ranks_for_a_more_urgent_job(
    sched: Running, tap: EventTap
) -> None:
    await _register(sched, "gpu-1", gpus=3)
    elastic = await sched.submit(job_yaml("elastic", replicas=4, min_replicas=2, gpus=1))
    elastic = await sched.wait_state(elastic.id, "scheduled")
    assert sorted(p.worker for p in elastic.placements) == [0, 1, 2]  # 3 of 4 fit
    await sched.agents.report(elastic, "started")
    await sched.wait_state(elastic.id, "running")
    urgent = await sched.submit(job_yaml("urgent", gpus=1, priority="high"))
    elastic = await sched.wait_state(elastic.id, "stopping")
    assert "shrinking to free GPUs for " + urgent.id in elastic.reason
    (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=elastic.id)
    assert stop.data["reason"] == "shrink" and stop.data["workers"] == [2]
    assert stop.data["nodes"] == ["gpu-1"]
    assert (await sched.get(urgent.id)).state == "pending"  # waits for the rank to stop
    await sched.agents.report(elastic, "stopped", workers=[2])
    elastic = await sched.wait_state(elastic.id, "running")
    assert elastic.workers == 2 and sorted(p.worker for p in elastic.placements) == [0, 1]
    assert elastic.attempt == 1  # the same attempt goes on with fewer workers
    urgent = await sched.wait_state(urgent.id, "scheduled")
    assert [p.node for p in urgent.placements] == ["gpu-1"]
    assert len(tap.of("gantry.job.stop.requested", job_id=elastic.id)) == 1


# ---------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("others_started", [True, False], ids=["running", "still-starting"])
async def test_a_failed_worker_fails_the_job_and_stops_the_other_ranks(
    sched: Running, tap: EventTap, others_started: bool
) -> None:
    """Also when the failure comes before the other ranks reported "started": they are
    starting, and would otherwise run on with resources the scheduler has given back."""
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    if others_started:
        job = await _running_gang(sched, "fails")
    else:
        job = await sched.submit(job_yaml("fails", replicas=2, gpus=1, topology="spread"))
        job = await sched.wait_state(job.id, "scheduled")
    bad = job.placements[1]
    await sched.agents.report(
        job, "failed", node=bad.node, exit_code=3, message="CUDA error: out of memory"
    )
    job = await sched.wait_state(job.id, "failed")
    assert job.reason == (f"worker(s) [1] on {bad.node} failed (exit 3): CUDA error: out of memory")
    (stop,) = await tap.wait_for("gantry.job.stop.requested", job_id=job.id)
    assert stop.data["reason"] == "failed"
    assert stop.data["nodes"] == [job.placements[0].node] and stop.data["workers"] == [0]


async def test_a_rank_that_ends_before_the_rest_of_its_gang_started_does_not_stall_it(
    sched: Running,
) -> None:
    """A quick rank may report "started" and "succeeded" before another node's "started"
    arrives: the gang still counts as running (no false gang timeout, run time counted)."""
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await sched.submit(job_yaml("quick", replicas=2, gpus=1, topology="spread"))
    job = await sched.wait_state(job.id, "scheduled")
    await sched.agents.report(job, "started", workers=[0])
    await sched.agents.report(job, "succeeded", workers=[0])
    await sched.agents.report(job, "started", workers=[1])
    job = await sched.wait_state(job.id, "running", timeout=5)
    assert job.started_ms > 0
    await sched.agents.report(job, "succeeded", workers=[1])
    job = await sched.wait_state(job.id, "succeeded")
    assert [h.state for h in job.history] == ["pending", "scheduled", "running", "succeeded"]


def test_a_job_past_its_max_runtime_is_stopped_and_fails(tmp_path: Path) -> None:
    """Control on its own with a clock the test moves (the minimum maxRuntime is 60 s)."""
    db = connect(f"sqlite:///{tmp_path / 'scheduler.db'}")
    migrate(db)
    now = [time.time()]
    control = Control(db, SchedulerOptions(heartbeat_timeout_s=3600), clock=lambda: now[0])
    try:
        control.recover()
        gpu = GpuDevice(index=0, model="A100", memory_mib=81920)
        control.node_registered(
            NodeRegistered(node="gpu-1", cpu_milli=8000, memory_mib=65536, gpus=[gpu])
        )
        job, _ = control.submit(
            job_yaml("long", extra_spec="  maxRuntime: 60"), owner="mia", roles=["ml-developer"]
        )
        control.schedule()
        assert job.state == "scheduled"
        control.worker_report(job.id, 1, "gpu-1", [0], "started")
        assert job.state == "running"
        now[0] += 58
        control.schedule()
        assert job.state == "running"
        now[0] += 3
        control.schedule()
        assert (job.state, job.stop_reason) == ("stopping", "max-runtime")
        assert job.reason == "exceeded its maxRuntime"
        control.worker_report(job.id, 1, "gpu-1", [0], "stopped")
        assert job.state == "failed" and job.reason == "exceeded its maxRuntime and was stopped"
        assert job.id not in control.jobs
    finally:
        db.dispose()


# ---------------------------------------------------------------------------------- trust


def _forged_report(job: pb.Job, source: str) -> EventEnvelope:
    return EventEnvelope(
        type="gantry.job.workers",
        source=source,
        actor="mallory",
        subject=job.id,
        data=JobWorkersReported(
            job_id=job.id, attempt=job.attempt, node="gpu-1", workers=[0], status="succeeded"
        ).model_dump(mode="json"),
    )


async def test_events_from_the_wrong_source_or_key_are_dead_lettered_and_change_nothing(
    sched: Running, tmp_path: Path
) -> None:
    await _register(sched, "gpu-1", gpus=1)
    job = await sched.wait_state((await sched.submit(job_yaml("victim"))).id, "scheduled")
    await sched.agents.report(job, "started")
    job = await sched.wait_state(job.id, "running")
    bus = sched.agents.bus
    stranger = Keyring(tmp_path / "elsewhere").service_key("training-agent")  # same kid, other key
    forgers: list[tuple[Any, str]] = [
        (Publisher(bus), AGENT),  # unsigned
        (Publisher(bus, signer=stranger), AGENT),  # a key the platform never trusted
        (Publisher(bus, signer=sched.keyring.account_key("mallory")), AGENT),  # not a service
        (Publisher(bus, signer=sched.keyring.service_key("governance")), "gantry/governance"),
    ]
    for publisher, source in forgers:
        await publisher.publish(_forged_report(job, source))
    gpus = [GpuDevice(index=i, model="H100", memory_mib=81920) for i in range(64)]
    fake_node = NodeRegistered(node="rogue", cpu_milli=1000, memory_mib=1024, gpus=gpus)
    await Publisher(bus, signer=sched.keyring.account_key("mallory")).publish(
        EventEnvelope(
            type="gantry.node.registered",
            source="ext/mallory",
            actor="mallory",
            subject="rogue",
            data=fake_node.model_dump(mode="json"),
        )
    )
    workers = await dead_letter_reasons(sched.nats_url, "gantry.deadletter.scheduler-workers", 4)
    assert len(workers) == 4
    assert any("not signed" in r for r in workers), workers
    assert any("bad event signature" in r for r in workers), workers
    assert any("sa-mallory" in r and "platform" in r for r in workers), workers
    assert any("'gantry/governance'" in r and "refused" in r for r in workers), workers
    (node,) = await dead_letter_reasons(sched.nats_url, "gantry.deadletter.scheduler-nodes", 1)
    assert "'ext/mallory'" in node and "refused" in node
    job = await sched.get(job.id)
    assert job.state == "running" and job.attempt == 1
    assert await _node_states(sched) == {"gpu-1": "ready"}
    await sched.agents.report(job, "succeeded")  # the real agent is still believed
    await sched.wait_state(job.id, "succeeded")


def test_races_between_stops_and_finishing_end_the_job_right(tmp_path: Path) -> None:
    """A job that succeeds while a preemption's stop is on its way succeeds (it is not run
    again); a cancel during a shrink stops every rank; a late report for a released rank
    changes nothing."""
    from gantry.events.catalog import GpuDevice, NodeRegistered
    from gantry.scheduler.control import Control
    from gantry.scheduler.settings import SchedulerOptions
    from gantry.scheduler.store import connect, migrate

    db = connect(f"sqlite:///{tmp_path / 's.db'}")
    migrate(db)
    c = Control(db, SchedulerOptions(heartbeat_timeout_s=3600))
    c.recover()
    gpus = [GpuDevice(index=i, model="A100") for i in range(4)]
    c.node_registered(NodeRegistered(node="n1", cpu_milli=64000, memory_mib=1 << 18, gpus=gpus))
    low, _ = c.submit(job_yaml("low", gpus=4, priority="low"), owner="mia", roles=[])
    c.schedule()
    c.worker_report(low.id, 1, "n1", [0], "started")
    c.submit(job_yaml("high", gpus=4, priority="high"), owner="mia", roles=[])
    c.schedule()
    assert c.get(low.id).state == "stopping"
    c.worker_report(low.id, 1, "n1", [0], "succeeded")  # it finished first
    assert c.get(low.id).state == "succeeded"

    el, _ = c.submit(
        job_yaml("el", replicas=4, gpus=1, min_replicas=2, priority="low"), owner="mia", roles=[]
    )
    for _ in range(3):
        c.schedule()
    high = next(j for j in c.list() if j.name == "high")
    c.worker_report(high.id, 1, "n1", [0], "started")
    c.worker_report(high.id, 1, "n1", [0], "succeeded")
    c.schedule()
    el_row = c.get(el.id)
    assert el_row.state == "scheduled" and el_row.workers == 4
    c.worker_report(el.id, el_row.attempt, "n1", [0, 1, 2, 3], "started")
    c.submit(job_yaml("urgent", gpus=2, priority="high"), owner="mia", roles=[])
    c.schedule()
    shrinking = c.get(el.id)
    assert shrinking.state == "stopping" and shrinking.stop_ranks == [2, 3]
    c.cancel(el.id, actor="mia")
    assert c.get(el.id).stop_reason == "cancelled" and c.get(el.id).stop_ranks == []
    c.worker_report(el.id, shrinking.attempt, "n1", [0, 1, 2, 3], "stopped")
    assert c.get(el.id).state == "cancelled"
