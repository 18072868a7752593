"""The profiler's live state (domain): running jobs and their gangs, nodes, and the intake.

:class:`Profiles` learns jobs from the scheduler's ``job.scheduled`` (which rank runs on which
node, with what resources) and ``job.state`` events, takes each worker's step windows and each
node's heartbeats, and returns what changed: findings raised or cleared, nodes degraded or
recovered. It refuses windows of jobs it does not know, of old attempts, of ranks the job does
not have or from the wrong node, and windows that cannot be true (see
:mod:`gantry.profiler.windows`).

**Rate limit.** A rank's windows are analysed at most once per ``min_interval_s``: a window
that comes sooner is merged (step-weighted) into the one held for that rank, and the merged
window is analysed when its time comes (:meth:`Profiles.flush`). A flood of tiny windows thus
costs one analysis per interval and loses nothing the analysis needs: every step is still
counted, in the same means.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from gantry.events.catalog import JobScheduled, NodeHeartbeat, NodeRegistered, WorkerPlacement
from gantry.profiler.nodes import HealthChange, NodeHealthConfig, NodeTracker
from gantry.profiler.stragglers import Change, DetectionConfig, Finding, GangAnalyzer
from gantry.profiler.windows import MetricRejected, Window, merge

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "pending"})
"""Job states after which an attempt's workers are gone (``pending`` again: requeued)."""


