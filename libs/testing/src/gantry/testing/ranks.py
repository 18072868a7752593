"""Run the ranks of a distributed job as separate processes and collect what each wrote.

Each rank runs ``command(rank)`` with its output in ``<work_dir>/rank<N>.log`` and is expected
to write ``<work_dir>/rank<N>.json``; all share one deadline, stragglers are killed, and a rank
that failed raises with the end of its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class RankFailed(RuntimeError):
    """A rank exited non-zero (or was killed at the deadline); the message holds its log tail."""


def run_ranks(
    command: Callable[[int], Sequence[str]],
    work_dir: Path,
    *,
    world: int = 2,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Start ``world`` processes, wait for all, return each rank's JSON result in rank order."""
    work_dir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    logs = [work_dir / f"rank{rank}.log" for rank in range(world)]
    workers = []
    for rank in range(world):
        with logs[rank].open("wb") as log:
            workers.append(
                subprocess.Popen(list(command(rank)), env=child_env, stdout=log, stderr=log)
            )
    deadline = time.monotonic() + timeout_s
    try:
        for worker in workers:
            try:
                worker.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                break
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for rank, worker in enumerate(workers):
        if worker.returncode != 0:
            tail = logs[rank].read_text(errors="replace")[-4000:]
            raise RankFailed(f"rank {rank} exited with {worker.returncode}:\n{tail}")
    return [json.loads((work_dir / f"rank{rank}.json").read_text()) for rank in range(world)]


__all__ = ["RankFailed", "run_ranks"]
