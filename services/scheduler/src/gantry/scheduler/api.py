"""The scheduler's gRPC API (handler): jobs, nodes, queues and usage.

Every method is mapped to an RBAC action in :data:`METHOD_RULES` (the interceptor checks it).
Cancelling or reading the logs of someone else's job needs ``update job`` on top (platform
admins). Every domain call runs on the control thread (:class:`ControlThread`), so the engine
is only ever touched by one thread; watch and log streams are fed by listeners the control
thread calls after each committed change.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from gantry.core import InvalidInput, PermissionDenied, get_logger
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.sched import QueueConfig
from gantry.sched.queues import UNLIMITED, Amount
from gantry.sched.spec import Metadata
from gantry.scheduler.control import TERMINAL, Control, JobRow
from gantry.security import Authorizer, MethodRule, Principal, current_principal
from gantry.security.rpc_errors import rpc_errors, stream_rpc_errors

SERVICE = "gantry.scheduler.v1.SchedulerService"
_log = get_logger("gantry.scheduler.api")
T = TypeVar("T")
#: Changes a slow watcher may fall behind by before it is cut off (it can reconnect).
WATCH_BUFFER = 1000

METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/{name}": MethodRule(action, kind)
    for name, (action, kind) in {
        "SubmitJob": ("create", "job"),
        "GetJob": ("read", "job"),
        "ListJobs": ("list", "job"),
        "CancelJob": ("cancel", "job"),
        "WatchJobs": ("watch", "job"),
        "JobLogs": ("logs", "job"),
        "ListNodes": ("list", "node"),
        "ListQueues": ("list", "queue"),
        "SetQuota": ("update", "queue"),
        "Usage": ("read", "usage"),
    }.items()
}


class ControlThread:
    """Runs :class:`Control` methods on one dedicated thread."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sched-control")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the control thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def submit(self, fn: Callable[[], None]) -> object:
        """Queue ``fn()`` on the control thread from any thread (fire and forget)."""
        return self._pool.submit(fn)

    def shutdown(self) -> None:
        """Finish queued calls and stop the thread."""
        self._pool.shutdown(wait=True)


def job_pb(
    job: JobRow,
    *,
    history: list[Any] | None = None,
    predicted: float = 0.0,
    rendezvous: str = "",
) -> pb.Job:
    """The protocol message of a job."""
    msg = pb.Job(
        id=job.id,
        name=job.name,
        queue=job.queue,
        owner=job.owner,
        priority=job.priority,
        state=job.state,
        reason=job.reason,
        replicas=job.spec.spec.replicas,
        min_replicas=job.spec.spec.min_replicas or job.spec.spec.replicas,
        workers=job.workers,
        attempt=job.attempt,
        submitted_ms=job.submitted_ms,
        started_ms=job.started_ms,
        finished_ms=job.finished_ms,
        spec_yaml=job.spec_yaml,
        request_id=job.request_id,
        gpu_milli=job.spec.spec.resources.milli_gpus,
        predicted_runtime_s=predicted or job.predicted_s,
        pool=job.pools if job.pools != "-" else "(none)",
        restarts=job.restarts,
        model=job.model,
        dataset_version=job.dataset_version,
        rendezvous=rendezvous,
    )
    msg.labels.update(job.spec.metadata.labels)
    msg.metrics.update(job.metrics)
    if job.progress:
        p = job.progress
        loss, eta = p.get("loss"), p.get("eta_s")
        msg.progress.CopyFrom(
            pb.Progress(
                step=int(p["step"]),
                total_steps=int(p.get("total_steps", 0)),
                epoch=int(p.get("epoch", 0)),
                loss=float(loss) if loss is not None else 0.0,
                has_loss=loss is not None,
                samples_per_s=float(p.get("samples_per_s", 0.0)),
                eta_s=float(eta) if eta is not None else 0.0,
                has_eta=eta is not None,
                updated_ms=int(p.get("updated_ms", 0)),
                attempt=int(p.get("attempt", 0)),
            )
        )
    for p in job.placements:
        msg.placements.add(
            worker=p["worker"],
            node=p["node"],
            gpu_index=[int(i) for i, _ in p["gpus"]],
            gpu_milli=[int(m) for _, m in p["gpus"]],
        )
    for h in history or ():
        msg.history.add(at_ms=h.at_ms, state=h.state, reason=h.reason, attempt=h.attempt)
    return msg


