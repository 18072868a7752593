"""Benchmark: the training runtime — overhead, DDP scaling, gradient compression, checkpoints,
resume after a kill, DP-SGD.

    python bench/training.py [--quick]

Everything runs on the CPU and every speed is set against a baseline from the same run (the
machines are noisy). The reference task is ``bench/_training_task.py``: an MLP of 330 k
parameters learning a teacher's labels, batch 64 per worker, AdamW. Every worker computes on
one thread (``--threads``), so two workers fill a 2-core machine and no figure hinges on how
the OS schedules a thread pool on cores shared with other processes: torch's pool waits at a
barrier after every operation, and one descheduled thread stalls it (on a loaded 2-core
machine two threads trained 30x slower than one).

- ``runtime_overhead_ratio``: steady-state samples/s of the Gantry ``Trainer`` (one worker, no
  hooks) over a plain hand-written PyTorch loop (same model, data, batch size, AdamW and steps);
  both warmed up, runs alternated, median of each. Target >= 0.95. ``_cpu`` is the same ratio
  of samples per second of the process's CPU time: a single-threaded worker's speed on a core
  of its own, which does not swing with the other processes on the machine as wall time does.
- ``ddp2_scaling_efficiency``: samples/s of two gloo workers (``samples_per_s_2workers``) over
  twice that of one worker (``samples_per_s_1worker``, run before and after them), one core
  each. Its ceiling on this machine at this moment is ``parallel_efficiency_2independent``: the
  same for two single workers training at the same time without talking to each other (below
  1 when other processes hold a core).
- ``bytes_per_step_<mode>`` and ``compression_ratio_<mode>`` (fp32 bytes / mode bytes) from rank
  0's ``CompressionStats`` with two gloo workers, for fp32 (DDP's all-reduce, counted), int8,
  int4 and powersgd (rank 1, uncompressed for the first tenth of the steps); ``final_loss_<mode>``
  is the loss over the whole data set after the same steps from the same seed and
  ``final_loss_rel_diff_<mode>`` its relative difference to fp32. Targets: ratio int8 >= 3.9 and
  int4 >= 7.5, loss within 2 %.
- ``checkpoint_blocking_ms_async`` / ``_sync``: how long capturing the state and
  ``CheckpointManager.save()`` hold the training loop for a ~100 MB state (an MLP of 8.4 M
  parameters plus AdamW's two moments), asynchronous vs ``blocking=True``, into the encrypted
  object store in a local directory; medians of alternated saves between training steps, each
  async save made once the previous write is done (a real interval is minutes).
  ``checkpoint_async_blocking_ratio`` = async / sync, target <= 0.10.
  ``checkpoint_blocking_ms_first`` is the first save, which allocates the snapshot buffers;
  ``train_step_ms_during_write`` vs ``train_step_ms`` shows what the background write costs.
- ``resume_s``: a real worker (``python -m gantry.training.run _training_task:task`` with the
  environment a node agent gives) is SIGKILLed once its first checkpoint is stored, and started
  again with ``GANTRY_RESUME=1``: seconds from the kill to its first training step, read from its
  progress pipe. ``cold_start_s`` is the same for the first start (nothing to load);
  ``resumed_from_step`` is the step it continued from, ``checkpoint_step`` the one stored.
- ``dp_overhead_ratio``: DP-SGD samples/s over plain samples/s on the same model and batch size
  in one process, alternated (counting the samples each Poisson batch really holds; ``_cpu`` as
  above; ``dp_slowdown_x`` is the inverse, as ``gantry.training.privacy.dp_overhead_ratio``
  reports it), and ``dp_epsilon`` spent at delta 1e-5 by the run (budget ``dp_epsilon_budget``).

Sizes (``--quick`` in brackets): overhead 9 (4) alternated runs of 300 (120) steps; 400 (80)
steps per two-worker run; 7 (3) checkpoint rounds; 3 (2) DP runs of 150 (30) steps; a checkpoint
interval of 10 s (2 s, or the spec's minimum if higher) for the resume. The first 20 steps of a
run (5 with DP) are warm-up and not timed.

Prints one JSON object as its LAST line and writes it to bench/results/training.json.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from annotated_types import Ge
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import emit_result, median
from _training_task import BATCH, LR, build_model, full_loss, loss_fn, reference_data

from gantry.core import configure_logging
from gantry.sched.spec import Privacy, Training
from gantry.storage import KeyManager, LocalBackend, LocalKeyFile, ObjectStore
from gantry.testing.ranks import run_ranks
from gantry.training.checkpoint import CheckpointManager, capture
from gantry.training.compression import CompressionHook
from gantry.training.hooks import hooks_for
from gantry.training.privacy import dp_overhead_ratio
from gantry.training.trainer import Hooks, StepMetrics, Trainer, TrainingOptions, WorkerEnv

WORLD = 2
WORKER_TIMEOUT_S = 300
COMPRESSION_RUNS = ("fp32", "int8", "int4", "powersgd")
DP_EPSILON = 3.0
DP_DELTA = 1e-5
CHECKPOINT_WIDTH = 1448  # 4 layers of 1448 x 1448: 8.4 M parameters, ~100 MB with AdamW's state


class _Marks:
    """A trainer callback keeping when each step ended (wall and CPU time) and its samples."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.samples: list[int] = []

    def __call__(self, metrics: StepMetrics) -> None:
        self.step(metrics.samples)

    def step(self, samples: int) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.samples.append(samples)

    def rate(self, warmup: int, *, cpu: bool = False) -> float:
        """Samples per second (of CPU time with ``cpu``) from the end of step ``warmup`` to the
        end of the last step."""
        marks = self.cpu if cpu else self.wall
        if len(marks) <= warmup:
            raise RuntimeError(f"only {len(marks)} steps ran; need more than {warmup}")
        return sum(self.samples[warmup:]) / (marks[-1] - marks[warmup - 1])


