"""The scheduling engine: gangs, topology, pools, quotas, preemption, elastic jobs, determinism."""

from __future__ import annotations

import pytest

from gantry.core import InvalidInput, NotFound
from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.engine import Engine, EngineJob, Start, Stop
from gantry.sched.packing import GantryPolicy
from gantry.sched.placement import BestFitPolicy
from gantry.sched.predict import JobFeatures
from gantry.sched.queues import Amount, QueueBook, QueueConfig
from gantry.sched.simulate import simulate
from gantry.sched.traces import TraceJob


def cluster(nodes: int = 4, gpus: int = 4, racks: list[str] | None = None) -> Cluster:
    return Cluster(
        [f"n{i}" for i in range(nodes)],
        [32_000] * nodes,
        [256_000] * nodes,
        [gpus] * nodes,
        ["A100"] * nodes,
        racks,
    )


def job(
    name: str,
    workers: int = 1,
    gpus: int = 1,
    *,
    milli: int = 1000,
    queue: str = "default",
    priority: int = 0,
    t: float = 0.0,
    min_workers: int = 0,
    topology: str = "pack",
    pools: frozenset[str] | None = None,
) -> EngineJob:
    demand = Demand(1000, 1024, gpus, milli if gpus == 1 else 1000 * (gpus > 0))
    return EngineJob(
        id=name,
        queue=queue,
        priority=priority,
        submit_time=t,
        workers=(demand,) * workers,
        features=JobFeatures("u", queue, name, workers * gpus * milli),
        min_workers=min_workers,
        topology=topology,
        pools=pools,
    )


def starts(decisions: list[Start | Stop]) -> dict[str, Start]:
    return {d.job: d for d in decisions if isinstance(d, Start)}


def nodes_of(engine: Engine, start: Start) -> list[str]:
    return [engine.cluster.names[node] for node, _, _ in start.slots]


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    e = Engine(cluster(nodes=2), BestFitPolicy(), ordering="fifo")
    e.submit(job("small", 1, 1))
    e.submit(job("gang", 2, 4, t=1))
    out = starts(e.schedule(0))
    assert set(out) == {"small"}  # the gang needs both nodes whole: nothing of it starts
    assert e.cluster.allocated_gpu_milli == 1000
    assert e.jobs["gang"].reason.startswith("waiting for capacity")
    e.finish("small", runtime_s=10)
    out = starts(e.schedule(10))
    assert set(out) == {"gang"} and len(out["gang"].slots) == 2


def test_topologies_same_node_pack_and_spread() -> None:
    e = Engine(cluster(nodes=4, racks=["r0", "r0", "r1", "r1"]), BestFitPolicy())
    e.submit(job("same", 2, 2, topology="same-node"))
    e.submit(job("spread", 3, 1, topology="spread", t=1))
    e.submit(job("pack", 4, 1, topology="pack", t=2))
    out = starts(e.schedule(0))
    assert len(set(nodes_of(e, out["same"]))) == 1
    assert len(set(nodes_of(e, out["spread"]))) == 3
    packed = nodes_of(e, out["pack"])
    racks = {e.cluster.racks[e.node_index(n)] for n in packed}  # type: ignore[index]
    assert len(set(packed)) <= 2 and len(racks) == 1


def test_same_node_that_no_node_can_hold_never_fits() -> None:
    e = Engine(cluster(nodes=2), BestFitPolicy())
    wide = job("wide", 3, 2, topology="same-node")
    assert "do not fit" in e.never_fits(wide)
    assert e.never_fits(job("ok", 2, 2, topology="same-node")) == ""
    with pytest.raises(InvalidInput, match="topology"):
        e.submit(job("x", topology="ring"))


def test_pools_confine_jobs_and_degraded_nodes_are_avoided() -> None:
    c = cluster(nodes=4)
    e = Engine(c, BestFitPolicy(), pools=["onprem", "onprem", "cloud", "cloud"])
    e.set_schedulable("n0", False)  # degraded
    e.submit(job("private", 2, 4, pools=frozenset({"onprem"})))
    out = starts(e.schedule(0))
    assert out == {}  # n0 is degraded, so onprem has one usable node for a 2-node gang
    e.set_schedulable("n0", True)
    out = starts(e.schedule(1))
    assert sorted(nodes_of(e, out["private"])) == ["n0", "n1"]
    assert "pools" in e.never_fits(job("nowhere", pools=frozenset({"mars"})))
    with pytest.raises(NotFound):
        e.set_schedulable("n9", False)


