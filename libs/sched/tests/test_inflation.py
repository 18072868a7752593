"""The workload-inflation protocol at small scale: determinism, and Gantry against baselines."""

from __future__ import annotations

import numpy as np

from gantry.sched import (
    BestFitPolicy,
    Cluster,
    Demand,
    FgdPolicy,
    GantryPolicy,
    RandomPolicy,
    inflate,
    run_arrivals,
)


def _cluster() -> Cluster:
    """50 nodes shaped like the openb trace: CPU-only, 8-GPU, CPU-rich 2-GPU, CPU-poor 2-GPU."""
    kinds = [(32_000, 0, "")] * 10 + [(96_000, 8, "G2")] * 20
    kinds += [(104_000, 2, "T4")] * 12 + [(16_000, 2, "P100")] * 8
    return Cluster(
        [f"n{i}" for i in range(len(kinds))],
        [k[0] for k in kinds],
        [262_144] * len(kinds),
        [k[1] for k in kinds],
        [k[2] for k in kinds],
    )


def _pods(seed: int = 5) -> list[Demand]:
    """A pod list with the openb mix: whole GPUs, GPU shares, CPU-only, multi-GPU, a spec."""
    rng = np.random.default_rng(seed)
    pods: list[Demand] = []
    for _ in range(400):
        u = rng.random()
        cpu = int(rng.choice([3000, 8000, 12_000, 16_000]))
        if u < 0.45:
            pods.append(Demand(cpu, 16_384, 1, 1000))
        elif u < 0.80:
            milli = int(rng.choice([810, 470, 320, 650, 230, 160]))
            pods.append(Demand(cpu // 2, 8192, 1, milli))
        elif u < 0.93:
            pods.append(Demand(int(rng.choice([8000, 12_500, 32_000])), 16_384))
        elif u < 0.97:
            pods.append(Demand(64_000, 65_536, 8, 1000))
        else:
            pods.append(Demand(cpu, 16_384, 1, 1000, frozenset({"T4"})))
    return pods


def test_inflation_is_seeded_and_stops_below_the_factor() -> None:
    pods = _pods()
    capacity = _cluster().total_gpu_milli
    first = inflate(pods, capacity, 1.3, 42)
    assert first == inflate(pods, capacity, 1.3, 42)
    assert first != inflate(pods, capacity, 1.3, 43)
    assert sum(p.total_gpu_milli for p in first) <= 1.3 * capacity


def test_runs_are_deterministic() -> None:
    pods = _pods()
    arrivals = inflate(pods, _cluster().total_gpu_milli, 1.3, 42)
    for make in (lambda: RandomPolicy(3), lambda: GantryPolicy(pods), lambda: FgdPolicy(pods)):
        one, two = _cluster(), _cluster()
        a, b = run_arrivals(one, arrivals, make()), run_arrivals(two, arrivals, make())
        assert a.alloc_by_arrived_pct == b.alloc_by_arrived_pct
        assert np.array_equal(one.gpu_free, two.gpu_free)


def test_gantry_allocates_at_least_as_much_as_bestfit_and_fgd() -> None:
    pods = _pods()
    capacity = _cluster().total_gpu_milli
    for seed in (42, 43):
        arrivals = inflate(pods, capacity, 1.3, seed)
        ratios = {}
        for policy in (BestFitPolicy(), FgdPolicy(pods), GantryPolicy(pods), RandomPolicy(seed)):
            cluster = _cluster()
            result = run_arrivals(cluster, arrivals, policy)
            assert result.placed + result.failed == len(arrivals)
            assert result.final_alloc == cluster.allocated_gpu_milli / capacity
            ratios[policy.name] = (result.alloc_at(100), result.alloc_at(130))
        assert ratios["gantry"][0] >= ratios["bestfit"][0]
        assert ratios["gantry"][1] >= ratios["bestfit"][1]
        assert ratios["gantry"][1] >= ratios["fgd"][1]
        assert ratios["bestfit"][1] >= ratios["random"][1]
