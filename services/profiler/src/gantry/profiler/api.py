"""The gRPC API (``gantry.profiler.v1.ProfilerService``): handlers only.

The interceptor checks each method's rule; what a call changes is authorised here as well:
starting a trace takes ``profile`` on ``job`` and the job's ownership (or ``update job``, as
cancelling does), marking a node takes ``update`` on ``node`` (platform admins), and uploads
come from the node agent of the node the rank runs on.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

from gantry.core import InvalidInput, PermissionDenied
from gantry.events.catalog import AuthzDecision
from gantry.profiler.recording import Recorder
from gantry.profiler.traces import TraceFileView, Traces, TraceView, Upload
from gantry.profiler.views import (
    ClusterView,
    FindingView,
    JobView,
    NodeView,
    Phases,
    job_view,
    nodes_view,
)
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.protos.v1 import profiler_pb2_grpc
from gantry.security import Authorizer, MethodRule, Principal, current_principal
from gantry.security.interceptor import DecisionSink
from gantry.security.rpc_errors import rpc_errors, stream_rpc_errors

SERVICE = "gantry.profiler.v1.ProfilerService"
SERVICE_NAME = "profiler"
AGENT_IDENTITY = "training-agent"
"""The subject of the node agents' service token: the only uploader of traces."""
METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/GetJobProfile": MethodRule("read", "job"),
    f"/{SERVICE}/ListNodes": MethodRule("list", "node"),
    f"/{SERVICE}/SetNodeHealth": MethodRule("update", "node"),
    f"/{SERVICE}/StartTrace": MethodRule("profile", "job"),
    f"/{SERVICE}/GetTrace": MethodRule("read", "job"),
    f"/{SERVICE}/ListTraces": MethodRule("read", "job"),
    f"/{SERVICE}/DownloadTrace": MethodRule("logs", "job"),
    f"/{SERVICE}/UploadTrace": MethodRule("trace", "job"),
}


def _phases(p: Phases) -> pb.PhaseTimes:
    return pb.PhaseTimes(
        step_ms=p.step_ms,
        data_ms=p.data_ms,
        forward_ms=p.forward_ms,
        backward_ms=p.backward_ms,
        comm_ms=p.comm_ms,
        optimizer_ms=p.optimizer_ms,
        busy_ms=p.busy_ms,
        samples_per_step=p.samples_per_step,
        tokens_per_step=p.tokens_per_step,
    )


def _finding(f: FindingView) -> pb.Finding:
    from gantry.profiler.store import dumps

    return pb.Finding(
        kind=f.kind,
        state=f.state,
        rank=f.rank,
        node=f.node,
        phase=f.phase,
        cause=f.cause,
        summary=f.summary,
        evidence_json=dumps(f.evidence),
        raised_step=f.raised_step,
        step=f.step,
        raised_ms=f.raised_ms,
        cleared_ms=f.cleared_ms,
    )


def job_pb(v: JobView) -> pb.JobProfile:
    """A job view as its protobuf."""
    ranks = []
    for r in v.ranks:
        ranks.append(
            pb.RankProfile(
                rank=r.rank,
                node=r.node,
                recent=_phases(r.recent),
                overall=_phases(r.overall),
                last_step=r.last_step,
                memory_mib=r.memory_mib,
                timeline=[
                    pb.RankPoint(
                        first_step=w.first_step,
                        last_step=w.last_step,
                        at_ms=w.at_ms,
                        times=_phases(Phases.of([w])),
                        loss=w.loss or 0.0,
                        has_loss=w.loss is not None,
                        memory_mib=w.memory_mib,
                    )
                    for w in r.timeline
                ],
            )
        )
    return pb.JobProfile(
        job_id=v.job_id,
        attempt=v.attempt,
        name=v.name,
        owner=v.owner,
        state=v.state,
        world_size=v.world_size,
        ranks=ranks,
        findings=[_finding(f) for f in v.findings],
        samples_per_s=v.samples_per_s,
        compute_fraction=v.compute_fraction,
        last_step=v.last_step,
        started_ms=v.started_ms,
        updated_ms=v.updated_ms,
        attempts=v.attempts,
        gpu_util=v.gpu_util,
    )