def _options(steps: int, **extra: Any) -> TrainingOptions:
    return TrainingOptions(
        micro_batch_size=BATCH, epochs=10_000, max_steps=steps, lr=LR, device="cpu", **extra
    )


# -- runtime overhead --------------------------------------------------------------------------


def trainer_rate(data: TensorDataset, steps: int, warmup: int) -> _Marks:
    """The steps of one Trainer worker without hooks."""
    marks = _Marks()
    Trainer(
        build_model,
        loss_fn,
        lambda: data,
        options=_options(steps),
        env=WorkerEnv(),
        callbacks=[marks],
    ).fit()
    return marks


def plain_rate(data: TensorDataset, steps: int, warmup: int) -> _Marks:
    """The steps of the loop a user would write by hand for the same training."""
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(
        data,
        batch_size=BATCH,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )
    marks = _Marks()
    while len(marks.wall) < steps:
        for inputs, labels in loader:
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            marks.step(len(labels))
            if len(marks.wall) == steps:
                break
    return marks


def bench_overhead(data: TensorDataset, rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    plain_rate(data, warmup + 10, warmup)  # warm-up: allocator, kernels, imports
    trainer_rate(data, warmup + 10, warmup)
    plain, gantry = [], []
    for _ in range(rounds):
        plain.append(plain_rate(data, steps, warmup))
        gantry.append(trainer_rate(data, steps, warmup))
    wall = [median([m.rate(warmup) for m in runs]) for runs in (plain, gantry)]
    cpu = [median([m.rate(warmup, cpu=True) for m in runs]) for runs in (plain, gantry)]
    return {
        "plain_samples_per_s": round(wall[0], 1),
        "trainer_samples_per_s": round(wall[1], 1),
        "runtime_overhead_ratio": round(wall[1] / wall[0], 3),
        "runtime_overhead_ratio_cpu": round(cpu[1] / cpu[0], 3),
        "runtime_overhead_runs": rounds,
    }


# -- two gloo workers: scaling and compression --------------------------------------------------


def _ddp_run(run: str, rank: int, data: TensorDataset, steps: int, warmup: int) -> dict[str, Any]:
    """One Trainer run of ``run``: independent (each rank alone, at the same time as the other),
    scaling (DDP, no hook), or a counting compression hook's mode."""
    dist.barrier()  # start together
    if run == "independent":
        return {"samples_per_s": trainer_rate(data, steps, warmup).rate(warmup)}
    mode = "none" if run in ("scaling", "fp32") else run
    hook = None
    if run != "scaling":  # PowerSGD compresses after a tenth of the steps (the runtime: 1000)
        hook = CompressionHook(mode, powersgd_start_iter=max(2, steps // 10))
    marks = _Marks()
    trainer = Trainer(
        build_model,
        loss_fn,
        lambda: data,
        options=_options(steps, compression=mode),
        env=WorkerEnv(rank=rank, world_size=WORLD),
        hooks=Hooks(comm=hook),
        callbacks=[marks],
    )
    trainer.fit()
    module = trainer.state.module
    params = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    out: dict[str, Any] = {
        "samples_per_s": marks.rate(warmup) * WORLD,  # every rank runs the same steps
        "final_loss": full_loss(module, data),
        "digest": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    }
    if hook is not None and hook.stats is not None:
        out["bytes_per_step"] = hook.stats.bytes_per_step
        out["fp32_bytes_per_step"] = hook.stats.fp32_bytes_per_step
        out["compression_ratio"] = hook.stats.compression_ratio
    # free the DDP wrapper while the process group lives: torch aborts or hangs when a gloo
    # group is torn down under a live DDP reducer
    del trainer, module
    gc.collect()
    return out


def worker_main(rank: int, tmp: Path) -> None:
    """One rank of the two-worker runs; results to ``tmp/rank{rank}.json``."""
    config = json.loads((tmp / "config.json").read_text())
    configure_logging("bench-training", level="WARNING")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp / 'rendezvous'}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=WORKER_TIMEOUT_S),  # a lost peer ends the run, not a hang
    )
    data = reference_data()
    try:
        results = {
            run: _ddp_run(run, rank, data, config["steps"], config["warmup"])
            for run in config["runs"]
        }
    finally:
        gc.collect()
        dist.destroy_process_group()
    (tmp / f"rank{rank}.json").write_text(json.dumps(results))


