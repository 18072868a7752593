"""The node agent against a real nats-server: the test plays the scheduler's part.

It publishes signed ``gantry.job.scheduled`` / ``gantry.job.stop.requested`` events and reads
what the agent publishes through a plain subscription on ``gantry.>`` (the harness is in
conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gantry.core import InvalidInput, new_id
from gantry.events import Publisher
from gantry.events.catalog import (
    JOB_SCHEDULED,
    DatasetUse,
    JobScheduled,
    WorkerPlacement,
)
from gantry.supervisor import NatsServer
from gantry.testing.agents import spawn_agent as spawn_agent_process
from gantry.testing.probes import http_get, readyz
from gantry.training_agent.__main__ import build_parser, inventory_from_args, main
from gantry.training_agent.agent import CANNOT_START, NodeAgent
from gantry.training_agent.governance import Grant
from gantry.training_agent.inventory import NodeInventory
from gantry.training_agent.launch import master_port, worker_command, worker_environment

from .conftest import HEARTBEAT_S, NODE, Env, Scheduler, Watch

# -- worker scripts (run with ``python -c``) -------------------------------------------------

PRINT_RANK = 'import os; print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])'

FAIL = textwrap.dedent(
    """
    import os, sys, time
    if os.environ["RANK"] == "0":
        time.sleep(0.2)
        print("loading", flush=True)
        print("boom: bad input", file=sys.stderr)
        sys.exit(3)
    time.sleep(60)
    """
)

#: Counts its starts, checkpoints its step on SIGTERM, says whether it resumes and from where.
TRAIN = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    ckpt = pathlib.Path(os.environ["GANTRY_CHECKPOINT_DIR"])
    with open(ckpt / "starts", "a") as f:
        f.write(os.environ["RANK"] + "\\n")
    (ckpt / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    step = 0
    def on_term(*_):
        (ckpt / "step").write_text(str(step))
        print("checkpointed at", step, flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    last = (ckpt / "step").read_text() if (ckpt / "step").exists() else "none"
    print("resume", os.environ.get("GANTRY_RESUME", "0"), "from", last, flush=True)
    while not (ckpt / "go").exists():
        step += 1
        time.sleep(0.02)
    print("done", flush=True)
    """
)


# -- registration and heartbeats -------------------------------------------------------------


async def test_registers_its_inventory_then_heartbeats_with_increasing_seq(
    env: Env, agent: NodeAgent
) -> None:
    [registered] = await env.watch.until("gantry.node.registered")
    assert registered.source == "gantry/training-agent"
    assert registered.data["node"] == NODE
    assert registered.data["pool"] == "onprem"
    assert registered.data["cpu_milli"] == 8000
    assert registered.data["memory_mib"] == 16384
    assert [g["model"] for g in registered.data["gpus"]] == ["A100", "A100"]
    assert registered.data["labels"] == {"rack": "r1"}
    assert registered.data["heartbeat_s"] == HEARTBEAT_S

    beats = await env.watch.until("gantry.metrics.node.heartbeat", 3, node=NODE)
    seqs = [b.data["seq"] for b in beats]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(b.data["jobs"] == [] for b in beats)
    registered_at = next(s.at for s in env.watch.seen if s.subject == "gantry.node.registered")
    first_beat_at = next(s.at for s in env.watch.seen if s.subject.endswith("heartbeat"))
    assert registered_at <= first_beat_at
    # signed with the agent's own platform key
    heads = [s.headers for s in env.watch.seen if s.subject == "gantry.node.registered"]
    assert heads[0]["Gantry-Signature"].startswith("svc-training-agent:")


async def test_answers_its_probes_once_its_node_is_registered(agent: NodeAgent) -> None:
    assert await readyz(agent.health_port) == "200 ready\n"
    metrics = await asyncio.to_thread(http_get, agent.health_port, "/metrics")
    assert metrics.startswith("200 ") and "python_info" in metrics


def test_the_command_line_declares_hardware() -> None:
    args = build_parser().parse_args(
        shlex.split(
            "--node x --pool onprem --gpus 4 --gpu-model H100 --gpu-memory 80Gi --cpus 32 "
            "--memory 256Gi --rack r1 --label zone=z1"
        )
    )
    inventory = inventory_from_args(args)
    assert (inventory.node, inventory.pool) == ("x", "onprem")
    assert (inventory.cpu_milli, inventory.memory_mib) == (32000, 256 * 1024)
    assert [(g.index, g.model, g.memory_mib) for g in inventory.gpus] == [
        (i, "H100", 80 * 1024) for i in range(4)
    ]
    assert inventory.labels == {"rack": "r1", "zone": "z1"}


