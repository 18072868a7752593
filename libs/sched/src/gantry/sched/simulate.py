"""A discrete-event simulator: replays a job trace through the scheduling engine.

Simulated time, no sleeping. Events are job arrivals and completions; after each batch of
events at one instant the :class:`~gantry.sched.engine.Engine` — the same code the live
scheduler service runs — decides what starts and what stops; the simulator carries the
decisions out at once (a preempted job loses the work since its last periodic checkpoint, a
shrunk elastic job runs on at its smaller size). Orderings:

- ``fifo``: submit order, strictly (the head blocks everyone behind it) — the baseline;
- ``sjf-oracle``: shortest true GPU-time first, with backfill — an upper bound no real
  scheduler reaches (it reads the trace's durations);
- ``gantry``: the production order — shortest *predicted* GPU-time first (predictions learnt
  online from jobs that already finished, see :mod:`gantry.sched.predict`), with backfill that
  never delays the head.

A job with more GPUs than a node has runs as a gang of full-node workers placed together.
Queues with quotas (``queues``) apply exactly as in the service. Deterministic: the same
trace, cluster, queues and policies give the same result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.engine import ORDERINGS, Engine, EngineJob, Ordering, Start, Stop
from gantry.sched.placement import PlacementPolicy
from gantry.sched.predict import DurationPredictor, JobFeatures
from gantry.sched.queues import Amount, QueueBook, QueueConfig
from gantry.sched.traces import TraceJob

#: Stops and starts carried out at one instant before time moves on (victims free at once).
_ROUNDS_PER_INSTANT = 4


@dataclass
class _Run:
    """What the simulator tracks of one job beyond the engine's view."""

    index: int
    trace: TraceJob
    engine_job: EngineJob
    remaining: float  # work left, in seconds at full size
    first_start: float = -1.0
    end: float = -1.0
    rate: float = 0.0  # fraction of full speed (workers / replicas)
    since: float = 0.0  # when the current rate began
    attempt_start: float = 0.0
    token: int = 0  # invalidates the finish event of an earlier attempt or rate
    preemptions: int = 0


@dataclass(frozen=True)
class SimResult:
    """What a replay measured (times in seconds)."""

    ordering: str
    placement: str
    jobs: int
    unplaceable: int
    jct: np.ndarray  # completion - submit, per finished job
    queueing: np.ndarray  # start - submit
    makespan: float
    gpu_alloc_times: np.ndarray
    gpu_alloc_fraction: np.ndarray
    preemptions: int = 0

    def summary(self) -> dict[str, float]:
        """Average and p50/p95/p99 JCT and queueing delay, makespan, mean GPU allocation."""

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if len(values) else 0.0

        times, alloc = self.gpu_alloc_times, self.gpu_alloc_fraction
        mean_alloc = 0.0
        if len(times) > 1 and times[-1] > times[0]:
            mean_alloc = float(np.sum(alloc[:-1] * np.diff(times)) / (times[-1] - times[0]))
        return {
            "jobs": float(self.jobs),
            "unplaceable": float(self.unplaceable),
            "avg_jct_s": float(self.jct.mean()) if len(self.jct) else 0.0,
            "p50_jct_s": pct(self.jct, 50),
            "p95_jct_s": pct(self.jct, 95),
            "p99_jct_s": pct(self.jct, 99),
            "avg_queueing_s": float(self.queueing.mean()) if len(self.queueing) else 0.0,
            "p50_queueing_s": pct(self.queueing, 50),
            "p95_queueing_s": pct(self.queueing, 95),
            "p99_queueing_s": pct(self.queueing, 99),
            "makespan_s": self.makespan,
            "mean_gpu_alloc": mean_alloc,
            "preemptions": float(self.preemptions),
        }


