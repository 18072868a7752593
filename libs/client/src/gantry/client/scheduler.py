"""The scheduler SDK: submit training jobs, follow them, read their logs; nodes, queues, usage.

::

    from gantry.client.scheduler import SchedulerClient

    with SchedulerClient("127.0.0.1:7033", token) as sched:
        job = sched.submit(Path("train.yaml").read_text(), request_id="nightly-2026-01-31").job
        with sched.watch(job.id) as updates:
            for update in updates:
                print(update.state, update.reason)
                if update.terminal:
                    break

Every call returns plain frozen dataclasses (:class:`JobInfo`, :class:`NodeInfo`, ...), never
protocol messages, and raises Gantry's typed errors (see :mod:`gantry.client.errors`).
:meth:`SchedulerClient.watch` and :meth:`SchedulerClient.logs` return a :class:`ServerStream`:
iterate it, and stop it with ``cancel()`` from any thread or by leaving its ``with`` block.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from typing import Any, Self, TypeVar

import grpc

from gantry.client._rpc import ActAs, RpcClient
from gantry.client._sched_records import (
    JOB_STATES,
    TERMINAL_STATES,
    Gpu,
    JobEvent,
    JobInfo,
    JobProgress,
    LogLine,
    NodeInfo,
    QueueInfo,
    Resources,
    SubmitResult,
    UsageRow,
    WorkerPlacement,
)
from gantry.core import GantryError, InvalidInput, TlsSettings
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc

#: How usage can be grouped.
USAGE_GROUPS = ("user", "queue", "pool")

T = TypeVar("T")


class ServerStream(Iterator[T]):
    """The replies of one server stream, as records, as the service sends them.

    Stop it early with :meth:`cancel` (safe from any thread) or by leaving its ``with``
    block; a stopped stream simply ends. A failure of the call raises the typed error.
    """

    def __init__(
        self,
        call: Any,
        convert: Callable[[Any], T],
        error: Callable[[grpc.RpcError], GantryError],
    ) -> None:
        self._call = call
        self._convert = convert
        self._error = error
        self._cancelled = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        if self._cancelled:
            raise StopIteration
        try:
            message = next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled:  # cancel() from another thread while we waited
                raise StopIteration from None
            raise self._error(exc) from None
        return self._convert(message)

    def cancel(self) -> None:
        """Stop the stream: the service is told, and iteration ends."""
        self._cancelled = True
        self._call.cancel()

    def close(self) -> None:
        """The same as :meth:`cancel`, for :func:`contextlib.closing`."""
        self.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class SchedulerClient(RpcClient):
    """A synchronous client of the scheduler service, authenticated with a bearer token.

    ``timeout_s`` bounds each request/response call; ``stream_timeout_s`` bounds a whole
    watch or log stream (``None``, the default: a watch runs until it is cancelled).
    """

    service = "scheduler"

    def __init__(
        self,
        address: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        stream_timeout_s: float | None = None,
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, token, timeout_s=timeout_s, act_as=act_as, tls=tls)
        self._stub = pb_grpc.SchedulerServiceStub(self._channel)
        self._stream_timeout = stream_timeout_s

    # ------------------------------------------------------------------ jobs

    def submit(
        self, spec_yaml: str, *, request_id: str = "", dry_run: bool = False
    ) -> SubmitResult:
        """Submit a TrainingJob document (YAML text); the new job, pending.

        ``request_id`` makes the submission idempotent: a repeat returns the first job with
        ``duplicate=True``. ``dry_run`` only validates the spec and checks it could ever be
        placed; nothing is stored. An invalid spec raises :class:`InvalidInput` with the
        service's list of problems.
        """
        if not spec_yaml.strip():
            raise InvalidInput(
                "the job spec is empty", hint="write a TrainingJob document (see docs/jobs.md)"
            )
        request = pb.SubmitJobRequest(spec_yaml=spec_yaml, request_id=request_id, dry_run=dry_run)
        reply: pb.SubmitJobResponse = self._call("SubmitJob", request)
        return SubmitResult(JobInfo.from_pb(reply.job), reply.duplicate)

    def get(self, id: str) -> JobInfo:
        """One job, by id or by name (the newest job of that name)."""
        return JobInfo.from_pb(self._call("GetJob", pb.GetJobRequest(id=_needed(id))))

    def list(
        self, queue: str = "", state: str = "", owner: str = "", limit: int = 100
    ) -> builtins.list[JobInfo]:
        """Jobs the caller may see, filtered by queue, state and owner ("" = any).

        ``state`` is one of :data:`JOB_STATES`, or ``active`` for every job not finished.
        At most ``limit`` jobs (0: the service's default of 100).
        """
        if limit < 0:
            raise InvalidInput(f"limit must be 0 or more, not {limit}")
        request = pb.ListJobsRequest(queue=queue, state=state, owner=owner, limit=limit)
        reply: pb.ListJobsResponse = self._call("ListJobs", request)
        return [JobInfo.from_pb(j) for j in reply.jobs]

    def cancel(self, id: str, reason: str = "") -> JobInfo:
        """Cancel a job (its workers are stopped); the job as it is now. ``reason`` is kept."""
        request = pb.CancelJobRequest(id=_needed(id), reason=reason)
        return JobInfo.from_pb(self._call("CancelJob", request))

    def watch(self, id: str = "", include_current: bool = True) -> ServerStream[JobInfo]:
        """The job (or, for ``""``, every job the caller may see) each time it changes.

        With ``include_current`` the current state of the matching jobs comes first. The
        stream does not end by itself when a job finishes: stop when :attr:`JobInfo.terminal`.
        """
        request = pb.WatchJobsRequest(id=id, include_current=include_current)
        return self._stream("WatchJobs", request, JobInfo.from_pb)

    def logs(self, id: str, follow: bool = False, tail: int = 0) -> ServerStream[LogLine]:
        """A job's log lines: the last ``tail`` kept (0: all), then new ones with ``follow``.

        Without ``follow`` the stream ends after the kept lines; with it, when the job ends.
        """
        if tail < 0:
            raise InvalidInput(f"tail must be 0 or more, not {tail}")
        request = pb.JobLogsRequest(id=_needed(id), follow=follow, tail=tail)
        return self._stream("JobLogs", request, LogLine.from_pb)

    # ------------------------------------------------------------------ cluster

    def nodes(self) -> builtins.list[NodeInfo]:
        """Every node with its capacity, what is free of it, and its jobs."""
        reply: pb.ListNodesResponse = self._call("ListNodes", pb.ListNodesRequest())
        return [NodeInfo.from_pb(n) for n in reply.nodes]

    def queues(self) -> builtins.list[QueueInfo]:
        """Every queue with its quota, usage and fair-share standing."""
        reply: pb.ListQueuesResponse = self._call("ListQueues", pb.ListQueuesRequest())
        return [QueueInfo.from_pb(q) for q in reply.queues]

    def set_quota(
        self,
        queue: str,
        *,
        gpus: float,
        cpus: float,
        memory_mib: int,
        cohort: str = "",
        weight: float = 0,
        borrowing_limit: Resources | None = None,
    ) -> QueueInfo:
        """Set a queue's guaranteed quota (the queue is created when it does not exist).

        Every value given is sent as is: ``cohort`` "" puts the queue in no cohort. ``weight``
        0 keeps the current weight (1 for a new queue). ``borrowing_limit`` caps what the
        queue may borrow from its cohort. A negative amount (quota or limit) means unlimited.
        """
        _needed(queue, "a queue name")
        if weight < 0:
            raise InvalidInput(f"weight must be 0 or more, not {weight:g}")
        request = pb.SetQuotaRequest(
            queue=queue,
            cohort=cohort,
            quota=Resources(gpus, cpus, memory_mib).to_pb(),
            weight=weight,
            has_borrowing_limit=borrowing_limit is not None,
            borrowing_limit=borrowing_limit.to_pb() if borrowing_limit is not None else None,
        )
        return QueueInfo.from_pb(self._call("SetQuota", request))

    def usage(
        self, group_by: str = "user", since_ms: int = 0, until_ms: int = 0
    ) -> builtins.list[UsageRow]:
        """GPU-, CPU- and queueing hours and job counts per user, queue or pool.

        The window is ``since_ms`` to ``until_ms`` (Unix ms; 0 = from the start, until now).
        """
        if group_by not in USAGE_GROUPS:
            raise InvalidInput(
                f"cannot group usage by {group_by!r}", hint=f"use one of {', '.join(USAGE_GROUPS)}"
            )
        if since_ms < 0 or until_ms < 0 or (since_ms and until_ms and since_ms >= until_ms):
            raise InvalidInput(f"bad usage window: since_ms={since_ms}, until_ms={until_ms}")
        request = pb.UsageRequest(group_by=group_by, since_ms=since_ms, until_ms=until_ms)
        reply: pb.UsageResponse = self._call("Usage", request)
        return [UsageRow.from_pb(r) for r in reply.rows]

    # ------------------------------------------------------------------ plumbing

    def _stream(self, method: str, request: Any, convert: Callable[[Any], T]) -> ServerStream[T]:
        call = getattr(self._stub, method)(
            request, metadata=self._metadata, timeout=self._stream_timeout
        )
        return ServerStream(call, convert, self._error)


def _needed(value: str, what: str = "a job id or name") -> str:
    if not value.strip():
        raise InvalidInput(f"{what} is needed")
    return value


__all__ = [
    "JOB_STATES",
    "TERMINAL_STATES",
    "USAGE_GROUPS",
    "Gpu",
    "JobEvent",
    "JobInfo",
    "JobProgress",
    "LogLine",
    "NodeInfo",
    "QueueInfo",
    "Resources",
    "SchedulerClient",
    "ServerStream",
    "SubmitResult",
    "UsageRow",
    "WorkerPlacement",
]
