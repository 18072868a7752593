"""The scheduling engine: one policy core for the live scheduler service AND the simulator.

The engine holds the cluster's allocation state, the queues and every job it knows, and answers
one question, :meth:`Engine.schedule`, "what should change now?", with :class:`Start` and
:class:`Stop` decisions. It never sleeps and never does I/O: time is an argument, so the
simulator drives it with simulated time and the service with the wall clock, and the same
inputs always give the same decisions.

A pass, in order:

1. **Order.** Pending jobs are grouped by queue; inside a queue by priority (higher first),
   then by the ordering policy — ``fifo`` (submit time), ``sjf-oracle`` (true GPU-time, for
   simulations only) or ``gantry`` (*predicted* GPU-time from similar finished jobs, Helios
   QSSF-style, see :mod:`gantry.sched.predict`). Across queues, Dominant Resource Fairness:
   the queue with the smallest weighted dominant share goes next.
2. **Admit.** A job starts only within its queue's quota, or by borrowing its cohort's idle
   quota (:class:`~gantry.sched.queues.QueueBook`); otherwise it waits with the reason.
3. **Place.** All workers or none (gang), on schedulable nodes of the pools it may use,
   following its topology (``same-node``, ``pack`` — nodes the gang already uses, then its
   rack, then anywhere — or ``spread``), each worker by the placement policy (the
   fragmentation-aware :class:`~gantry.sched.packing.GantryPolicy` in production). An elastic
   job (``min_workers < replicas``) starts with as many workers as fit, at least its minimum.
4. **Backfill.** When a job cannot be placed, the engine estimates when it could start
   (releasing running jobs at their predicted ends) and from then on only starts jobs
   predicted to end before that — small jobs fill holes without delaying the head.
5. **Preempt.** A job that still cannot start may take resources from running jobs of lower
   priority in its queue, or reclaim quota its queue lent to cohort borrowers. Victims are
   chosen to lose the least work (time since their last checkpoint x GPUs), elastic victims
   shrink to their minimum before anyone is stopped outright, and no job is preempted again
   within ``protect_s`` of its last preemption (no thrashing). Victims keep their resources
   until they report stopped (:meth:`Engine.requeue` / :meth:`Engine.release_workers`).
6. **Grow.** When nothing is left waiting for capacity, a running elastic job below its size
   whose full size would now fit is stopped to restart bigger from its checkpoint.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from gantry.core import Conflict, InvalidInput, NotFound
from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.placement import PlacementPolicy
from gantry.sched.predict import DurationPredictor, JobFeatures
from gantry.sched.queues import Amount, QueueBook

Ordering = Literal["fifo", "sjf-oracle", "gantry"]
ORDERINGS: tuple[Ordering, ...] = ("fifo", "sjf-oracle", "gantry")
TOPOLOGIES = ("same-node", "pack", "spread")

#: Jobs a scheduling pass tries and fails to place before it stops looking further down
#: (like Slurm's ``bf_max_job_test``).
MAX_FAILED_TRIES = 64
#: Blocked jobs a pass tries to preempt for.
MAX_PREEMPTION_TRIES = 4
#: Nodes a same-node gang tries as its home before giving up for this pass.
SAME_NODE_TRIES = 8

JobState = Literal["pending", "running", "stopping"]
Slot = tuple[int, Demand, tuple[tuple[int, int], ...]]
"""One placed worker: (node index, its demand, its (gpu index, milli-GPU) shares)."""


@dataclass
class EngineJob:
    """A job as the engine sees it. ``workers`` is the per-worker demand of the full size."""

    id: str
    queue: str
    priority: int
    submit_time: float
    workers: tuple[Demand, ...]
    features: JobFeatures
    min_workers: int = 0  # 0 = all of them (not elastic)
    topology: str = "pack"
    pools: frozenset[str] | None = None  # None = any pool
    oracle_duration: float = math.nan  # only sjf-oracle reads it
    # ---- state the engine keeps
    state: JobState = "pending"
    placed: list[Slot | None] = field(default_factory=list)  # by rank; None = stopped rank
    started: float = -1.0
    last_checkpoint: float = -1.0
    preempted_at: float = -math.inf
    attained: float = 0.0  # GPU-seconds of service in earlier attempts (for LAS levels)
    reason: str = ""
    stopping_for: str = ""  # the job a stop was requested for
    seq: int = 0

    @property
    def replicas(self) -> int:
        """The full size."""
        return len(self.workers)

    @property
    def minimum(self) -> int:
        """The fewest workers it may run with."""
        return self.min_workers or len(self.workers)

    @property
    def elastic(self) -> bool:
        """Whether it may run with fewer workers than its full size."""
        return self.minimum < self.replicas

    @property
    def running_workers(self) -> int:
        """Workers holding resources now."""
        return sum(1 for s in self.placed if s is not None)

    def amount(self, count: int | None = None) -> Amount:
        """What ``count`` (default: all) of its workers take."""
        ws = self.workers[: self.replicas if count is None else count]
        return Amount(
            sum(w.total_gpu_milli for w in ws),
            sum(w.cpu_milli for w in ws),
            sum(w.memory_mib for w in ws),
        )

    def held(self) -> Amount:
        """What its placed workers hold."""
        slots = [s for s in self.placed if s is not None]
        return Amount(
            sum(d.total_gpu_milli for _, d, _ in slots),
            sum(d.cpu_milli for _, d, _ in slots),
            sum(d.memory_mib for _, d, _ in slots),
        )


@dataclass(frozen=True)
class Start:
    """Start ``job`` with these worker slots (rank = position)."""

    job: str
    slots: tuple[Slot, ...]
    resume: bool = False


@dataclass(frozen=True)
class Stop:
    """Ask ``job``'s workers to checkpoint and stop: all of them, or the ranks in ``workers``."""

    job: str
    reason: Literal["preempted", "shrink", "resize"]
    workers: tuple[int, ...] = ()
    for_job: str = ""