def test_a_bad_flag_is_an_error_that_says_what_to_write(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpus", "0", "--memory", "lots"]) == 2
    assert "'lots' is not a quantity: write e.g. 32Gi" in capsys.readouterr().err


def test_detect_reads_this_machine() -> None:
    inventory = NodeInventory.detect("here", gpus=False)
    assert inventory.cpu_milli >= 1000
    assert inventory.memory_mib > 100
    assert inventory.gpus == ()
    assert inventory.to_event(heartbeat_s=1).node == "here"


# -- running workers -------------------------------------------------------------------------


async def test_runs_the_workers_placed_here_and_reports_success(env: Env, agent: NodeAgent) -> None:
    job = env.scheduler.job(PRINT_RANK, workers=2, elsewhere=1)
    scheduled = await env.scheduler.schedule(job)

    started = await env.watch.report(job.job_id, "started")
    assert started["workers"] == [0, 1] and started["node"] == NODE
    succeeded = await env.watch.report(job.job_id, "succeeded")
    assert succeeded["workers"] == [0, 1]
    assert env.watch.statuses(job.job_id) == ["started", "succeeded"]
    lines = env.watch.log_lines(job.job_id)
    assert sorted(lines) == ["rank 0 of 3", "rank 1 of 3"]  # rank 2 runs on n-other
    [report] = env.watch.of("gantry.job.workers", job_id=job.job_id, status="succeeded")
    assert report.causation_id == scheduled.id
    assert report.correlation_id == scheduled.correlation_id


#: Writes $GANTRY_OUTPUT_DIR/metrics.json from its argument, as any entrypoint may.
WRITES_METRICS = textwrap.dedent(
    """
    import os, pathlib, sys
    out = pathlib.Path(os.environ["GANTRY_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(sys.argv[1])
    print("model dir:", os.environ.get("GANTRY_MODEL_DIR", "none"))
    """
)


async def test_the_metrics_rank_0_wrote_come_with_success_and_a_bad_file_is_only_noted(
    env: Env, agent: NodeAgent
) -> None:
    good = env.scheduler.job(WRITES_METRICS)
    good = good.model_copy(update={"spec": {"entrypoint": {
        "command": [sys.executable, "-c", WRITES_METRICS], "args": ['{"auc": 0.91, "rows": 3}'],
    }}})  # fmt: skip
    bad = good.model_copy(update={"job_id": new_id(), "spec": {"entrypoint": {
        "command": [sys.executable, "-c", WRITES_METRICS], "args": ['{"auc": "high"}'],
    }}})  # fmt: skip
    await env.scheduler.schedule(good)
    await env.scheduler.schedule(bad)

    reported = await env.watch.report(good.job_id, "succeeded")
    assert reported["metrics"] == {"auc": 0.91, "rows": 3.0}
    assert "model dir: none" in env.watch.log_lines(good.job_id)  # no spec.model
    ignored = await env.watch.report(bad.job_id, "succeeded")  # a bad file fails nothing
    assert ignored["metrics"] == {}
    notes = env.watch.log_lines(bad.job_id, "gantry")
    assert any(
        "metrics not reported:" in n and "metric 'auc' is 'high', not a number" in n for n in notes
    ), notes


#: Writes evaluation records to its progress pipe as the runtime's rank 0 does with eval_every,
#: and malformed ones between them.
EVALUATES = textwrap.dedent(
    """
    import json, os
    records = [
        {"kind": "evaluation", "step": 8, "epoch": 1,
         "metrics": {"accuracy": 0.75, "eval_loss": 0.5}},
        {"kind": "evaluation", "step": 12, "epoch": 2, "metrics": {"accuracy": "high"}},
        {"kind": "evaluation", "step": 12, "epoch": 2, "metrics": [0.5]},
        {"kind": "evaluation", "step": 12, "epoch": 2},
        {"kind": "evaluation", "step": -1, "epoch": 2, "metrics": {}},
        {"kind": "evaluation", "step": 16, "epoch": 2,
         "metrics": {"accuracy": 0.8, "eval_loss": float("nan")}},
    ]
    with os.fdopen(int(os.environ["GANTRY_PROGRESS_FD"]), "w") as pipe:
        for record in records:
            pipe.write(json.dumps(record) + "\\n")
    """
)


async def test_evaluation_records_become_signed_evaluation_events(
    env: Env, agent: NodeAgent
) -> None:
    job = env.scheduler.job(EVALUATES)
    await env.scheduler.schedule(job)

    await env.watch.report(job.job_id, "succeeded")
    events = await env.watch.until("gantry.metrics.job.evaluation", 2, job_id=job.job_id)
    await asyncio.sleep(0.2)  # nothing more comes: the malformed records were dropped
    events = env.watch.of("gantry.metrics.job.evaluation", job_id=job.job_id)
    assert [(e.data["step"], e.data["epoch"], e.data["metrics"]) for e in events] == [
        (8, 1, {"accuracy": 0.75, "eval_loss": 0.5}),
        (16, 2, {"accuracy": 0.8}),
    ]  # NaN: left out
    for e in events:
        assert e.source == "gantry/training-agent" and e.subject == job.job_id
        assert (e.data["attempt"], e.data["node"]) == (1, NODE) and e.data["at_ms"] > 0
    heads = [s.headers for s in env.watch.seen if s.subject == "gantry.metrics.job.evaluation"]
    assert all(h["Gantry-Signature"].startswith("svc-training-agent:") for h in heads)


async def test_an_output_without_governance_fails_the_job_and_keeps_the_files(
    env: Env, agent: NodeAgent
) -> None:
    script = (
        "import os, pathlib; d = pathlib.Path(os.environ['GANTRY_OUTPUT_DIR']) / 'dataset'; "
        "d.mkdir(parents=True); (d / 'part.parquet').write_bytes(b'PAR1')"
    )
    job = env.scheduler.job(script).model_copy(update={"spec": {
        "entrypoint": {"command": [sys.executable, "-c", script]},
        "output": {"dataset": "scores"},
    }})  # fmt: skip
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed")
    kept = env.checkpoint_dir(job) / "output-1" / "dataset"
    assert failed["exit_code"] == 0  # the workers succeeded; their output did not land
    assert "its output was not committed to scores: no governance service" in failed["message"]
    assert f"the files are kept in {kept}" in failed["message"]
    assert (kept / "part.parquet").is_file()


async def test_a_failing_worker_fails_the_node_and_its_siblings_are_killed(
    env: Env, agent: NodeAgent
) -> None:
    job = env.scheduler.job(FAIL, workers=2)
    await env.scheduler.schedule(job)

    failed = await env.watch.report(job.job_id, "failed")
    assert failed["exit_code"] == 3
    assert failed["message"] == "boom: bad input"
    assert failed["workers"] == [0, 1]
    assert "loading" in env.watch.log_lines(job.job_id)
    assert "boom: bad input" in env.watch.log_lines(job.job_id, "stderr")
    async with asyncio.timeout(5):
        while agent.running_jobs():  # rank 1 (sleeping a minute) was killed
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert env.watch.statuses(job.job_id) == ["started", "failed"]


async def test_a_job_that_cannot_start_is_reported_failed(env: Env, agent: NodeAgent) -> None:
    job = env.scheduler.job("")
    job = job.model_copy(update={"spec": {"entrypoint": {"command": ["/nonexistent/trainer"]}}})
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed")
    assert failed["exit_code"] == 127
    assert "cannot start" in failed["message"]


async def test_stop_checkpoints_then_stops_and_a_resumed_attempt_sees_the_step(
    env: Env, agent: NodeAgent
) -> None:
    job = env.scheduler.job(TRAIN)
    await env.scheduler.schedule(job)
    await env.watch.report(job.job_id, "started")
    await env.watch.until("gantry.log.job", job_id=job.job_id)  # the SIGTERM handler is set
    beat = await env.watch.until("gantry.metrics.node.heartbeat", 1, jobs=[job.job_id])
    assert beat

    began = time.monotonic()
    await env.scheduler.stop(job, grace_s=5, nodes=[NODE])
    stopped = await env.watch.report(job.job_id, "stopped")
    assert time.monotonic() - began < 5
    assert stopped["message"] == "preempted"
    statuses = env.watch.statuses(job.job_id)
    assert statuses == ["started", "checkpointed", "stopped"]
    step = env.watch.reports(job.job_id)[1]["step"]
    assert step > 0
    assert (env.checkpoint_dir(job) / "step").read_text() == str(step)
    assert f"checkpointed at {step}" in env.watch.log_lines(job.job_id)

    # the same stop again, and one for an attempt that never ran here: nothing happens
    await env.scheduler.stop(job)
    await env.scheduler.stop(job.model_copy(update={"attempt": 7}))

    resumed = job.model_copy(update={"attempt": 2, "resume": True})
    await env.scheduler.schedule(resumed)
    await env.watch.until("gantry.log.job", job_id=job.job_id, attempt=2)
    assert env.watch.log_lines(job.job_id)[-1] == f"resume 1 from {step}"
    assert env.watch.statuses(job.job_id) == ["started", "checkpointed", "stopped", "started"]

    # shutting the agent down stops the running attempt too
    agent.stop()
    down = await env.watch.until("gantry.job.workers", job_id=job.job_id, status="stopped", n=2)
    assert down[1].data["attempt"] == 2
    assert down[1].data["message"] == "shutdown"


async def test_a_stop_for_some_ranks_leaves_the_others_running(env: Env, agent: NodeAgent) -> None:
    job = env.scheduler.job(TRAIN, workers=2)
    await env.scheduler.schedule(job)
    await env.watch.report(job.job_id, "started")
    await env.watch.until("gantry.log.job", 2, job_id=job.job_id)
    await env.scheduler.stop(job, workers=[1], nodes=[])
    stopped = await env.watch.report(job.job_id, "stopped")
    assert stopped["workers"] == [1]
    assert agent.running_jobs() == [job.job_id]
    (env.checkpoint_dir(job) / "go").touch()
    succeeded = await env.watch.report(job.job_id, "succeeded")
    assert succeeded["workers"] == [0]


def test_worker_environment_without_an_agent(tmp_path: Path) -> None:
    job = JobScheduled(
        job_id="j-1",
        attempt=3,
        resume=True,
        placements=[
            WorkerPlacement(worker=0, node="a", gpus=[(2, 1000), (3, 1000)]),
            WorkerPlacement(worker=1, node="b", gpus=[(0, 500)]),
        ],
    )
    env = worker_environment(
        job,
        job.placements[1],
        local_rank=0,
        local_world_size=1,
        job_dir=tmp_path,
        output_dir=tmp_path / "out",
        resume=job.resume,
        cuda_mps=True,
        base={"PATH": "/bin", "GANTRY_RESUME": "stale", "GANTRY_MODEL_DIR": "/stale"},
    )
    assert env["GANTRY_RESUME"] == "1"
    assert env["GANTRY_JOB_ID"] == "j-1" and env["GANTRY_ATTEMPT"] == "3"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "0")
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == str(master_port(job))
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["GANTRY_GPU_MILLI"] == "500"
    # half a GPU: a memory cap for the runtime and, under MPS, half the compute
    assert env["GANTRY_GPU_MEMORY_FRACTION"] == "0.500"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["GANTRY_JOB_SPEC"] == str(tmp_path / "spec.json")
    assert env["GANTRY_CHECKPOINT_DIR"] == str(tmp_path)
    assert env["PATH"] == "/bin"
    first = worker_environment(
        job.model_copy(update={"resume": False, "master_addr": "10.0.0.5", "master_port": 23456}),
        job.placements[0],
        local_rank=0,
        local_world_size=1,
        job_dir=tmp_path,
        output_dir=tmp_path / "out",
        resume=False,
        restarts=1,
        model_dir=tmp_path / "model",
        base={"GANTRY_RESUME": "stale", "GANTRY_MODEL_DIR": "/stale"},
    )
    assert first["GANTRY_MODEL_DIR"] == str(tmp_path / "model")  # the job's input model
    assert "GANTRY_MODEL_DIR" not in env  # none: none inherited either
    assert first["CUDA_VISIBLE_DEVICES"] == "2,3" and first["GANTRY_GPU_MILLI"] == "2000"
    assert "GANTRY_GPU_MEMORY_FRACTION" not in first  # whole GPUs: no cap
    assert first["MASTER_ADDR"] == "10.0.0.5"
    # the scheduler's port, moved on by a restart so the new gang never meets the old socket
    assert first["MASTER_PORT"] == str(23456 + 7)
    assert 20000 <= master_port(job) < 30000


