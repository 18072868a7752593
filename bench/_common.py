"""Shared plumbing of the benchmarks: percentiles, the JSON result line and file."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values`` (nearest-rank on sorted values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: list[float]) -> float:
    """The median."""
    return statistics.median(values)


def emit_result(name: str, figures: dict[str, Any]) -> None:
    """Write ``bench/results/<name>.json`` and print the same object as the LAST line."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(figures, sort_keys=True)
    (RESULTS / f"{name}.json").write_text(text + "\n")
    sys.stdout.flush()
    print(text, flush=True)