Decision = Start | Stop


class Engine:
    """Scheduling state and policy. Not thread-safe: one owner drives it."""

    def __init__(
        self,
        cluster: Cluster,
        placement: PlacementPolicy,
        *,
        ordering: Ordering = "gantry",
        queues: QueueBook | None = None,
        predictor: DurationPredictor | None = None,
        pools: Sequence[str] | None = None,
        protect_s: float = 600.0,
        preemption: bool = True,
        las_thresholds: Sequence[float] = (),
    ) -> None:
        if ordering not in ORDERINGS:
            raise InvalidInput(f"unknown ordering {ordering!r}", hint=f"one of {ORDERINGS}")
        self.placement = placement
        self.ordering: Ordering = ordering
        self.queues = queues
        self.predictor = predictor or DurationPredictor()
        self.protect_s = protect_s
        self.preemption = preemption
        self.las_thresholds = tuple(sorted(las_thresholds))
        self.jobs: dict[str, EngineJob] = {}
        self._seq = 0
        self._predicted: dict[str, float] = {}
        self._changes = 0
        self._reserved: tuple[str, int, float] | None = None
        self._set_cluster(cluster, pools)

    # ------------------------------------------------------------------ the cluster

    def _set_cluster(self, cluster: Cluster, pools: Sequence[str] | None) -> None:
        self.cluster = cluster
        n = cluster.num_nodes
        self.node_pool: tuple[str, ...] = tuple(pools) if pools is not None else ("",) * n
        if len(self.node_pool) != n:
            raise InvalidInput("give one pool per node")
        self.schedulable = np.ones(n, dtype=np.bool_)
        self._index = {name: i for i, name in enumerate(cluster.names)}
        self._empty = cluster.copy()
        self._empty.cpu_free[:] = self._empty.cpu_total
        self._empty.mem_free[:] = self._empty.mem_total
        self._empty.gpu_free[self._empty.gpu_free >= 0] = 1000
        self._empty.version += 1
        self._masks: dict[frozenset[str] | None, NDArray[np.bool_] | None] = {}

    def replace_cluster(self, cluster: Cluster, pools: Sequence[str] | None = None) -> None:
        """Swap in a new node set (nodes joined or left), keeping every running job's slots
        on the nodes that remain (by name). Jobs on vanished nodes must be requeued first."""
        old = self.cluster
        placed = {
            job.id: [None if s is None else (old.names[s[0]], s[1], s[2]) for s in job.placed]
            for job in self.jobs.values()
            if job.placed
        }
        unschedulable = {old.names[i] for i in np.flatnonzero(~self.schedulable)}
        self._set_cluster(cluster, pools)
        for name in unschedulable & set(self._index):
            self.schedulable[self._index[name]] = False
        for job_id, slots in placed.items():
            job = self.jobs[job_id]
            job.placed = []
            for slot in slots:
                if slot is None:
                    job.placed.append(None)
                    continue
                name, demand, gpus = slot
                if name not in self._index:
                    raise Conflict(
                        f"job {job_id} still runs on node {name}, which the new cluster lacks",
                        hint="requeue the node's jobs before removing it",
                    )
                node = self._index[name]
                self.cluster.allocate(node, demand, gpus)
                job.placed.append((node, demand, gpus))
        self._changes += 1

    def node_index(self, name: str) -> int:
        """The index of node ``name``."""
        try:
            return self._index[name]
        except KeyError:
            raise NotFound("node", name) from None

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        """Allow or forbid new placements on a node (degraded, lost, drained)."""
        self.schedulable[self.node_index(name)] = schedulable
        self._masks.clear()
        self._changes += 1

    def jobs_on(self, name: str) -> list[str]:
        """Jobs with a worker on node ``name``."""
        node = self.node_index(name)
        return sorted(
            j.id
            for j in self.jobs.values()
            if any(s is not None and s[0] == node for s in j.placed)
        )

    def _mask(self, pools: frozenset[str] | None) -> NDArray[np.bool_] | None:
        """Nodes a job may use: schedulable ones in its pools (None: every node)."""
        if pools in self._masks:
            return self._masks[pools]
        mask: NDArray[np.bool_] | None = self.schedulable.copy()
        if pools is not None and mask is not None:
            mask &= np.asarray([p in pools for p in self.node_pool], dtype=np.bool_)
        if mask is not None and bool(mask.all()):
            mask = None  # fastest path: no restriction
        self._masks[pools] = mask
        return mask

    # ------------------------------------------------------------------ jobs in and out

    def submit(self, job: EngineJob) -> None:
        """Queue a new job (pending)."""
        if job.id in self.jobs:
            raise Conflict(f"job {job.id} is already known to the engine")
        if job.topology not in TOPOLOGIES:
            raise InvalidInput(f"unknown topology {job.topology!r}", hint=f"one of {TOPOLOGIES}")
        if self.queues is not None:
            self.queues.queue(job.queue)  # NotFound lists the queues
        if not job.workers:
            raise InvalidInput(f"job {job.id} has no workers")
        self._seq += 1
        job.seq = self._seq
        job.state = "pending"
        self.jobs[job.id] = job

    def restore_running(self, job: EngineJob, slots: Sequence[Slot | None], started: float) -> None:
        """Recovery: a job that runs on ``slots`` already (charged without an admission check)."""
        self.submit(job)
        for slot in slots:
            if slot is not None:
                self.cluster.allocate(*slot)
        job.placed = list(slots)
        job.state = "running"
        job.started = started
        job.last_checkpoint = started
        if self.queues is not None:
            self.queues.charge(job.queue, job.id, job.held())

    def never_fits(self, job: EngineJob) -> str:
        """Why the job could never run on this cluster even when empty ('' if it could)."""
        mask = self._pool_mask_all(job.pools)
        if mask is not None and not mask.any():
            return f"no node is in the pools it may use ({', '.join(sorted(job.pools or ()))})"
        saved = self.cluster
        self.cluster = self._empty
        try:
            slots = self._place(job, job.minimum, mask)
        finally:
            self.cluster = saved
        if slots is None:
            w = job.workers[0]
            return (
                f"{job.minimum} worker(s) of {w.num_gpu} GPU x {w.gpu_milli} milli "
                f"{'(' + '/'.join(sorted(w.models)) + ') ' if w.models else ''}"
                f"{w.cpu_milli} milli-CPU {w.memory_mib} MiB do not fit on the cluster even "
                f"when it is empty ({job.topology})"
            )
        for node, demand, gpus in slots:
            self._empty.release(node, demand, gpus)
        return ""

    def _pool_mask_all(self, pools: frozenset[str] | None) -> NDArray[np.bool_] | None:
        if pools is None:
            return None
        return np.asarray([p in pools for p in self.node_pool], dtype=np.bool_)

    def _free(self, job: EngineJob) -> None:
        for slot in job.placed:
            if slot is not None:
                self.cluster.release(*slot)
        job.placed = []
        if self.queues is not None:
            self.queues.release(job.id)
        self._changes += 1

    def finish(self, job_id: str, runtime_s: float | None = None) -> EngineJob:
        """The job ended (succeeded, failed or cancelled): free it and forget it.

        ``runtime_s`` (a successful run's length) teaches the duration predictor.
        """
        job = self._job(job_id)
        self._free(job)
        del self.jobs[job_id]
        self._predicted.pop(job_id, None)
        if runtime_s is not None:
            self.predictor.observe(job.features, runtime_s)
            self._predicted.clear()
        return job

    def requeue(self, job_id: str, now: float) -> EngineJob:
        """The job's workers stopped (preempted, node lost, resized): back to pending."""
        job = self._job(job_id)
        job.attained = self.attained(job, now)
        self._free(job)
        if job.stopping_for:
            job.preempted_at = now
        job.state = "pending"
        job.stopping_for = ""
        job.reason = "requeued; resumes from its last checkpoint"
        return job

    def release_workers(self, job_id: str, ranks: Iterable[int], now: float | None = None) -> None:
        """Some of a running job's workers stopped (a shrink): give their resources back.

        A shrink done for another job counts as a preemption at ``now`` (no thrashing).
        """
        job = self._job(job_id)
        if job.stopping_for and now is not None:
            job.preempted_at = now
        for rank in ranks:
            if 0 <= rank < len(job.placed) and job.placed[rank] is not None:
                slot = job.placed[rank]
                assert slot is not None
                self.cluster.release(*slot)
                job.placed[rank] = None
        while job.placed and job.placed[-1] is None:
            job.placed.pop()
        if self.queues is not None:
            self.queues.release(job.id)
            self.queues.charge(job.queue, job.id, job.held())
        if job.state == "stopping":
            job.state = "running"
            job.stopping_for = ""
        self._changes += 1

    def checkpointed(self, job_id: str, now: float) -> None:
        """The job saved a checkpoint at ``now`` (preemption then loses less work)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.last_checkpoint = now

    def _job(self, job_id: str) -> EngineJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise NotFound("job", job_id) from None

    # ------------------------------------------------------------------ ordering

    def predicted_runtime(self, job: EngineJob) -> float:
        """The job's predicted run time (the oracle's true one under sjf-oracle)."""
        if self.ordering == "sjf-oracle":
            return job.oracle_duration
        value = self._predicted.get(job.id)
        if value is None:
            value = self._predicted[job.id] = self.predictor.predict(job.features)
        return value

    def attained(self, job: EngineJob, now: float) -> float:
        """GPU-seconds of service the job has had so far (all attempts)."""
        if job.started < 0 or not job.placed:
            return job.attained
        return job.attained + max(now - job.started, 0.0) * job.held().gpu_milli / 1000

    def las_level(self, job: EngineJob, now: float) -> int:
        """The job's least-attained-service level: how many thresholds its service passed."""
        return bisect.bisect_right(self.las_thresholds, self.attained(job, now))

    def _key(self, job: EngineJob) -> tuple[float, ...]:
        if self.ordering == "fifo":
            return (-job.priority, job.submit_time, 0.0, job.seq)
        gpu = max(job.features.gpu_milli_total, 100)
        level = bisect.bisect_right(self.las_thresholds, job.attained)
        return (-job.priority, level, gpu * self.predicted_runtime(job), job.submit_time, job.seq)

    def _order(self, pending: list[EngineJob]) -> list[EngineJob]:
        """Pending jobs in the order a pass tries them: DRF across queues, key inside one."""
        pending.sort(key=self._key)
        if self.queues is None or len({j.queue for j in pending}) <= 1:
            return pending
        by_queue: dict[str, list[EngineJob]] = {}
        for job in pending:
            by_queue.setdefault(job.queue, []).append(job)
        heads = dict.fromkeys(by_queue, 0)
        extra = {q: Amount() for q in by_queue}
        out: list[EngineJob] = []
        while heads:
            name = min(
                heads,
                key=lambda q: (self.queues.dominant_share(q, extra[q]), q),  # type: ignore[union-attr]
            )
            job = by_queue[name][heads[name]]
            out.append(job)
            extra[name] = extra[name] + job.amount(job.minimum)
            heads[name] += 1
            if heads[name] == len(by_queue[name]):
                del heads[name]
        return out

    # ------------------------------------------------------------------ placing

    def _place(
        self, job: EngineJob, count: int, mask: NDArray[np.bool_] | None
    ) -> list[Slot] | None:
        """Place ``count`` workers all together following the topology, or None (no change)."""
        if job.topology == "same-node":
            return self._place_same_node(job, count, mask)
        done: list[Slot] = []
        used = np.zeros(self.cluster.num_nodes, dtype=np.bool_)
        racks = self.cluster.racks
        for demand in job.workers[:count]:
            choice = None
            if job.topology == "spread":
                allowed = ~used if mask is None else mask & ~used
                choice = self.placement.choose(self.cluster, demand, allowed)
            else:
                if done:  # pack: nodes the gang already uses, then their racks, then any
                    near = used if mask is None else used & mask
                    choice = self.placement.choose(self.cluster, demand, near)
                    if choice is None and racks is not None:
                        mine = {racks[n] for n, _, _ in done}
                        in_rack = np.asarray([r in mine for r in racks], dtype=np.bool_)
                        choice = self.placement.choose(
                            self.cluster, demand, in_rack if mask is None else in_rack & mask
                        )
                if choice is None:
                    choice = self.placement.choose(self.cluster, demand, mask)
            if choice is None:
                for slot in done:
                    self.cluster.release(*slot)
                return None
            self.cluster.allocate(choice.node, demand, choice.gpus)
            done.append((choice.node, demand, choice.gpus))
            used[choice.node] = True
        return done

    def _place_same_node(
        self, job: EngineJob, count: int, mask: NDArray[np.bool_] | None
    ) -> list[Slot] | None:
        allowed = np.ones(self.cluster.num_nodes, dtype=np.bool_) if mask is None else mask.copy()
        for _ in range(SAME_NODE_TRIES):
            first = self.placement.choose(self.cluster, job.workers[0], allowed)
            if first is None:
                return None
            home = np.zeros_like(allowed)
            home[first.node] = True
            done: list[Slot] = []
            for demand in job.workers[:count]:
                choice = self.placement.choose(self.cluster, demand, home)
                if choice is None:
                    break
                self.cluster.allocate(choice.node, demand, choice.gpus)
                done.append((choice.node, demand, choice.gpus))
            if len(done) == count:
                return done
            for slot in done:
                self.cluster.release(*slot)
            allowed[first.node] = False
        return None

    def _try_start(self, job: EngineJob, now: float) -> Start | None:
        mask = self._mask(job.pools)
        slots = self._place(job, job.replicas, mask)
        if slots is None and job.elastic:
            for count in range(job.replicas - 1, job.minimum - 1, -1):
                slots = self._place(job, count, mask)
                if slots is not None:
                    break
        if slots is None:
            return None
        if self.queues is not None:
            held = Amount(
                sum(d.total_gpu_milli for _, d, _ in slots),
                sum(d.cpu_milli for _, d, _ in slots),
                sum(d.memory_mib for _, d, _ in slots),
            )
            admission = self.queues.check(job.queue, held)
            if not admission.allowed:
                for slot in slots:
                    self.cluster.release(*slot)
                job.reason = admission.reason
                return None
            self.queues.charge(job.queue, job.id, held)
        resume = job.started >= 0
        job.placed = list(slots)
        job.state = "running"
        job.started = now
        job.last_checkpoint = now
        job.reason = ""
        self._changes += 1
        return Start(job.id, tuple(slots), resume=resume)

    # ------------------------------------------------------------------ the pass

    def schedule(self, now: float) -> list[Decision]:
        """One scheduling pass at time ``now``: the decisions to carry out."""
        pending = [j for j in self.jobs.values() if j.state == "pending"]
        decisions: list[Decision] = []
        if pending:
            self._pass(self._order(pending), now, decisions)
        if self.preemption and not any(
            j.state == "pending" and not j.reason.startswith("queue ") for j in self.jobs.values()
        ):
            decisions.extend(self._grow(now))
        return decisions

    def _pass(self, ordered: list[EngineJob], now: float, out: list[Decision]) -> None:
        reservation = math.inf
        failures = 0
        preempt_tries = 0
        for job in ordered:
            if failures >= MAX_FAILED_TRIES:
                job.reason = "waiting: the queue ahead of it is being scheduled first"
                continue
            if reservation < math.inf and now + self.predicted_runtime(job) > reservation:
                job.reason = (
                    "waiting: starting it now could delay a job ahead of it (backfill only "
                    "takes jobs predicted to end before that job can start)"
                )
                continue
            if self.queues is not None:
                admission = self.queues.check(job.queue, job.amount(job.minimum))
                if not admission.allowed:
                    job.reason = admission.reason
                    if self.preemption and preempt_tries < MAX_PREEMPTION_TRIES:
                        preempt_tries += 1
                        out.extend(self._preempt_for(job, now))
                    continue
            start = self._try_start(job, now)
            if start is not None:
                out.append(start)
                continue
            if not job.reason.startswith("queue "):
                job.reason = "waiting for capacity: no nodes with room for all its workers"
            failures += 1
            stops: list[Stop] = []
            if self.preemption and preempt_tries < MAX_PREEMPTION_TRIES:
                preempt_tries += 1
                stops = self._preempt_for(job, now)
                out.extend(stops)
            if self.ordering == "fifo" and self.queues is None:
                break  # strict FIFO: the head blocks the queue
            if stops:
                continue
            if reservation == math.inf and not any(
                j.stopping_for == job.id for j in self.jobs.values()
            ):
                reservation = self._head_start_estimate(job, now)

    # ------------------------------------------------------------------ backfill estimate

    def _head_start_estimate(self, head: EngineJob, now: float) -> float:
        cached = self._reserved
        if cached is not None and cached[0] == head.id and cached[1] == self._changes:
            return cached[2]
        start = self._estimate(head, now)
        self._reserved = (head.id, self._changes, start)
        return start

    def _estimate(self, head: EngineJob, now: float) -> float:
        need = head.amount(head.minimum).gpu_milli
        trial = self.cluster.copy()
        saved, self.cluster = self.cluster, trial
        try:
            running = [j for j in self.jobs.values() if j.placed]
            ends = sorted(
                (max(j.started + self.predicted_runtime(j), now), j.seq, j) for j in running
            )
            mask = self._mask(head.pools)
            for end, _, job in ends:
                for slot in job.placed:
                    if slot is not None:
                        trial.release(*slot)
                if trial.total_gpu_milli - trial.allocated_gpu_milli < need:
                    continue
                slots = self._place(head, head.minimum, mask)
                if slots is not None:
                    return end
            return math.inf
        finally:
            self.cluster = saved

    # ------------------------------------------------------------------ preemption

    def _victim_ok(self, job: EngineJob, victim: EngineJob, now: float) -> bool:
        if victim.state != "running" or victim.id == job.id:
            return False
        if now - victim.preempted_at < self.protect_s:
            return False  # never thrash: not again so soon
        if victim.queue == job.queue:
            if victim.priority < job.priority:
                return True
            # 2D-LAS (Tiresias): a job that has had much more service yields to one that had
            # little, at the same priority — long jobs cannot block short ones for long
            return (
                bool(self.las_thresholds)
                and victim.priority == job.priority
                and self.las_level(victim, now) > self.las_level(job, now)
            )
        if self.queues is None:
            return False
        mine, theirs = self.queues.queue(job.queue), self.queues.queue(victim.queue)
        return (
            bool(mine.cohort)
            and mine.cohort == theirs.cohort
            and self.queues.borrowed(victim.queue) != Amount()
            and (self.queues.used(job.queue) + job.amount(job.minimum)).fits_in(mine.quota)
        )

    def _preempt_for(self, job: EngineJob, now: float) -> list[Stop]:
        """Stops that would let ``job`` start, losing the least work; [] when none would."""
        if any(j.stopping_for == job.id for j in self.jobs.values()):
            job.reason = "waiting for preempted jobs to checkpoint and stop"
            return []
        candidates = [v for v in self.jobs.values() if self._victim_ok(job, v, now)]
        if not candidates:
            return []
        # units: (class, lost work, seq, victim, ranks) — shrinks first, then whole jobs
        units: list[tuple[int, float, int, EngineJob, tuple[int, ...]]] = []
        for v in candidates:
            lost = max(now - v.last_checkpoint, 0.0) * max(v.held().gpu_milli, 100)
            live = [r for r, s in enumerate(v.placed) if s is not None]
            if v.elastic and len(live) > v.minimum:
                units.append((0, lost, v.seq, v, tuple(live[v.minimum :])))
            units.append((1, lost, v.seq, v, ()))
        units.sort(key=lambda u: (u[0], u[1], u[3].priority, u[2]))  # lowest priority first
        chosen: list[tuple[EngineJob, tuple[int, ...]]] = []
        for unit in units:
            victim, ranks = unit[3], unit[4]
            chosen = [(v, r) for v, r in chosen if v.id != victim.id]  # whole job replaces shrink
            chosen.append((victim, ranks))
            if self._fits_without(job, chosen):
                break
        else:
            return []
        for i in range(len(chosen) - 1, -1, -1):  # drop victims that were not needed
            fewer = chosen[:i] + chosen[i + 1 :]
            if fewer and self._fits_without(job, fewer):
                chosen = fewer
        stops: list[Stop] = []
        for victim, ranks in chosen:
            victim.state = "stopping"
            victim.stopping_for = job.id
            stops.append(Stop(victim.id, "shrink" if ranks else "preempted", ranks, for_job=job.id))
        job.reason = (
            f"preempting {', '.join(v.id for v, _ in chosen)}; starts when they have "
            "checkpointed and stopped"
        )
        self._changes += 1
        return stops

    def _fits_without(
        self, job: EngineJob, victims: list[tuple[EngineJob, tuple[int, ...]]]
    ) -> bool:
        trial = self.cluster.copy()
        book = self.queues.copy() if self.queues is not None else None
        for victim, ranks in victims:
            for rank, slot in enumerate(victim.placed):
                if slot is not None and (not ranks or rank in ranks):
                    trial.release(*slot)
            if book is not None:
                book.release(victim.id)
                if ranks:
                    keep = [
                        s for r, s in enumerate(victim.placed) if s is not None and r not in ranks
                    ]
                    book.charge(
                        victim.queue,
                        victim.id,
                        Amount(
                            sum(d.total_gpu_milli for _, d, _ in keep),
                            sum(d.cpu_milli for _, d, _ in keep),
                            sum(d.memory_mib for _, d, _ in keep),
                        ),
                    )
        if book is not None and not book.check(job.queue, job.amount(job.minimum)).allowed:
            return False
        saved, self.cluster = self.cluster, trial
        try:
            return self._place(job, job.minimum, self._mask(job.pools)) is not None
        finally:
            self.cluster = saved

    # ------------------------------------------------------------------ elastic growth

    def _grow(self, now: float) -> list[Stop]:
        out: list[Stop] = []
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            if job.state != "running" or not job.elastic or job.running_workers >= job.replicas:
                continue
            if self.queues is not None:
                others = self.queues.used(job.queue) - job.held()
                if not (others + job.amount()).fits_in(self.queues.queue(job.queue).quota):
                    continue  # growing would borrow: not worth a restart
            trial = self.cluster.copy()
            for slot in job.placed:
                if slot is not None:
                    trial.release(*slot)
            saved, self.cluster = self.cluster, trial
            try:
                fits = self._place(job, job.replicas, self._mask(job.pools)) is not None
            finally:
                self.cluster = saved
            if fits:
                job.state = "stopping"
                out.append(Stop(job.id, "resize"))
        return out


__all__ = [
    "MAX_FAILED_TRIES",
    "ORDERINGS",
    "TOPOLOGIES",
    "Decision",
    "Engine",
    "EngineJob",
    "Ordering",
    "Slot",
    "Start",
    "Stop",
]