def run_workers(tmp: Path, steps: int, warmup: int) -> list[dict[str, Any]]:
    """Both ranks' results of the scaling and compression runs (two processes, one core each)."""
    runs = ["independent", "scaling", *COMPRESSION_RUNS]
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps({"steps": steps, "warmup": warmup, "runs": runs}))
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return run_ranks(
        lambda rank: [sys.executable, __file__, "--worker", str(rank), str(tmp)],
        tmp,
        world=WORLD,
        timeout_s=WORKER_TIMEOUT_S,
        env=env,
    )


def bench_ddp(data: TensorDataset, tmp: Path, steps: int, warmup: int) -> dict[str, Any]:
    before = trainer_rate(data, steps, warmup).rate(warmup)
    ranks = run_workers(tmp, steps, warmup)
    after = trainer_rate(data, steps, warmup).rate(warmup)
    one = (before + after) / 2
    two = ranks[0]["scaling"]["samples_per_s"]
    apart = sum(rank["independent"]["samples_per_s"] for rank in ranks)
    figures: dict[str, Any] = {
        "samples_per_s_1worker": round(one, 1),
        "samples_per_s_2workers": round(two, 1),
        "ddp2_scaling_efficiency": round(two / (2 * one), 3),
        "samples_per_s_2independent": round(apart, 1),
        "parallel_efficiency_2independent": round(apart / (2 * one), 3),
        "ddp_steps": steps,
        "ddp_ranks_in_sync": all(
            ranks[0][run]["digest"] == ranks[1][run]["digest"]
            for run in ranks[0]
            if "digest" in ranks[0][run]
        ),
    }
    results = ranks[0]
    fp32 = results["fp32"]
    figures["final_loss_fp32"] = round(fp32["final_loss"], 5)
    figures["bytes_per_step_fp32"] = fp32["bytes_per_step"]
    for mode in COMPRESSION_RUNS[1:]:
        run = results[mode]
        figures[f"bytes_per_step_{mode}"] = run["bytes_per_step"]
        figures[f"compression_ratio_{mode}"] = round(
            fp32["bytes_per_step"] / run["bytes_per_step"], 3
        )
        figures[f"final_loss_{mode}"] = round(run["final_loss"], 5)
        figures[f"final_loss_rel_diff_{mode}"] = round(
            abs(run["final_loss"] - fp32["final_loss"]) / fp32["final_loss"], 4
        )
    return figures


# -- checkpoints --------------------------------------------------------------------------------