def node_pb(n: NodeView) -> pb.NodeHealth:
    from gantry.profiler.store import dumps

    return pb.NodeHealth(
        node=n.node,
        state=n.state,
        reason=n.reason,
        evidence_json=dumps(n.evidence),
        since_ms=n.since_ms,
        cpu_util=n.cpu_util,
        gpu_util=n.gpu_util,
        gpus=n.gpus,
        gpus_allocated=n.gpus_allocated,
        cpu_allocated=n.cpus_allocated,
        cpus=n.cpus,
        memory_used_mib=n.memory_used_mib,
        net_rx_bytes_per_s=n.net_rx_bytes_per_s,
        net_tx_bytes_per_s=n.net_tx_bytes_per_s,
        throttled=n.throttled,
        jobs=n.jobs,
        last_seen_ms=n.last_seen_ms,
        slow_jobs=n.slow_jobs,
        temperature_c=n.temperature_c,
        power_w=n.power_w,
    )


def cluster_pb(c: ClusterView) -> pb.ClusterUtilisation:
    return pb.ClusterUtilisation(
        nodes=c.nodes,
        degraded=c.degraded,
        gpus=c.gpus,
        gpus_allocated=c.gpus_allocated,
        gpus_busy=c.gpus_busy,
        cpus=c.cpus,
        cpus_allocated=c.cpus_allocated,
        cpus_busy=c.cpus_busy,
        running_jobs=c.running_jobs,
    )


def _file(f: TraceFileView) -> pb.TraceFile:
    return pb.TraceFile(
        rank=f.rank,
        node=f.node,
        state=f.state,
        bytes=f.bytes,
        sha256=f.sha256,
        reason=f.reason,
        first_step=f.first_step,
        steps=f.steps,
    )


def trace_pb(t: TraceView) -> pb.Trace:
    return pb.Trace(
        trace_id=t.trace_id,
        job_id=t.job_id,
        attempt=t.attempt,
        steps=t.steps,
        state=t.state,
        requested_by=t.requested_by,
        requested_ms=t.requested_ms,
        files=[_file(f) for f in t.files],
    )


