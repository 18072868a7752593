"""What the training tells the scheduler and what the scheduler tells the gang: the rendezvous
of each attempt, progress, workers restarted by their agent, the model a job registered.

Node agents are the in-process :class:`~.conftest.Agents` (real signed events over real NATS).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from gantry.client.scheduler import JobInfo
from gantry.events import EventEnvelope, Publisher
from gantry.events.catalog import GpuDevice, JobProgress, NodeRegistered
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.scheduler import control as control_module
from gantry.scheduler import store
from gantry.scheduler.control import Control
from gantry.scheduler.progress import SAVE_INTERVAL_MS
from gantry.scheduler.rendezvous import PORT_BASE, PORT_RANGE, master_port
from gantry.scheduler.settings import SchedulerOptions
from gantry.testing.events import EventTap, dead_letter_reasons

from .conftest import AGENT, Running, job_yaml


async def _register(r: Running, *nodes: str, gpus: int, **kw: str) -> None:
    for node in nodes:
        await r.agents.register(node, gpus=gpus, address=f"10.0.0.{node[-1]}", **kw)
    async with asyncio.timeout(10):
        while True:
            listing = await r.stub.ListNodes(pb.ListNodesRequest(), metadata=r.md())
            if set(nodes) <= {n.name for n in listing.nodes}:
                return
            await asyncio.sleep(0.05)


async def _running(r: Running, name: str, *, replicas: int = 2, topology: str = "spread") -> pb.Job:
    job = await r.submit(job_yaml(name, replicas=replicas, gpus=1, topology=topology))
    job = await r.wait_state(job.id, "scheduled")
    await r.agents.report(job, "started")
    return await r.wait_state(job.id, "running")


# ---------------------------------------------------------------------------------- rendezvous


async def test_a_gang_over_nodes_meets_at_rank_0s_node_and_one_node_on_loopback(
    sched: Running, tap: EventTap
) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=2)
    nodes = await sched.stub.ListNodes(pb.ListNodesRequest(), metadata=sched.md())
    assert {(n.name, n.address, n.worker_slots) for n in nodes.nodes} == {
        ("gpu-1", "10.0.0.1", "gpu"),
        ("gpu-2", "10.0.0.2", "gpu"),
    }
    gang = await sched.submit(job_yaml("gang", replicas=2, gpus=1, topology="spread"))
    gang = await sched.wait_state(gang.id, "scheduled")
    rank0 = next(p.node for p in gang.placements if p.worker == 0)
    (placed,) = await tap.wait_for("gantry.job.scheduled", job_id=gang.id)
    assert len(placed.data["nodes"]) == 2
    assert placed.data["master_addr"] == f"10.0.0.{rank0[-1]}"
    assert placed.data["master_port"] == master_port(gang.id, 1)

    await sched.agents.report(gang, "started")
    await sched.agents.report(gang, "succeeded")
    await sched.wait_state(gang.id, "succeeded")
    pair = await sched.submit(job_yaml("pair", replicas=2, gpus=1, topology="pack"))
    pair = await sched.wait_state(pair.id, "scheduled")
    assert len({p.node for p in pair.placements}) == 1
    (placed,) = await tap.wait_for("gantry.job.scheduled", job_id=pair.id)
    assert placed.data["master_addr"] == ""  # the agent uses loopback
    assert PORT_BASE <= placed.data["master_port"] < PORT_BASE + PORT_RANGE


async def test_a_requeued_attempt_gets_another_rendezvous_port(
    sched: Running, tap: EventTap
) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "gang")
    await sched.agents.report(job, "stopped", node=job.placements[1].node, message="shutdown")
    await sched.wait(job.id, lambda j: j.attempt == 2 and j.state == "scheduled")
    ports = [e.data["master_port"] for e in await tap.wait_for("gantry.job.scheduled", 2)]
    assert ports == [master_port(job.id, 1), master_port(job.id, 2)]
    assert ports[0] != ports[1]


def test_rendezvous_ports_stay_in_range_and_differ_between_attempts() -> None:
    for job_id in ("j-1", "j-0123456789ab", "j-ffffffffffff"):
        ports = [master_port(job_id, attempt) for attempt in range(1, 200)]
        assert all(PORT_BASE <= p < PORT_BASE + PORT_RANGE for p in ports)
        assert len(set(ports)) == len(ports)
    assert master_port("j-1", 1) != master_port("j-2", 1)


# ---------------------------------------------------------------------------------- progress


async def test_progress_shows_in_get_list_and_watch(sched: Running) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "train")
    watch = sched.stub.WatchJobs(pb.WatchJobsRequest(id=job.id), metadata=sched.md())
    await asyncio.sleep(0.2)  # the watch is listening
    at_ms = int(time.time() * 1000)
    await sched.agents.progress(
        job, 120, total_steps=500, epoch=2, loss=0.4123, samples_per_s=812.0, eta_s=90.0,
        at_ms=at_ms,
    )  # fmt: skip
    job = await sched.wait(job.id, lambda j: j.progress.step == 120)
    p = job.progress
    assert (p.total_steps, p.epoch, p.samples_per_s, p.updated_ms, p.attempt) == (
        500, 2, 812.0, at_ms, 1
    )  # fmt: skip
    assert p.has_loss and abs(p.loss - 0.4123) < 1e-9 and p.has_eta and p.eta_s == 90.0
    listing = await sched.stub.ListJobs(pb.ListJobsRequest(), metadata=sched.md())
    assert [j.progress.step for j in listing.jobs] == [120]
    async with asyncio.timeout(5):
        async for change in watch:
            if change.progress.step == 120:
                break
    watch.cancel()
    # without a loss or an ETA the message says so; an older measurement changes nothing
    await sched.agents.progress(job, 100, at_ms=at_ms - 1000)
    await sched.agents.progress(job, 130, at_ms=at_ms + 1000)
    job = await sched.wait(job.id, lambda j: j.progress.step == 130)
    assert not job.progress.has_loss and not job.progress.has_eta
    await asyncio.sleep(0.3)
    assert (await sched.get(job.id)).progress.step == 130


async def test_progress_of_an_older_attempt_is_ignored(sched: Running) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "gang")
    await sched.agents.progress(job, 50, total_steps=100)
    await sched.wait(job.id, lambda j: j.progress.step == 50)
    await sched.agents.report(job, "stopped", node=job.placements[1].node, message="shutdown")
    again = await sched.wait(job.id, lambda j: j.attempt == 2 and j.state == "scheduled")
    await sched.agents.report(again, "started")
    again = await sched.wait_state(job.id, "running")
    # the old gang's last words arrive late; then the new gang reports (resumed at step 40)
    await sched.agents.progress(job, 99, attempt=1, at_ms=int(time.time() * 1000) + 60_000)
    await sched.agents.progress(again, 40, total_steps=100)
    again = await sched.wait(job.id, lambda j: j.progress.attempt == 2)
    assert again.progress.step == 40
    await asyncio.sleep(0.3)
    assert (await sched.get(job.id)).progress.step == 40


def _forged_progress(job: pb.Job, source: str) -> EventEnvelope:
    return EventEnvelope(
        type="gantry.metrics.job.progress",
        source=source,
        actor="mallory",
        subject=job.id,
        data=JobProgress(job_id=job.id, attempt=job.attempt, step=10**6).model_dump(mode="json"),
    )


async def test_progress_from_the_wrong_source_or_key_is_refused(sched: Running) -> None:
    await _register(sched, "gpu-1", gpus=1)
    job = await _running(sched, "victim", replicas=1)
    bus = sched.agents.bus
    forgers = [
        (Publisher(bus), AGENT),  # unsigned
        (Publisher(bus, signer=sched.keyring.account_key("mallory")), AGENT),  # not a service
        (Publisher(bus, signer=sched.keyring.service_key("governance")), "gantry/governance"),
    ]
    for publisher, source in forgers:
        await publisher.publish(_forged_progress(job, source))
    reasons = await dead_letter_reasons(
        sched.nats_url, "gantry.deadletter.scheduler-progress", len(forgers)
    )
    assert any("not signed" in r for r in reasons), reasons
    assert any("sa-mallory" in r for r in reasons), reasons
    assert any("'gantry/governance'" in r and "refused" in r for r in reasons), reasons
    await sched.agents.progress(job, 7)  # the real agent is believed
    job = await sched.wait(job.id, lambda j: j.progress.step == 7)


def test_progress_is_written_at_most_once_per_interval_and_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control on its own, with a clock the test moves: the progress shown is always the
    latest; the row lags by at most the save interval and catches up in a scheduling pass."""
    now = [int(time.time() * 1000)]
    monkeypatch.setattr(control_module, "_now_ms", lambda: now[0])
    db = store.connect(f"sqlite:///{tmp_path / 's.db'}")
    store.migrate(db)
    control = Control(db, SchedulerOptions(heartbeat_timeout_s=3600))

    def stored() -> dict[str, Any]:
        with db.connect() as conn:
            text = conn.execute(
                sa.select(store.jobs.c.progress).where(store.jobs.c.id == job.id)
            ).scalar_one()
        return dict(orjson.loads(text))

    try:
        control.recover()
        gpu = GpuDevice(index=0, model="A100")
        control.node_registered(
            NodeRegistered(node="n1", cpu_milli=8000, memory_mib=65536, gpus=[gpu])
        )
        job, _ = control.submit(job_yaml("p"), owner="mia", roles=[])
        control.schedule()
        control.worker_report(job.id, 1, "n1", [0], "started")  # writes the row
        assert not control.job_progress(JobProgress(job_id=job.id, attempt=2, step=1))
        now[0] += 1000
        for step in range(1, 21):
            assert control.job_progress(JobProgress(job_id=job.id, attempt=1, step=step))
        assert control.get(job.id).progress["step"] == 20  # what the API shows
        assert stored() == {}  # the row was written a second ago
        control.schedule()
        assert stored() == {}  # not due yet
        now[0] += SAVE_INTERVAL_MS
        control.schedule()
        assert stored()["step"] == 20  # caught up
        now[0] += 1
        control.job_progress(JobProgress(job_id=job.id, attempt=1, step=21))
        assert stored()["step"] == 20
        now[0] += SAVE_INTERVAL_MS
        control.job_progress(JobProgress(job_id=job.id, attempt=1, step=22))
        assert stored()["step"] == 22  # due: written at once
        control.worker_report(job.id, 1, "n1", [0], "succeeded", model="resnet:3")
        assert stored()["step"] == 22
        assert not control.job_progress(JobProgress(job_id=job.id, attempt=1, step=23))
    finally:
        db.dispose()