def test_worker_command_from_the_spec() -> None:
    module = {"entrypoint": {"module": "train", "args": ["--epochs", 3]}}
    assert worker_command(module) == [sys.executable, "-m", "train", "--epochs", "3"]
    command = {"entrypoint": {"command": "python train.py", "args": ["-v"]}}
    assert worker_command(command) == ["python", "train.py", "-v"]
    task = {"entrypoint": {"task": "my_job:task", "args": ["epochs=2"]}}
    assert worker_command(task) == [
        sys.executable,
        "-m",
        "gantry.training.run",
        "my_job:task",
        "epochs=2",
    ]
    evaluate = {"entrypoint": {"task": "my_job:task", "mode": "evaluate", "args": ["seed=1"]}}
    assert worker_command(evaluate) == [
        sys.executable, "-m", "gantry.training.run", "--evaluate", "my_job:task", "seed=1",
    ]  # fmt: skip
    transform = {"entrypoint": {"transform": "prep:clean", "args": ["min=3"], "mode": "train"}}
    assert worker_command(transform) == [
        sys.executable, "-m", "gantry.training.transform", "prep:clean", "min=3",
    ]  # fmt: skip
    with pytest.raises(Exception, match="exactly one of task, transform, module or command"):
        worker_command({"entrypoint": {"module": "a", "command": ["b"]}})
    with pytest.raises(Exception, match="exactly one of task, transform, module or command"):
        worker_command({"entrypoint": {"task": "a:b", "transform": "c:d"}})
    with pytest.raises(Exception, match="no entrypoint"):
        worker_command({})


