"""The profiler SDK: where a job's step time goes, node health, and deep traces of a few steps.

::

    from gantry.client.profiler import ProfilerClient

    with ProfilerClient("127.0.0.1:7035", token) as profiler:
        profile = profiler.job_profile("resnet-ft")
        for finding in profile.standing:
            print(finding.summary)                    # the verdict in words
        trace = profiler.start_trace("resnet-ft", steps=5)
        ...                                           # poll profiler.trace(trace.trace_id)
        profiler.download_trace(trace.trace_id, 0, Path("rank0.json.gz"))

Calls go to ``gantry.profiler.v1.ProfilerService``. Every call returns plain frozen dataclasses
(:class:`JobProfileInfo`, :class:`NodeInfo`, :class:`TraceInfo`, ...), never protocol messages,
so tables and plots need no protobuf; failures raise Gantry's typed errors (see
:mod:`gantry.client.errors`).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantry.client._rpc import ActAs, RpcClient
from gantry.client.scheduler import ServerStream
from gantry.core import IntegrityError, InvalidInput, TlsSettings
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.protos.v1 import profiler_pb2_grpc as pb_grpc

#: The phases of a training step, in the order a step runs them; ``comm`` is waiting on the
#: other ranks, the rest is the rank's own work.
PHASES = ("data", "forward", "backward", "optimizer", "comm")
#: Trace states after which nothing changes any more.
TRACE_DONE = frozenset({"ready", "partial", "failed", "expired"})
#: The most steps one trace may record (the service refuses more).
MAX_TRACE_STEPS = 1000


def _evidence(text: str) -> dict[str, Any]:
    """``evidence_json`` as a dict; text that is not a JSON object is kept under ``raw``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": value}


@dataclass(frozen=True)
class PhaseTimesInfo:
    """Per-step means of one rank over some steps, in milliseconds (and work per step)."""

    step_ms: float
    data_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    comm_ms: float
    busy_ms: float
    samples_per_step: float
    tokens_per_step: float

    @classmethod
    def from_pb(cls, p: pb.PhaseTimes) -> PhaseTimesInfo:
        """From the protocol message."""
        return cls(
            step_ms=p.step_ms,
            data_ms=p.data_ms,
            forward_ms=p.forward_ms,
            backward_ms=p.backward_ms,
            optimizer_ms=p.optimizer_ms,
            comm_ms=p.comm_ms,
            busy_ms=p.busy_ms,
            samples_per_step=p.samples_per_step,
            tokens_per_step=p.tokens_per_step,
        )

    def phase(self, name: str) -> float:
        """Milliseconds per step in one of :data:`PHASES`."""
        if name not in PHASES:
            raise InvalidInput(f"unknown phase {name!r}", hint=f"one of {', '.join(PHASES)}")
        return float(getattr(self, f"{name}_ms"))


@dataclass(frozen=True)
class RankPointInfo:
    """One window of one rank: a point of its timeline."""

    first_step: int
    last_step: int
    at_ms: int
    times: PhaseTimesInfo
    loss: float | None
    memory_mib: int


@dataclass(frozen=True)
class RankInfo:
    """One rank of a job: its recent and overall phase times and its timeline."""

    rank: int
    node: str
    recent: PhaseTimesInfo
    """Over the steps the verdicts were judged on."""
    overall: PhaseTimesInfo
    """Over the whole attempt."""
    last_step: int
    memory_mib: int
    """Peak memory."""
    timeline: tuple[RankPointInfo, ...]

    @classmethod
    def from_pb(cls, r: pb.RankProfile) -> RankInfo:
        """From the protocol message."""
        return cls(
            rank=r.rank,
            node=r.node,
            recent=PhaseTimesInfo.from_pb(r.recent),
            overall=PhaseTimesInfo.from_pb(r.overall),
            last_step=r.last_step,
            memory_mib=r.memory_mib,
            timeline=tuple(
                RankPointInfo(
                    first_step=p.first_step,
                    last_step=p.last_step,
                    at_ms=p.at_ms,
                    times=PhaseTimesInfo.from_pb(p.times),
                    loss=p.loss if p.has_loss else None,
                    memory_mib=p.memory_mib,
                )
                for p in r.timeline
            ),
        )