# ---------------------------------------------------------------------------------- restarts


async def test_workers_restarted_by_their_agent_keep_the_job_running_and_are_counted(
    sched: Running,
) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "crashy")
    node = job.placements[0].node
    await sched.agents.report(job, "restarted", node=node, step=120, restarts=1, message="oom")
    job = await sched.wait(job.id, lambda j: j.restarts == 1)
    assert job.state == "running" and job.attempt == 1
    line = f"worker(s) [0] on {node} restarted from step 120 (restart 1 of attempt 1): oom"
    assert job.reason == line
    assert (job.history[-1].state, job.history[-1].reason) == ("running", line)
    logs = [
        (entry.stream, entry.text)
        async for entry in sched.stub.JobLogs(pb.JobLogsRequest(id=job.id), metadata=sched.md())
    ]
    assert ("gantry", line) in logs
    # a redelivered report counts once; the next restart counts again
    await sched.agents.report(job, "restarted", node=node, step=120, restarts=1)
    await sched.agents.report(job, "restarted", node=node, step=180, restarts=2)
    job = await sched.wait(job.id, lambda j: "from step 180" in j.reason)
    assert job.restarts == 2 and len(job.history) == 5  # pending, scheduled, running, 2 restarts
    await sched.agents.report(job, "succeeded")
    job = await sched.wait_state(job.id, "succeeded")
    assert job.restarts == 2  # kept with the finished job


