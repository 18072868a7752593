"""The scheduler's control state (domain): jobs through their lifecycle over the shared engine.

:class:`Control` owns the :class:`~gantry.sched.engine.Engine` (the policy core the simulator
runs too) and the database. Every method runs on ONE thread (the app gives it a dedicated
executor), so the engine is never touched concurrently. Each change commits the job's new
state together with its events (outbox) in one transaction, then tells the listeners (watch
streams) about it.

Job states::

    pending ──place──> scheduled ──all workers started──> running ──all succeeded──> succeeded
       ^                   │                                │   └─ a worker failed ──> failed
       │                   └─ gang timeout ─┐               │
       └──────── requeue (resume) <─────────┴─ stopping <───┘  (preempted, resize, node lost)
                                                 └──> cancelled / failed (max runtime)

Node agents report per worker rank (``gantry.job.workers``); reports of an older attempt are
ignored, so redelivered or late events never move a job backwards.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
from pydantic import BaseModel

from gantry.core import Conflict, InvalidInput, NotFound, get_logger, new_id
from gantry.events import EventEnvelope, Inbox, Outbox
from gantry.events.catalog import (
    DatasetUse,
    JobProgress,
    JobScheduled,
    JobStateChanged,
    JobStopRequested,
    JobSubmitted,
    JobUsage,
    NodeLost,
    NodeRegistered,
    QueueChanged,
    WorkerPlacement,
)
from gantry.sched import (
    BestFitPolicy,
    Cluster,
    DataSensitivity,
    Demand,
    DurationPredictor,
    FgdPolicy,
    GantryPolicy,
    JobFeatures,
    Pool,
    QueueBook,
    QueueConfig,
    eligible_pools,
    load_queues,
    parse_job,
)
from gantry.sched.engine import Engine, EngineJob, Slot, Start, Stop
from gantry.sched.placement import PlacementPolicy
from gantry.sched.queues import UNLIMITED, Amount
from gantry.sched.spec import TrainingJob
from gantry.scheduler import store
from gantry.scheduler.progress import SaveThrottle, progress_record, supersedes
from gantry.scheduler.rendezvous import master_addr, master_port, worker_port
from gantry.scheduler.settings import SchedulerOptions

SOURCE = "gantry/scheduler"
ACTOR = "svc-scheduler"
TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("pending", "scheduled", "running", "stopping")
#: Worker reports that mean a rank came up (a quick one may have finished already).
UP = ("started", "succeeded")
#: Worker reports that mean a rank holds nothing any more.
ENDED = ("succeeded", "stopped", "failed")
#: States in which a job's current attempt has workers (whose progress is taken).
PLACED = ("scheduled", "running", "stopping")
#: Extra time after the grace period before a stop is taken as done (agents gone silent).
STOP_SLACK_S = 30.0
_OUTBOX = Outbox(store.outbox)
_LOG_INBOX = Inbox(store.inbox, "scheduler-logs")
#: One compiled statement for every job update (parameters bound per call).
_UPDATE_JOB = store.jobs.update().where(store.jobs.c.id == sa.bindparam("b_id"))
_log = get_logger("gantry.scheduler.control")
#: A typical mix used as the fragmentation target until real jobs have been seen.
_DEFAULT_WORKLOAD = (
    [Demand(4000, 16384, 1, 1000)] * 4
    + [Demand(8000, 32768, 2, 1000)] * 2
    + [Demand(2000, 8192, 1, 500)] * 2
    + [Demand(16000, 65536, 8, 1000)]
)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class JobRow:
    """A job as the scheduler keeps it (a row of ``sched_jobs``, decoded)."""

    id: str
    name: str
    queue: str
    owner: str
    owner_roles: list[str]
    priority: int
    state: str
    reason: str
    spec_yaml: str
    request_id: str
    submitted_ms: int
    pending_since_ms: int
    attempt: int = 0
    workers: int = 0
    placements: list[dict[str, Any]] = field(default_factory=list)
    reports: dict[str, str] = field(default_factory=dict)  # rank -> last status
    stop_reason: str = ""
    stop_ranks: list[int] = field(default_factory=list)
    deadline_ms: int = 0
    pools: str = ""
    attempt_start_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    run_s: float = 0.0
    checkpoint_ms: int = 0
    preempted_ms: int = 0
    progress: dict[str, Any] = field(default_factory=dict)  # see gantry.scheduler.progress
    restarts: int = 0  # workers restarted from a checkpoint by their agent, in all
    attempt_restarts: int = 0  # the same, in the current attempt (as the agents count them)
    model: str = ""  # on success: the model version registered, name:version
    metrics: dict[str, float] = field(default_factory=dict)  # on success: rank 0's metrics
    dataset_version: str = ""  # on success: the version committed for spec.output
    predicted_s: float = 0.0
    _spec: TrainingJob | None = None

    @property
    def spec(self) -> TrainingJob:
        """The parsed TrainingJob document."""
        if self._spec is None:
            self._spec = parse_job(self.spec_yaml)
        return self._spec

    def values(self) -> dict[str, Any]:
        """Column values for ``sched_jobs`` (lists and mappings as JSON)."""
        out: dict[str, Any] = {}
        for column in _JOB_COLUMNS:
            value = getattr(self, column)
            out[column] = orjson.dumps(value).decode() if column in _JSON_COLUMNS else value
        return out

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> JobRow:
        """Decode a ``sched_jobs`` row."""
        m = row._mapping
        return cls(
            **{
                column: orjson.loads(m[column]) if column in _JSON_COLUMNS else m[column]
                for column in _JOB_COLUMNS
            }
        )

    @property
    def live_ranks(self) -> list[int]:
        """Ranks of the current attempt that hold resources."""
        return [int(p["worker"]) for p in self.placements]

    def nodes_of(self, ranks: Iterable[int] | None = None) -> list[str]:
        """Nodes hosting ``ranks`` (default: every placed worker)."""
        wanted = None if ranks is None else set(ranks)
        return sorted(
            {p["node"] for p in self.placements if wanted is None or p["worker"] in wanted}
        )


_JOB_COLUMNS = tuple(c.name for c in store.jobs.columns)
_JSON_COLUMNS = frozenset(
    {"owner_roles", "placements", "reports", "stop_ranks", "progress", "metrics"}
)


@dataclass
class NodeRow:
    """A registered node."""

    name: str
    pool: str
    inventory: NodeRegistered
    state: str  # ready | degraded | lost
    reason: str
    last_seen_ms: int
    registered_ms: int

    @property
    def gpu_model(self) -> str:
        """The node's GPU model (the most common one when mixed)."""
        models = Counter(g.model for g in self.inventory.gpus)
        return models.most_common(1)[0][0] if models else ""