def test_quota_holds_a_job_back_with_the_reason_and_borrowing_lets_it_run() -> None:
    cap = Amount(16_000, 128_000, 1 << 20)
    book = QueueBook(
        [
            QueueConfig("a", Amount(4000, 64_000, 1 << 19), cohort="lab"),
            QueueConfig("b", Amount(4000, 64_000, 1 << 19), cohort="lab"),
            QueueConfig("solo", Amount(2000, 64_000, 1 << 19)),
        ],
        cap,
    )
    e = Engine(cluster(), BestFitPolicy(), queues=book)
    e.submit(job("a1", 1, 4, queue="a"))
    e.submit(job("a2", 1, 4, queue="a", t=1))  # borrows b's idle quota
    e.submit(job("s1", 1, 2, queue="solo"))
    e.submit(job("s2", 1, 2, queue="solo", t=1))  # solo has no cohort: must wait
    out = starts(e.schedule(0))
    assert set(out) == {"a1", "a2", "s1"}
    assert "over its quota" in e.jobs["s2"].reason
    assert book.borrowed("a").gpu_milli == 4000


def test_reclaim_preempts_the_borrower_when_the_lender_needs_its_quota() -> None:
    cap = Amount(16_000, 128_000, 1 << 20)
    book = QueueBook(
        [
            QueueConfig("a", Amount(8000, 64_000, 1 << 19), cohort="lab"),
            QueueConfig("b", Amount(8000, 64_000, 1 << 19), cohort="lab"),
        ],
        cap,
    )
    e = Engine(cluster(), BestFitPolicy(), queues=book, protect_s=100)
    for i in range(4):
        e.submit(job(f"a{i}", 1, 4, queue="a", t=i))
    assert len(starts(e.schedule(0))) == 4  # a borrows all of b's quota
    e.submit(job("b0", 1, 4, queue="b", t=10))
    out = e.schedule(10)
    stops = [d for d in out if isinstance(d, Stop)]
    assert len(stops) == 1 and stops[0].reason == "preempted" and stops[0].for_job == "b0"
    assert "preempting" in e.jobs["b0"].reason
    assert e.schedule(11) == []  # no second victim while the first is stopping
    e.requeue(stops[0].job, now=12)
    out = starts(e.schedule(12))
    assert set(out) == {"b0"}


def test_priority_preemption_picks_the_least_lost_work_and_never_thrashes() -> None:
    e = Engine(cluster(nodes=1), BestFitPolicy(), protect_s=1000)
    e.submit(job("old", 1, 2, priority=100))
    e.submit(job("new", 1, 2, priority=100, t=1))
    e.schedule(0)
    e.checkpointed("old", now=95)  # old saved a checkpoint recently: cheaper to stop
    e.submit(job("urgent", 1, 2, priority=1000, t=2))
    stops = [d for d in e.schedule(100) if isinstance(d, Stop)]
    assert [s.job for s in stops] == ["old"]
    e.requeue("old", now=101)
    assert "urgent" in starts(e.schedule(101))
    # old was just preempted: another urgent job may not preempt it again so soon
    e.finish("new")
    assert "old" in starts(e.schedule(102))  # old restarts on the freed GPUs
    e.submit(job("urgent2", 1, 2, priority=1000, t=3))
    assert e.schedule(103) == []
    assert e.jobs["urgent2"].reason.startswith("waiting for capacity")
    # a lower-priority job never preempts
    e2 = Engine(cluster(nodes=1), BestFitPolicy())
    e2.submit(job("hi", 1, 4, priority=1000))
    e2.schedule(0)
    e2.submit(job("lo", 1, 4, priority=1))
    assert e2.schedule(1) == []


