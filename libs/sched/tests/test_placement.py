"""Every policy places only where a task fits; hand-built clusters with checkable choices."""

from __future__ import annotations

import numpy as np
import pytest

from gantry.sched import (
    BestFitPolicy,
    Cluster,
    Demand,
    FgdPolicy,
    GantryPolicy,
    Placement,
    PlacementPolicy,
    RandomPolicy,
    Workload,
    feasible_nodes,
    packing,
)
from gantry.sched.packing import DeltaTable

MODELS = ("", "T4", "V100")


def _random_cluster(rng: np.random.Generator, nodes: int = 12) -> Cluster:
    gpus = rng.integers(0, 5, size=nodes)
    models = [MODELS[int(rng.integers(1, 3))] if g else "" for g in gpus]
    return Cluster(
        [f"n{i}" for i in range(nodes)],
        rng.integers(4, 40, size=nodes) * 1000,
        rng.integers(8, 64, size=nodes) * 1024,
        gpus,
        models,
    )


def _random_demand(rng: np.random.Generator) -> Demand:
    kind = int(rng.integers(4))
    models = frozenset({"T4"}) if rng.random() < 0.3 else frozenset()
    cpu, mem = int(rng.integers(0, 12)) * 1000, int(rng.integers(0, 16)) * 1024
    if kind == 0:
        return Demand(cpu, mem)
    if kind == 3:
        return Demand(cpu, mem, int(rng.integers(2, 5)), 1000, models)
    return Demand(cpu, mem, 1, int(rng.integers(1, 11)) * 100, models)


def _fits(cluster: Cluster, demand: Demand, node: int) -> bool:
    """A plain-Python statement of the placement rules, to check the vectorised ones."""
    if cluster.cpu_free[node] < demand.cpu_milli or cluster.mem_free[node] < demand.memory_mib:
        return False
    if demand.num_gpu == 0:
        return True
    model = cluster.model_names[int(cluster.model[node])]
    if demand.models and model not in demand.models:
        return False
    free = [int(f) for f in cluster.gpu_free[node] if f >= 0]
    if demand.num_gpu == 1:
        return any(f >= demand.gpu_milli for f in free)
    return sum(f == 1000 for f in free) >= demand.num_gpu


def _assert_feasible(cluster: Cluster, demand: Demand, placement: Placement) -> None:
    assert _fits(cluster, demand, placement.node)
    indices = [g for g, _ in placement.gpus]
    assert len(set(indices)) == len(indices) == demand.num_gpu
    for g, milli in placement.gpus:
        assert milli == demand.gpu_milli
        assert cluster.gpu_free[placement.node, g] >= milli
    cluster.allocate(placement.node, demand, placement.gpus)  # refuses anything infeasible


