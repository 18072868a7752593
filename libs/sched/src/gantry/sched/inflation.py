"""The FGD paper's "workload inflation" experiment: arrive, place or fail, never leave.

The workload is a pod list sampled uniformly with replacement until the requested GPU would
exceed ``factor`` x the cluster's capacity, then shuffled with a seed. Pods arrive in order;
each is placed by the policy or counted as failed. The allocation ratio is recorded as the
arrived GPU demand passes each whole percent of capacity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.placement import PlacementPolicy


def inflate(pods: list[Demand], capacity_milli: int, factor: float, seed: int) -> list[Demand]:
    """``pods`` sampled with replacement up to ``factor`` x capacity, in a seeded order.

    Sampling stops at the first pod that would take the requested milli-GPU past
    ``factor * capacity_milli``. The same arguments always give the same list.
    """
    rng = np.random.default_rng(seed)
    limit = factor * capacity_milli
    picked: list[Demand] = []
    total = 0
    while True:
        for i in rng.integers(len(pods), size=4096):
            pod = pods[int(i)]
            if total + pod.total_gpu_milli > limit:
                order = rng.permutation(len(picked))
                return [picked[int(j)] for j in order]
            total += pod.total_gpu_milli
            picked.append(pod)


@dataclass
class InflationResult:
    """One run: allocation ratio (0..1) by arrived percent of capacity, failures, speed."""

    alloc_by_arrived_pct: dict[int, float] = field(default_factory=dict)
    final_alloc: float = 0.0
    placed: int = 0
    failed: int = 0
    decisions_per_s: float = 0.0

    def alloc_at(self, pct: int) -> float:
        """The ratio when arrived demand passed ``pct``% (the final ratio if it never did)."""
        return self.alloc_by_arrived_pct.get(pct, self.final_alloc)


def run_arrivals(
    cluster: Cluster, arrivals: list[Demand], policy: PlacementPolicy
) -> InflationResult:
    """Place ``arrivals`` in order on ``cluster`` (which is mutated) with ``policy``."""
    if not arrivals:
        raise ValueError("no arrivals to place")
    result = InflationResult()
    capacity = max(cluster.total_gpu_milli, 1)
    allocated = cluster.allocated_gpu_milli
    arrived = 0
    next_pct = 1
    spent = 0.0
    for demand in arrivals:
        started = time.perf_counter()
        placement = policy.choose(cluster, demand)
        spent += time.perf_counter() - started
        if placement is None:
            result.failed += 1
        else:
            cluster.allocate(placement.node, demand, placement.gpus)
            allocated += demand.total_gpu_milli
            result.placed += 1
        arrived += demand.total_gpu_milli
        while 100 * arrived >= next_pct * capacity:
            result.alloc_by_arrived_pct[next_pct] = allocated / capacity
            next_pct += 1
    result.final_alloc = allocated / capacity
    result.decisions_per_s = len(arrivals) / spent if spent > 0 else float("inf")
    return result
