"""The analyses without a bus: checks of windows, segments, verdicts, nodes, the rate limit,
and the store's downsampling."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from gantry.events.catalog import (
    GpuDevice,
    GpuUsage,
    JobScheduled,
    NodeHeartbeat,
    NodeRegistered,
    WorkerPlacement,
)
from gantry.profiler import store
from gantry.profiler.nodes import NodeHealthConfig, NodeTracker
from gantry.profiler.profiles import Profiles, UnknownJob
from gantry.profiler.stragglers import GangAnalyzer
from gantry.profiler.windows import MetricRejected, Window, check, merge


def w(
    rank: int,
    first: int,
    last: int,
    *,
    data: float = 1.0,
    comm: float = 0.5,
    forward: float = 2.0,
    backward: float = 3.0,
    tokens: int = 0,
    node: str | None = None,
    job: str = "j",
) -> Window:
    steps = last - first + 1
    step = data + comm + forward + backward + 0.5
    return Window(
        job_id=job,
        attempt=1,
        rank=rank,
        node=node or f"n{rank}",
        first_step=first,
        last_step=last,
        step_ms=step,
        step_ms_max=step,
        data_ms=data,
        forward_ms=forward,
        backward_ms=backward,
        comm_ms=comm,
        optimizer_ms=0.5,
        samples=16 * steps,
        tokens=tokens * steps,
        loss=None,
        memory_mib=1,
        at_ms=last,
    )


def test_impossible_windows_are_refused_with_a_reason() -> None:
    good = w(0, 1, 10)
    check(good)
    cases = {
        "negative": replace(good, comm_ms=-1.0),
        "nan": replace(good, forward_ms=math.nan),
        "steps_backwards": replace(good, first_step=11),
        "phases_exceed_step": replace(good, data_ms=100.0),
        "max_below_mean": replace(good, step_ms_max=1.0),
        "zero_step": replace(
            good, step_ms=0.0, data_ms=0, forward_ms=0, backward_ms=0, comm_ms=0, optimizer_ms=0
        ),
    }
    for reason, bad in cases.items():
        with pytest.raises(MetricRejected) as err:
            check(bad)
        assert err.value.reason == reason


def test_merge_keeps_every_step_in_the_means() -> None:
    a, b = w(0, 1, 10, data=1.0), w(0, 11, 40, data=5.0)
    m = merge(a, b)
    assert (m.first_step, m.last_step, m.samples) == (1, 40, 16 * 40)
    assert m.data_ms == pytest.approx((1.0 * 10 + 5.0 * 30) / 40)


def test_one_slow_window_raises_no_alarm_and_a_persistent_one_does() -> None:
    gang = GangAnalyzer("j", 1, {0: "n0", 1: "n1"})
    changes = []
    for first in range(1, 101, 10):
        slow = first == 41  # a single bad window: a hiccup
        changes += gang.add(w(0, first, first + 9, comm=20.5 if slow else 0.5))
        changes += gang.add(w(1, first, first + 9, data=21.0 if slow else 1.0))
    assert changes == []
    for first in range(101, 141, 10):
        changes += gang.add(w(0, first, first + 9, comm=20.5))
        changes += gang.add(w(1, first, first + 9, data=21.0))
    (raised,) = changes
    assert raised.state == "raised" and raised.finding.rank == 1
    assert raised.finding.step <= 130  # within three windows of the slowdown
    cleared = []
    for first in range(141, 221, 10):
        cleared += gang.add(w(0, first, first + 9))
        cleared += gang.add(w(1, first, first + 9))
    assert [c.state for c in cleared] == ["cleared"]


def test_without_the_others_waiting_a_slow_rank_is_not_a_straggler() -> None:
    gang = GangAnalyzer("j", 1, {0: "n0", 1: "n1", 2: "n2"})
    changes = []
    for first in range(1, 101, 10):  # rank 2 is busier, but nobody waits for it
        for rank in range(3):
            changes += gang.add(w(rank, first, first + 9, forward=6.0 if rank == 2 else 2.0))
    assert [c.finding.kind for c in changes] == []


def test_slow_compute_names_the_node_and_two_jobs_degrade_it() -> None:
    profiles = Profiles(nodes=NodeHealthConfig(slow_jobs=2))
    for job in ("a", "b"):
        profiles.scheduled(
            JobScheduled(
                job_id=job,
                placements=[
                    WorkerPlacement(worker=0, node="n0"),
                    WorkerPlacement(worker=1, node="bad"),
                ],
            ),
            0,
        )
    health = []
    findings = []
    now = 0
    for job in ("a", "b"):
        for first in range(1, 61, 10):
            now += 1000
            out = profiles.window(w(0, first, first + 9, comm=10.5, job=job), now)
            out.extend(
                profiles.window(w(1, first, first + 9, backward=13.0, node="bad", job=job), now)
            )
            health += out.health
            findings += [c.finding for _, c in out.findings]
    assert {f.cause for f in findings if f.kind == "straggler"} == {"slow_compute"}
    assert {f.node for f in findings} == {"bad"}
    (change,) = health
    assert change.node == "bad" and change.degraded and change.evidence["jobs"] == ["a", "b"]


def test_unknown_jobs_old_attempts_and_wrong_nodes_are_refused() -> None:
    profiles = Profiles()
    with pytest.raises(UnknownJob):
        profiles.window(w(0, 1, 10), 0)
    profiles.scheduled(JobScheduled(job_id="j", attempt=2, nodes=["n0", "n1"]), 0)
    with pytest.raises(MetricRejected) as err:
        profiles.window(w(0, 1, 10), 0)
    assert err.value.reason == "stale_attempt"
    with pytest.raises(MetricRejected) as err:
        profiles.window(replace(w(0, 1, 10), attempt=2, node="n5"), 0)
    assert err.value.reason == "wrong_node"
    profiles.window(replace(w(0, 1, 10), attempt=2), 0)
    with pytest.raises(MetricRejected) as err:
        profiles.window(replace(w(0, 1, 10), attempt=2), 10_000)
    assert err.value.reason == "duplicate"


def test_the_rate_limit_merges_and_flushes() -> None:
    profiles = Profiles(min_interval_s=1.0)
    profiles.scheduled(JobScheduled(job_id="j", nodes=["n0", "n1"]), 0)
    analysed = []
    for step in range(1, 11):
        analysed += profiles.window(w(0, step, step), 100 * step).analysed
    assert [x.last_step for x in analysed] == [1]  # the rest merged, waiting
    assert profiles.merged == 8
    out = profiles.flush(5_000)
    (merged,) = out.analysed
    assert (merged.first_step, merged.last_step, merged.samples) == (2, 10, 16 * 9)


def test_nodes_recover_after_probation() -> None:
    tracker = NodeTracker(NodeHealthConfig(slow_jobs=1, probation_s=60))
    change = tracker.slow_in_job("n1", "a", {}, 1_000)
    assert change is not None and change.degraded
    assert tracker.tick(30_000) == []
    (recovered,) = tracker.tick(61_000)
    assert not recovered.degraded and "probation" in recovered.reason
    assert (
        tracker.heartbeat(NodeHeartbeat(node="n1", seq=1, gpus=[GpuUsage(index=0)]), 62_000) is None
    )


def test_compaction_folds_old_rows_into_minutes_and_expires_older(tmp_path: Path) -> None:
    engine = store.connect(f"sqlite:///{tmp_path / 'p.db'}")
    store.migrate(engine)
    minute = store.MINUTE_MS
    rows = [replace(w(0, i * 10 + 1, i * 10 + 10), at_ms=minute * 10 + i * 1000) for i in range(30)]
    rows.append(replace(w(0, 1000, 1009), at_ms=minute))  # past the rollup retention
    with engine.begin() as conn:
        conn.execute(store.windows.insert(), [store.window_row(r) for r in rows])
    folded, deleted = store.compact(engine, now_ms=minute * 100, raw_s=60, keep_s=95 * 60)
    assert deleted == 1
    with engine.connect() as conn:
        kept = store.job_windows(conn, "j", 1)
        flags = conn.execute(sa.select(store.windows.c.rollup)).scalars().all()
    assert len(kept) == 1 and all(flags)
    assert (kept[0].first_step, kept[0].last_step, kept[0].samples) == (1, 300, 16 * 300)
    assert folded == 29


def test_detection_settings_keep_their_hysteresis() -> None:
    from pydantic import ValidationError

    from gantry.profiler.settings import DetectionOptions

    assert DetectionOptions().config().clear_threshold < DetectionOptions().config().threshold
    with pytest.raises(ValidationError, match="must be below threshold"):
        DetectionOptions(threshold=1.2, clear_threshold=1.25)


def test_a_trace_nobody_answers_expires(tmp_path: Path) -> None:
    from typing import Any, cast

    from gantry.profiler.recording import Recorder
    from gantry.profiler.traces import Traces

    engine = store.connect(f"sqlite:///{tmp_path / 'p.db'}")
    store.migrate(engine)
    now = [1_000_000]
    recorder = Recorder(engine, Profiles(), clock=lambda: now[0])
    recorder.scheduled(JobScheduled(job_id="j", owner="ann", nodes=["n0", "n1"]))
    traces = Traces(recorder, cast(Any, None), max_bytes=1 << 20, expire_s=60)
    trace = traces.request("j", 5, [], "ann")
    assert trace.state == "pending"
    now[0] += 59_000
    assert traces.get(trace.trace_id).state == "pending"
    now[0] += 2_000
    assert traces.get(trace.trace_id).state == "expired"
    with pytest.raises(MetricRejected.__mro__[1]):  # InvalidInput: no such rank
        traces.request("j", 5, [7], "ann")


def test_a_gang_waiting_for_data_or_for_the_network_is_told_so() -> None:
    gang = GangAnalyzer("j", 1, {0: "n0", 1: "n1"})
    changes = []
    for first in range(1, 61, 10):  # everyone waits ~60% of the step for data
        changes += gang.add(w(0, first, first + 9, data=12.0))
        changes += gang.add(w(1, first, first + 9, data=12.5))
    kinds = {c.finding.kind: c.finding for c in changes if c.state == "raised"}
    assert set(kinds) == {"input_bound"}
    assert kinds["input_bound"].rank is None and "num_workers" in kinds["input_bound"].summary
    comm = GangAnalyzer("k", 1, {0: "n0", 1: "n1"})
    changes = []
    for first in range(1, 61, 10):  # everyone waits on the all-reduce, nobody is slow
        changes += comm.add(w(0, first, first + 9, comm=15.0))
        changes += comm.add(w(1, first, first + 9, comm=15.5))
    assert [c.finding.kind for c in changes] == ["comm_bound"]
    assert changes[0].finding.evidence["share"] > 0.5


def test_utilisation_sets_allocation_against_use() -> None:
    import dataclasses

    profiles = Profiles()
    gpus = [GpuDevice(index=i, model="A100") for i in range(4)]
    profiles.registered(NodeRegistered(node="g1", cpu_milli=16_000, memory_mib=1, gpus=gpus))
    profiles.scheduled(
        JobScheduled(
            job_id="j",
            placements=[
                WorkerPlacement(worker=0, node="g1", gpus=[(0, 1000), (1, 1000)], cpu_milli=4000),
                WorkerPlacement(worker=1, node="g1", gpus=[(2, 500)], cpu_milli=2000),
            ],
        ),
        0,
    )
    assert profiles.allocation("g1") == (2.5, 6.0)
    for seq, util in enumerate((0.2, 0.4)):
        gpus = [GpuUsage(index=i, util=util if i < 3 else 0.0) for i in range(4)]
        profiles.heartbeat(
            NodeHeartbeat(node="g1", seq=seq, gpu_util=util, cpu_util=0.5, gpus=gpus),
            1000 * (seq + 1),
        )
    state = profiles.tracker.nodes["g1"]
    assert state.utilisation(2000, 300) == (0.5, pytest.approx(0.3))
    profiles.job_state("j", 1, "succeeded", 3000)
    assert profiles.allocation("g1") == (0.0, 0.0)  # ended: nothing placed any more
    assert dataclasses.asdict(profiles.tracker.config)["utilisation_window_s"] == 300