# -- only the scheduler is obeyed, and only once ---------------------------------------------


async def test_placements_not_from_the_scheduler_are_refused(
    env: Env, agent: NodeAgent, tmp_path: Path
) -> None:
    def touching(name: str) -> str:
        return f"open({str(tmp_path / name)!r}, 'w').close()"

    s = env.scheduler
    unsigned = s.job(touching("unsigned"))
    outsider = s.job(touching("outsider"))
    other_service = s.job(touching("other-service"))
    outside_source = s.job(touching("outside-source"))
    await Publisher(s.bus).publish(s.envelope(JOB_SCHEDULED.type, unsigned))
    await s.publish(s.envelope(JOB_SCHEDULED.type, outsider), env.keyring.account_key("mallory"))
    await s.schedule(other_service, source="gantry/governance")  # a service, not the scheduler
    await s.publish(s.envelope(JOB_SCHEDULED.type, outside_source, source="team/x"), "governance")
    good = s.job(touching("good"))
    await s.schedule(good)

    await env.watch.report(good.job_id, "succeeded")
    dead = await env.watch.until("gantry.deadletter.agent-n1", 4)
    assert {d.data["job_id"] for d in dead} == {
        unsigned.job_id,
        outsider.job_id,
        other_service.job_id,
        outside_source.job_id,
    }
    reasons = [s.headers["Gantry-Dead-Reason"] for s in env.watch.seen if "deadletter" in s.subject]
    assert any("not signed" in r for r in reasons)
    assert sum("only the scheduler" in r for r in reasons) == 2
    markers = await asyncio.to_thread(lambda: [p.name for p in tmp_path.iterdir() if p.is_file()])
    assert markers == ["good"]
    assert [r["job_id"] for r in (e.data for e in env.watch.of("gantry.job.workers"))] == [
        good.job_id,
        good.job_id,
    ]


