"""What a worker runs, and with which environment.

A job whose ``spec.entrypoint`` names a ``task`` runs ``python -m gantry.training.run TASK
ARGS`` (the training runtime; ``--evaluate`` first for ``mode: evaluate``), a ``transform``
runs ``python -m gantry.training.transform FUNCTION ARGS``; ``module`` and ``command`` entry
points run as they are. Every
worker gets the ``torchrun``-style rendezvous variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and Gantry's own (job, attempt, directories,
resume flag, deep-trace directory, its GPUs and, for a fractional GPU, its memory cap and MPS
compute share).
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import sys
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gantry.core import InvalidInput
from gantry.events.catalog import JobScheduled, WorkerPlacement
from gantry.sched.spec import MILLI

#: The module that runs a training task in a worker.
RUNTIME_MODULE = "gantry.training.run"
#: The module that runs a data job's transform in a worker.
TRANSFORM_MODULE = "gantry.training.transform"
_PR_SET_PDEATHSIG = 1


def worker_command(spec: Mapping[str, Any]) -> list[str]:
    """The argv of a job's workers from its TrainingJob ``spec``."""
    entry = spec.get("entrypoint")
    if not isinstance(entry, Mapping):
        raise InvalidInput(
            "job spec has no entrypoint",
            hint="give spec.entrypoint as {task: my_job:task}, {transform: prep:clean}, "
            "{module: train} or {command: [python, train.py]}",
        )
    args = entry.get("args") or []
    if isinstance(args, str) or not isinstance(args, Sequence):
        raise InvalidInput("spec.entrypoint.args must be a list of strings")
    task, module, command = entry.get("task"), entry.get("module"), entry.get("command")
    transform = entry.get("transform")
    if sum(map(bool, (task, transform, module, command))) != 1:
        raise InvalidInput(
            "spec.entrypoint needs exactly one of task, transform, module or command"
        )
    if task:
        mode = ["--evaluate"] if entry.get("mode") == "evaluate" else []
        head = [sys.executable, "-m", RUNTIME_MODULE, *mode, str(task)]
    elif transform:
        head = [sys.executable, "-m", TRANSFORM_MODULE, str(transform)]
    elif module:
        head = [sys.executable, "-m", str(module)]
    elif isinstance(command, str):
        head = shlex.split(command)
    elif isinstance(command, Sequence):
        head = [str(part) for part in command]
    else:
        raise InvalidInput("spec.entrypoint.command must be a list of strings or a string")
    return [*head, *(str(a) for a in args)]


def input_model(spec: Mapping[str, Any]) -> tuple[str, int] | None:
    """The model version a job's spec names as its input (``spec.model``), if any."""
    model = spec.get("model")
    if not isinstance(model, Mapping):
        return None
    name, version = model.get("name"), model.get("version")
    if not isinstance(name, str) or not name or isinstance(version, bool):
        raise InvalidInput("spec.model needs a name and a version")
    if not isinstance(version, int) or version < 1:
        raise InvalidInput(f"spec.model.version {version!r} is not a version number (1, 2, ...)")
    return name, version


def output_dataset(spec: Mapping[str, Any]) -> tuple[str, str] | None:
    """The dataset a job's spec commits a version of (``spec.output``) and the commit
    message it gives, if any."""
    output = spec.get("output")
    if not isinstance(output, Mapping):
        return None
    dataset = output.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise InvalidInput("spec.output needs a dataset")
    return dataset, str(output.get("message") or "")


def master_port(job: JobScheduled, restarts: int = 0) -> int:
    """The rendezvous port: the scheduler's for the attempt (or one derived from the job id),
    moved on by each restart so a restarted gang never meets the previous one's socket."""
    base = job.master_port or 20000 + zlib.crc32(job.job_id.encode()) % 10000
    return 20000 + (base - 20000 + restarts * 7) % 10000