def workers_of(job: TraceJob, node_gpus: int) -> tuple[Demand, ...]:
    """The per-worker demands of a trace job (a gang of full nodes when wider than one)."""
    models = frozenset(job.gpu_models)
    if job.num_gpus == 0:
        return (Demand(job.cpu_milli, job.memory_mib, 0, 0, models),)
    if job.num_gpus == 1:
        return (Demand(job.cpu_milli, job.memory_mib, 1, job.gpu_milli, models),)
    if job.num_gpus <= node_gpus:
        return (Demand(job.cpu_milli, job.memory_mib, job.num_gpus, 1000, models),)
    count = math.ceil(job.num_gpus / node_gpus)
    per = math.ceil(job.num_gpus / count)
    return tuple(
        Demand(job.cpu_milli // count, job.memory_mib // count, per, 1000, models)
        for _ in range(count)
    )


class Simulator:
    """One replay of ``jobs`` on a copy of ``cluster`` with the given policies."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: Sequence[TraceJob],
        placement: PlacementPolicy,
        ordering: Ordering = "gantry",
        *,
        predictor: DurationPredictor | None = None,
        progress: Callable[[int], None] | None = None,
        queues: Sequence[QueueConfig] | None = None,
        checkpoint_s: float = 600.0,
        las_thresholds: Sequence[float] = (),
    ) -> None:
        book = None
        if queues:
            capacity = Amount(
                cluster.total_gpu_milli, int(cluster.cpu_total.sum()), int(cluster.mem_total.sum())
            )
            book = QueueBook(queues, capacity)
        self.engine = Engine(
            cluster.copy(),
            placement,
            ordering=ordering,
            queues=book,
            predictor=predictor,
            las_thresholds=las_thresholds if ordering == "gantry" else (),
        )
        self.placement = placement
        self.ordering = ordering
        self.progress = progress
        self.checkpoint_s = checkpoint_s
        node_gpus = int(cluster.gpu_count.max())
        self.runs: list[_Run] = []
        for i, j in enumerate(jobs):
            ej = EngineJob(
                id=str(i),
                queue=j.queue if book is not None else "default",
                priority=0,
                submit_time=j.submit_time,
                workers=workers_of(j, node_gpus),
                features=JobFeatures(
                    j.user,
                    j.queue,
                    j.name or f"job-{i}",
                    j.gpu_milli_total,
                    cpu_milli=j.cpu_milli,
                    memory_mib=j.memory_mib,
                ),
                oracle_duration=j.duration,
            )
            self.runs.append(_Run(i, j, ej, remaining=j.duration))

    @property
    def cluster(self) -> Cluster:
        """The simulated cluster's current state."""
        return self.engine.cluster

    def run(self) -> SimResult:
        """Replay every job; return the measurements."""
        events: list[tuple[float, int, int, int]] = []  # (time, 0=finish 1=arrive, job, token)
        for r in self.runs:
            heapq.heappush(events, (r.trace.submit_time, 1, r.index, 0))
        unplaceable = 0
        total = self.cluster.total_gpu_milli or 1
        times: list[float] = []
        alloc: list[float] = []
        handled = 0
        now = 0.0
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, idx, token = heapq.heappop(events)
                r = self.runs[idx]
                if kind == 0:
                    if token != r.token:
                        continue  # an earlier attempt's or rate's end
                    r.end = now
                    self.engine.finish(r.engine_job.id, runtime_s=r.trace.duration)
                    handled += 1
                    if self.progress is not None:
                        self.progress(handled)
                elif self.engine.never_fits(r.engine_job):
                    unplaceable += 1
                else:
                    self.engine.submit(r.engine_job)
            for _ in range(_ROUNDS_PER_INSTANT):
                decisions = self.engine.schedule(now)
                for decision in decisions:
                    if isinstance(decision, Start):
                        self._start(decision, now, events)
                    else:
                        self._stop(decision, now, events)
                if not any(isinstance(d, Stop) for d in decisions):
                    break
            times.append(now)
            alloc.append(self.cluster.allocated_gpu_milli / total)
        done = [r for r in self.runs if r.end >= 0]
        return SimResult(
            ordering=self.ordering,
            placement=self.placement.name,
            jobs=len(self.runs),
            unplaceable=unplaceable,
            jct=np.asarray([r.end - r.trace.submit_time for r in done]),
            queueing=np.asarray([r.first_start - r.trace.submit_time for r in done]),
            makespan=now - (self.runs[0].trace.submit_time if self.runs else 0.0),
            gpu_alloc_times=np.asarray(times),
            gpu_alloc_fraction=np.asarray(alloc),
            preemptions=sum(r.preemptions for r in self.runs),
        )

    def _reschedule(self, r: _Run, now: float, events: list[tuple[float, int, int, int]]) -> None:
        r.token += 1
        r.since = now
        if r.rate > 0:
            heapq.heappush(events, (now + r.remaining / r.rate, 0, r.index, r.token))

    def _start(self, start: Start, now: float, events: list[tuple[float, int, int, int]]) -> None:
        r = self.runs[int(start.job)]
        if r.first_start < 0:
            r.first_start = now
        r.attempt_start = now
        r.rate = len(start.slots) / r.engine_job.replicas
        self._reschedule(r, now, events)

    def _stop(self, stop: Stop, now: float, events: list[tuple[float, int, int, int]]) -> None:
        r = self.runs[int(stop.job)]
        r.remaining -= (now - r.since) * r.rate
        if stop.reason == "shrink":
            self.engine.release_workers(stop.job, stop.workers, now)
            r.rate = r.engine_job.running_workers / r.engine_job.replicas
            self._reschedule(r, now, events)
            return
        if stop.reason == "preempted":
            # work since the last periodic checkpoint of this attempt is lost
            ran = now - r.attempt_start
            lost = (ran - math.floor(ran / self.checkpoint_s) * self.checkpoint_s) * r.rate
            r.remaining = min(r.remaining + lost, r.trace.duration)
            r.preemptions += 1
        r.rate = 0.0
        r.token += 1
        self.engine.requeue(stop.job, now)


def simulate(
    cluster: Cluster,
    jobs: Sequence[TraceJob],
    placement: PlacementPolicy,
    ordering: Ordering = "gantry",
    *,
    queues: Sequence[QueueConfig] | None = None,
) -> SimResult:
    """Replay ``jobs`` on ``cluster`` (which is not modified); see :class:`Simulator`."""
    return Simulator(cluster, jobs, placement, ordering, queues=queues).run()


__all__ = ["ORDERINGS", "Ordering", "SimResult", "Simulator", "simulate", "workers_of"]