class UnknownJob(MetricRejected):
    """Metrics of a job (or attempt) the profiler has not seen scheduled (yet)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="unknown_job", hint="only scheduled jobs are profiled")


@dataclass
class JobRecord:
    """One attempt of one job, as the profiler follows it."""

    job_id: str
    attempt: int
    name: str
    owner: str
    placements: list[WorkerPlacement]
    gang: GangAnalyzer
    started_ms: int
    state: str = "running"
    ended_ms: int = 0
    updated_ms: int = 0
    last_step: int = 0

    @property
    def running(self) -> bool:
        return self.state == "running"

    def rank_nodes(self) -> dict[int, str]:
        return {p.worker: p.node for p in self.placements}


@dataclass
class Outcome:
    """What one input changed."""

    findings: list[tuple[JobRecord, Change]] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)
    analysed: list[Window] = field(default_factory=list)
    """Windows analysed now (merged ones included), to be stored."""

    def extend(self, other: Outcome) -> None:
        self.findings += other.findings
        self.health += other.health
        self.analysed += other.analysed


class Profiles:
    """Running jobs, their analyses, and the nodes."""

    def __init__(
        self,
        detection: DetectionConfig | None = None,
        nodes: NodeHealthConfig | None = None,
        *,
        min_interval_s: float = 0.2,
        max_jobs: int = 500,
    ) -> None:
        self.detection = detection or DetectionConfig()
        self.tracker = NodeTracker(nodes)
        self.min_interval_ms = int(min_interval_s * 1000)
        self.max_jobs = max_jobs
        self.jobs: OrderedDict[str, JobRecord] = OrderedDict()
        """Latest attempt of each job, least recently scheduled first."""
        self._held: dict[tuple[str, int, int], Window] = {}
        self._last: dict[tuple[str, int, int], int] = {}
        self.merged = 0
        """Windows merged by the rate limit."""

    # -- jobs ----------------------------------------------------------------------------------

    def scheduled(self, s: JobScheduled, now_ms: int) -> JobRecord | None:
        """A job attempt was placed; None when it is older than the attempt we know."""
        known = self.jobs.get(s.job_id)
        if known is not None and known.attempt >= s.attempt:
            return None
        placements = sorted(s.placements, key=lambda p: p.worker)
        if not placements:  # an older scheduler: ranks in node order
            placements = [WorkerPlacement(worker=i, node=n) for i, n in enumerate(s.nodes)]
        record = JobRecord(
            job_id=s.job_id,
            attempt=s.attempt,
            name=s.name,
            owner=s.owner,
            placements=placements,
            gang=GangAnalyzer(
                s.job_id, s.attempt, {p.worker: p.node for p in placements}, self.detection
            ),
            started_ms=now_ms,
            updated_ms=now_ms,
        )
        self.jobs[s.job_id] = record
        self.jobs.move_to_end(s.job_id)
        self._evict()
        return record

    def adopt(self, record: JobRecord) -> None:
        """Take back a running attempt as stored (after a restart)."""
        self.jobs[record.job_id] = record
        self._evict()

    def job_state(self, job_id: str, attempt: int, state: str, now_ms: int) -> JobRecord | None:
        """A job changed state; the record when this ended the attempt we follow."""
        record = self.jobs.get(job_id)
        if record is None or not record.running or state not in TERMINAL_STATES:
            return None
        if attempt and attempt != record.attempt:
            return None
        record.state = "ended"
        record.ended_ms = now_ms
        for key in [k for k in self._held if k[0] == job_id]:
            del self._held[key]
        return record

    def _evict(self) -> None:
        """Forget the oldest ended jobs beyond ``max_jobs`` (they stay in the database)."""
        while len(self.jobs) > self.max_jobs:
            oldest = next((k for k, r in self.jobs.items() if not r.running), None)
            if oldest is None:
                return
            del self.jobs[oldest]

    def record_for(self, w: Window) -> JobRecord:
        """The attempt a window belongs to, or why it cannot be taken."""
        record = self.jobs.get(w.job_id)
        if record is None or w.attempt > record.attempt:
            raise UnknownJob(
                f"job {w.job_id} attempt {w.attempt} is not a job the profiler saw scheduled"
            )
        if w.attempt < record.attempt:
            raise MetricRejected(
                f"job {w.job_id}: attempt {w.attempt} was replaced by attempt {record.attempt}",
                reason="stale_attempt",
            )
        if not record.running:
            raise MetricRejected(
                f"job {w.job_id} attempt {w.attempt} has ended", reason="job_ended"
            )
        return record

    # -- windows -------------------------------------------------------------------------------

    def window(self, w: Window, now_ms: int) -> Outcome:
        """Take one window (checked already by :meth:`Window.from_event`)."""
        record = self.record_for(w)
        if w.rank not in record.gang.ranks:  # say so now, not when a held window is flushed
            record.gang.add(w)
        key = (w.job_id, w.attempt, w.rank)
        held = self._held.get(key)
        if held is not None:
            if w.first_step > held.last_step and w.node == held.node:
                self._held[key] = merge(held, w)
                self.merged += 1
                return Outcome()
            out = self._analyse(record, self._held.pop(key), now_ms)
            out.extend(self._analyse(record, w, now_ms))
            return out
        if now_ms - self._last.get(key, -(10**12)) < self.min_interval_ms:
            if w.node != record.gang.ranks[w.rank].node:
                record.gang.add(w)  # raises: wrong node
            self._held[key] = w
            return Outcome()
        return self._analyse(record, w, now_ms)

    def flush(self, now_ms: int) -> Outcome:
        """Analyse held windows whose interval has passed."""
        out = Outcome()
        for key, w in list(self._held.items()):
            if now_ms - self._last.get(key, 0) < self.min_interval_ms:
                continue
            del self._held[key]
            record = self.jobs.get(key[0])
            if record is None or record.attempt != key[1] or not record.running:
                continue
            try:
                out.extend(self._analyse(record, w, now_ms))
            except MetricRejected:
                continue  # a duplicate that came in a flood: its steps are counted already
        return out

    def _analyse(self, record: JobRecord, w: Window, now_ms: int) -> Outcome:
        changes = record.gang.add(w)
        self._last[(w.job_id, w.attempt, w.rank)] = now_ms
        record.updated_ms = now_ms
        record.last_step = max(record.last_step, w.last_step)
        out = Outcome(analysed=[w])
        for change in changes:
            out.findings.append((record, change))
            f = change.finding
            if change.state == "raised" and f.kind == "straggler" and f.cause == "slow_compute":
                health = self.tracker.slow_in_job(f.node, record.job_id, f.evidence, now_ms)
                if health is not None:
                    out.health.append(health)
        return out

    # -- nodes ---------------------------------------------------------------------------------

    def registered(self, r: NodeRegistered) -> None:
        self.tracker.registered(r)

    def heartbeat(self, hb: NodeHeartbeat, now_ms: int) -> Outcome:
        change = self.tracker.heartbeat(hb, now_ms)
        return Outcome(health=[change] if change is not None else [])

    def tick(self, now_ms: int) -> Outcome:
        out = self.flush(now_ms)
        out.health += self.tracker.tick(now_ms)
        return out

    def allocation(self, node: str) -> tuple[float, float]:
        """(GPUs, CPUs) the running attempts' workers hold on ``node``."""
        gpus = cpus = 0.0
        for record in self.jobs.values():
            if not record.running:
                continue
            for p in record.placements:
                if p.node == node:
                    gpus += sum(milli for _, milli in p.gpus) / 1000
                    cpus += p.cpu_milli / 1000
        return gpus, cpus

    def standing(self, job_id: str) -> list[Finding]:
        record = self.jobs.get(job_id)
        return list(record.gang.active.values()) if record is not None else []


__all__ = ["TERMINAL_STATES", "JobRecord", "Outcome", "Profiles", "UnknownJob"]
