"""Real gloo training runs for tests and benchmarks: the ``sequences`` example, back to back.

:func:`train` starts ``world`` processes (``python -m gantry.testing.gangs``) that join one gloo
group and train the example once per entry of ``runs`` (``{"steps": N, "params": {...},
"profile": true}``: the task's parameters, e.g. a slowed rank, and whether the runtime's step
metrics are on). Each rank's progress reporter writes the step windows it would send the node
agent to ``run<i>.rank<r>.jsonl``; :func:`train` returns them per run and rank, and
:func:`rates` each run's samples per second.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gantry.testing.ranks import run_ranks


def train(
    work_dir: Path, runs: Sequence[Mapping[str, Any]], *, world: int = 2, timeout_s: float = 300
) -> list[list[list[dict[str, Any]]]]:
    """Run ``runs`` in one gloo group; per run, per rank, the step windows as reported."""
    work_dir.mkdir(parents=True, exist_ok=True)
    init = work_dir / "init"
    init.unlink(missing_ok=True)
    plan = json.dumps(list(runs))
    run_ranks(
        lambda rank: [
            sys.executable,
            "-m",
            __name__,
            str(rank),
            str(world),
            str(init),
            str(work_dir),
            plan,
        ],
        work_dir,
        world=world,
        timeout_s=timeout_s,
    )
    out = []
    for index in range(len(runs)):
        per_rank = []
        for rank in range(world):
            path = work_dir / f"run{index}.rank{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            records = [json.loads(line) for line in lines]
            per_rank.append([r for r in records if r.get("kind") == "steps"])
        out.append(per_rank)
    return out


def rates(work_dir: Path) -> list[float]:
    """Samples per second of each run (rank 0's clock)."""
    return [float(x) for x in json.loads((work_dir / "rank0.json").read_text())["samples_per_s"]]


def _worker(argv: Sequence[str]) -> int:
    import torch
    import torch.distributed as dist

    from gantry.training.examples.sequences import task
    from gantry.training.progress import ProgressReporter
    from gantry.training.task import DataContext
    from gantry.training.trainer import Trainer, TrainingOptions, WorkerEnv

    rank, world, init, out = int(argv[0]), int(argv[1]), argv[2], Path(argv[3])
    runs = json.loads(argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    env = WorkerEnv(rank=rank, world_size=world)
    rates = []
    with open(os.devnull, "w") as quiet:
        for index, run in enumerate(runs):
            ctx = DataContext(env, None, index, params={**task.params, **run.get("params", {})})
            profile = bool(run.get("profile", True))
            callbacks = []
            reporter = None
            if profile:
                path = out / f"run{index}.rank{rank}.jsonl"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                reporter = ProgressReporter(fd=fd, out=quiet)
                callbacks.append(reporter)
            options = TrainingOptions(
                epochs=1,
                max_steps=int(run["steps"]),
                micro_batch_size=16,
                lr=1e-3,
                seed=index,
                step_metrics=profile,
            )

            def dataset(ctx: DataContext = ctx) -> Any:
                return task.dataset(ctx)

            trainer = Trainer(
                task.model,
                task.loss,
                dataset,
                options=options,
                env=env,
                callbacks=callbacks,
            )
            dist.barrier()
            started = time.perf_counter()
            trainer.fit()
            elapsed = time.perf_counter() - started
            if reporter is not None:
                reporter.close()
            rates.append(int(run["steps"]) * 16 * world / elapsed)
            # free the DDP wrapper while the group lives: a reducer that outlives the group
            # can deadlock in its destructor (see Trainer._drop_ddp_wrapper)
            del trainer
            gc.collect()
    (out / f"rank{rank}.json").write_text(json.dumps({"samples_per_s": rates}))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads have nothing left to do


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))


__all__ = ["rates", "train"]