@dataclass(frozen=True)
class FindingInfo:
    """A verdict on a job: a straggler, data imbalance, or an input- or comm-bound gang."""

    kind: str
    """straggler | data_imbalance | input_bound | comm_bound"""
    state: str
    """raised (it stands) | cleared"""
    rank: int | None
    """The rank it is about; None: the whole gang."""
    node: str
    phase: str
    cause: str
    summary: str
    """The verdict in words."""
    evidence: Mapping[str, Any]
    """The verdict in numbers (e.g. a straggler's ratio, excess_ms, others_wait_ms)."""
    raised_step: int
    step: int
    """The last step judged (the clearing step once cleared)."""
    raised_ms: int
    cleared_ms: int

    @classmethod
    def from_pb(cls, f: pb.Finding) -> FindingInfo:
        """From the protocol message."""
        return cls(
            kind=f.kind,
            state=f.state,
            rank=f.rank if f.rank >= 0 else None,
            node=f.node,
            phase=f.phase,
            cause=f.cause,
            summary=f.summary,
            evidence=_evidence(f.evidence_json),
            raised_step=f.raised_step,
            step=f.step,
            raised_ms=f.raised_ms,
            cleared_ms=f.cleared_ms,
        )

    @property
    def standing(self) -> bool:
        """Whether the verdict still holds."""
        return self.state != "cleared"


@dataclass(frozen=True)
class JobProfileInfo:
    """Where one attempt of a job spends its steps, rank by rank, and what the profiler makes
    of it."""

    job_id: str
    attempt: int
    name: str
    owner: str
    state: str
    """running | ended"""
    world_size: int
    ranks: tuple[RankInfo, ...]
    findings: tuple[FindingInfo, ...]
    """Standing first, then cleared, newest first."""
    samples_per_s: float
    compute_fraction: float
    """Forward + backward over step time, median rank (0..1)."""
    gpu_util: float
    """Mean over the job's nodes, 0..1 (CPU utilisation on CPU nodes)."""
    last_step: int
    started_ms: int
    updated_ms: int
    attempts: tuple[int, ...]

    @classmethod
    def from_pb(cls, j: pb.JobProfile) -> JobProfileInfo:
        """From the protocol message."""
        return cls(
            job_id=j.job_id,
            attempt=j.attempt,
            name=j.name,
            owner=j.owner,
            state=j.state,
            world_size=j.world_size,
            ranks=tuple(RankInfo.from_pb(r) for r in j.ranks),
            findings=tuple(FindingInfo.from_pb(f) for f in j.findings),
            samples_per_s=j.samples_per_s,
            compute_fraction=j.compute_fraction,
            gpu_util=j.gpu_util,
            last_step=j.last_step,
            started_ms=j.started_ms,
            updated_ms=j.updated_ms,
            attempts=tuple(j.attempts),
        )

    @property
    def standing(self) -> tuple[FindingInfo, ...]:
        """The findings that still hold."""
        return tuple(f for f in self.findings if f.standing)

    @property
    def cleared(self) -> tuple[FindingInfo, ...]:
        """The findings that no longer hold."""
        return tuple(f for f in self.findings if not f.standing)

    @property
    def straggler(self) -> FindingInfo | None:
        """The standing straggler verdict, if any."""
        return next((f for f in self.standing if f.kind == "straggler"), None)


