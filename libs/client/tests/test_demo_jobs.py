"""The demo's scheduling story, in parts: its job documents and its worker program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gantry.client.demo_jobs import AGENTS, QUEUE, SCHEDULER_ENV, WORKER, job_yaml
from gantry.sched import parse_job

pytestmark = pytest.mark.timeout(60)


def test_the_jobs_are_valid_training_jobs_in_the_quota_queue() -> None:
    train = parse_job(
        job_yaml("train-churn", replicas=2, gpus=1, steps=6, data=("customers", "ab" * 32))
    )
    assert train.metadata.queue == QUEUE and train.spec.replicas == 2
    assert [(d.dataset, d.view) for d in train.spec.data] == [("customers", "deidentified")]
    assert train.spec.entrypoint.command[:2] == (sys.executable, "-c")
    low = parse_job(job_yaml("sweep-low", replicas=1, gpus=4, steps=20, priority="low"))
    high = parse_job(job_yaml("eval-high", replicas=1, gpus=4, steps=6, priority="high"))
    assert low.metadata.priority_value < high.metadata.priority_value
    assert low.spec.data == ()


def test_the_agents_pools_are_the_ones_the_scheduler_is_told_about() -> None:
    pools = json.loads(SCHEDULER_ENV["GANTRY_SCHEDULER__POOLS"])
    assert {a.pool for a in AGENTS} == set(pools)
    assert sorted(pools.values()) == [False, True]  # one trusted pool, one not
    assert all(a.gpus == 4 and a.gpu_model == "A100" for a in AGENTS)


def worker(tmp_path: Path, *args: str, resume: bool = False) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "GANTRY_NODE": "n1",
        "CUDA_VISIBLE_DEVICES": "0",
        "GANTRY_CHECKPOINT_DIR": str(tmp_path),
    }
    if resume:
        env["GANTRY_RESUME"] = "1"
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_worker_trains_checkpoints_on_sigterm_and_resumes(tmp_path: Path) -> None:
    done = worker(tmp_path, "3", "0.01", "customers@abc")
    out, _ = done.communicate(timeout=20)
    assert done.returncode == 0, out
    assert "rank 0 of 2 on n1, GPUs 0, data customers@abc" in out
    assert "step 3/3 loss" in out and "rank 0 done" in out

    running = worker(tmp_path, "1000", "0.02", "none")
    assert running.stdout is not None
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        seen.append(running.stdout.readline())
        if "step 3/1000" in seen[-1]:
            break
    running.send_signal(signal.SIGTERM)
    rest, _ = running.communicate(timeout=20)
    assert running.returncode == 0, "".join(seen) + rest
    step = int((tmp_path / "step").read_text())
    assert step >= 3 and f"checkpointed at step {step}" in rest

    resumed = worker(tmp_path, str(step + 2), "0.01", "none", resume=True)
    out, _ = resumed.communicate(timeout=20)
    assert f"resuming from checkpoint at step {step}" in out
    assert f"step {step + 1}/" in out and "step 1/" not in out