async def test_the_model_a_job_registered_is_kept_on_success(sched: Running) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "resnet")
    rank0 = next(p.node for p in job.placements if p.worker == 0)
    rank1 = next(p.node for p in job.placements if p.worker == 1)
    await sched.agents.report(job, "succeeded", node=rank1)
    await sched.agents.report(job, "succeeded", node=rank0, model="resnet:3")
    job = await sched.wait_state(job.id, "succeeded")
    assert job.model == "resnet:3"  # read back from the database: the job is finished
    listing = await sched.stub.ListJobs(pb.ListJobsRequest(), metadata=sched.md())
    assert [j.model for j in listing.jobs] == ["resnet:3"]


async def test_metrics_and_a_committed_dataset_version_are_kept_and_announced(
    sched: Running, tap: EventTap
) -> None:
    await _register(sched, "gpu-1", "gpu-2", gpus=1)
    job = await _running(sched, "prep")
    rank0 = next(p.node for p in job.placements if p.worker == 0)
    rank1 = next(p.node for p in job.placements if p.worker == 1)
    await sched.agents.report(
        job, "succeeded", node=rank0, metrics={"accuracy": 0.852, "rows": 4000.0},
        dataset_version="churn-features@" + "ab" * 32,
    )  # fmt: skip
    await sched.agents.report(job, "succeeded", node=rank1)  # other nodes report no metrics
    job = await sched.wait_state(job.id, "succeeded")
    assert dict(job.metrics) == {"accuracy": 0.852, "rows": 4000.0}
    assert job.dataset_version == "churn-features@" + "ab" * 32
    listing = await sched.stub.ListJobs(pb.ListJobsRequest(), metadata=sched.md())
    assert [dict(j.metrics) for j in listing.jobs] == [{"accuracy": 0.852, "rows": 4000.0}]
    (done,) = await tap.wait_for("gantry.job.state", job_id=job.id, state="succeeded")
    assert done.data["metrics"] == {"accuracy": 0.852, "rows": 4000.0}
    assert done.data["dataset_version"] == job.dataset_version and done.data["model"] == ""
    (running,) = tap.of("gantry.job.state", job_id=job.id, state="running")
    assert running.data["metrics"] == {}  # only the succeeded state carries what it made

    client_job = JobInfo.from_pb(job)
    assert client_job.metrics == {"accuracy": 0.852, "rows": 4000.0}
    assert client_job.dataset_version == job.dataset_version


