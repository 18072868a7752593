"""Benchmark: the profiler's intake, detection, false alarms and its cost to training.

    python bench/profiler.py [--quick]

Two parts, each measured against a baseline in the same run.

**Training (real gloo, 2 ranks on this machine's CPUs).** One gloo group (``gantry.testing.gangs``)
trains the ``sequences`` example back to back, 16 samples per rank per step, sequences of 256
positions (steps of ~30-40 ms here; real steps are 0.1-1 s):

- ``training_overhead_ratio``: pairs of identical runs, one with the runtime's step metrics on
  (phase timing, the hooks that split backward from the all-reduce wait, and the progress
  reporter writing its windows) and one with them off, alternating so drift hits both alike;
  the median over pairs of samples/s on over samples/s off (target >= 0.98);
  ``training_overhead_ratio_pooled`` the same over all their time together. A first run,
  not counted, warms the processes up.
- ``false_alarm_rate``: the profiled runs of those pairs are even (no rank slowed); the
  fraction of them where the analysis raised a straggler or data-imbalance alarm (target
  <= 0.05).
- ``detection_steps``: runs where rank 1's data loader starts sleeping 1.5 ms per sample after
  ``SLOW_FROM`` steps; steps from the slowdown to the straggler verdict (the median over runs,
  ``detection_steps_max`` the worst; target <= 50), with ``detection_s`` in seconds, and
  whether each verdict named the right rank, phase and cause (``detections_correct``).

**Intake (a real nats-server and the profiler service in this process).** ``JOBS`` jobs of
``RANKS`` ranks are scheduled, then ``WINDOWS`` step windows per rank are stored in the METRICS
stream while the profiler is stopped; it is started again and timed until every window is
taken:

- ``metrics_ingest_per_s``: windows checked, analysed and stored per second with the rate
  limit off (each window analysed on its own);
- ``metrics_ingest_per_s_rate_limited``: the same with the default rate limit (a flood merges);
- ``bare_consume_per_s``: a plain durable consumer that only checks and acks the same events
  (envelope, catalog, signature): the bus's own cost; ``ingest_vs_bare`` the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result

from gantry.core import NatsSettings
from gantry.events import Bus, ConsumerRunner, ConsumerSpec, EventEnvelope, Publisher
from gantry.events.catalog import JobScheduled, JobStepMetrics, WorkerPlacement
from gantry.profiler.app import ProfilerService
from gantry.profiler.settings import ProfilerOptions, ProfilerSettings
from gantry.profiler.stragglers import GangAnalyzer
from gantry.profiler.windows import Window
from gantry.security.keyring import Keyring
from gantry.supervisor.nats_server import NatsServer
from gantry.testing import gangs

SLOW_FROM = 60
LENGTH = 256


def windows_of(job: str, per_rank: list[list[dict[str, Any]]]) -> list[list[Window]]:
    return [
        [
            Window(
                job_id=job,
                attempt=1,
                rank=rank,
                node=f"node-{rank}",
                at_ms=0,
                **{k: v for k, v in r.items() if k not in ("kind", "compute_ms")},
            )
            for r in records
        ]
        for rank, records in enumerate(per_rank)
    ]


def analyse(per_rank: list[list[Window]]) -> list[Any]:
    gang = GangAnalyzer(per_rank[0][0].job_id, 1, {r: f"node-{r}" for r in range(len(per_rank))})
    changes = []
    for w in sorted((w for ws in per_rank for w in ws), key=lambda w: (w.last_step, w.rank)):
        changes += gang.add(w)
    return changes


def training(work: Path, *, pairs: int, slowed: int, steps: int) -> dict[str, Any]:
    even = {"steps": steps, "params": {"length": LENGTH}}
    plan: list[dict[str, Any]] = [{**even, "profile": False}]  # warm-up, not counted
    for i in range(pairs):
        on, off = {**even, "profile": True}, {**even, "profile": False}
        plan += [on, off] if i % 2 == 0 else [off, on]
    slow_params = {"length": LENGTH, "slow_rank": 1, "slow_ms": 1.5, "slow_after": 16 * SLOW_FROM}
    plan += [{"steps": steps, "params": slow_params}] * slowed
    started = time.perf_counter()
    results = gangs.train(work, plan, timeout_s=3600)
    rates = gangs.rates(work)
    elapsed = time.perf_counter() - started
    ratios, alarms, even_runs = [], 0, 0
    pooled_on = pooled_off = 0.0
    for i in range(pairs):
        a, b = 1 + 2 * i, 2 + 2 * i
        on, off = (a, b) if plan[a]["profile"] else (b, a)
        ratios.append(rates[on] / rates[off])
        pooled_on += steps / rates[on]
        pooled_off += steps / rates[off]
        even_runs += 1
        changes = analyse(windows_of(f"even{i}", results[on]))
        if any(c.finding.kind in ("straggler", "data_imbalance") for c in changes):
            alarms += 1
    detections, seconds, correct = [], [], 0
    for j in range(slowed):
        index = 1 + 2 * pairs + j
        per_rank = windows_of(f"slow{j}", results[index])
        verdicts = [
            c.finding
            for c in analyse(per_rank)
            if c.state == "raised" and c.finding.kind == "straggler"
        ]
        if not verdicts:
            detections.append(float(steps))  # never found: count the whole run against it
            continue
        v = verdicts[0]
        correct += (v.rank, v.phase, v.cause) == (1, "data", "slow_data_loading")
        detections.append(float(v.raised_step - SLOW_FROM))
        step_ms = statistics.median(w.step_ms for w in per_rank[0] if w.first_step > SLOW_FROM)
        seconds.append((v.raised_step - SLOW_FROM) * step_ms / 1000)
    first_on = next(i for i, run in enumerate(plan) if run.get("profile", True))
    step_ms_even = statistics.median(w.step_ms for w in windows_of("x", results[first_on])[0])
    return {
        "training_overhead_ratio": round(statistics.median(ratios), 4),
        "training_overhead_ratio_pooled": round(pooled_off / pooled_on, 4),
        "training_overhead_ratios": [round(r, 4) for r in ratios],
        "false_alarm_rate": round(alarms / even_runs, 4),
        "even_runs": even_runs,
        "detection_steps": statistics.median(detections),
        "detection_steps_max": max(detections),
        "detection_s": round(statistics.median(seconds), 3) if seconds else None,
        "detections_correct": f"{correct}/{slowed}",
        "step_ms_even": round(step_ms_even, 2),
        "training_s": round(elapsed, 1),
    }


async def _publish(publisher: Publisher, events: list[EventEnvelope]) -> None:
    await publisher.publish_many(events, concurrency=256)


def _window_events(jobs: int, ranks: int, windows: int) -> list[EventEnvelope]:
    out = []
    for k in range(windows):
        for j in range(jobs):
            for r in range(ranks):
                slow = r == 1
                first, last = k * 10 + 1, k * 10 + 10
                data = JobStepMetrics(
                    job_id=f"job-{j}",
                    node=f"node-{j % 8}-{r}",
                    worker=r,
                    first_step=first,
                    last_step=last,
                    step_ms=30.0,
                    step_ms_max=40.0,
                    data_ms=21.0 if slow else 1.0,
                    compute_ms=5.0,
                    forward_ms=2.0,
                    backward_ms=3.0,
                    comm_ms=2.0 if slow else 22.0,
                    optimizer_ms=1.0,
                    samples=160,
                    loss=1.0,
                    at_ms=1000 + last,
                )
                out.append(
                    EventEnvelope(
                        type="gantry.metrics.job.step",
                        source="gantry/training-agent",
                        actor="svc-training-agent",
                        subject=data.job_id,
                        data=data.model_dump(mode="json"),
                    )
                )
    return out


async def intake(work: Path, *, jobs: int, ranks: int, windows: int, interval_s: float) -> float:
    """Windows per second the profiler takes from a full stream."""
    server = NatsServer(work / "nats").start()
    try:
        nats = NatsSettings(url=server.url)
        data_dir = work / "data"
        keyring = Keyring(data_dir / "keys")
        settings = ProfilerSettings(
            data_dir=data_dir,
            nats=nats,
            profiler=ProfilerOptions(grpc_port=0, metrics_port=0, min_window_interval_s=interval_s),
        )
        bus = await Bus.connect(nats, name="bench")
        await bus.ensure_streams()
        scheduler = Publisher(bus, signer=keyring.service_key("scheduler"))
        agent = Publisher(bus, signer=keyring.service_key("training-agent"))
        service = ProfilerService(settings)
        task = asyncio.create_task(service.run())
        while service.grpc_port == 0:
            await asyncio.sleep(0.01)
        await _publish(
            scheduler,
            [
                EventEnvelope(
                    type="gantry.job.scheduled",
                    source="gantry/scheduler",
                    actor="bench",
                    subject=f"job-{j}",
                    data=JobScheduled(
                        job_id=f"job-{j}",
                        placements=[
                            WorkerPlacement(worker=r, node=f"node-{j % 8}-{r}")
                            for r in range(ranks)
                        ],
                    ).model_dump(mode="json"),
                )
                for j in range(jobs)
            ],
        )
        while len(service.recorder.profiles.jobs) < jobs:
            await asyncio.sleep(0.01)
        service.stop()
        await task
        events = _window_events(jobs, ranks, windows)
        await _publish(agent, events)
        service = ProfilerService(settings)
        task = asyncio.create_task(service.run())
        while service.grpc_port == 0:
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        while service.steps_handled() < len(events):
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        service.stop()
        await task
        await bus.close()
        return len(events) / elapsed
    finally:
        server.stop()


async def bare(work: Path, *, jobs: int, ranks: int, windows: int) -> float:
    """Windows per second a durable consumer that only checks and acks takes."""
    server = NatsServer(work / "nats").start()
    try:
        nats = NatsSettings(url=server.url)
        keyring = Keyring(work / "keys")
        bus = await Bus.connect(nats, name="bench")
        await bus.ensure_streams()
        agent = Publisher(bus, signer=keyring.service_key("training-agent"))
        events = _window_events(jobs, ranks, windows)
        await _publish(agent, events)

        async def nothing(batch: Any) -> None:
            return None

        runner = ConsumerRunner(
            bus,
            ConsumerSpec(
                durable="bench-bare",
                stream="METRICS",
                filter_subject="gantry.metrics.job.step",
                batch_size=500,
                fetch_timeout_s=0.5,
            ),
            nothing,
            publisher=agent,
            verifier=keyring.trust(),
        )
        started = time.perf_counter()
        consuming = asyncio.create_task(runner.run())
        while runner.handled < len(events):
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        runner.stop()
        await consuming
        await bus.close()
        return len(events) / elapsed
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    args = parser.parse_args()
    quick = args.quick
    work = Path(tempfile.mkdtemp(prefix="gantry-bench-profiler-"))
    try:
        figures: dict[str, Any] = {"quick": quick}
        shape = {"jobs": 20, "ranks": 4, "windows": 10 if quick else 50}
        figures["intake_windows"] = shape["jobs"] * shape["ranks"] * shape["windows"]
        figures["metrics_ingest_per_s"] = round(
            asyncio.run(intake(work / "a", interval_s=0.0, **shape)), 1
        )
        figures["metrics_ingest_per_s_rate_limited"] = round(
            asyncio.run(intake(work / "b", interval_s=0.2, **shape)), 1
        )
        figures["bare_consume_per_s"] = round(asyncio.run(bare(work / "c", **shape)), 1)
        figures["ingest_vs_bare"] = round(
            figures["metrics_ingest_per_s"] / figures["bare_consume_per_s"], 3
        )
        figures.update(
            training(
                work / "t",
                pairs=8 if quick else 40,
                slowed=2 if quick else 6,
                steps=100 if quick else 240,
            )
        )
        figures["targets"] = {
            "training_overhead_ratio": ">= 0.98",
            "detection_steps": "<= 50",
            "false_alarm_rate": "<= 0.05",
        }
        emit_result("profiler", figures)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
