"""A discrete-event simulator: replays a job trace through the scheduling policy code.

Simulated time, no sleeping. Events are job arrivals and completions; after each batch of
events at one instant the queue is scheduled: jobs are taken in the ordering policy's order
and placed (all workers or none) with the placement policy. Orderings:

- ``fifo``: submit order, strictly (the head blocks everyone behind it) — the baseline;
- ``sjf-oracle``: shortest true GPU-time first, with backfill — an upper bound no real
  scheduler reaches (it reads the trace's durations);
- ``gantry``: the production order — shortest *predicted* GPU-time first (predictions learnt
  online from jobs that already finished, see :mod:`gantry.sched.predict`), with backfill that
  never delays the head: a job may jump ahead only if it is predicted to finish before the
  head could start anyway, or if it uses resources the head cannot use.

A job with more GPUs than a node has runs as a gang of full-node workers placed together.
Deterministic: the same trace, cluster and policies give the same result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gantry.core import InvalidInput
from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.placement import Placement, PlacementPolicy
from gantry.sched.predict import DurationPredictor, JobFeatures
from gantry.sched.traces import TraceJob

Ordering = Literal["fifo", "sjf-oracle", "gantry"]
ORDERINGS: tuple[Ordering, ...] = ("fifo", "sjf-oracle", "gantry")

#: Jobs a scheduling pass tries and fails to place before it stops looking further down.
MAX_FAILED_TRIES = 64


@dataclass
class _Job:
    index: int
    trace: TraceJob
    workers: tuple[Demand, ...]
    features: JobFeatures
    start: float = -1.0
    end: float = -1.0
    placed: list[tuple[int, Demand, tuple[tuple[int, int], ...]]] = field(default_factory=list)


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
    ) -> None:
        if ordering not in ORDERINGS:
            raise InvalidInput(f"unknown ordering {ordering!r}", hint=f"one of {ORDERINGS}")
        self.cluster = cluster.copy()
        self._empty = cluster.copy()
        self._empty.cpu_free[:] = self._empty.cpu_total
        self._empty.mem_free[:] = self._empty.mem_total
        self._empty.gpu_free[self._empty.gpu_free >= 0] = 1000
        self._empty.version += 1  # the arrays changed outside allocate(): drop cached scores
        self.placement = placement
        self.ordering = ordering
        self._changes = 0  # bumped whenever a job starts or finishes
        self._predicted: dict[int, float] = {}  # per job, until the predictor learns more
        self._reserved: tuple[int, int, float] | None = None  # (head, changes, start)
        self.predictor = predictor or DurationPredictor()
        self.progress = progress
        node_gpus = int(cluster.gpu_count.max())
        self.jobs = [
            _Job(
                i,
                j,
                workers_of(j, node_gpus),
                JobFeatures(
                    j.user, j.queue, j.name or f"job-{i}", j.gpu_milli_total, cpu_milli=j.cpu_milli
                ),
            )
            for i, j in enumerate(jobs)
        ]

    # ------------------------------------------------------------------ ordering

    def _key(self, job: _Job) -> tuple[float, float, int]:
        t = job.trace
        if self.ordering == "fifo":
            return (t.submit_time, 0.0, job.index)
        if self.ordering == "sjf-oracle":
            return (max(t.gpu_milli_total, 100) * t.duration, t.submit_time, job.index)
        return (max(t.gpu_milli_total, 100) * self._predict(job), t.submit_time, job.index)

    def _predict(self, job: _Job) -> float:
        value = self._predicted.get(job.index)
        if value is None:
            value = self._predicted[job.index] = self.predictor.predict(job.features)
        return value

    def _predicted_end(self, job: _Job, now: float) -> float:
        if self.ordering == "sjf-oracle":
            return now + job.trace.duration
        return now + self._predict(job)

    # ------------------------------------------------------------------ placing

    def _try_place(self, job: _Job) -> bool:
        done: list[tuple[int, Demand, tuple[tuple[int, int], ...]]] = []
        for demand in job.workers:
            choice: Placement | None = self.placement.choose(self.cluster, demand)
            if choice is None:
                for node, d, gpus in done:  # all or nothing
                    self.cluster.release(node, d, gpus)
                return False
            self.cluster.allocate(choice.node, demand, choice.gpus)
            done.append((choice.node, demand, choice.gpus))
        job.placed = done
        return True

    def _release(self, job: _Job) -> None:
        for node, demand, gpus in job.placed:
            self.cluster.release(node, demand, gpus)
        job.placed = []

    def _head_start_estimate(
        self, head: _Job, running: list[tuple[float, int]], now: float
    ) -> float:
        """When the blocked head could start, releasing running jobs in predicted-end order.

        Cached while neither the head nor the set of running jobs changes.
        """
        cached = self._reserved
        if cached is not None and cached[0] == head.index and cached[1] == self._changes:
            return cached[2]
        start = self._estimate(head, running, now)
        self._reserved = (head.index, self._changes, start)
        return start

    def _estimate(self, head: _Job, running: list[tuple[float, int]], now: float) -> float:
        need = sum(d.total_gpu_milli for d in head.workers)
        trial = self.cluster.copy()
        saved, self.cluster = self.cluster, trial
        try:
            ends = sorted(
                (max(self._predicted_end_of_running(idx), now), idx) for _, idx in running
            )
            for end, idx in ends:
                for node, demand, gpus in self.jobs[idx].placed:
                    trial.release(node, demand, gpus)
                if trial.total_gpu_milli - trial.allocated_gpu_milli < need:
                    continue  # cannot fit yet: not worth a placement attempt
                if all(self.placement.choose(trial, d) is not None for d in head.workers):
                    return end
            return math.inf
        finally:
            self.cluster = saved

    def _predicted_end_of_running(self, idx: int) -> float:
        job = self.jobs[idx]
        if self.ordering == "sjf-oracle":
            return job.start + job.trace.duration
        return job.start + self._predict(job)

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        """Replay every job; return the measurements."""
        events: list[tuple[float, int, int]] = []  # (time, kind 0=finish 1=arrive, job)
        for job in self.jobs:
            heapq.heappush(events, (job.trace.submit_time, 1, job.index))
        pending: list[int] = []
        running: list[tuple[float, int]] = []
        unplaceable = 0
        total = self.cluster.total_gpu_milli or 1
        times: list[float] = []
        alloc: list[float] = []
        handled = 0
        now = 0.0
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, idx = heapq.heappop(events)
                job = self.jobs[idx]
                if kind == 0:
                    self._changes += 1
                    self._release(job)
                    running.remove((job.end, idx))
                    self.predictor.observe(job.features, job.trace.duration)
                    self._predicted.clear()
                    handled += 1
                    if self.progress is not None:
                        self.progress(handled)
                elif self._fits_empty(job):
                    pending.append(idx)
                else:
                    unplaceable += 1
            self._schedule(pending, running, events, now)
            times.append(now)
            alloc.append(self.cluster.allocated_gpu_milli / total)
        done = [j for j in self.jobs if j.end >= 0]
        return SimResult(
            ordering=self.ordering,
            placement=self.placement.name,
            jobs=len(self.jobs),
            unplaceable=unplaceable,
            jct=np.asarray([j.end - j.trace.submit_time for j in done]),
            queueing=np.asarray([j.start - j.trace.submit_time for j in done]),
            makespan=now - (self.jobs[0].trace.submit_time if self.jobs else 0.0),
            gpu_alloc_times=np.asarray(times),
            gpu_alloc_fraction=np.asarray(alloc),
        )

    def _fits_empty(self, job: _Job) -> bool:
        """Whether the job could ever run: it fits the cluster with nothing running."""
        empty = self._empty
        placed: list[tuple[int, Demand, tuple[tuple[int, int], ...]]] = []
        try:
            for demand in job.workers:
                choice = self.placement.choose(empty, demand)
                if choice is None:
                    return False
                empty.allocate(choice.node, demand, choice.gpus)
                placed.append((choice.node, demand, choice.gpus))
            return True
        finally:
            for node, demand, gpus in placed:
                empty.release(node, demand, gpus)

    def _schedule(
        self,
        pending: list[int],
        running: list[tuple[float, int]],
        events: list[tuple[float, int, int]],
        now: float,
    ) -> None:
        pending.sort(key=lambda i: self._key(self.jobs[i]))
        started: list[int] = []
        reservation = math.inf
        failures = 0
        for idx in pending:
            if failures >= MAX_FAILED_TRIES:
                break  # like Slurm's bf_max_job_test: a pass looks this deep at most
            job = self.jobs[idx]
            if reservation < math.inf and self._predicted_end(job, now) > reservation:
                continue  # backfill only what ends before the blocked head may start
            if self._try_place(job):
                self._changes += 1
                job.start, job.end = now, now + job.trace.duration
                heapq.heappush(events, (job.end, 0, idx))
                running.append((job.end, idx))
                started.append(idx)
            elif self.ordering == "fifo":
                break  # strict FIFO: the head blocks the queue
            else:
                failures += 1
                if reservation == math.inf:
                    reservation = self._head_start_estimate(job, running, now)
        if started:
            gone = set(started)
            pending[:] = [i for i in pending if i not in gone]


def simulate(
    cluster: Cluster,
    jobs: Sequence[TraceJob],
    placement: PlacementPolicy,
    ordering: Ordering = "gantry",
) -> SimResult:
    """Replay ``jobs`` on ``cluster`` (which is not modified); see :class:`Simulator`."""
    return Simulator(cluster, jobs, placement, ordering).run()


__all__ = ["ORDERINGS", "Ordering", "SimResult", "Simulator", "simulate", "workers_of"]
