"""Real gloo training runs (see :mod:`gantry.testing.gangs`) as profiler windows, analysed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gantry.profiler.stragglers import Change, DetectionConfig, GangAnalyzer
from gantry.profiler.windows import Window
from gantry.testing import gangs


def as_windows(job: str, rank: int, records: Sequence[Mapping[str, Any]]) -> list[Window]:
    """The runtime's step records as the profiler's windows (what the agent would send)."""
    out = []
    for record in records:
        fields = {k: v for k, v in record.items() if k not in ("kind", "compute_ms")}
        out.append(Window(job_id=job, attempt=1, rank=rank, node=f"node-{rank}", at_ms=0, **fields))
    return out


def train(
    work_dir: Path, runs: Sequence[Mapping[str, Any]], *, world: int = 2
) -> list[list[list[Window]]]:
    """Per run, per rank, the windows of real training runs."""
    results = gangs.train(work_dir, runs, world=world)
    return [
        [as_windows(f"run{i}", rank, records) for rank, records in enumerate(per_rank)]
        for i, per_rank in enumerate(results)
    ]


def analyse(
    per_rank: Sequence[Sequence[Window]], config: DetectionConfig | None = None
) -> tuple[GangAnalyzer, list[Change]]:
    """Feed one run's windows to an analyzer in the order they would arrive."""
    gang = GangAnalyzer(
        per_rank[0][0].job_id, 1, {r: f"node-{r}" for r in range(len(per_rank))}, config
    )
    arrivals = sorted(
        (w for windows in per_rank for w in windows), key=lambda w: (w.last_step, w.rank)
    )
    changes = []
    for w in arrivals:
        changes += gang.add(w)
    return gang, changes