def worker_environment(
    job: JobScheduled,
    placement: WorkerPlacement,
    *,
    local_rank: int,
    local_world_size: int,
    job_dir: Path,
    output_dir: Path,
    resume: bool,
    restarts: int = 0,
    cuda_mps: bool = False,
    trace_dir: Path | None = None,
    model_dir: Path | None = None,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The environment of one worker: ``base`` plus the rendezvous and Gantry variables
    (``GANTRY_MODEL_DIR`` when the job has an input model, downloaded into ``model_dir``)."""
    env = dict(base)
    gpu_milli = sum(milli for _, milli in placement.gpus)
    env.update(
        GANTRY_JOB_ID=job.job_id,
        GANTRY_JOB_NAME=job.name,
        GANTRY_ATTEMPT=str(job.attempt),
        GANTRY_NODE=placement.node,
        GANTRY_CHECKPOINT_DIR=str(job_dir),
        GANTRY_OUTPUT_DIR=str(output_dir),
        GANTRY_JOB_SPEC=str(job_dir / "spec.json"),
        GANTRY_GPU_MILLI=str(gpu_milli),
        GANTRY_RESTARTS=str(restarts),
        CUDA_VISIBLE_DEVICES=",".join(str(index) for index, _ in placement.gpus),
        RANK=str(placement.worker),
        WORLD_SIZE=str(len(job.placements)),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_world_size),
        MASTER_ADDR=job.master_addr or "127.0.0.1",
        MASTER_PORT=str(master_port(job, restarts)),
        PYTHONUNBUFFERED="1",
    )
    for name in (
        "GANTRY_RESUME",
        "GANTRY_GPU_MEMORY_FRACTION",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "GANTRY_TRACE_DIR",
        "GANTRY_MODEL_DIR",
    ):
        env.pop(name, None)
    if model_dir is not None:
        env["GANTRY_MODEL_DIR"] = str(model_dir)
    if resume:
        env["GANTRY_RESUME"] = "1"
    if trace_dir is not None:  # where deep-trace requests arrive (gantry.training.tracing)
        env["GANTRY_TRACE_DIR"] = str(trace_dir)
    if "OMP_NUM_THREADS" not in base:
        # the worker's CPU share, as torchrun would: several workers must not oversubscribe
        # the node's cores
        env["OMP_NUM_THREADS"] = str(max(1, placement.cpu_milli // MILLI))
    if placement.gpus and 0 < gpu_milli < MILLI * len(placement.gpus):
        # a share of one device: cap its memory (the runtime applies it) and, under MPS,
        # its compute
        fraction = gpu_milli / (MILLI * len(placement.gpus))
        env["GANTRY_GPU_MEMORY_FRACTION"] = f"{fraction:.3f}"
        if cuda_mps:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(100 * fraction)))
    return env


def write_spec(job: JobScheduled, job_dir: Path) -> Path:
    """Write the job's name and spec where the runtime reads them (``spec.json``)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "spec.json"
    # a temporary name of this process's own: agents on one machine may share the directory
    # (a gang spread over two local nodes), and a shared name lets one rename the other's file
    tmp = job_dir / f".spec.json.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps({"name": job.name, "job_id": job.job_id, "spec": job.spec}))
    tmp.replace(path)
    return path


def read_step(job_dir: Path) -> int | None:
    """The step of the last checkpoint the workers stored (``<job_dir>/step``), if any."""
    try:
        step = int((job_dir / "step").read_text().strip())
    except (OSError, ValueError):
        return None
    return step if step >= 0 else None


def die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook making a worker die with the agent (Linux ``PR_SET_PDEATHSIG``): a
    SIGKILLed agent is a lost node, and a lost node's workers are gone too."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the agent died before the hook ran
            os._exit(1)

    return hook


__all__ = [
    "RUNTIME_MODULE",
    "TRANSFORM_MODULE",
    "die_with_parent",
    "input_model",
    "master_port",
    "output_dataset",
    "read_step",
    "worker_command",
    "worker_environment",
    "write_spec",
]