async def test_a_redelivered_placement_does_not_start_workers_twice(
    env: Env, agent: NodeAgent
) -> None:
    s = env.scheduler
    job = s.job(TRAIN, workers=2)
    event = await s.schedule(job)
    await env.watch.report(job.job_id, "started")
    await env.watch.until("gantry.log.job", 2, job_id=job.job_id)  # both wrote their start

    async def sentinel() -> None:  # handled after everything published before it
        marker = s.job(PRINT_RANK)
        await s.schedule(marker)
        await env.watch.report(marker.job_id, "succeeded")

    payload, headers = Publisher(s.bus, signer=s.keyring.service_key("scheduler")).encode(event)
    await s.bus.js.publish(event.type, payload, headers={**headers, "Nats-Msg-Id": new_id()})
    await s.schedule(job)  # the same decision again, as a new event
    await sentinel()
    starts = env.checkpoint_dir(job) / "starts"
    assert sorted(starts.read_text().split()) == ["0", "1"]
    assert env.watch.statuses(job.job_id) == ["started"]

    (env.checkpoint_dir(job) / "go").touch()
    await env.watch.report(job.job_id, "succeeded")
    await s.schedule(job)  # after it finished
    await sentinel()
    assert sorted(starts.read_text().split()) == ["0", "1"]
    assert env.watch.statuses(job.job_id) == ["started", "succeeded"]


async def test_reregisters_after_nats_restarts(
    env: Env, agent: NodeAgent, nats_server: NatsServer
) -> None:
    await env.watch.until("gantry.node.registered")
    await asyncio.to_thread(nats_server.restart)
    async with asyncio.timeout(15):  # counted in the stream: the watch may miss it reconnecting
        while (await env.scheduler.bus.js.stream_info("NODES")).state.messages < 2:
            await asyncio.sleep(0.1)
    seq = agent.heartbeats
    async with asyncio.timeout(5):
        while agent.heartbeats < seq + 2:
            await asyncio.sleep(0.05)