def _resources(amount: Amount) -> pb.Resources:
    def big(v: int) -> bool:
        return v >= UNLIMITED // 2

    return pb.Resources(
        gpus=-1 if big(amount.gpu_milli) else amount.gpu_milli / 1000,
        cpus=-1 if big(amount.cpu_milli) else amount.cpu_milli / 1000,
        memory_mib=-1 if big(amount.memory_mib) else amount.memory_mib,
    )


def _amount(res: pb.Resources, missing: int) -> Amount:
    def one(v: float, scale: int) -> int:
        return missing if v < 0 else int(v * scale)

    return Amount(one(res.gpus, 1000), one(res.cpus, 1000), one(res.memory_mib, 1))


class SchedulerApi(pb_grpc.SchedulerServiceServicer):  # type: ignore[misc]
    """The servicer."""

    def __init__(
        self, control: ControlThread, authorizer: Authorizer, kick: Callable[[], None]
    ) -> None:
        self.c = control
        self.authorizer = authorizer
        self.kick = kick
        self._watchers: set[tuple[asyncio.Queue[JobRow | None], str]] = set()
        self._log_waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Subscribe to the control's changes (call once, from the event loop)."""
        self._loop = loop
        self.c.control.listeners.add(self._changed)
        self.c.control.log_listeners.add(self._logged)

    # called on the control thread
    def _changed(self, job: JobRow) -> None:
        loop = self._loop
        if loop is None:
            return
        snapshot = JobRow(**{k: getattr(job, k) for k in job.__dataclass_fields__})
        snapshot.placements = list(job.placements)
        loop.call_soon_threadsafe(self._fan_out, snapshot)

    def _fan_out(self, job: JobRow) -> None:
        for queue, wanted in list(self._watchers):
            if wanted and wanted not in (job.id, job.name):
                continue
            if queue.qsize() >= WATCH_BUFFER:
                self._watchers.discard((queue, wanted))
                queue.put_nowait(None)  # cut off: it fell too far behind
            else:
                queue.put_nowait(job)

    def _logged(self, job_id: str) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._wake_logs, job_id)

    def _wake_logs(self, job_id: str) -> None:
        for event in self._log_waiters.get(job_id, set()):
            event.set()

    def _may_touch(self, principal: Principal, job: JobRow, action: str) -> None:
        if principal.subject == job.owner:
            return
        decision = self.authorizer.decide(principal.subject, principal.roles, "update", "job")
        if not decision.allowed:
            raise PermissionDenied(
                principal.subject,
                action,
                f"job {job.id}",
                reason=f"the job belongs to {job.owner}; only its owner or a principal allowed "
                "'update job' (platform admins) may do this",
            )

    # ------------------------------------------------------------------ jobs

    @rpc_errors
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.SubmitJobResponse:
        """Validate and queue a TrainingJob."""
        principal = current_principal()
        if not request.spec_yaml.strip():
            raise InvalidInput("the job spec is empty", hint="send a TrainingJob YAML document")
        job, duplicate = await self.c.call(
            self.c.control.submit,
            request.spec_yaml,
            owner=principal.subject,
            roles=list(principal.roles),
            request_id=request.request_id,
            dry_run=request.dry_run,
        )
        if not duplicate and not request.dry_run:
            self.kick()
        return pb.SubmitJobResponse(job=job_pb(job), duplicate=duplicate)

    @rpc_errors
    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        """A job with its placements and history."""
        return await self.c.call(self._job, request.id)

    def _job(self, job_id: str) -> pb.Job:
        # built in one go on the control thread: an active job's row is live, and a report
        # applied between reading it and its history would give a state the history lacks
        control = self.c.control
        job = control.get(job_id)
        return job_pb(
            job,
            history=control.history(job.id),
            predicted=control.predicted(job),
            rendezvous=control.rendezvous(job),
        )

    @rpc_errors
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        """Jobs, newest first."""

        def listing() -> pb.ListJobsResponse:  # on the control thread, like GetJob
            jobs = self.c.control.list(
                queue=request.queue,
                state=request.state,
                owner=request.owner,
                limit=min(request.limit or 100, 10_000),
            )
            return pb.ListJobsResponse(jobs=[job_pb(j) for j in jobs])

        return await self.c.call(listing)

    @rpc_errors
    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.Job:
        """Cancel a job (its workers checkpoint and stop first)."""
        principal = current_principal()
        job = await self.c.call(self.c.control.get, request.id)
        self._may_touch(principal, job, "cancel")
        job = await self.c.call(
            self.c.control.cancel, job.id, actor=principal.subject, reason=request.reason
        )
        self.kick()
        return job_pb(job)

    @stream_rpc_errors
    async def WatchJobs(self, request: pb.WatchJobsRequest, context: Any) -> AsyncIterator[pb.Job]:
        """Stream job changes as they happen (one job, or all)."""
        queue: asyncio.Queue[JobRow | None] = asyncio.Queue()
        entry = (queue, request.id)
        self._watchers.add(entry)
        try:
            target: JobRow | None = None
            if request.id:
                target = await self.c.call(self.c.control.get, request.id)
                entry2 = (queue, target.id)
                self._watchers.discard(entry)
                self._watchers.add(entry2)
                entry = entry2
                if request.include_current:
                    yield job_pb(target)
                if target.state in TERMINAL:
                    return
            elif request.include_current:
                for job in await self.c.call(self.c.control.list, state="active", limit=1000):
                    yield job_pb(job)
            while True:
                change = await queue.get()
                if change is None:
                    return
                yield job_pb(change)
                if target is not None and change.state in TERMINAL:
                    return
        finally:
            self._watchers.discard(entry)

    @stream_rpc_errors
    async def JobLogs(self, request: pb.JobLogsRequest, context: Any) -> AsyncIterator[pb.LogLine]:
        """A job's log lines; with ``follow``, new ones as they arrive until the job ends."""
        principal = current_principal()
        job = await self.c.call(self.c.control.get, request.id)
        self._may_touch(principal, job, "logs")
        wake = asyncio.Event()
        self._log_waiters.setdefault(job.id, set()).add(wake)
        try:
            last = 0
            rows = await self.c.call(self.c.control.logs, job.id, tail=max(request.tail, 0))
            while True:
                for row in rows:
                    last = row.id
                    yield pb.LogLine(
                        at_ms=row.at_ms,
                        node=row.node,
                        worker=row.worker,
                        stream=row.stream,
                        text=row.text,
                    )
                if not request.follow:
                    return
                current = await self.c.call(self.c.control.get, job.id)
                if current.state in TERMINAL and not rows:
                    return
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=1.0)
                rows = await self.c.call(self.c.control.logs, job.id, after_id=last)
        finally:
            self._log_waiters[job.id].discard(wake)
            if not self._log_waiters[job.id]:
                del self._log_waiters[job.id]

    # ------------------------------------------------------------------ nodes, queues, usage

    @rpc_errors
    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        """Nodes with capacity, free resources, state and jobs."""
        return await self.c.call(self._nodes)

    def _nodes(self) -> pb.ListNodesResponse:
        control = self.c.control
        engine = control.engine
        out = pb.ListNodesResponse()
        for name in sorted(control.nodes):
            row = control.nodes[name]
            inv = row.inventory
            node = out.nodes.add(
                name=name,
                pool=row.pool,
                state=row.state,
                reason=row.reason,
                cpu_milli=inv.cpu_milli,
                memory_mib=inv.memory_mib,
                last_heartbeat_ms=row.last_seen_ms,
                address=inv.address,
                worker_slots=inv.worker_slots,
            )
            node.labels.update(inv.labels)
            free = None
            if engine is not None:
                i = engine.node_index(name)
                node.cpu_free_milli = int(engine.cluster.cpu_free[i])
                node.memory_free_mib = int(engine.cluster.mem_free[i])
                free = engine.cluster.gpu_free[i]
                node.jobs.extend(engine.jobs_on(name))
            for g in inv.gpus:
                node.gpus.add(
                    index=g.index,
                    model=g.model,
                    memory_mib=g.memory_mib,
                    free_milli=int(free[g.index])
                    if free is not None and g.index < len(free)
                    else 0,
                )
        return out

    @rpc_errors
    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: Any
    ) -> pb.ListQueuesResponse:
        """Queues with quota, usage, borrowing limit and pending/running counts."""
        return await self.c.call(self._queues)

    def _queues(self) -> pb.ListQueuesResponse:
        control = self.c.control
        book = control.queues
        counts: dict[str, list[int]] = {}
        for job in control.jobs.values():
            c = counts.setdefault(job.queue, [0, 0])
            c[0 if job.state == "pending" else 1] += 1
        out = pb.ListQueuesResponse()
        for name in sorted(book.queues):
            q = book.queues[name]
            pending, running = counts.get(name, [0, 0])
            out.queues.add(
                name=name,
                cohort=q.cohort,
                quota=_resources(q.quota),
                used=_resources(book.used(name)),
                borrowing_limit=_resources(q.borrowing_limit),
                weight=q.weight,
                pending=pending,
                running=running,
                dominant_share=book.dominant_share(name) if book.capacity.gpu_milli else 0.0,
            )
        return out

    @rpc_errors
    async def SetQuota(self, request: pb.SetQuotaRequest, context: Any) -> pb.Queue:
        """Create a queue or change its quota, cohort, weight or borrowing limit."""
        principal = current_principal()
        if not request.queue:
            raise InvalidInput("name the queue", hint="gantry queues set-quota QUEUE --gpus N")
        existing = self.c.control.queues.queues.get(request.queue)
        weight = request.weight or (existing.weight if existing else 1.0)
        limit = (
            _amount(request.borrowing_limit, UNLIMITED)
            if request.has_borrowing_limit
            else (existing.borrowing_limit if existing else Amount(UNLIMITED, UNLIMITED, UNLIMITED))
        )
        config = QueueConfig(
            request.queue,
            _amount(request.quota, UNLIMITED),
            request.cohort or (existing.cohort if existing else ""),
            limit,
            weight,
        )
        try:
            Metadata(name="x", queue=request.queue)
        except ValueError:
            raise InvalidInput(
                f"queue name {request.queue!r} is not allowed",
                hint="1-63 lower-case letters, digits or '-'",
            ) from None
        await self.c.call(self.c.control.set_quota, config, actor=principal.subject)
        self.kick()
        listing = await self.c.call(self._queues)
        return next(q for q in listing.queues if q.name == request.queue)

    @rpc_errors
    async def Usage(self, request: pb.UsageRequest, context: Any) -> pb.UsageResponse:
        """GPU-hours, CPU-hours and queueing time per user, queue or pool."""
        group = request.group_by or "user"
        rows = await self.c.call(self.c.control.usage, group, request.since_ms, request.until_ms)
        out = pb.UsageResponse(group_by=group)
        for r in rows:
            out.rows.add(
                key=r["key"],
                gpu_hours=r["gpu_h"],
                cpu_hours=r["cpu_h"],
                queueing_hours=r["queue_h"],
                jobs=r["jobs"],
            )
        return out


__all__ = ["METHOD_RULES", "SERVICE", "ControlThread", "SchedulerApi", "job_pb"]