def _policies(workload: list[Demand]) -> list[PlacementPolicy]:
    return [RandomPolicy(1), BestFitPolicy(), FgdPolicy(workload), GantryPolicy(workload)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_policy_returns_only_feasible_placements(seed: int) -> None:
    rng = np.random.default_rng(seed)
    workload = [_random_demand(rng) for _ in range(50)]
    for policy in _policies(workload):
        cluster = _random_cluster(np.random.default_rng(seed))
        assert isinstance(policy, PlacementPolicy)
        for _ in range(150):
            demand = _random_demand(rng)
            expected = [n for n in range(cluster.num_nodes) if _fits(cluster, demand, n)]
            assert np.flatnonzero(feasible_nodes(cluster, demand)).tolist() == expected
            placement = policy.choose(cluster, demand)
            if placement is None:
                assert expected == [], policy.name
            else:
                _assert_feasible(cluster, demand, placement)


def test_fragmentation_table_follows_allocations_and_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(packing, "_BATCH_ROWS", 5)  # refresh in several chunks
    rng = np.random.default_rng(7)
    cluster = _random_cluster(rng)
    workload = Workload.from_demands([_random_demand(rng) for _ in range(40)], MODELS)
    table = DeltaTable(cluster, workload, max_columns=3)  # half the probes uncached
    probes = [_random_demand(rng) for _ in range(6)]
    placed: list[tuple[Placement, Demand]] = []
    policy = BestFitPolicy()
    for step in range(60):
        demand = _random_demand(rng)
        placement = policy.choose(cluster, demand)
        if placement is not None:
            cluster.allocate(placement.node, demand, placement.gpus)
            placed.append((placement, demand))
        if step % 3 == 2 and placed:
            old, old_demand = placed.pop(0)
            cluster.release(old.node, old_demand, old.gpus)
        fresh = DeltaTable(cluster, workload)
        for probe in probes:
            assert np.array_equal(table.column(probe), fresh.column(probe))
    for placement, demand in placed:  # many nodes change at once
        cluster.release(placement.node, demand, placement.gpus)
    fresh = DeltaTable(cluster, workload)
    for probe in probes:
        assert np.array_equal(table.column(probe), fresh.column(probe))


def test_hand_built_choices() -> None:
    # node 0: one empty GPU; node 1: one GPU with 700 free. The workload is 500-milli tasks.
    cluster = Cluster(["a", "b"], [64_000, 64_000], [65_536, 65_536], [1, 1], ["T4", "T4"])
    cluster.allocate(1, Demand(0, 0, 1, 300), [(0, 300)])
    workload = [Demand(1000, 1024, 1, 500)] * 10
    task = Demand(1000, 1024, 1, 300)
    # best fit: least GPU left -> node 1, leaving 400 that no 500-milli task can use;
    assert BestFitPolicy().choose(cluster, task) == Placement(1, ((0, 300),))
    # FGD and Gantry keep node 1's 700 usable and take the empty GPU instead.
    assert FgdPolicy(workload).choose(cluster, task) == Placement(0, ((0, 300),))
    assert GantryPolicy(workload).choose(cluster, task) == Placement(0, ((0, 300),))


def test_gantry_keeps_cpu_for_free_gpus_where_fgd_does_not() -> None:
    # Two nodes with two free GPUs each; node 0 has little CPU to spare, node 1 plenty.
    cluster = Cluster(["a", "b"], [20_000, 100_000], [10**6, 10**6], [2, 2], ["T4", "T4"])
    # Most GPU tasks need little CPU (median 2 cores), a few need much (mean 9 per GPU).
    workload = [Demand(2000, 1000, 1, 1000)] * 3 + [Demand(30_000, 1000, 1, 1000)]
    cpu_task = Demand(16_000, 1000)
    # FGD: the median task still fits on node 0 after, so no fragmentation either way; tie.
    assert FgdPolicy(workload).choose(cluster, cpu_task) == Placement(0)
    # Gantry sees node 0's two GPUs stranded without CPU and uses node 1.
    assert GantryPolicy(workload).choose(cluster, cpu_task) == Placement(1)


def test_none_when_nothing_fits() -> None:
    cluster = Cluster(["a"], [1000], [1000], [1], ["T4"])
    for policy in _policies([Demand(1, 1, 1, 100)]):
        assert policy.choose(cluster, Demand(1, 1, 1, 100, frozenset({"V100"}))) is None
        assert policy.choose(cluster, Demand(1, 1, 2, 1000)) is None
        assert policy.choose(cluster, Demand(2000, 1)) is None


def test_gantry_keeps_unconstrained_tasks_off_models_constrained_tasks_need() -> None:
    # Node 0 has T4s, node 1 V100s; half the workload may only run on T4.
    cluster = Cluster(["a", "b"], [64_000] * 2, [65_536] * 2, [2, 2], ["T4", "V100"])
    workload = [Demand(1000, 1024, 1, 1000, frozenset({"T4"})), Demand(1000, 1024, 1, 1000)]
    anywhere = Demand(1000, 1024, 1, 1000)
    with_pressure = GantryPolicy(workload).scores(cluster, anywhere)
    without = GantryPolicy(workload, pressure_weight=0).scores(cluster, anywhere)
    # T4 carries all of the T4-only demand: pressure >= 1, so the full 2 x 1000 is added.
    assert (with_pressure - without).tolist() == pytest.approx([2000.0, 0.0])
    assert GantryPolicy(workload).choose(cluster, anywhere) == Placement(1, ((0, 1000),))