class ProfilerApi(profiler_pb2_grpc.ProfilerServiceServicer):
    """Profiles, node health and traces."""

    def __init__(
        self, recorder: Recorder, traces: Traces, authorizer: Authorizer, sink: DecisionSink
    ) -> None:
        self.recorder = recorder
        self.traces = traces
        self.authorizer = authorizer
        self.sink = sink

    def _may_touch_job(
        self,
        principal: Principal,
        job_id: str,
        owner: str,
        method: str,
        doing: str = "trace",
    ) -> None:
        """The job's owner, or a principal allowed ``update job``; ``doing`` says what for."""
        if principal.subject == owner:
            return
        decision = self.authorizer.decide(principal.subject, principal.roles, "update", "job")
        self.sink.record(
            AuthzDecision(
                principal=principal.subject,
                roles=list(principal.roles),
                action="update",
                resource_kind="job",
                resource_name=job_id,
                decision="allow" if decision.allowed else "deny",
                reason=decision.reason,
                service=SERVICE_NAME,
                method=f"/{SERVICE}/{method}",
                via=principal.via,
                address=principal.address,
            ),
            actor=principal.subject,
        )
        if not decision.allowed:
            raise PermissionDenied(
                principal.subject,
                doing,
                f"job {job_id}",
                reason=f"the job belongs to {owner}; only its owner or a principal allowed "
                f"'update job' (platform admins) may {doing} it",
            )

    @rpc_errors
    async def GetJobProfile(self, request: pb.GetJobProfileRequest, context: Any) -> pb.JobProfile:
        """A job's profile: per-rank phases, timeline, findings."""
        if not request.job_id:
            raise InvalidInput("no job given", hint="give a job id or name")
        view = await asyncio.to_thread(
            job_view,
            self.recorder,
            request.job_id,
            attempt=request.attempt,
            max_points=request.max_points or 200,
        )
        return job_pb(view)

    @rpc_errors
    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        """Every node's health and utilisation, and the cluster's."""
        nodes, cluster = await asyncio.to_thread(nodes_view, self.recorder)
        return pb.ListNodesResponse(nodes=[node_pb(n) for n in nodes], cluster=cluster_pb(cluster))

    @rpc_errors
    async def SetNodeHealth(self, request: pb.SetNodeHealthRequest, context: Any) -> pb.NodeHealth:
        """An operator marks a node degraded or recovered."""
        if not request.node:
            raise InvalidInput("no node given", hint="give the node's name")
        principal = current_principal()
        await asyncio.to_thread(
            self.recorder.set_node_health,
            request.node,
            request.degraded,
            request.reason,
            principal.subject,
        )
        nodes, _ = await asyncio.to_thread(nodes_view, self.recorder)
        return node_pb(next(n for n in nodes if n.node == request.node))

    @rpc_errors
    async def StartTrace(self, request: pb.StartTraceRequest, context: Any) -> pb.Trace:
        """Ask a running job for a deep trace of its next steps."""
        principal = current_principal()
        from gantry.profiler.views import resolve_job

        job_id = await asyncio.to_thread(resolve_job, self.recorder, request.job_id)
        with self.recorder.lock:
            record = self.recorder.profiles.jobs.get(job_id)
            owner = record.owner if record is not None else ""
        self._may_touch_job(principal, job_id, owner, "StartTrace")
        view = await asyncio.to_thread(
            self.traces.request, job_id, request.steps, list(request.ranks), principal.subject
        )
        return trace_pb(view)

    @rpc_errors
    async def GetTrace(self, request: pb.GetTraceRequest, context: Any) -> pb.Trace:
        """A trace and its files (the job's owner, or a principal allowed ``update job``)."""
        view = await asyncio.to_thread(self.traces.get, request.trace_id)
        principal = current_principal()
        self._may_touch_job(principal, view.job_id, view.owner, "GetTrace", "read traces of")
        return trace_pb(view)

    @rpc_errors
    async def ListTraces(
        self, request: pb.ListTracesRequest, context: Any
    ) -> pb.ListTracesResponse:
        """A job's traces (its owner, or a principal allowed ``update job``)."""
        job_id, owner = await asyncio.to_thread(self.traces.owner, request.job_id)
        principal = current_principal()
        self._may_touch_job(principal, job_id, owner, "ListTraces", "read traces of")
        views = await asyncio.to_thread(self.traces.list, job_id)
        return pb.ListTracesResponse(traces=[trace_pb(v) for v in views])

    @stream_rpc_errors
    async def DownloadTrace(
        self, request: pb.DownloadTraceRequest, context: Any
    ) -> AsyncIterator[pb.Chunk]:
        """One rank's trace file (gzipped Chrome trace JSON), in pieces; for the job's owner or
        a principal allowed ``update job`` (a trace shows the job's code and data shapes)."""
        view = await asyncio.to_thread(self.traces.get, request.trace_id)
        principal = current_principal()
        self._may_touch_job(
            principal, view.job_id, view.owner, "DownloadTrace", "download traces of"
        )
        pieces: Iterator[bytes] = await asyncio.to_thread(
            self.traces.open, request.trace_id, request.rank
        )
        while True:
            piece = await asyncio.to_thread(next, pieces, b"")
            if not piece:
                return
            yield pb.Chunk(data=piece)

    @rpc_errors
    async def UploadTrace(
        self, request_iterator: AsyncIterator[pb.UploadTraceRequest], context: Any
    ) -> pb.UploadTraceResponse:
        """A node agent hands over what a worker recorded (streamed into the object store)."""
        principal = current_principal()
        if principal.subject != AGENT_IDENTITY:
            raise PermissionDenied(
                principal.subject,
                "trace",
                "a job",
                reason=f"only the node agents ({AGENT_IDENTITY}) upload traces",
            )
        first = None
        async for message in request_iterator:
            first = message
            break
        if first is None or not first.trace_id:
            raise InvalidInput("an upload starts with the trace it belongs to")
        up = Upload(
            trace_id=first.trace_id,
            job_id=first.job_id,
            attempt=first.attempt,
            rank=first.rank,
            node=first.node,
            first_step=first.first_step,
            steps=first.steps,
            failed_reason=first.failed_reason,
        )
        await asyncio.to_thread(self.traces.check_upload, up, principal.subject)
        # the pieces go to the store as they come (a bounded queue: memory stays small)
        pieces: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        loop = asyncio.get_running_loop()

        def chunks() -> Iterator[bytes]:
            while (piece := pieces.get()) is not None:
                yield piece

        storing = loop.run_in_executor(None, self.traces.store, up, chunks(), principal.subject)

        def put(piece: bytes | None) -> bool:
            """Hand a piece over; False once the store gave up (its error is raised below)."""
            while True:
                try:
                    pieces.put(piece, timeout=0.2)
                    return True
                except queue.Full:
                    if storing.done():
                        return False

        try:
            if first.data:
                await asyncio.to_thread(put, first.data)
            async for message in request_iterator:
                if not await asyncio.to_thread(put, message.data):
                    break
        finally:
            await asyncio.to_thread(put, None)
        stored = await storing
        return pb.UploadTraceResponse(bytes=stored.bytes, sha256=stored.sha256)


__all__ = ["METHOD_RULES", "SERVICE", "ProfilerApi", "cluster_pb", "job_pb", "node_pb", "trace_pb"]