def bench_checkpoint(tmp: Path, rounds: int) -> dict[str, Any]:
    torch.manual_seed(0)
    width = CHECKPOINT_WIDTH
    net = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    inputs, targets = torch.randn(32, width), torch.randn(32, width)

    def train_step() -> float:
        start = time.perf_counter()
        loss = nn.functional.mse_loss(net(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    train_step()  # AdamW's moments exist from here on
    state_bytes = sum(v.numel() * v.element_size() for v in net.state_dict().values()) + sum(
        v.numel() * v.element_size()
        for slot in optimizer.state.values()
        for v in slot.values()
        if isinstance(v, torch.Tensor)
    )
    sync, asynchronous, snapshot, waited, write, plain_steps, write_steps = ([] for _ in range(7))
    tmp.mkdir(parents=True, exist_ok=True)
    with KeyManager(LocalKeyFile(tmp / "keys" / "ring.json")) as keys:
        store = ObjectStore(LocalBackend(tmp / "objects"), keys)
        with CheckpointManager(store, "bench-checkpoint", keep=2) as manager:
            step = 0

            def save(blocking: bool) -> tuple[float, Any]:
                nonlocal step
                step += 1
                start = time.perf_counter()
                handle = manager.save(capture(net, optimizer, step=step), blocking=blocking)
                return time.perf_counter() - start, handle

            first, handle = save(False)
            handle.result()
            for _ in range(rounds):
                plain_steps.extend(train_step() for _ in range(2))
                took, _ = save(True)
                sync.append(took)
                plain_steps.extend(train_step() for _ in range(2))
                took, handle = save(False)
                asynchronous.append(took)
                snapshot.append(handle.snapshot_s)
                waited.append(handle.waited_s)
                while not handle.done():  # training goes on while the write runs
                    write_steps.append(train_step())
                handle.result()
                write.append(handle.write_s)
    ms = 1000.0
    return {
        "checkpoint_state_mb": round(state_bytes / 1e6, 1),
        "checkpoint_blocking_ms_sync": round(median(sync) * ms, 1),
        "checkpoint_blocking_ms_async": round(median(asynchronous) * ms, 1),
        "checkpoint_async_blocking_ratio": round(median(asynchronous) / median(sync), 3),
        "checkpoint_blocking_ms_first": round(first * ms, 1),
        "checkpoint_snapshot_ms": round(median(snapshot) * ms, 1),
        "checkpoint_waited_ms": round(median(waited) * ms, 2),
        "checkpoint_write_s": round(median(write), 3),
        "checkpoint_rounds": rounds,
        "train_step_ms": round(median(plain_steps) * ms, 1),
        "train_step_ms_during_write": round(median(write_steps) * ms, 1) if write_steps else None,
    }


# -- resume after SIGKILL -----------------------------------------------------------------------


class _Worker:
    """A ``python -m gantry.training.run`` process and the progress records of its pipe."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        read_fd, write_fd = os.pipe()
        self.records: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.started = time.perf_counter()
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gantry.training.run", "_training_task:task"],
                env={**env, "GANTRY_PROGRESS_FD": str(write_fd)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        os.close(write_fd)
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as pipe:
            for line in pipe:
                self.records.put((time.perf_counter(), json.loads(line)))

    def first_step(self, timeout: float) -> tuple[float, dict[str, Any]]:
        """When the first progress record (the first step) arrived, and the record."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None and self.records.empty():
                raise RuntimeError(f"the worker exited with {self.process.returncode}")
            try:
                at, record = self.records.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError("no training step from the worker") from None
                continue
            if record.get("kind") == "progress":
                return at, record

    def kill(self) -> float:
        """SIGKILL the worker; when the signal was sent."""
        sent = time.perf_counter()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=5)
        return sent


def checkpoint_interval_s(wanted: int) -> int:
    """``wanted``, or the spec's minimum checkpoint interval if that is larger."""
    field = Training.model_fields["checkpoint_interval_s"]
    floor = max((m.ge for m in field.metadata if isinstance(m, Ge)), default=1)
    return max(wanted, int(floor))  # type: ignore[call-overload]


def bench_resume(tmp: Path, interval_s: int) -> dict[str, Any]:
    spec = {
        "name": "bench-resume",
        "spec": {
            "entrypoint": {"task": "_training_task:task"},
            "training": {"checkpointInterval": interval_s},
        },
    }
    job_dir = tmp / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GANTRY_")
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        GANTRY_JOB_ID="bench-resume",
        GANTRY_DATA_DIR=str(tmp / "data"),
        GANTRY_CHECKPOINT_DIR=str(job_dir),
        GANTRY_JOB_SPEC=str(job_dir / "spec.json"),
        GANTRY_LOG_LEVEL="WARNING",
        OMP_NUM_THREADS=str(torch.get_num_threads()),
        PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    log = tmp / "worker.log"
    marker = job_dir / "step"
    first = _Worker(env, log)
    try:
        at, _ = first.first_step(timeout=120)
        cold_start = at - first.started
        deadline = time.monotonic() + interval_s + 120
        while not marker.exists():  # the runtime writes it once a checkpoint is stored
            if first.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint was stored; see {log.read_text()[-4000:]}")
            time.sleep(0.02)
        stored = int(marker.read_text())
    finally:
        killed = first.kill()
    second = _Worker({**env, "GANTRY_RESUME": "1"}, log)
    try:
        at, record = second.first_step(timeout=120)
    finally:
        second.kill()
    return {
        "resume_s": round(at - killed, 2),
        "cold_start_s": round(cold_start, 2),
        "resumed_from_step": int(record["step"]) - 1,
        "checkpoint_step": stored,
        "checkpoint_interval_s": interval_s,
    }


# -- DP-SGD -------------------------------------------------------------------------------------


def dp_run(data: TensorDataset, steps: int, private: bool) -> tuple[_Marks, float]:
    """The steps of one run, with DP-SGD or without, and the epsilon it spent."""
    privacy = Privacy(epsilon=DP_EPSILON, delta=DP_DELTA, max_grad_norm=1.0) if private else None
    options = _options(steps, privacy=privacy)
    env = WorkerEnv()
    hooks, _, privacy_hook = hooks_for(options, env)
    marks = _Marks()
    Trainer(
        build_model, loss_fn, lambda: data, options=options, env=env, hooks=hooks, callbacks=[marks]
    ).fit()
    return marks, privacy_hook.epsilon() if privacy_hook is not None else 0.0


def bench_dp(data: TensorDataset, rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    plain, private, epsilons = [], [], []
    for _ in range(rounds):
        plain.append(dp_run(data, steps, private=False)[0])
        marks, epsilon = dp_run(data, steps, private=True)
        private.append(marks)
        epsilons.append(epsilon)
    wall = [median([m.rate(warmup) for m in runs]) for runs in (plain, private)]
    cpu = [median([m.rate(warmup, cpu=True) for m in runs]) for runs in (plain, private)]
    return {
        "dp_samples_per_s": round(wall[1], 1),
        "nondp_samples_per_s": round(wall[0], 1),
        "dp_overhead_ratio": round(wall[1] / wall[0], 3),
        "dp_overhead_ratio_cpu": round(cpu[1] / cpu[0], 3),
        "dp_slowdown_x": round(dp_overhead_ratio(wall[0], wall[1]), 2),
        "dp_epsilon": round(epsilons[-1], 3),
        "dp_epsilon_budget": DP_EPSILON,
        "dp_delta": DP_DELTA,
        "dp_steps": steps,
    }


# -- main ---------------------------------------------------------------------------------------


def _timed(label: str, fn: Callable[[], dict[str, Any]], figures: dict[str, Any]) -> None:
    start = time.perf_counter()
    print(f"{label} ...", flush=True)
    figures.update(fn())
    print(f"{label}: {time.perf_counter() - start:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (< 1 min)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per worker (default 1)"
    )
    parser.add_argument("--worker", nargs=2, metavar=("RANK", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            worker_main(int(args.worker[0]), Path(args.worker[1]))
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        # skip interpreter teardown: gloo's threads may still be winding down, and C++ static
        # destructors racing them abort the process
        os._exit(code)

    configure_logging("bench-training", level="WARNING")
    logging.disable(logging.WARNING)  # Opacus: "Ignoring drop_last" for its Poisson sampling
    # torch, for Opacus's hooks on the first layer (harmless: they read output gradients only)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    torch.set_num_threads(args.threads)
    quick = args.quick
    data = reference_data()
    warmup = 20
    figures: dict[str, Any] = {
        "benchmark": "training",
        "quick": quick,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": args.threads,
    }
    with tempfile.TemporaryDirectory(prefix="gantry-bench-training-") as name:
        tmp = Path(name)
        _timed(
            "overhead",
            lambda: bench_overhead(data, 4 if quick else 9, 120 if quick else 300, warmup),
            figures,
        )
        _timed("ddp", lambda: bench_ddp(data, tmp / "ddp", 80 if quick else 400, warmup), figures)
        _timed("checkpoint", lambda: bench_checkpoint(tmp / "ckpt", 3 if quick else 7), figures)
        _timed("dp", lambda: bench_dp(data, 2 if quick else 3, 30 if quick else 150, 5), figures)
        _timed(
            "resume",
            lambda: bench_resume(tmp / "resume", checkpoint_interval_s(2 if quick else 10)),
            figures,
        )
    figures["targets"] = {
        "runtime_overhead_ratio": ">= 0.95",
        "compression_ratio_int8": ">= 3.9",
        "compression_ratio_int4": ">= 7.5",
        "final_loss_rel_diff": "<= 0.02",
        "checkpoint_async_blocking_ratio": "<= 0.10",
    }
    emit_result("training", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
