"""Benchmark: GPU packing on the Alibaba "openb" trace, the FGD paper's inflation protocol.

    python bench/sched_packing.py [--quick] [--traces DIR]

Protocol (shared/traces/README.md): cluster = ``openb_node_list_all_node.csv`` (1,523 nodes,
6,212 GPUs); workload = a pod list sampled with replacement until the requested GPU would
exceed 1.3 x the cluster's milli-GPU, shuffled with seeds 42..51 (``--quick``: 42, 43). Pods
arrive in order and never leave; each is placed or fails. Every policy runs on the same
inflated workloads, from ``gantry.sched`` (the code the scheduler service runs).

Figures (default workload; full mode repeats them for ``gpushare100_``, ``multigpu50_`` and
``gpuspec33_``), means over seeds, gantry unprefixed, baselines prefixed ``bestfit_`` / ``fgd_``:

- ``alloc_pct_at_100``: allocated milli-GPU / total milli-GPU (%) when arrived GPU demand
  passes 100% of capacity.
- ``alloc_pct_at_130``: the same at the end of the workload (arrived demand just under 130%).
- ``unallocated_gpus_at_130``: (1 - ratio at 130%) x total GPUs.
- ``*_per_seed``: the per-seed values of each of the above.
- ``gantry_beats_fgd_every_seed``: gantry allocates more than the same-run FGD at 100% and
  at 130% arrived on every seed (for every workload run).
- ``published_*``: the FGD authors' means of 10 seeds (``fgd_published_results.csv``).
- ``placements_per_s``: gantry policy decisions per second (time inside ``choose`` only),
  averaged over its runs; ``wall_s``: the whole benchmark's wall time.

Prints one JSON object as its LAST line and writes it to bench/results/sched_packing.json.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gantry.sched import (
    BestFitPolicy,
    FgdPolicy,
    GantryPolicy,
    inflate,
    load_nodes_csv,
    load_pods_csv,
    run_arrivals,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"
POLICIES = ("gantry", "bestfit", "fgd")
PUBLISHED_NAMES = {"bestfit": "05-BestFit", "fgd": "06-FGD"}


def _one_run(traces: str, variant: str, seed: int, policy_name: str) -> dict[str, float]:
    """One policy on one inflated workload (a process-pool task)."""
    cluster = load_nodes_csv(Path(traces) / "openb_node_list_all_node.csv")
    pods = load_pods_csv(Path(traces) / f"openb_pod_list_{variant}.csv")
    arrivals = inflate(pods, cluster.total_gpu_milli, 1.3, seed)
    policy = {
        "gantry": lambda: GantryPolicy(pods),
        "bestfit": BestFitPolicy,
        "fgd": lambda: FgdPolicy(pods),
    }[policy_name]()
    gpus = cluster.total_gpu_milli / 1000
    result = run_arrivals(cluster, arrivals, policy)
    return {
        "alloc_pct_at_100": 100 * result.alloc_at(100),
        "alloc_pct_at_130": 100 * result.alloc_at(130),
        "unallocated_gpus_at_130": (1 - result.alloc_at(130)) * gpus,
        "decisions_per_s": result.decisions_per_s,
    }


def _published(traces: Path, variant: str) -> dict[str, float]:
    path = traces / "fgd_published_results.csv"
    out: dict[str, float] = {}
    if not path.exists():
        return out
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] != f"openb_pod_list_{variant}":
                continue
            for short, long in PUBLISHED_NAMES.items():
                if row["policy"] == long:
                    out[f"published_{short}_alloc_pct_at_100"] = float(
                        row["alloc_pct_at_100pct_arrived"]
                    )
                    out[f"published_{short}_alloc_pct_at_130"] = float(
                        row["alloc_pct_at_130pct_arrived"]
                    )
                    out[f"published_{short}_unallocated_gpus_at_130"] = float(
                        row["unallocated_gpus_at_130pct"]
                    )
    return out


def main() -> None:
    """Run the protocol and emit the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seeds 42, 43; default workload")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="trace directory")
    args = parser.parse_args()
    traces: Path = args.traces
    seeds = [42, 43] if args.quick else list(range(42, 52))
    variants = ["default"] if args.quick else ["default", "gpushare100", "multigpu50", "gpuspec33"]
    started = time.perf_counter()
    jobs = [(v, s, p) for v in variants for s in seeds for p in POLICIES]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(_one_run, str(traces), v, s, p) for v, s, p in jobs]
        runs = {job: future.result() for job, future in zip(jobs, futures, strict=True)}

    figures: dict[str, Any] = {"benchmark": "sched_packing", "quick": args.quick, "seeds": seeds}
    beats_everywhere = True
    for variant in variants:
        vp = "" if variant == "default" else f"{variant}_"
        for policy in POLICIES:
            pp = "" if policy == "gantry" else f"{policy}_"
            for metric in ("alloc_pct_at_100", "alloc_pct_at_130", "unallocated_gpus_at_130"):
                values = [runs[(variant, s, policy)][metric] for s in seeds]
                figures[f"{vp}{pp}{metric}"] = round(statistics.fmean(values), 3)
                figures[f"{vp}{pp}{metric}_per_seed"] = [round(v, 3) for v in values]
        beats = all(
            runs[(variant, s, "gantry")][m] > runs[(variant, s, "fgd")][m]
            for s in seeds
            for m in ("alloc_pct_at_100", "alloc_pct_at_130")
        )
        figures[f"{vp}gantry_beats_fgd_every_seed"] = beats
        beats_everywhere &= beats
        for key, value in _published(traces, variant).items():
            figures[f"{vp}{key}"] = value
    figures["gantry_beats_fgd_every_seed_all_workloads"] = beats_everywhere
    speeds = [runs[(v, s, "gantry")]["decisions_per_s"] for v in variants for s in seeds]
    figures["placements_per_s"] = round(statistics.fmean(speeds), 1)
    figures["workers"] = min(len(jobs), os.cpu_count() or 1)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    emit_result("sched_packing", figures)


if __name__ == "__main__":
    main()