def test_elastic_jobs_start_small_shrink_instead_of_stopping_and_grow_back() -> None:
    e = Engine(cluster(nodes=2), BestFitPolicy(), protect_s=0)
    e.submit(job("busy", 1, 4))
    e.schedule(0)
    e.submit(job("elastic", 4, 1, min_workers=2, priority=10, t=1))
    out = starts(e.schedule(1))
    assert len(out["elastic"].slots) == 4  # fits whole on the free node
    e.finish("busy")
    e.submit(job("big", 1, 4, priority=500, t=2))
    assert "big" in starts(e.schedule(2))
    e.submit(job("urgent", 1, 2, priority=500, t=3))
    stops = [d for d in e.schedule(3) if isinstance(d, Stop)]
    assert stops == [Stop("elastic", "shrink", (2, 3), for_job="urgent")]
    e.release_workers("elastic", stops[0].workers)
    assert e.jobs["elastic"].running_workers == 2 and e.jobs["elastic"].state == "running"
    assert "urgent" in starts(e.schedule(4))
    # capacity frees: the elastic job is restarted at full size
    e.finish("urgent")
    e.finish("big")
    grow = [d for d in e.schedule(5) if isinstance(d, Stop)]
    assert grow == [Stop("elastic", "resize")]
    e.requeue("elastic", now=6)
    again = starts(e.schedule(6))["elastic"]
    assert len(again.slots) == 4 and again.resume


def test_elastic_job_starts_with_what_fits() -> None:
    e = Engine(cluster(nodes=1), BestFitPolicy())
    e.submit(job("busy", 1, 1))
    e.submit(job("el", 4, 1, min_workers=2, t=1))
    out = starts(e.schedule(0))
    assert len(out["el"].slots) == 3


def test_replace_cluster_keeps_running_jobs_and_refuses_to_drop_them() -> None:
    e = Engine(cluster(nodes=2), BestFitPolicy())
    e.submit(job("a", 1, 4))
    e.schedule(0)
    slot = e.jobs["a"].placed[0]
    assert slot is not None
    node = e.cluster.names[slot[0]]
    assert e.jobs_on(node) == ["a"]
    bigger = cluster(nodes=3)
    e.replace_cluster(bigger)
    assert e.cluster.allocated_gpu_milli == 4000
    smaller = Cluster(
        [n for n in bigger.names if n != node], [32_000] * 2, [256_000] * 2, [4, 4], ["A100"] * 2
    )
    with pytest.raises(Exception, match="requeue"):
        e.replace_cluster(smaller)


def test_the_engine_is_deterministic_and_the_simulator_runs_queues() -> None:
    trace = [
        TraceJob(i * 7 % 50, 100 + (i * 37) % 900, 1 + i % 4, queue="a" if i % 2 else "b")
        for i in range(60)
    ]
    queues = [
        QueueConfig("a", Amount(8000, 10**6, 10**7), cohort="lab"),
        QueueConfig("b", Amount(8000, 10**6, 10**7), cohort="lab"),
    ]
    demands = [Demand(1000, 1024, 1, 1000), Demand(1000, 1024, 2, 1000)]
    runs = [
        simulate(cluster(), trace, GantryPolicy(demands), "gantry", queues=queues).summary()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0]["jobs"] == 60 and runs[0]["unplaceable"] == 0


def test_las_levels_let_a_new_job_preempt_one_that_has_had_much_more_service() -> None:
    """2D-LAS (Tiresias): at equal priority, a job past a service threshold yields to a job
    below it; without thresholds equal priorities never preempt each other."""
    for thresholds, preempts in (((3600.0,), True), ((), False)):
        e = Engine(cluster(nodes=1), BestFitPolicy(), las_thresholds=thresholds, protect_s=0)
        e.submit(job("long", 1, 4))
        e.schedule(0)
        assert e.las_level(e.jobs["long"], 0) == 0
        e.submit(job("new", 1, 4, t=1000))
        # 4 GPUs x 1000 s = 4000 GPU-s > 3600: "long" is on level 1 now
        stops = [d for d in e.schedule(1000) if isinstance(d, Stop)]
        assert bool(stops) is preempts
        if preempts:
            assert stops == [Stop("long", "preempted", (), for_job="new")]
            e.requeue("long", 1001)
            assert e.jobs["long"].attained == 4004.0
            assert set(starts(e.schedule(1001))) == {"new"}
            # back in the queue, the long job waits behind level-0 work
            e.submit(job("short", 1, 1, t=1002))
            e.finish("new")
            assert set(starts(e.schedule(1003))) == {"short"}
