"""The discrete-event simulator: orderings, backfill, gangs, determinism."""

from __future__ import annotations

from gantry.sched.cluster import Cluster
from gantry.sched.placement import BestFitPolicy
from gantry.sched.simulate import Simulator, simulate
from gantry.sched.traces import TraceJob


def cluster(nodes: int = 2, gpus: int = 4) -> Cluster:
    return Cluster(
        [f"n{i}" for i in range(nodes)],
        [64_000] * nodes,
        [256_000] * nodes,
        [gpus] * nodes,
        ["A100"] * nodes,
    )


def burst() -> list[TraceJob]:
    """A node-wide job runs; a cluster-wide one queues; short ones behind it wait under FIFO."""
    jobs = [TraceJob(0, 1000, 4, name="wide-1", user="u")]
    jobs += [TraceJob(1, 1000, 8, name="whole-1", user="u")]
    jobs += [TraceJob(2, 10, 1, name=f"short-{i}", user="u") for i in range(20)]
    return jobs


def test_duration_aware_order_beats_fifo_and_approaches_the_oracle() -> None:
    c = cluster()
    fifo = simulate(c, burst(), BestFitPolicy(), "fifo").summary()
    oracle = simulate(c, burst(), BestFitPolicy(), "sjf-oracle").summary()
    # teach the predictor what these jobs take (history from earlier runs)
    sim = Simulator(c, burst(), BestFitPolicy(), "gantry")
    for run in sim.runs:
        sim.engine.predictor.observe(run.engine_job.features, run.trace.duration)
    gantry = sim.run().summary()
    assert gantry["avg_jct_s"] < 0.6 * fifo["avg_jct_s"]
    assert oracle["avg_jct_s"] <= gantry["avg_jct_s"] <= 1.3 * oracle["avg_jct_s"]
    assert fifo["jobs"] == gantry["jobs"] == 22 and gantry["unplaceable"] == 0


def test_a_gang_wider_than_a_node_is_placed_whole_or_not_at_all() -> None:
    c = cluster(nodes=2, gpus=4)
    jobs = [TraceJob(0, 100, 1, name="a"), TraceJob(1, 50, 8, name="gang")]
    result = simulate(c, jobs, BestFitPolicy(), "gantry")
    starts = dict(zip(["a", "gang"], result.queueing, strict=True))
    assert starts["gang"] == 99  # waits for the one-GPU job: it needs both nodes whole
    too_big = simulate(c, [TraceJob(0, 1, 12)], BestFitPolicy(), "fifo")
    assert too_big.unplaceable == 1 and len(too_big.jct) == 0


def test_replays_are_deterministic_and_leave_the_cluster_untouched() -> None:
    c = cluster()
    first = simulate(c, burst(), BestFitPolicy(), "gantry")
    second = simulate(c, burst(), BestFitPolicy(), "gantry")
    assert (first.jct == second.jct).all() and first.makespan == second.makespan
    assert c.allocated_gpu_milli == 0
    s = first.summary()
    assert 0 < s["mean_gpu_alloc"] <= 1 and s["p99_jct_s"] >= s["p50_jct_s"]


def test_the_production_placement_policy_runs_in_the_simulator() -> None:
    from gantry.sched.demand import Demand
    from gantry.sched.packing import GantryPolicy

    c = cluster(nodes=3)
    workload = [Demand(1000, 1024, 1, 500), Demand(1000, 1024, 4, 1000), Demand(1000, 1024)]
    jobs = burst() + [TraceJob(3, 30, 1, gpu_milli=500, name=f"share-{i}") for i in range(6)]
    result = simulate(c, jobs, GantryPolicy(workload), "gantry")
    assert len(result.jct) == len(jobs) and result.unplaceable == 0
    assert c.allocated_gpu_milli == 0