@dataclass(frozen=True)
class NodeInfo:
    """One node's health (ok or degraded, and why) and its recent utilisation."""

    node: str
    state: str
    """ok | degraded"""
    reason: str
    evidence: Mapping[str, Any]
    since_ms: int
    cpu_util: float
    """Mean over the last minutes, 0..1."""
    gpu_util: float
    """Mean over the last minutes, 0..1."""
    gpus: int
    gpus_allocated: float
    """GPUs the scheduler placed workers on (fractions count)."""
    cpus: float
    cpus_allocated: float
    memory_used_mib: int
    net_rx_bytes_per_s: float
    net_tx_bytes_per_s: float
    throttled: bool
    temperature_c: float
    """The hottest GPU."""
    power_w: float
    jobs: tuple[str, ...]
    slow_jobs: int
    """Distinct jobs it was slow in, recently."""
    last_seen_ms: int

    @classmethod
    def from_pb(cls, n: pb.NodeHealth) -> NodeInfo:
        """From the protocol message."""
        return cls(
            node=n.node,
            state=n.state,
            reason=n.reason,
            evidence=_evidence(n.evidence_json),
            since_ms=n.since_ms,
            cpu_util=n.cpu_util,
            gpu_util=n.gpu_util,
            gpus=n.gpus,
            gpus_allocated=n.gpus_allocated,
            cpus=n.cpus,
            cpus_allocated=n.cpu_allocated,
            memory_used_mib=n.memory_used_mib,
            net_rx_bytes_per_s=n.net_rx_bytes_per_s,
            net_tx_bytes_per_s=n.net_tx_bytes_per_s,
            throttled=n.throttled,
            temperature_c=n.temperature_c,
            power_w=n.power_w,
            jobs=tuple(n.jobs),
            slow_jobs=n.slow_jobs,
            last_seen_ms=n.last_seen_ms,
        )

    @property
    def degraded(self) -> bool:
        """Whether the node is marked degraded."""
        return self.state == "degraded"

    @property
    def unit(self) -> str:
        """What the node's workers run on: ``GPUs``, or ``CPUs`` on a node without a GPU."""
        return "GPUs" if self.gpus else "CPUs"

    @property
    def allocated(self) -> float:
        """Devices of :attr:`unit` the scheduler placed workers on."""
        return self.gpus_allocated if self.gpus else self.cpus_allocated

    @property
    def used(self) -> float:
        """Devices of :attr:`unit` actually busy (utilisation times capacity)."""
        return self.gpu_util * self.gpus if self.gpus else self.cpu_util * self.cpus

    @property
    def capacity(self) -> float:
        """Devices of :attr:`unit` the node has."""
        return float(self.gpus) if self.gpus else self.cpus