# ---------------------------------------------------------------------------------- nodes, schema


async def test_a_cpu_node_lists_its_worker_slots(sched: Running) -> None:
    await sched.agents.register("cpu-1", gpus=0, address="10.0.1.1", worker_slots="cpu")
    async with asyncio.timeout(10):
        while not (await sched.stub.ListNodes(pb.ListNodesRequest(), metadata=sched.md())).nodes:
            await asyncio.sleep(0.05)
    (node,) = (await sched.stub.ListNodes(pb.ListNodesRequest(), metadata=sched.md())).nodes
    assert (node.address, node.worker_slots, len(node.gpus)) == ("10.0.1.1", "cpu", 0)


def test_a_version_1_database_is_migrated_and_its_jobs_read(
    tmp_path: Path, database_url: str | None
) -> None:
    """On SQLite and PostgreSQL: the new columns are added, and old rows read with defaults."""
    db = store.connect(database_url or f"sqlite:///{tmp_path / 's.db'}")
    try:
        store.migrate(db)
        with db.begin() as conn:  # back to version 1: the jobs table without the new columns
            for column in (
                "progress", "restarts", "attempt_restarts", "model", "metrics", "dataset_version",
            ):  # fmt: skip
                conn.execute(sa.text(f"ALTER TABLE sched_jobs DROP COLUMN {column}"))
            conn.execute(sa.text("DELETE FROM sched_schema_version WHERE version >= 2"))
            conn.execute(
                sa.text(
                    "INSERT INTO sched_jobs (id, name, queue, owner, owner_roles, priority, "
                    "state, reason, spec_yaml, request_id, attempt, workers, placements, "
                    "reports, stop_reason, stop_ranks, deadline_ms, pools, submitted_ms, "
                    "pending_since_ms, attempt_start_ms, started_ms, finished_ms, run_s, "
                    "checkpoint_ms, preempted_ms) VALUES ('j-old', 'old', 'default', 'mia', "
                    "'[]', 500, 'succeeded', 'all workers finished', :spec, '', 1, 0, '[]', "
                    "'{}', '', '[]', 0, '', 1, 1, 1, 1, 2, 1.0, 0, 0)"
                ),
                {"spec": job_yaml("old")},
            )
        assert store.migrate(db) == 1
        control = Control(db, SchedulerOptions())
        control.recover()
        old = control.get("j-old")
        assert (old.progress, old.restarts, old.model) == ({}, 0, "")
        assert (old.metrics, old.dataset_version) == ({}, "")
    finally:
        db.dispose()
