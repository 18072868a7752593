"""Benchmark: placement decisions per second through the policy engine.

    python bench/sched_throughput.py [--quick] [--traces DIR]

Two clusters: ``openb`` (the Alibaba node list: 1,523 nodes, 6,212 GPUs) and a synthetic
10,000-node cluster with 80,000 GPUs (8 per node, models and CPU/memory drawn from openb's
GPU nodes, seeded). For each, a queue of pending jobs of mixed shapes (sampled from the openb
pod list: CPU-only, GPU shares, one and several whole GPUs, model constraints) is placed one
after another with the production policy (``GantryPolicy``), each placement allocated, until
the queue is empty; once the cluster is full the remaining decisions are "no node fits", which
the scheduler must also take quickly. A decision is one ``choose`` call; every allocation is
part of the loop, as in the live scheduler.

Figures: ``placements_per_s_1k`` (openb), ``placements_per_s_10k`` (10,000 nodes): successful
placements per second (time of the decisions that found a node, allocation included);
``decisions_per_s_*``: all decisions, "no node fits" included (those are cheaper);
``decisions_*`` (how many) and ``placed_*`` (how many found a node); the best-fit baseline on
the same queues beside them (``bestfit_*``). Queue: 50,000 jobs
(``--quick``: 5,000). Anchors: kube-scheduler ~100 pods/s at 5,000 nodes, YuniKorn 204 pods/s at
2,000 nodes, Slurm ~500 jobs/s. Prints one JSON object as its LAST line and writes it to
bench/results/sched_throughput.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gantry.sched import (
    BestFitPolicy,
    Cluster,
    Demand,
    GantryPolicy,
    PlacementPolicy,
    load_nodes_csv,
    load_pods_csv,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "alibaba-gpu-2023"


def synthetic_cluster(openb: Cluster, nodes: int, seed: int = 7) -> Cluster:
    """``nodes`` nodes of 8 GPUs, models and CPU/memory drawn from openb's GPU nodes."""
    rng = np.random.default_rng(seed)
    gpu_nodes = np.flatnonzero(openb.gpu_count > 0)
    picks = rng.choice(gpu_nodes, size=nodes)
    return Cluster(
        [f"syn-{i:05d}" for i in range(nodes)],
        [int(openb.cpu_total[i]) for i in picks],
        [int(openb.mem_total[i]) for i in picks],
        [8] * nodes,
        [openb.model_names[int(openb.model[i])] for i in picks],
    )


def queue(pods: list[Demand], size: int, seed: int = 11) -> list[Demand]:
    """``size`` pending jobs sampled from the pod list (mixed shapes), seeded."""
    rng = np.random.default_rng(seed)
    return [pods[int(i)] for i in rng.integers(len(pods), size=size)]


def rate(cluster: Cluster, jobs: list[Demand], policy: PlacementPolicy) -> tuple[float, float, int]:
    """Placing ``jobs`` in order (allocating each): successful placements per second (time
    spent on decisions that found a node, allocation included), all decisions per second, and
    how many were placed."""
    c = cluster.copy()
    placed = 0
    placing = 0.0
    started = time.perf_counter()
    for demand in jobs:
        t0 = time.perf_counter()
        choice = policy.choose(c, demand)
        if choice is not None:
            c.allocate(choice.node, demand, choice.gpus)
            placed += 1
            placing += time.perf_counter() - t0
    total = time.perf_counter() - started
    return placed / placing if placing else 0.0, len(jobs) / total, placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5,000 jobs; under a minute")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = parser.parse_args(argv)
    pods = load_pods_csv(args.traces / "openb_pod_list_default.csv")
    openb = load_nodes_csv(args.traces / "openb_node_list_all_node.csv")
    big = synthetic_cluster(openb, 10_000)
    size = 5_000 if args.quick else 50_000
    figures: dict[str, Any] = {"benchmark": "sched_throughput", "quick": args.quick}
    for label, cluster in (("1k", openb), ("10k", big)):
        jobs = queue(pods, size)
        for name, policy in (("", GantryPolicy(pods)), ("bestfit_", BestFitPolicy())):
            per_s, decisions_per_s, placed = rate(cluster, jobs, policy)
            figures[f"{name}placements_per_s_{label}"] = round(per_s, 1)
            figures[f"{name}decisions_per_s_{label}"] = round(decisions_per_s, 1)
            figures[f"{name}placed_{label}"] = placed
        figures[f"decisions_{label}"] = len(jobs)
        figures[f"nodes_{label}"] = cluster.num_nodes
        figures[f"gpus_{label}"] = int(cluster.gpu_count.sum())
        print(
            f"{label}: {cluster.num_nodes} nodes, gantry "
            f"{figures[f'placements_per_s_{label}']:.0f}/s, best-fit "
            f"{figures[f'bestfit_placements_per_s_{label}']:.0f}/s",
            flush=True,
        )
    emit_result("sched_throughput", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