Listener = Callable[[JobRow], None]


class Control:
    """Jobs, nodes, queues and the engine. Call every method from one thread only."""

    def __init__(
        self,
        db: sa.Engine,
        options: SchedulerOptions,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.options = options
        self.clock = clock
        self.jobs: dict[str, JobRow] = {}  # active jobs
        self.nodes: dict[str, NodeRow] = {}
        self.sensitivity = DataSensitivity()
        self.pools = {name: Pool(name, trusted) for name, trusted in options.pools.items()}
        self.queues = QueueBook([], Amount())
        self.predictor = DurationPredictor()
        self.engine: Engine | None = None
        self.listeners: set[Listener] = set()
        self.log_listeners: set[Callable[[str], None]] = set()
        self.launcher: Callable[[JobRow, Start], None] | None = None
        self.stopper: Callable[[JobRow, list[int]], None] | None = None
        self.decisions = 0
        self._recent: list[Demand] = []
        self._progress_saves = SaveThrottle()

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Rebuild everything from the database (start-up, also after a crash)."""
        now_ms = _now_ms()
        with self.db.connect() as conn:
            for row in conn.execute(sa.select(store.queues)):
                self.queues.set_queue(_queue_config(row))
            for row in conn.execute(sa.select(store.datasets)):
                self.sensitivity.observe(row.name, row.sensitivity)
            for row in conn.execute(sa.select(store.nodes)):
                inv = NodeRegistered.model_validate(orjson.loads(row.inventory))
                # a restart is no evidence of node loss: every node gets a fresh timeout
                seen = now_ms if row.state != "lost" else row.last_seen_ms
                self.nodes[row.name] = NodeRow(
                    row.name, row.pool, inv, row.state, row.reason, seen, row.registered_ms
                )
            active = conn.execute(
                sa.select(store.jobs)
                .where(store.jobs.c.state.in_(ACTIVE))
                .order_by(store.jobs.c.submitted_ms)
            ).all()
            finished = conn.execute(
                sa.select(store.jobs)
                .where(store.jobs.c.state == "succeeded")
                .order_by(store.jobs.c.finished_ms.desc())
                .limit(2000)
            ).all()
        self._seed_queues()
        for row in reversed(finished):
            job = JobRow.from_row(row)
            self.predictor.observe(self._features(job), job.run_s)
        for row in active:
            job = JobRow.from_row(row)
            self.jobs[job.id] = job
        self._rebuild_cluster()
        _log.info(
            "recovered", jobs=len(self.jobs), nodes=len(self.nodes), queues=len(self.queues.queues)
        )

    def _seed_queues(self) -> None:
        configs: list[QueueConfig] = []
        if self.options.queues_file is not None:
            try:
                text = self.options.queues_file.read_text()
            except OSError as exc:
                raise InvalidInput(
                    f"cannot read queues file {self.options.queues_file}: {exc.strerror}"
                ) from None
            configs = load_queues(text)
        elif not self.queues.queues:
            configs = [QueueConfig("default", Amount(UNLIMITED, UNLIMITED, UNLIMITED))]
        with self.db.begin() as conn:
            for config in configs:
                if config.name not in self.queues.queues:
                    conn.execute(store.queues.insert().values(**_queue_values(config)))
                    self.queues.set_queue(config)

    # ------------------------------------------------------------------ the cluster

    def _capacity(self) -> Amount:
        gpu = cpu = mem = 0
        for n in self.nodes.values():
            if n.state != "lost":
                gpu += len(n.inventory.gpus) * 1000
                cpu += n.inventory.cpu_milli
                mem += n.inventory.memory_mib
        return Amount(gpu, cpu, mem)

    def _policy(self, cluster: Cluster) -> PlacementPolicy:
        name = self.options.placement
        if name == "bestfit":
            return BestFitPolicy()
        # The target workload is the recent GPU tasks' shapes (CPU-only tasks strand no GPU);
        # a cluster that ran only CPU jobs so far uses the default shapes.
        workload = [d for d in self._recent[-2000:] if d.num_gpu] or _DEFAULT_WORKLOAD
        if name == "fgd":
            return FgdPolicy(workload)
        return GantryPolicy(workload)

    def _rebuild_cluster(self) -> None:
        """Build the engine's cluster from the known nodes (on start and when nodes change)."""
        self.queues.capacity = self._capacity()
        names = sorted(self.nodes)
        if not names:
            return
        rows = [self.nodes[n] for n in names]
        racks = [r.inventory.labels.get("rack", "") for r in rows]
        cluster = Cluster(
            names,
            [r.inventory.cpu_milli for r in rows],
            [r.inventory.memory_mib for r in rows],
            [len(r.inventory.gpus) for r in rows],
            [r.gpu_model for r in rows],
            racks if any(racks) else None,
        )
        pools = [r.pool for r in rows]
        if self.engine is None:
            self.engine = Engine(
                cluster,
                self._policy(cluster),
                ordering=self.options.ordering,
                queues=self.queues,
                predictor=self.predictor,
                pools=pools,
                protect_s=self.options.preemption_protect_s,
                las_thresholds=[h * 3600 for h in self.options.las_thresholds_gpu_h],
            )
            for job in sorted(self.jobs.values(), key=lambda j: j.submitted_ms):
                self._enter_engine(job)
        else:
            self.engine.placement = self._policy(cluster)
            self.engine.replace_cluster(cluster, pools)
        for r in rows:
            self.engine.set_schedulable(r.name, r.state == "ready")

    def _enter_engine(self, job: JobRow) -> None:
        assert self.engine is not None
        ej = self._engine_job(job)
        if job.state == "pending":
            self.engine.submit(ej)
            return
        slots: list[Slot | None] = []
        by_rank = {int(p["worker"]): p for p in job.placements}
        demand = ej.workers[0]
        for rank in range(max(by_rank, default=-1) + 1):
            p = by_rank.get(rank)
            if p is None:
                slots.append(None)
                continue
            gpus = tuple((int(i), int(m)) for i, m in p["gpus"])
            slots.append((self.engine.node_index(p["node"]), demand, gpus))
        self.engine.restore_running(ej, slots, job.attempt_start_ms / 1000)
        if job.checkpoint_ms:
            self.engine.checkpointed(job.id, job.checkpoint_ms / 1000)
        if job.state == "stopping":
            ej.state = "stopping"

    # ------------------------------------------------------------------ jobs in

    def _features(self, job: JobRow) -> JobFeatures:
        spec = job.spec.spec
        return JobFeatures(
            job.owner,
            job.queue,
            job.name,
            spec.replicas * spec.resources.milli_gpus,
            max_runtime_s=float(spec.max_runtime_s),
            cpu_milli=spec.resources.cpu_milli,
            memory_mib=spec.resources.memory_mib,
        )

    def _demand(self, tj: TrainingJob) -> Demand:
        r = tj.spec.resources
        models = frozenset(r.gpu_models)
        if r.gpu_memory_mib:
            fitting = {
                g.model
                for n in self.nodes.values()
                for g in n.inventory.gpus
                if g.memory_mib >= r.gpu_memory_mib
            }
            models = (models & fitting) if models else frozenset(fitting)
            if not models:
                raise InvalidInput(
                    f"spec.resources.gpuMemory: no registered GPU has {r.gpu_memory_mib} MiB",
                    hint="ask for less GPU memory or a model the cluster has",
                )
        if r.gpu_milli and r.gpus <= 1:
            return Demand(r.cpu_milli, r.memory_mib, 1, r.gpu_milli, models)
        if r.gpus:
            return Demand(r.cpu_milli, r.memory_mib, r.gpus, 1000, models)
        return Demand(r.cpu_milli, r.memory_mib, 0, 0)

    def _pools_for(self, tj: TrainingJob) -> tuple[frozenset[str] | None, str]:
        datasets = [d.dataset for d in tj.spec.data]
        if not datasets:
            return None, ""
        known = dict(self.pools)
        for n in self.nodes.values():
            known.setdefault(n.pool, Pool(n.pool, trusted=False))
        allowed, why = eligible_pools(datasets, known, self.sensitivity)
        if allowed == frozenset(known):
            return None, ""
        return allowed, why

    def _engine_job(self, job: JobRow) -> EngineJob:
        tj = job.spec
        demand = self._demand(tj)
        pools = frozenset(job.pools.split(",")) if job.pools else None
        if job.pools == "-":
            pools = frozenset()
        return EngineJob(
            id=job.id,
            queue=job.queue,
            priority=job.priority,
            submit_time=job.submitted_ms / 1000,
            workers=(demand,) * tj.spec.replicas,
            features=self._features(job),
            min_workers=tj.spec.min_replicas or 0,
            topology=tj.spec.topology.value,
            pools=pools,
        )

    def submit(
        self,
        spec_yaml: str,
        *,
        owner: str,
        roles: Sequence[str],
        request_id: str = "",
        dry_run: bool = False,
    ) -> tuple[JobRow, bool]:
        """Validate and queue a job; a repeated ``request_id`` returns the first job."""
        tj = parse_job(spec_yaml)
        request_id = request_id or tj.metadata.request_id
        if request_id:
            existing = self._by_request(owner, request_id)
            if existing is not None:
                return existing, True
        if tj.metadata.queue not in self.queues.queues:
            known = ", ".join(sorted(self.queues.queues)) or "none"
            raise InvalidInput(
                f"metadata.queue: there is no queue {tj.metadata.queue!r}",
                hint=f"known queues: {known} (an admin creates one with gantry queues set-quota)",
            )
        self._check_models(tj)
        pools, pool_reason = self._pools_for(tj)
        now_ms = _now_ms()
        job = JobRow(
            id="j-" + new_id().replace("-", "")[-12:],
            name=tj.metadata.name,
            queue=tj.metadata.queue,
            owner=owner,
            owner_roles=list(roles),
            priority=tj.metadata.priority_value,
            state="pending",
            reason="queued" + (f"; {pool_reason}" if pool_reason else ""),
            spec_yaml=spec_yaml,
            request_id=request_id,
            submitted_ms=now_ms,
            pending_since_ms=now_ms,
            pools=",".join(sorted(pools)) if pools else ("-" if pools is not None else ""),
            _spec=tj,
        )
        ej = self._engine_job(job)
        if self.engine is not None:
            why = self.engine.never_fits(ej)
            if why:
                raise InvalidInput(
                    f"the job can never run here: {why}",
                    hint="ask for fewer or smaller workers, or other GPU models; "
                    "see gantry nodes list",
                )
        else:
            job.reason = "queued; no node has registered yet"
        job.predicted_s = self.predictor.predict(ej.features)
        if dry_run:
            return job, False
        with self.db.begin() as conn:
            conn.execute(store.jobs.insert(), job.values())
            self._history(conn, job, "")
            self._emit(
                conn,
                "gantry.job.submitted",
                JobSubmitted(
                    job_id=job.id,
                    name=job.name,
                    queue=job.queue,
                    owner=owner,
                    priority=job.priority,
                    replicas=tj.spec.replicas,
                    min_replicas=tj.spec.min_replicas or tj.spec.replicas,
                    gpu_milli=tj.spec.resources.milli_gpus,
                    request_id=request_id,
                ),
                job.id,
                actor=owner,
            )
        self.jobs[job.id] = job
        self._recent.extend(ej.workers)
        del self._recent[:-4000]
        if self.engine is not None:
            self.engine.submit(ej)
        self._notify(job)
        return job, False

    def _check_models(self, tj: TrainingJob) -> None:
        wanted = set(tj.spec.resources.gpu_models)
        if not wanted or not self.nodes:
            return
        known = {g.model for n in self.nodes.values() for g in n.inventory.gpus}
        unknown = sorted(wanted - known)
        if unknown and not (wanted & known):
            raise InvalidInput(
                f"spec.resources.gpuModels: no node has {', '.join(unknown)}",
                hint=f"GPU models in this cluster: {', '.join(sorted(known)) or 'none'}",
            )

    def _by_request(self, owner: str, request_id: str) -> JobRow | None:
        with self.db.connect() as conn:
            row = conn.execute(
                sa.select(store.jobs).where(
                    store.jobs.c.owner == owner, store.jobs.c.request_id == request_id
                )
            ).first()
        if row is None:
            return None
        return self.jobs.get(row.id) or JobRow.from_row(row)

    def cancel(self, job_id: str, *, actor: str, reason: str = "") -> JobRow:
        """Cancel a job: at once when pending, else by asking its workers to stop."""
        job = self.get(job_id)
        if job.state in TERMINAL:
            raise Conflict(f"job {job.id} is already {job.state}", hint="nothing to cancel")
        why = f"cancelled by {actor}" + (f": {reason}" if reason else "")
        if job.state == "pending":
            self._finish(job, "cancelled", why, actor=actor)
        elif job.state == "stopping" and job.stop_ranks:
            # a shrink stops some ranks only: stop them all now
            self._request_stop(job, "cancelled", [], why)
        elif job.state == "stopping":
            job.stop_reason = "cancelled"
            self._save(job, why, state_event=False)
        else:
            self._request_stop(job, "cancelled", [], why)
        return job

    # ------------------------------------------------------------------ the pass

    def schedule(self) -> int:
        """One scheduling pass plus timeouts; returns the number of decisions."""
        now = self.clock()
        self._check_timeouts(now)
        self._flush_progress()
        if self.engine is None:
            return 0
        decisions = self.engine.schedule(now)
        for decision in decisions:
            job = self.jobs.get(decision.job)
            if job is None:
                continue
            if isinstance(decision, Start):
                self._started(job, decision)
            else:
                self._stop_decided(job, decision)
        for job in list(self.jobs.values()):
            ej = self.engine.jobs.get(job.id)
            if job.state == "pending" and ej is not None and ej.reason and ej.reason != job.reason:
                job.reason = ej.reason
                with self.db.begin() as conn:
                    conn.execute(
                        store.jobs.update()
                        .where(store.jobs.c.id == job.id)
                        .values(reason=job.reason)
                    )
                self._notify(job)
        self.decisions += len(decisions)
        return len(decisions)

    def _started(self, job: JobRow, start: Start) -> None:
        assert self.engine is not None
        names = self.engine.cluster.names
        job.attempt += 1
        job.workers = len(start.slots)
        job.placements = [
            {
                "worker": rank,
                "node": names[node],
                "gpus": [list(g) for g in gpus],
                "cpu_milli": demand.cpu_milli,
                "memory_mib": demand.memory_mib,
            }
            for rank, (node, demand, gpus) in enumerate(start.slots)
        ]
        job.reports = {}
        job.state = "scheduled"
        job.stop_reason = ""
        job.stop_ranks = []
        job.attempt_restarts = 0
        now_ms = _now_ms()
        job.attempt_start_ms = now_ms
        job.deadline_ms = now_ms + int(self.options.gang_timeout_s * 1000)
        tj = job.spec
        event = JobScheduled(
            job_id=job.id,
            owner=job.owner,
            owner_roles=job.owner_roles,
            nodes=job.nodes_of(),
            datasets=[
                DatasetUse(dataset=d.dataset, version=d.version, view=d.view) for d in tj.spec.data
            ],
            name=job.name,
            queue=job.queue,
            attempt=job.attempt,
            placements=[
                WorkerPlacement(
                    worker=p["worker"],
                    node=p["node"],
                    gpus=[(int(i), int(m)) for i, m in p["gpus"]],
                    cpu_milli=p["cpu_milli"],
                    memory_mib=p["memory_mib"],
                )
                for p in job.placements
            ],
            spec=tj.spec.model_dump(mode="json", by_alias=True),
            # resume only when an earlier attempt ran (a gang that never started has no state)
            resume=start.resume and bool(job.started_ms or job.checkpoint_ms),
            master_addr=master_addr(job.placements, self._node_address),
            master_port=master_port(job.id, job.attempt),
        )
        reason = f"placed {job.workers} worker(s) on {', '.join(job.nodes_of())}" + (
            " (resuming from its last checkpoint)" if event.resume else ""
        )
        job.reason = reason
        with self.db.begin() as conn:
            self._write(conn, job)
            self._history(conn, job, "pending")
            self._emit(conn, "gantry.job.scheduled", event, job.id)
            self._emit_state(conn, job, "pending")
        if self.launcher is not None:
            self.launcher(job, start)
        self._notify(job)

    def _stop_decided(self, job: JobRow, stop: Stop) -> None:
        ranks = list(stop.workers)
        why = {
            "preempted": f"preempted for {stop.for_job}; checkpointing, then requeued",
            "shrink": f"shrinking to free GPUs for {stop.for_job}",
            "resize": "restarting bigger: capacity freed up",
        }[stop.reason]
        if stop.reason == "preempted":
            job.preempted_ms = _now_ms()
        self._request_stop(job, stop.reason, ranks, why)

    def _request_stop(self, job: JobRow, reason: str, ranks: list[int], why: str) -> None:
        previous = job.state
        job.state = "stopping"
        job.stop_reason = reason
        job.stop_ranks = ranks
        job.reason = why
        grace = self.options.stop_grace_s
        job.deadline_ms = _now_ms() + int((grace + STOP_SLACK_S) * 1000)
        if self.engine is not None and job.id in self.engine.jobs:
            self.engine.jobs[job.id].state = "stopping"
        with self.db.begin() as conn:
            self._write(conn, job)
            self._history(conn, job, previous)
            self._emit(
                conn,
                "gantry.job.stop.requested",
                JobStopRequested(
                    job_id=job.id,
                    attempt=max(job.attempt, 1),
                    reason=reason,  # type: ignore[arg-type]
                    nodes=job.nodes_of(ranks or None),
                    workers=ranks,
                    grace_s=grace,
                ),
                job.id,
            )
            self._emit_state(conn, job, previous)
        if self.stopper is not None:
            self.stopper(job, ranks)
        self._notify(job)

    # ------------------------------------------------------------------ reports from agents

    def worker_report(
        self,
        job_id: str,
        attempt: int,
        node: str,
        workers: Sequence[int],
        status: str,
        *,
        exit_code: int = 0,
        message: str = "",
        step: int = 0,
        restarts: int = 0,
        model: str = "",
        metrics: Mapping[str, float] | None = None,
        dataset_version: str = "",
    ) -> None:
        """A node agent's report on some of a job's workers (see the module docstring).

        ``step`` and ``restarts`` come with "restarted" (the checkpoint's step, the agent's
        count in this attempt); ``model``, ``metrics`` and ``dataset_version`` with
        "succeeded" (the model version registered, rank 0's metrics, the dataset version
        committed): kept with the job, and in the succeeded state's event.
        """
        job = self.jobs.get(job_id)
        if job is None or attempt != job.attempt or job.state == "pending":
            return  # an older attempt, a finished job, or a duplicate: nothing to do
        ranks = list(workers) or [p["worker"] for p in job.placements if p["node"] == node]
        ranks = [r for r in ranks if r in job.live_ranks]
        if not ranks and status != "checkpointed":
            return  # ranks a shrink already released, or not of this attempt's placement
        if status == "checkpointed":
            job.checkpoint_ms = _now_ms()
            if self.engine is not None:
                self.engine.checkpointed(job.id, self.clock())
            self._save(job, job.reason, state_event=False, notify=False)
            return
        if status == "restarted":
            self._restarted(job, node, ranks, step, restarts, message)
            return
        for rank in ranks:
            job.reports[str(rank)] = status
        if status == "succeeded":
            job.model = model or job.model
            job.dataset_version = dataset_version or job.dataset_version
            finite = {k: float(v) for k, v in (metrics or {}).items() if math.isfinite(v)}
            job.metrics = finite or job.metrics
        live = [str(r) for r in job.live_ranks]
        if status == "failed":
            detail = f"worker(s) {ranks} on {node} failed (exit {exit_code})" + (
                f": {message}" if message else ""
            )
            # ranks still starting (no report yet) must stop too, not only the started ones
            others = [r for r in job.live_ranks if job.reports.get(str(r)) not in ENDED]
            if others:
                self._tell_to_stop(job, "failed", job.nodes_of(others), workers=others)
            self._finish(job, "failed", detail)
            return
        if status == "started":
            self._maybe_running(job)
            return
        if job.state == "stopping":
            targets = [str(r) for r in (job.stop_ranks or job.live_ranks)]
            if all(job.reports.get(r) in ENDED for r in targets):
                self._stop_completed(job)
            else:
                self._save(job, job.reason, state_event=False, notify=False)
            return
        if status == "succeeded":
            if all(job.reports.get(r) == "succeeded" for r in live):
                self._finish(job, "succeeded", "all workers finished")
            else:
                self._save(job, job.reason, state_event=False, notify=False)
            return
        if status == "stopped":  # stopped without being asked: the agent is going away
            rest = [n for n in job.nodes_of() if n != node]
            if rest:  # the rest of the gang cannot go on without these ranks
                self._tell_to_stop(job, "node-lost", rest)
            job.reason = f"worker(s) {ranks} on {node} stopped" + (
                f": {message}" if message else " without a stop request"
            )
            job.stop_reason = "node-lost"
            job.state = "stopping"
            self._stop_completed(job)

    def _maybe_running(self, job: JobRow) -> None:
        """Save a report of ranks coming up; the job runs once every rank is up."""
        live = [str(r) for r in job.live_ranks]
        if job.state == "scheduled" and all(job.reports.get(r) in UP for r in live):
            previous = job.state
            job.state = "running"
            job.reason = f"{job.workers} worker(s) running"
            if not job.started_ms:
                job.started_ms = _now_ms()
            job.deadline_ms = 0
            self._save(job, job.reason, previous=previous)
        else:
            self._save(job, job.reason, state_event=False, notify=False)

    def _restarted(
        self, job: JobRow, node: str, ranks: list[int], step: int, restarts: int, message: str
    ) -> None:
        """An agent restarted crashed workers from their last checkpoint: the job goes on.

        The agent counts its restarts in the attempt; a count not above the one kept is a
        redelivery (or another node's report of the same restart) and changes nothing.
        """
        count = max(restarts, 1)
        if count <= job.attempt_restarts:
            return
        job.restarts += count - job.attempt_restarts
        job.attempt_restarts = count
        why = (
            f"worker(s) {ranks} on {node} restarted from step {step} "
            f"(restart {count} of attempt {job.attempt})" + (f": {message}" if message else "")
        )
        for rank in ranks:
            if job.reports.get(str(rank)) not in ENDED:
                job.reports[str(rank)] = "started"  # up again
        if job.state == "running":
            self._save(job, why, previous="running")  # a line in its history and a state event
        elif job.state == "scheduled":
            self._maybe_running(job)
        else:  # stopping: the stop's reason stays the job's reason
            self._save(job, job.reason, state_event=False)
        self.add_logs(job.id, node, min(ranks, default=0), "gantry", [why])

    def _stop_completed(self, job: JobRow) -> None:
        reason = job.stop_reason
        if reason == "shrink":
            ranks = set(job.stop_ranks)
            if self.engine is not None:
                self.engine.release_workers(job.id, ranks, self.clock())
            self._record_usage_part(job, ranks)
            job.placements = [p for p in job.placements if p["worker"] not in ranks]
            job.workers = len(job.placements)
            job.stop_ranks = []
            job.stop_reason = ""
            job.state = "running"
            if self._all_succeeded(job):  # the kept ranks finished while the others stopped
                self._finish(job, "succeeded", "all workers finished")
                return
            self._save(job, f"shrunk to {job.workers} worker(s)", previous="stopping")
            return
        if self._all_succeeded(job):  # it finished before the stop reached it
            self._finish(job, "succeeded", "all workers finished (before the stop took effect)")
            return
        if reason == "cancelled":
            self._finish(job, "cancelled", job.reason)
        elif reason == "max-runtime":
            self._finish(job, "failed", "exceeded its maxRuntime and was stopped")
        else:
            self._requeue(job, job.reason)

    def _all_succeeded(self, job: JobRow) -> bool:
        return bool(job.placements) and all(
            job.reports.get(str(r)) == "succeeded" for r in job.live_ranks
        )

    def _requeue(self, job: JobRow, why: str) -> None:
        now_ms = _now_ms()
        previous = job.state
        usage = self._usage_event(job, now_ms)
        job.run_s += max(now_ms - job.attempt_start_ms, 0) / 1000 if job.started_ms else 0.0
        if self.engine is not None and job.id in self.engine.jobs:
            ej = self.engine.requeue(job.id, self.clock())
            if job.stop_reason == "preempted":
                ej.preempted_at = self.clock()
        job.state = "pending"
        job.placements = []
        job.workers = 0
        job.reports = {}
        job.stop_reason = ""
        job.stop_ranks = []
        job.deadline_ms = 0
        job.pending_since_ms = now_ms
        job.reason = f"requeued ({why}); resumes from its last checkpoint"
        with self.db.begin() as conn:
            self._write(conn, job)
            self._history(conn, job, previous)
            if usage is not None:
                self._usage_row(conn, usage)
            self._emit_state(conn, job, previous)
        self._notify(job)

    def _finish(self, job: JobRow, state: str, why: str, *, actor: str = ACTOR) -> None:
        now_ms = _now_ms()
        previous = job.state
        usage = self._usage_event(job, now_ms) if previous != "pending" else None
        if job.started_ms and previous in ("running", "stopping", "scheduled"):
            job.run_s += max(now_ms - job.attempt_start_ms, 0) / 1000
        if self.engine is not None and job.id in self.engine.jobs:
            self.engine.finish(job.id, runtime_s=job.run_s if state == "succeeded" else None)
        job.state = state
        job.reason = why
        job.finished_ms = now_ms
        job.deadline_ms = 0
        with self.db.begin() as conn:
            self._write(conn, job)
            self._history(conn, job, previous)
            if usage is not None:
                self._usage_row(conn, usage)
            self._emit_state(conn, job, previous, actor=actor)
        self.jobs.pop(job.id, None)
        self._progress_saves.forget(job.id)
        self._notify(job)

    # ------------------------------------------------------------------ usage

    def _usage_event(
        self, job: JobRow, now_ms: int, ranks: set[int] | None = None
    ) -> JobUsage | None:
        if not job.attempt or not job.placements:
            return None
        run_s = max(now_ms - job.attempt_start_ms, 0) / 1000
        placed = [p for p in job.placements if ranks is None or p["worker"] in ranks]
        gpu_milli = sum(sum(int(m) for _, m in p["gpus"]) for p in placed)
        cpu_milli = sum(int(p["cpu_milli"]) for p in placed)
        queueing = max(job.attempt_start_ms - job.pending_since_ms, 0) / 1000
        return JobUsage(
            job_id=job.id,
            owner=job.owner,
            queue=job.queue,
            pools=sorted({self.nodes[p["node"]].pool for p in placed if p["node"] in self.nodes}),
            attempt=job.attempt,
            gpu_seconds=run_s * gpu_milli / 1000,
            cpu_seconds=run_s * cpu_milli / 1000,
            queueing_s=queueing if ranks is None else 0.0,
            run_s=run_s,
        )

    def _record_usage_part(self, job: JobRow, ranks: set[int]) -> None:
        """Usage of the ranks a shrink released (the rest is counted when the attempt ends)."""
        usage = self._usage_event(job, _now_ms(), ranks)
        if usage is None:
            return
        with self.db.begin() as conn:
            conn.execute(
                store.usage.insert().values(
                    job_id=job.id,
                    attempt=-job.attempt * 1000 - min(ranks),  # a partial record of the attempt
                    owner=usage.owner,
                    queue=usage.queue,
                    pools=",".join(usage.pools),
                    at_ms=_now_ms(),
                    gpu_seconds=usage.gpu_seconds,
                    cpu_seconds=usage.cpu_seconds,
                    queueing_s=0.0,
                    run_s=usage.run_s,
                )
            )

    def _usage_row(self, conn: sa.Connection, usage: JobUsage) -> None:
        exists = conn.execute(
            sa.select(store.usage.c.id).where(
                store.usage.c.job_id == usage.job_id, store.usage.c.attempt == usage.attempt
            )
        ).first()
        if exists is not None:
            return
        conn.execute(
            store.usage.insert().values(
                job_id=usage.job_id,
                attempt=usage.attempt,
                owner=usage.owner,
                queue=usage.queue,
                pools=",".join(usage.pools),
                at_ms=_now_ms(),
                gpu_seconds=usage.gpu_seconds,
                cpu_seconds=usage.cpu_seconds,
                queueing_s=usage.queueing_s,
                run_s=usage.run_s,
            )
        )
        self._emit(conn, "gantry.job.usage", usage, usage.job_id)

    def usage(self, group_by: str, since_ms: int, until_ms: int) -> list[dict[str, Any]]:
        """GPU-hours, CPU-hours, queueing hours and jobs per user, queue or pool."""
        if group_by not in ("user", "queue", "pool"):
            raise InvalidInput(f"cannot group usage by {group_by!r}", hint="user, queue or pool")
        until_ms = until_ms or _now_ms() + 1
        with self.db.connect() as conn:
            rows = conn.execute(
                sa.select(store.usage).where(
                    store.usage.c.at_ms >= since_ms, store.usage.c.at_ms < until_ms
                )
            ).all()
        out: dict[str, dict[str, Any]] = {}
        for r in rows:
            keys = (
                [r.owner]
                if group_by == "user"
                else [r.queue]
                if group_by == "queue"
                else (r.pools.split(",") if r.pools else ["(none)"])
            )
            for key in keys:
                acc = out.setdefault(
                    key, {"key": key, "gpu_h": 0.0, "cpu_h": 0.0, "queue_h": 0.0, "jobs": set()}
                )
                share = 1 / len(keys)
                acc["gpu_h"] += r.gpu_seconds * share / 3600
                acc["cpu_h"] += r.cpu_seconds * share / 3600
                acc["queue_h"] += r.queueing_s * share / 3600
                acc["jobs"].add(r.job_id)
        return [
            {**acc, "jobs": len(acc["jobs"])}
            for acc in sorted(out.values(), key=lambda a: (-a["gpu_h"], a["key"]))
        ]

    # ------------------------------------------------------------------ timeouts

    def _check_timeouts(self, now: float) -> None:
        now_ms = int(now * 1000)
        for node in list(self.nodes.values()):
            if node.state == "lost":
                continue
            if now_ms - node.last_seen_ms > self.options.heartbeat_timeout_s * 1000:
                self._node_lost(node, now_ms)
        for job in list(self.jobs.values()):
            if job.state == "running":
                ran_ms = job.run_s * 1000 + now_ms - job.attempt_start_ms
                if ran_ms > job.spec.spec.max_runtime_s * 1000:
                    self._request_stop(job, "max-runtime", [], "exceeded its maxRuntime")
                continue
            if not job.deadline_ms or now_ms < job.deadline_ms:
                continue
            if job.state == "scheduled":
                missing = [r for r in job.live_ranks if job.reports.get(str(r)) not in UP]
                self._tell_to_stop(job, "gang-timeout", job.nodes_of())
                job.stop_reason = "gang-timeout"
                self._requeue(
                    job,
                    f"gang timeout: worker(s) {missing} did not start within "
                    f"{self.options.gang_timeout_s:g} s",
                )
            elif job.state == "stopping":
                _log.warning("stop not confirmed in time; taking it as done", job=job.id)
                self._stop_completed(job)

    # ------------------------------------------------------------------ nodes

    def node_registered(self, data: NodeRegistered) -> None:
        """A node agent registered (or re-registered after a restart or a loss)."""
        now_ms = _now_ms()
        old = self.nodes.get(data.node)
        state = old.state if old is not None and old.state == "degraded" else "ready"
        reason = old.reason if old is not None and state == "degraded" else ""
        row = NodeRow(data.node, data.pool, data, state, reason, now_ms, now_ms)
        if old is not None and old.inventory == data and old.state == state:
            old.last_seen_ms = now_ms
            return
        with self.db.begin() as conn:
            conn.execute(sa.delete(store.nodes).where(store.nodes.c.name == data.node))
            conn.execute(
                store.nodes.insert().values(
                    name=data.node,
                    pool=data.pool,
                    inventory=orjson.dumps(data.model_dump(mode="json")).decode(),
                    state=state,
                    reason=reason,
                    last_seen_ms=now_ms,
                    registered_ms=now_ms,
                )
            )
        self.nodes[data.node] = row
        # a new address alone (the same agent boot) leaves its workers running where they are
        before = None if old is None else old.inventory.model_copy(update={"address": data.address})
        if before is not None and before != data:
            why = (
                f"the node agent on {data.node} restarted; the workers it ran are gone"
                if before.model_copy(update={"agent": data.agent}) == data
                else f"node {data.node} re-registered with another inventory"
            )
            for job_id in self._jobs_on(data.node):  # its work is gone or no longer fits
                job = self.jobs[job_id]
                survivors = [n for n in job.nodes_of() if n != data.node]
                if survivors:
                    self._tell_to_stop(job, "node-lost", survivors)
                job.stop_reason = "node-lost"
                self._requeue(job, why)
        self._rebuild_cluster()
        _log.info("node registered", node=data.node, pool=data.pool, gpus=len(data.gpus))

    def heartbeat(self, node: str) -> None:
        """A node agent is alive."""
        row = self.nodes.get(node)
        if row is None:
            return  # unknown until it registers
        row.last_seen_ms = _now_ms()
        if row.state == "lost":  # it was only silent (a stall, a partition): take it back
            self.node_registered(row.inventory)

    def node_health(self, node: str, degraded: bool, reason: str) -> None:
        """The profiler marked a node degraded (avoid it for new work) or recovered."""
        row = self.nodes.get(node)
        if row is None or row.state == "lost":
            return
        row.state = "degraded" if degraded else "ready"
        row.reason = reason if degraded else ""
        with self.db.begin() as conn:
            conn.execute(
                store.nodes.update()
                .where(store.nodes.c.name == node)
                .values(state=row.state, reason=row.reason)
            )
        if self.engine is not None:
            self.engine.set_schedulable(node, not degraded)

    def rendezvous(self, job: JobRow) -> str:
        """``host:port`` where the running attempt's rank 0 listens ("" when not placed): the
        port a worker gets as ``MASTER_PORT`` (a dev session's server listens there)."""
        if job.state not in ("scheduled", "running") or not job.placements:
            return ""
        rank0 = min(job.placements, key=lambda p: int(p.get("worker", 0)))["node"]
        host = self._node_address(rank0) or rank0
        return f"{host}:{worker_port(job.id, job.attempt, job.attempt_restarts)}"

    def _node_address(self, node: str) -> str:
        row = self.nodes.get(node)
        return row.inventory.address if row is not None else ""

    def _jobs_on(self, node: str) -> list[str]:
        return sorted(
            j.id
            for j in self.jobs.values()
            if j.state in ("scheduled", "running", "stopping")
            and any(p["node"] == node for p in j.placements)
        )

    def _node_lost(self, node: NodeRow, now_ms: int) -> None:
        node.state = "lost"
        node.reason = f"no heartbeat for {self.options.heartbeat_timeout_s:g} s"
        if self.engine is not None:
            self.engine.set_schedulable(node.name, False)
        requeued = self._jobs_on(node.name)
        with self.db.begin() as conn:
            conn.execute(
                store.nodes.update()
                .where(store.nodes.c.name == node.name)
                .values(state="lost", reason=node.reason, last_seen_ms=node.last_seen_ms)
            )
            self._emit(
                conn,
                "gantry.node.lost",
                NodeLost(node=node.name, last_seen_ms=node.last_seen_ms, requeued=requeued),
                node.name,
            )
        _log.warning("node lost", node=node.name, requeued=requeued)
        for job_id in requeued:
            job = self.jobs[job_id]
            # the lost node too: if it was only cut off, its agent reads this when it is back
            # and stops the requeued attempt instead of running it next to the new one
            self._tell_to_stop(job, "node-lost", job.nodes_of())
            job.stop_reason = "node-lost"
            self._requeue(job, f"node {node.name} was lost")
        self.queues.capacity = self._capacity()

    # ------------------------------------------------------------------ queues and data

    def set_quota(self, config: QueueConfig, *, actor: str) -> QueueConfig:
        """Create a queue or change its quota (running jobs keep running)."""
        with self.db.begin() as conn:
            conn.execute(sa.delete(store.queues).where(store.queues.c.name == config.name))
            conn.execute(store.queues.insert().values(**_queue_values(config)))
            self._emit(
                conn,
                "gantry.job.queue.changed",
                QueueChanged(
                    queue=config.name,
                    cohort=config.cohort,
                    quota={
                        "gpus": config.quota.gpu_milli / 1000,
                        "cpus": config.quota.cpu_milli / 1000,
                        "memory_mib": float(config.quota.memory_mib),
                    },
                    weight=config.weight,
                ),
                config.name,
                actor=actor,
            )
        self.queues.set_queue(config)
        return config

    def dataset_classified(self, dataset: str, sensitivity: str) -> None:
        """Governance told us a dataset's classification."""
        self.sensitivity.observe(dataset, sensitivity)
        with self.db.begin() as conn:
            conn.execute(sa.delete(store.datasets).where(store.datasets.c.name == dataset))
            conn.execute(store.datasets.insert().values(name=dataset, sensitivity=sensitivity))

    # ------------------------------------------------------------------ progress

    def job_progress(self, event: JobProgress) -> bool:
        """The training reported how far it is; True when the job shows it now.

        Progress of another attempt than the current one (a gang being replaced), of a job not
        placed, or older than what is kept, is ignored. The job's row is written at most once
        per :data:`~gantry.scheduler.progress.SAVE_INTERVAL_MS`; watchers see every update.
        """
        job = self.jobs.get(event.job_id)
        if job is None or event.attempt != job.attempt or job.state not in PLACED:
            return False
        now_ms = _now_ms()
        record = progress_record(event, now_ms)
        if not supersedes(record, job.progress):
            return False
        job.progress = record  # a new dict: snapshots handed to watchers keep the old one
        if self._progress_saves.changed(job.id, now_ms):
            self._save_progress(job, now_ms)
        self._notify(job)
        return True

    def _save_progress(self, job: JobRow, now_ms: int) -> None:
        with self.db.begin() as conn:
            conn.execute(
                store.jobs.update()
                .where(store.jobs.c.id == job.id)
                .values(progress=orjson.dumps(job.progress).decode())
            )
        self._progress_saves.written(job.id, now_ms)

    def _flush_progress(self) -> None:
        """Write the progress that waited for its interval (from each scheduling pass)."""
        now_ms = _now_ms()
        for job_id in self._progress_saves.due(now_ms):
            job = self.jobs.get(job_id)
            if job is None:
                self._progress_saves.forget(job_id)
            else:
                self._save_progress(job, now_ms)

    # ------------------------------------------------------------------ logs

    def add_logs(
        self,
        job_id: str,
        node: str,
        worker: int,
        stream: str,
        lines: Sequence[str],
        *,
        event_id: str = "",
    ) -> None:
        """Keep a worker's log lines (bounded per job); a redelivered batch is kept once."""
        if not lines:
            return
        at = _now_ms()
        with self.db.begin() as conn:
            if event_id and not _LOG_INBOX.claim(conn, event_id):
                return
            conn.execute(
                store.logs.insert(),
                [
                    {
                        "job_id": job_id,
                        "at_ms": at,
                        "node": node,
                        "worker": worker,
                        "stream": stream,
                        "text": line[:8192],
                    }
                    for line in lines
                ],
            )
            count = conn.execute(
                sa.select(sa.func.count()).where(store.logs.c.job_id == job_id)
            ).scalar_one()
            excess = count - self.options.max_log_lines
            if excess > 0:
                cutoff = conn.execute(
                    sa.select(store.logs.c.id)
                    .where(store.logs.c.job_id == job_id)
                    .order_by(store.logs.c.id)
                    .offset(excess - 1)
                    .limit(1)
                ).scalar_one()
                conn.execute(
                    sa.delete(store.logs).where(
                        store.logs.c.job_id == job_id, store.logs.c.id <= cutoff
                    )
                )
        for listener in list(self.log_listeners):
            listener(job_id)

    def logs(self, job_id: str, *, after_id: int = 0, tail: int = 0) -> list[sa.Row[Any]]:
        """Log lines of a job after ``after_id`` (the last ``tail`` when given)."""
        query = sa.select(store.logs).where(
            store.logs.c.job_id == job_id, store.logs.c.id > after_id
        )
        with self.db.connect() as conn:
            if tail:
                rows = conn.execute(query.order_by(store.logs.c.id.desc()).limit(tail)).all()
                return list(reversed(rows))
            return list(conn.execute(query.order_by(store.logs.c.id).limit(10_000)).all())

    # ------------------------------------------------------------------ queries

    def get(self, job_id: str) -> JobRow:
        """A job by id, or the newest job with that name."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job
        with self.db.connect() as conn:
            row = conn.execute(sa.select(store.jobs).where(store.jobs.c.id == job_id)).first()
            if row is None:
                row = conn.execute(
                    sa.select(store.jobs)
                    .where(store.jobs.c.name == job_id)
                    .order_by(store.jobs.c.submitted_ms.desc())
                    .limit(1)
                ).first()
        if row is None:
            raise NotFound("job", job_id, hint="see gantry jobs list")
        return self.jobs.get(row.id) or JobRow.from_row(row)

    def history(self, job_id: str) -> list[sa.Row[Any]]:
        """The job's state changes, oldest first."""
        with self.db.connect() as conn:
            return list(
                conn.execute(
                    sa.select(store.job_history)
                    .where(store.job_history.c.job_id == job_id)
                    .order_by(store.job_history.c.id)
                ).all()
            )

    def list(
        self, *, queue: str = "", state: str = "", owner: str = "", limit: int = 100
    ) -> list[JobRow]:
        """Jobs, newest first."""
        query = sa.select(store.jobs).order_by(store.jobs.c.submitted_ms.desc()).limit(limit)
        if queue:
            query = query.where(store.jobs.c.queue == queue)
        if owner:
            query = query.where(store.jobs.c.owner == owner)
        if state == "active":
            query = query.where(store.jobs.c.state.in_(ACTIVE))
        elif state:
            query = query.where(store.jobs.c.state == state)
        with self.db.connect() as conn:
            rows = conn.execute(query).all()
        return [self.jobs.get(r.id) or JobRow.from_row(r) for r in rows]

    def predicted(self, job: JobRow) -> float:
        """The predicted run time of a job, in seconds."""
        try:
            return self.predictor.predict(self._features(job))
        except InvalidInput:
            return math.nan

    # ------------------------------------------------------------------ plumbing

    def _write(self, conn: sa.Connection, job: JobRow) -> None:
        values = job.values()
        values["b_id"] = values.pop("id")
        conn.execute(_UPDATE_JOB, values)
        self._progress_saves.written(job.id, _now_ms())  # its progress went with the row

    def _save(
        self,
        job: JobRow,
        reason: str,
        *,
        previous: str = "",
        state_event: bool = True,
        notify: bool = True,
    ) -> None:
        job.reason = reason
        with self.db.begin() as conn:
            self._write(conn, job)
            if state_event:
                self._history(conn, job, previous)
                self._emit_state(conn, job, previous)
        if notify:
            self._notify(job)

    def _history(self, conn: sa.Connection, job: JobRow, previous: str) -> None:
        del previous
        conn.execute(
            store.job_history.insert(),
            {
                "job_id": job.id,
                "at_ms": _now_ms(),
                "state": job.state,
                "reason": job.reason,
                "attempt": job.attempt,
            },
        )

    def _emit_state(
        self, conn: sa.Connection, job: JobRow, previous: str, *, actor: str = ACTOR
    ) -> None:
        made = job.state == "succeeded"  # what a job made travels with its success
        self._emit(
            conn,
            "gantry.job.state",
            JobStateChanged(
                job_id=job.id,
                state=job.state,
                previous=previous,
                reason=job.reason,
                attempt=job.attempt,
                model=job.model if made else "",
                metrics=job.metrics if made else {},
                dataset_version=job.dataset_version if made else "",
            ),
            job.id,
            actor=actor,
        )

    def _emit(
        self, conn: sa.Connection, type_: str, data: BaseModel, subject: str, *, actor: str = ACTOR
    ) -> None:
        _OUTBOX.add(
            conn,
            EventEnvelope(
                type=type_,
                source=SOURCE,
                actor=actor or "anonymous",
                subject=subject,
                data=data.model_dump(mode="json"),
            ),
        )

    def _tell_to_stop(
        self, job: JobRow, reason: str, nodes: Sequence[str], *, workers: Sequence[int] = ()
    ) -> None:
        """Ask the agents on ``nodes`` to stop the job's current attempt (its ranks
        ``workers``, or all), without a state change of its own."""
        data = JobStopRequested(
            job_id=job.id,
            attempt=job.attempt,
            reason=reason,  # type: ignore[arg-type]
            nodes=[*nodes],
            workers=list(workers),
            grace_s=self.options.stop_grace_s,
        )
        with self.db.begin() as conn:
            self._emit(conn, "gantry.job.stop.requested", data, job.id)

    def _notify(self, job: JobRow) -> None:
        for listener in list(self.listeners):
            listener(job)


def _queue_values(config: QueueConfig) -> dict[str, Any]:
    q, b = config.quota, config.borrowing_limit
    return {
        "name": config.name,
        "cohort": config.cohort,
        "quota": orjson.dumps([q.gpu_milli, q.cpu_milli, q.memory_mib]).decode(),
        "borrowing_limit": orjson.dumps([b.gpu_milli, b.cpu_milli, b.memory_mib]).decode(),
        "weight": config.weight,
    }


def _queue_config(row: sa.Row[Any]) -> QueueConfig:
    q = orjson.loads(row.quota)
    b = orjson.loads(row.borrowing_limit)
    return QueueConfig(row.name, Amount(*q), row.cohort, Amount(*b), row.weight)


__all__ = ["ACTIVE", "SOURCE", "TERMINAL", "Control", "JobRow", "NodeRow"]