# -- the agent as its own process ------------------------------------------------------------


def spawn(env: Env, node: str) -> subprocess.Popen[bytes]:
    return spawn_agent_process(
        env.nats_url, env.data_dir, node, heartbeat_s=HEARTBEAT_S, args=["--cpus", "4"]
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2] if sys.platform == "linux" else ""
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"  # a zombie is dead, only not reaped yet


async def test_a_sigkilled_agent_stops_heartbeating_and_its_workers_die(env: Env) -> None:
    proc = spawn(env, "n-kill")
    try:
        [registered] = await env.watch.until("gantry.node.registered", node="n-kill", wait_s=20)
        assert registered.data["cpu_milli"] == 4000
        await env.watch.until("gantry.metrics.node.heartbeat", 2, node="n-kill")
        job = env.scheduler.job(TRAIN, node="n-kill")
        await env.scheduler.schedule(job)
        await env.watch.report(job.job_id, "started")
        await env.watch.until("gantry.log.job", job_id=job.job_id)
        pid = int((env.checkpoint_dir(job) / "pid-0").read_text())
    finally:
        proc.kill()
        proc.wait()
    killed_at = time.monotonic()
    await asyncio.sleep(3 * HEARTBEAT_S + 0.1)
    late = [
        s
        for s in env.watch.seen
        if s.subject == "gantry.metrics.node.heartbeat" and s.at > killed_at + 0.05
    ]
    assert late == []
    async with asyncio.timeout(5):
        while alive(pid):
            await asyncio.sleep(0.05)


async def test_a_sigtermed_agent_stops_its_workers_and_exits_cleanly(env: Env) -> None:
    proc = spawn(env, "n-term")
    try:
        await env.watch.until("gantry.node.registered", node="n-term", wait_s=20)
        job = env.scheduler.job(TRAIN, node="n-term")
        await env.scheduler.schedule(job)
        await env.watch.report(job.job_id, "started")
        await env.watch.until("gantry.log.job", job_id=job.job_id)
        proc.send_signal(signal.SIGTERM)
        stopped = await env.watch.report(job.job_id, "stopped")
        assert stopped["message"] == "shutdown"
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert env.watch.statuses(job.job_id) == ["started", "checkpointed", "stopped"]


# -- real training tasks: the runtime under the agent ----------------------------------------

#: A small regression task: deterministic data, two workers split it; ``steps`` sets its length.
TASK = textwrap.dedent(
    """
    import time
    import torch
    from gantry.training import Task

    class Slow(torch.nn.Module):  # 10 ms a step, so a stop or a kill lands mid-run
        def forward(self, x):
            time.sleep(0.01)
            return x

    def model():
        return torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), Slow(), torch.nn.Linear(32, 1)
        )

    def dataset(ctx):
        g = torch.Generator().manual_seed(7)
        x = torch.randn(256, 8, generator=g)
        y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(256, 1, generator=g)
        return torch.utils.data.TensorDataset(x, y)

    task = Task(model=model, loss=torch.nn.functional.mse_loss, dataset=dataset,
                options={"micro_batch_size": 16, "lr": 0.01, "epochs": 2})
    """
)


def task_job(
    scheduler: Scheduler, *, workers: int = 2, args: Sequence[str] = (), **kw: Any
) -> JobScheduled:
    job = scheduler.job("", workers=workers, **kw)
    placements = [WorkerPlacement(worker=p.worker, node=p.node) for p in job.placements]
    spec = {
        "entrypoint": {"task": "agenttask:task", "args": list(args)},
        "training": {"checkpointInterval": 1},
    }
    return job.model_copy(update={"placements": placements, "spec": spec, "name": "regress"})


