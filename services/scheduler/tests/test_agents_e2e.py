"""The scheduler with real node agent processes (:mod:`gantry.training_agent`): workers are real
subprocesses with RANK/WORLD_SIZE, their output comes back as job logs, and a SIGKILLed agent is
a lost node whose job resumes from its checkpoint on the other node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.testing.agents import spawn_agent
from gantry.testing.trainers import counting_trainer

from .conftest import Running, running, scheduler_settings

NODES = ("node-a", "node-b")

#: Prints its rank and exits 0.
HELLO = "import os; print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\")"

TRAIN = counting_trainer()


def command_job(name: str, script: str, *, replicas: int = 1) -> str:
    """A TrainingJob whose workers run ``script`` with this Python, one per node."""
    argv = json.dumps([sys.executable, "-c", script])  # a JSON list is a YAML flow sequence
    return (
        "apiVersion: gantry/v1\n"
        "kind: TrainingJob\n"
        f"metadata: {{name: {name}, queue: default}}\n"
        "spec:\n"
        f"  replicas: {replicas}\n"
        "  topology: spread\n"
        "  resources: {gpus: 1, cpus: 1, memory: 1Gi}\n"
        f"  entrypoint: {{command: {argv}}}\n"
    )


@contextlib.contextmanager
def agents(nats_url: str, data_dir: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """One agent process per node (2 declared GPUs each); stopped, or killed, afterwards."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in NODES:
            procs[node] = spawn_agent(
                nats_url,
                data_dir,
                node,
                gpus=2,
                heartbeat_s=0.2,
                args=("--cpus", "8", "--memory", "16Gi"),
            )
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def node_states(r: Running) -> dict[str, str]:
    nodes = await r.stub.ListNodes(pb.ListNodesRequest(), metadata=r.md())
    return {n.name: n.state for n in nodes.nodes}