@dataclass(frozen=True)
class ClusterInfo:
    """The whole cluster's allocation against its actual use."""

    nodes: int
    degraded: int
    gpus: int
    gpus_allocated: float
    gpus_busy: float
    """Sum of GPU utilisation: what the allocated GPUs actually do."""
    cpus: float
    cpus_allocated: float
    cpus_busy: float
    running_jobs: int

    @classmethod
    def from_pb(cls, c: pb.ClusterUtilisation) -> ClusterInfo:
        """From the protocol message."""
        return cls(
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


@dataclass(frozen=True)
class TraceFileInfo:
    """What one rank recorded for a trace."""

    rank: int
    node: str
    state: str
    """pending | ready | failed"""
    bytes: int
    sha256: str
    reason: str
    """Why it failed."""
    first_step: int
    steps: int


@dataclass(frozen=True)
class TraceInfo:
    """A deep trace (torch.profiler) of a few steps of a job, one file per rank."""

    trace_id: str
    job_id: str
    attempt: int
    steps: int
    state: str
    """pending | ready | partial | failed"""
    requested_by: str
    requested_ms: int
    files: tuple[TraceFileInfo, ...]

    @classmethod
    def from_pb(cls, t: pb.Trace) -> TraceInfo:
        """From the protocol message."""
        return cls(
            trace_id=t.trace_id,
            job_id=t.job_id,
            attempt=t.attempt,
            steps=t.steps,
            state=t.state,
            requested_by=t.requested_by,
            requested_ms=t.requested_ms,
            files=tuple(
                TraceFileInfo(
                    f.rank, f.node, f.state, f.bytes, f.sha256, f.reason, f.first_step, f.steps
                )
                for f in t.files
            ),
        )

    @property
    def done(self) -> bool:
        """Whether the trace has stopped changing (ready, partial, failed or expired)."""
        return self.state in TRACE_DONE

    @property
    def ready_files(self) -> tuple[TraceFileInfo, ...]:
        """The files that can be downloaded."""
        return tuple(f for f in self.files if f.state == "ready")


class ProfilerClient(RpcClient):
    """A synchronous client of the profiler service, authenticated with a bearer token.

    ``timeout_s`` bounds each request/response call; ``download_timeout_s`` bounds a whole
    trace download.
    """

    service = "profiler"

    def __init__(
        self,
        address: str,
        bearer: str | None,
        *,
        timeout_s: float = 30.0,
        download_timeout_s: float = 600.0,
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, bearer, timeout_s=timeout_s, act_as=act_as, tls=tls)
        self._stub = pb_grpc.ProfilerServiceStub(self._channel)
        self._download_timeout = download_timeout_s

    # ------------------------------------------------------------------ jobs

    def job_profile(self, job: str, *, attempt: int = 0, max_points: int = 200) -> JobProfileInfo:
        """The profile of ``job`` (an id, or a name: the newest job of that name); ``attempt``
        0 is the latest; at most ``max_points`` timeline points per rank."""
        if attempt < 0:
            raise InvalidInput(f"attempt must be 0 (the latest) or more, not {attempt}")
        if max_points < 1:
            raise InvalidInput(f"max_points must be 1 or more, not {max_points}")
        request = pb.GetJobProfileRequest(
            job_id=_needed(job), attempt=attempt, max_points=max_points
        )
        return JobProfileInfo.from_pb(self._call("GetJobProfile", request))

    # ------------------------------------------------------------------ nodes

    def nodes(self) -> tuple[builtins.list[NodeInfo], ClusterInfo]:
        """Every node's health and utilisation, and the cluster's."""
        reply = self._call("ListNodes", pb.ListNodesRequest())
        return [NodeInfo.from_pb(n) for n in reply.nodes], ClusterInfo.from_pb(reply.cluster)

    def set_node_health(self, node: str, *, degraded: bool, reason: str) -> NodeInfo:
        """Mark ``node`` degraded, or recovered (``degraded=False``): an operator's decision,
        which the scheduler acts on."""
        request = pb.SetNodeHealthRequest(
            node=_needed(node, "a node name"), degraded=degraded, reason=reason
        )
        return NodeInfo.from_pb(self._call("SetNodeHealth", request))

    # ------------------------------------------------------------------ traces

    def start_trace(self, job: str, *, steps: int, ranks: tuple[int, ...] = ()) -> TraceInfo:
        """Ask ``job``'s workers to record the next ``steps`` steps with torch.profiler
        (``ranks``: those ranks only; empty: every rank). The trace starts pending."""
        if not 1 <= steps <= MAX_TRACE_STEPS:
            raise InvalidInput(f"steps must be 1..{MAX_TRACE_STEPS}, not {steps}")
        bad = [r for r in ranks if r < 0]
        if bad:
            raise InvalidInput(f"ranks are 0 or more, not {bad[0]}")
        request = pb.StartTraceRequest(job_id=_needed(job), steps=steps, ranks=sorted(set(ranks)))
        return TraceInfo.from_pb(self._call("StartTrace", request))

    def trace(self, trace_id: str) -> TraceInfo:
        """Where a trace stands, file by file."""
        request = pb.GetTraceRequest(trace_id=_needed(trace_id, "a trace id"))
        return TraceInfo.from_pb(self._call("GetTrace", request))

    def traces(self, job: str) -> builtins.list[TraceInfo]:
        """Every trace of ``job`` (an id or a name)."""
        reply = self._call("ListTraces", pb.ListTracesRequest(job_id=_needed(job)))
        return [TraceInfo.from_pb(t) for t in reply.traces]

    def download_trace(
        self,
        trace_id: str,
        rank: int,
        dest: Path,
        *,
        sha256: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        """Stream one rank's trace file (a gzipped Chrome trace) to ``dest``; return ``dest``.

        The file appears only once complete: a failed download leaves nothing at ``dest``.
        With ``sha256`` (:attr:`TraceFileInfo.sha256`) the bytes are checked against it.
        ``progress`` is called with the size of each chunk received.
        """
        if rank < 0:
            raise InvalidInput(f"rank must be 0 or more, not {rank}")
        request = pb.DownloadTraceRequest(trace_id=_needed(trace_id, "a trace id"), rank=rank)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part")
        digest = hashlib.sha256()
        call = self._stub.DownloadTrace(
            request, metadata=self._metadata, timeout=self._download_timeout
        )
        try:
            with ServerStream(call, _chunk_data, self._error) as chunks, part.open("wb") as out:
                for data in chunks:
                    out.write(data)
                    digest.update(data)
                    if progress is not None:
                        progress(len(data))
            if sha256 and digest.hexdigest() != sha256:
                raise IntegrityError(
                    f"trace {trace_id} rank {rank} arrived damaged: sha256 {digest.hexdigest()} "
                    f"is not the recorded {sha256}",
                    hint="download it again",
                )
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest


def _chunk_data(chunk: pb.Chunk) -> bytes:
    return chunk.data


def _needed(value: str, what: str = "a job id or name") -> str:
    if not value.strip():
        raise InvalidInput(f"{what} is needed")
    return value


__all__ = [
    "MAX_TRACE_STEPS",
    "PHASES",
    "TRACE_DONE",
    "ClusterInfo",
    "FindingInfo",
    "JobProfileInfo",
    "NodeInfo",
    "PhaseTimesInfo",
    "ProfilerClient",
    "RankInfo",
    "RankPointInfo",
    "TraceFileInfo",
    "TraceInfo",
]