@pytest.fixture
def task_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``agenttask`` importable by the workers the agent starts."""
    root = tmp_path / "code"
    root.mkdir()
    (root / "agenttask.py").write_text(TASK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return root


def final_loss(watch: Watch, job_id: str) -> float:
    [line] = [ln for ln in watch.log_lines(job_id) if ln.startswith("finished after")]
    return float(line.split("final_loss=")[1].split(",")[0])


async def test_a_task_trains_on_two_workers_with_progress_and_step_metrics(
    env: Env, agent: NodeAgent, task_module: Path
) -> None:
    job = task_job(env.scheduler)
    await env.scheduler.schedule(job)
    await env.watch.report(job.job_id, "succeeded", wait_s=120)
    progress = [e.data for e in env.watch.of("gantry.metrics.job.progress", job_id=job.job_id)]
    assert progress, "no progress events"
    steps = [p["step"] for p in progress]
    assert steps == sorted(steps) and steps[-1] == progress[-1]["total_steps"] == 16
    assert all(p["samples_per_s"] > 0 for p in progress[1:])
    windows = env.watch.of("gantry.metrics.job.step", job_id=job.job_id)
    assert {w.data["worker"] for w in windows} == {0, 1}
    assert all(w.data["samples"] > 0 and w.data["step_ms"] > 0 for w in windows)
    assert sum(w.data["samples"] for w in windows) == 16 * 16 * 2  # 16 steps, 2 ranks
    assert final_loss(env.watch, job.job_id) < 1.0
    notes = env.watch.log_lines(job.job_id, "gantry")
    assert any("model not registered: no governance service" in n for n in notes)


async def test_a_killed_worker_restarts_the_gang_from_its_checkpoint(
    env: Env, agent: NodeAgent, task_module: Path
) -> None:
    reference = task_job(env.scheduler, args=["epochs=60"])
    await env.scheduler.schedule(reference)
    await env.watch.report(reference.job_id, "succeeded", wait_s=180)
    expected = final_loss(env.watch, reference.job_id)

    job = task_job(env.scheduler, args=["epochs=60"])
    await env.scheduler.schedule(job)
    job_dir = env.checkpoint_dir(job)
    async with asyncio.timeout(120):  # a checkpoint is stored (interval 1 s)
        while not (job_dir / "step").exists():
            await asyncio.sleep(0.05)
    worker = agent._attempts[(job.job_id, 1)].workers[1]
    os.kill(worker.process.pid, signal.SIGKILL)
    restarted = await env.watch.report(job.job_id, "restarted", wait_s=30)
    assert restarted["restarts"] == 1 and restarted["step"] > 0
    await env.watch.report(job.job_id, "succeeded", wait_s=180)
    assert final_loss(env.watch, job.job_id) == pytest.approx(expected, rel=1e-3)
    notes = env.watch.log_lines(job.job_id, "gantry")
    assert any("restarting the workers from the checkpoint of step" in n for n in notes)


async def test_preempted_twice_then_finishes_from_its_checkpoints(
    env: Env, agent: NodeAgent, task_module: Path
) -> None:
    job = task_job(env.scheduler, args=["epochs=60"])
    stopped_at = []
    for attempt in (1, 2):
        current = job.model_copy(update={"attempt": attempt, "resume": attempt > 1})
        await env.scheduler.schedule(current)
        await env.watch.until(
            "gantry.metrics.job.progress", 2, job_id=job.job_id, attempt=attempt, wait_s=60
        )
        await env.scheduler.stop(current, grace_s=30)
        [checkpointed] = await env.watch.until(
            "gantry.job.workers",
            job_id=job.job_id,
            status="checkpointed",
            attempt=attempt,
            wait_s=30,
        )
        stopped_at.append(checkpointed.data["step"])
        await env.watch.until(
            "gantry.job.workers", job_id=job.job_id, status="stopped", attempt=attempt, wait_s=30
        )
    assert 0 < stopped_at[0] < stopped_at[1]
    final = job.model_copy(update={"attempt": 3, "resume": True})
    await env.scheduler.schedule(final)
    first = await env.watch.until(
        "gantry.metrics.job.progress", job_id=job.job_id, attempt=3, wait_s=60
    )
    assert first[0].data["step"] > stopped_at[1]  # resumed, not restarted from 0
    await env.watch.report(job.job_id, "succeeded", wait_s=180)


async def test_an_entry_point_that_does_not_import_fails_fast_with_the_users_error(
    env: Env, agent: NodeAgent, task_module: Path
) -> None:
    (task_module / "broken.py").write_text("import torch\nraise RuntimeError('bad config: lr')\n")
    job = task_job(env.scheduler, workers=1)
    job = job.model_copy(update={"spec": {"entrypoint": {"task": "broken:task"}}})
    started = time.monotonic()
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed", wait_s=60)
    assert time.monotonic() - started < 60
    assert failed["exit_code"] == 1 and "bad config: lr" in failed["message"]
    assert "restarted" not in env.watch.statuses(job.job_id)
    assert any(
        "RuntimeError: bad config: lr" in ln for ln in env.watch.log_lines(job.job_id, "stderr")
    )

    missing = task_job(env.scheduler, workers=1)
    missing = missing.model_copy(update={"spec": {"entrypoint": {"task": "nosuch_module:task"}}})
    await env.scheduler.schedule(missing)
    failed = await env.watch.report(missing.job_id, "failed", wait_s=60)
    assert "No module named 'nosuch_module'" in failed["message"]


# -- data grants: issued for the job, renewed before they expire -----------------------------


@dataclass
class FakeGovernance:
    """Stands in for governance in these unit tests: grants that expire in ``ttl_s``."""

    ttl_s: float = 1.5
    refuse: str = ""
    issued: list[str] = field(default_factory=list)

    async def issue_grant(self, job: JobScheduled) -> Grant:
        if self.refuse:
            raise InvalidInput(self.refuse, hint="ask a data steward for access")
        token = f"grant-{len(self.issued) + 1}"
        self.issued.append(token)
        return Grant(token=token, expires_ms=int((time.time() + self.ttl_s) * 1000))

    def token(self) -> str:
        return "agent-token"

    def address(self) -> str:
        return "governance.invalid:7032"

    def known(self) -> bool:
        return False


#: Reads its grant as the data loader does (the file the agent rewrites) until it changes.
READS_GRANT = textwrap.dedent(
    """
    import os, sys, time
    first = os.environ["GANTRY_DATA_GRANT"]
    path = os.environ["GANTRY_DATA_GRANT_FILE"]
    print("started with", first, "token", os.environ["GANTRY_TOKEN"], flush=True)
    for _ in range(200):
        now = open(path).read().strip()
        if now != first:
            print("renewed to", now, flush=True)
            print("grant file mode", oct(os.stat(path).st_mode & 0o777), flush=True)
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(4)
    """
)


async def test_a_jobs_grant_is_renewed_before_it_expires(env: Env, agent: NodeAgent) -> None:
    fake = FakeGovernance(ttl_s=1.5)
    agent.governance = fake  # type: ignore[assignment]
    job = env.scheduler.job(READS_GRANT).model_copy(
        update={"datasets": [DatasetUse(dataset="churn", version="v1")]}
    )
    await env.scheduler.schedule(job)
    await env.watch.report(job.job_id, "succeeded", wait_s=30)
    lines = env.watch.log_lines(job.job_id)
    assert "started with grant-1 token agent-token" in lines
    assert "renewed to grant-2" in lines
    assert "grant file mode 0o600" in lines  # private while the job runs
    grant_file = env.checkpoint_dir(job) / "grant"
    assert not grant_file.exists()  # and the credential does not outlive the attempt


async def test_a_grant_governance_refuses_fails_the_job_with_its_reason(
    env: Env, agent: NodeAgent
) -> None:
    agent.governance = FakeGovernance(refuse="dev may not read churn")  # type: ignore[assignment]
    job = env.scheduler.job("print(1)").model_copy(
        update={"datasets": [DatasetUse(dataset="churn", version="v1")]}
    )
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed", wait_s=20)
    assert failed["exit_code"] == CANNOT_START
    assert "dev may not read churn" in failed["message"]
    notes = env.watch.log_lines(job.job_id, "gantry")
    assert any("ask a data steward for access" in n for n in notes)


async def test_a_grant_is_asked_again_until_governance_has_seen_the_placement(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gantry.client.errors import RemoteNotFound
    from gantry.protos.v1 import governance_pb2 as gpb
    from gantry.training_agent.governance import GovernanceLink

    calls: list[str] = []

    class Client:
        def _call(self, method: str, request: Any) -> Any:
            calls.append(request.job_id)
            if len(calls) < 3:  # governance has not read gantry.job.scheduled yet
                raise RemoteNotFound(f"scheduled job {request.job_id!r} not found")
            return gpb.Grant(token="grant-x", expires_ms=123)

        def close(self) -> None:
            pass

    link = GovernanceLink(env.settings(), env.keyring)
    monkeypatch.setattr(link, "_client", Client)
    grant = await link.issue_grant(env.scheduler.job("print(1)", job_id="j-late"))
    assert (grant.token, grant.expires_ms) == ("grant-x", 123)
    assert calls == ["j-late"] * 3


def test_agents_sharing_a_job_directory_write_its_spec_without_clashing(tmp_path: Path) -> None:
    """Two local agents of one gang write the same spec.json at once (a shared temporary name
    once let one rename the other's file away, and its workers never started)."""
    import concurrent.futures

    from gantry.training_agent.launch import write_spec

    job = JobScheduled(job_id="j-2", attempt=1, placements=[], spec={"replicas": 2})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        written = list(pool.map(lambda _: write_spec(job, tmp_path), range(200)))
    assert {p.name for p in written} == {"spec.json"}
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]  # no temporary file left