async def wait_nodes(r: Running, expected: dict[str, str], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while await node_states(r) != expected:
            await asyncio.sleep(0.1)


async def log_lines(r: Running, job_id: str) -> list[pb.LogLine]:
    return [line async for line in r.stub.JobLogs(pb.JobLogsRequest(id=job_id), metadata=r.md())]


async def wait_logs(
    r: Running, job_id: str, *texts: str, timeout: float = 10.0
) -> list[pb.LogLine]:
    """The job's log lines once each of ``texts`` is among them (logs travel on their own
    stream, so they may land just after the report that the job ended)."""
    async with asyncio.timeout(timeout):
        while True:
            lines = await log_lines(r, job_id)
            if all(any(t in line.text for line in lines) for t in texts):
                return lines
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_real_agents_run_a_gang_and_resume_a_job_from_a_killed_node(
    tmp_path: Path, nats_url: str
) -> None:
    data_dir = tmp_path / "data"
    settings = scheduler_settings(data_dir, nats_url, heartbeat_timeout_s=1.5)
    async with running(settings) as r:  # creates the keys the agents sign with
        with agents(nats_url, data_dir) as procs:
            await wait_nodes(r, dict.fromkeys(NODES, "ready"))

            gang = await r.submit(command_job("hello", HELLO, replicas=2))
            gang = await r.wait_state(gang.id, "succeeded", timeout=20)
            assert {p.node for p in gang.placements} == set(NODES)
            assert [h.state for h in gang.history] == [
                "pending",
                "scheduled",
                "running",
                "succeeded",
            ]
            lines = await wait_logs(r, gang.id, "rank 0 of 2", "rank 1 of 2")
            by_text = {line.text: line for line in lines}
            assert by_text["rank 0 of 2"].worker == 0 and by_text["rank 1 of 2"].worker == 1
            assert by_text["rank 0 of 2"].node != by_text["rank 1 of 2"].node

            job = await r.submit(command_job("train", TRAIN))
            job = await r.wait_state(job.id, "running", timeout=20)
            (victim,) = [p.node for p in job.placements]
            (other,) = [n for n in NODES if n != victim]
            step_file = data_dir / "checkpoints" / job.id / "step"
            async with asyncio.timeout(10):
                while not step_file.exists() or int(step_file.read_text() or 0) < 2:
                    await asyncio.sleep(0.05)
            procs[victim].kill()  # the node dies, and its worker with it
            procs[victim].wait(timeout=10)

            await wait_nodes(r, {victim: "lost", other: "ready"}, timeout=10)
            job = await r.wait(job.id, lambda j: j.attempt == 2, timeout=10)
            assert [p.node for p in job.placements] == [other]
            job = await r.wait_state(job.id, "succeeded", timeout=20)
            lines = await wait_logs(r, job.id, "resumed from step")
            (resumed,) = [line for line in lines if line.text.startswith("resumed from step")]
            assert resumed.node == other and int(resumed.text.rsplit(" ", 1)[1]) >= 2
            assert [h.state for h in job.history] == [
                "pending", "scheduled", "running", "pending", "scheduled", "running", "succeeded"
            ]  # fmt: skip
            assert f"node {victim} was lost" in job.history[3].reason


#: A real training task for the runtime: a small regression, long enough to be killed midway.
TASK = """
import time
import torch
from gantry.training import Task

class Slow(torch.nn.Module):  # 10 ms a step: the run lasts long enough to be killed midway
    def forward(self, x):
        time.sleep(0.01)
        return x

def model():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), Slow(), torch.nn.Linear(32, 1)
    )

def dataset(ctx):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(512, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))

task = Task(model=model, loss=torch.nn.functional.mse_loss, dataset=dataset,
            options={"micro_batch_size": 16, "lr": 0.01, "epochs": 25})
"""


def task_job(name: str) -> str:
    return (
        "apiVersion: gantry/v1\n"
        "kind: TrainingJob\n"
        f"metadata: {{name: {name}, queue: default}}\n"
        "spec:\n"
        "  resources: {gpus: 1, cpus: 1, memory: 1Gi}\n"
        "  entrypoint: {task: 'e2etask:task'}\n"
        "  training: {checkpointInterval: 1}\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_training_task_resumes_from_its_checkpoint_after_its_agent_is_killed(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "e2etask.py").write_text(TASK)
    monkeypatch.setenv("PYTHONPATH", str(code))  # the agents' workers import the task
    data_dir = tmp_path / "data"
    settings = scheduler_settings(data_dir, nats_url, heartbeat_timeout_s=1.5)
    async with running(settings) as r:
        with agents(nats_url, data_dir) as procs:
            await wait_nodes(r, dict.fromkeys(NODES, "ready"))
            job = await r.submit(task_job("regress"))
            job = await r.wait_state(job.id, "running", timeout=30)
            (victim,) = [p.node for p in job.placements]
            (other,) = [n for n in NODES if n != victim]
            marker = data_dir / "checkpoints" / job.id / "step"
            async with asyncio.timeout(90):  # a checkpoint is stored in the encrypted store
                while not marker.exists() or int(marker.read_text() or 0) < 5:
                    await asyncio.sleep(0.05)
            stored = int(marker.read_text())
            procs[victim].kill()  # the node dies, and its worker with it
            procs[victim].wait(timeout=10)

            job = await r.wait(job.id, lambda j: j.attempt == 2, timeout=20)
            assert [p.node for p in job.placements] == [other]
            job = await r.wait(
                job.id,
                lambda j: j.progress.attempt == 2 and j.progress.step > 0,
                timeout=90,
            )
            assert job.progress.step > stored  # resumed from the checkpoint, not from step 0
            job = await r.wait_state(job.id, "succeeded", timeout=150)
            lines = await wait_logs(r, job.id, "finished after 800 steps")
            restored = re.compile(r'restored"?\s*[=:]\s*[Tt]rue')  # text or JSON log lines
            resumed = [ln for ln in lines if "resume" in ln.text and restored.search(ln.text)]
            assert resumed and all(ln.node == other for ln in resumed)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_training_gang_spread_over_two_agents_rendezvous_and_finishes(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker per node: the agents start them with the scheduler's rendezvous (rank 0's
    node address and the attempt's port), and DDP trains across the two nodes."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "e2etask.py").write_text(TASK.replace('"epochs": 25', '"epochs": 2'))
    monkeypatch.setenv("PYTHONPATH", str(code))
    data_dir = tmp_path / "data"
    settings = scheduler_settings(data_dir, nats_url, heartbeat_timeout_s=3)
    async with running(settings) as r:
        with agents(nats_url, data_dir):
            await wait_nodes(r, dict.fromkeys(NODES, "ready"))
            spec = task_job("gang").replace("spec:\n", "spec:\n  replicas: 2\n  topology: spread\n")
            job = await r.submit(spec)
            job = await r.wait_state(job.id, "succeeded", timeout=180)
            assert {p.node for p in job.placements} == set(NODES)
            lines = await wait_logs(r, job.id, "finished after 32 steps")  # 2 x 512 / (16 x 2)
            finished = [ln for ln in lines if ln.text.startswith("finished after")]
            assert [ln.worker for ln in finished] == [0]  # rank 0 evaluates and exports
