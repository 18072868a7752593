"""The scheduler service's answers as plain frozen dataclasses, built from its messages.

Re-exported by :mod:`gantry.client.scheduler`; import them from there. Every field after the
first has a default, so the service can grow a field without breaking code that builds these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gantry.protos.v1 import scheduler_pb2 as pb

#: Job states in lifecycle order; the last three are final.
JOB_STATES = ("pending", "scheduled", "running", "stopping", "succeeded", "failed", "cancelled")
#: States a job never leaves.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
MILLI = 1000


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker of the current attempt runs: its node and GPUs.

    ``gpu_milli`` holds the share of each GPU in ``gpu_index`` (1000 = the whole GPU).
    """

    worker: int
    node: str = ""
    gpu_index: tuple[int, ...] = ()
    gpu_milli: tuple[int, ...] = ()

    def shares(self) -> tuple[tuple[int, int], ...]:
        """(GPU index, milli-GPU) per GPU; whole GPUs where the service sent no share."""
        milli = self.gpu_milli if len(self.gpu_milli) == len(self.gpu_index) else ()
        return tuple(zip(self.gpu_index, milli or (MILLI,) * len(self.gpu_index), strict=True))

    @classmethod
    def from_pb(cls, m: pb.WorkerPlacement) -> WorkerPlacement:
        """From the protocol message."""
        return cls(m.worker, m.node, tuple(m.gpu_index), tuple(m.gpu_milli))


@dataclass(frozen=True)
class JobEvent:
    """One step of a job's history: at ``at_ms`` (Unix ms) it entered ``state`` for ``reason``."""

    at_ms: int
    state: str = ""
    reason: str = ""
    attempt: int = 0

    @classmethod
    def from_pb(cls, m: pb.JobEvent) -> JobEvent:
        """From the protocol message."""
        return cls(m.at_ms, m.state, m.reason, m.attempt)


@dataclass(frozen=True)
class JobProgress:
    """How far a job's training is: the latest progress its rank 0 reported.

    ``total_steps`` is 0 when the training does not know it; ``loss`` and ``eta_s`` (seconds
    left, as of ``updated_ms``) are None when it did not say. ``updated_ms`` is when it was
    measured (Unix ms), ``attempt`` the attempt that reported it.
    """

    step: int
    total_steps: int = 0
    epoch: int = 0
    loss: float | None = None
    samples_per_s: float = 0.0
    eta_s: float | None = None
    updated_ms: int = 0
    attempt: int = 0

    @property
    def fraction(self) -> float | None:
        """Steps done of the total (0..1), or None when the total is unknown."""
        if self.total_steps <= 0:
            return None
        return min(self.step / self.total_steps, 1.0)

    @classmethod
    def from_pb(cls, m: pb.Progress) -> JobProgress:
        """From the protocol message."""
        return cls(
            step=m.step,
            total_steps=m.total_steps,
            epoch=m.epoch,
            loss=m.loss if m.has_loss else None,
            samples_per_s=m.samples_per_s,
            eta_s=m.eta_s if m.has_eta else None,
            updated_ms=m.updated_ms,
            attempt=m.attempt,
        )


@dataclass(frozen=True)
class JobInfo:
    """A training job as the scheduler sees it: its shape, state, placements and history.

    Times are Unix milliseconds (0 until they happen). ``gpu_milli`` is per worker;
    ``workers`` is how many run in the current attempt (an elastic job runs with
    ``min_replicas`` to ``replicas``). ``reason`` says why the job is in its state, e.g. why it
    is still pending. ``progress`` is None until the training reported how far it is;
    ``restarts`` counts the times node agents restarted crashed workers from a checkpoint
    (the job ran on); ``model`` is the model version a successful job registered
    (``name:version``), ``metrics`` the numbers its rank 0 wrote (``metrics.json``: the
    training's final metrics, an evaluation's results) and ``dataset_version`` the version a
    data job committed (``dataset@version``).
    """

    id: str
    name: str = ""
    queue: str = ""
    owner: str = ""
    priority: int = 0
    state: str = ""
    reason: str = ""
    replicas: int = 0
    min_replicas: int = 0
    workers: int = 0
    attempt: int = 0
    submitted_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    placements: tuple[WorkerPlacement, ...] = ()
    spec_yaml: str = ""  #: the document as submitted
    history: tuple[JobEvent, ...] = ()
    request_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_milli: int = 0
    predicted_runtime_s: float = 0.0
    pool: str = ""  #: pools the job may use, comma-separated ("" = any)
    progress: JobProgress | None = None
    restarts: int = 0
    model: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    dataset_version: str = ""
    rendezvous: str = ""
    """``host:port`` where the running attempt's rank 0 listens (a dev session's server); "" when
    not placed (filled by ``get`` only)."""

    @property
    def terminal(self) -> bool:
        """Whether the job has finished (succeeded, failed or was cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def gpus(self) -> float:
        """GPUs the job holds (running) or asks for (otherwise): per worker times workers."""
        count = self.workers if self.workers else self.replicas
        return self.gpu_milli * count / MILLI

    @classmethod
    def from_pb(cls, m: pb.Job) -> JobInfo:
        """From the protocol message."""
        return cls(
            id=m.id,
            name=m.name,
            queue=m.queue,
            owner=m.owner,
            priority=m.priority,
            state=m.state,
            reason=m.reason,
            replicas=m.replicas,
            min_replicas=m.min_replicas,
            workers=m.workers,
            attempt=m.attempt,
            submitted_ms=m.submitted_ms,
            started_ms=m.started_ms,
            finished_ms=m.finished_ms,
            placements=tuple(WorkerPlacement.from_pb(p) for p in m.placements),
            spec_yaml=m.spec_yaml,
            history=tuple(JobEvent.from_pb(e) for e in m.history),
            request_id=m.request_id,
            labels=dict(m.labels),
            gpu_milli=m.gpu_milli,
            predicted_runtime_s=m.predicted_runtime_s,
            pool=m.pool,
            progress=JobProgress.from_pb(m.progress)
            if m.HasField("progress") and m.progress.updated_ms
            else None,
            restarts=m.restarts,
            model=m.model,
            metrics=dict(m.metrics),
            dataset_version=m.dataset_version,
            rendezvous=m.rendezvous,
        )


@dataclass(frozen=True)
class SubmitResult:
    """A submitted job; ``duplicate`` when its request id matched an earlier submission.

    For a dry run, ``job`` is what the service would have created (it was not stored).
    """

    job: JobInfo
    duplicate: bool = False


@dataclass(frozen=True)
class LogLine:
    """One line a worker wrote; ``stream`` is stdout, stderr or gantry (the platform's own)."""

    at_ms: int
    node: str = ""
    worker: int = 0
    stream: str = ""
    text: str = ""

    @classmethod
    def from_pb(cls, m: pb.LogLine) -> LogLine:
        """From the protocol message."""
        return cls(m.at_ms, m.node, m.worker, m.stream, m.text)


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node; ``free_milli`` is how much of it is unallocated (1000 = all)."""

    index: int
    model: str = ""
    memory_mib: int = 0
    free_milli: int = 0

    @classmethod
    def from_pb(cls, m: pb.Gpu) -> Gpu:
        """From the protocol message."""
        return cls(m.index, m.model, m.memory_mib, m.free_milli)


@dataclass(frozen=True)
class NodeInfo:
    """A node: its pool, health, capacity and what is free of it, and the jobs on it.

    ``state`` is ready, degraded or lost (``reason`` says why when not ready). ``address``
    is where other nodes reach it ("" = not registered); ``worker_slots`` is ``gpu``, or
    ``cpu`` for a node without GPUs that runs workers on its CPUs.
    """

    name: str
    pool: str = ""
    state: str = ""
    reason: str = ""
    cpu_milli: int = 0
    cpu_free_milli: int = 0
    memory_mib: int = 0
    memory_free_mib: int = 0
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    last_heartbeat_ms: int = 0
    jobs: tuple[str, ...] = ()
    address: str = ""
    worker_slots: str = "gpu"

    def gpus_by_model(self) -> dict[str, tuple[float, int]]:
        """Per GPU model: (free GPUs, counting shares as fractions; GPUs in all)."""
        out: dict[str, tuple[float, int]] = {}
        for g in self.gpus:
            free, total = out.get(g.model, (0.0, 0))
            out[g.model] = (free + g.free_milli / MILLI, total + 1)
        return out

    @classmethod
    def from_pb(cls, m: pb.Node) -> NodeInfo:
        """From the protocol message."""
        return cls(
            name=m.name,
            pool=m.pool,
            state=m.state,
            reason=m.reason,
            cpu_milli=m.cpu_milli,
            cpu_free_milli=m.cpu_free_milli,
            memory_mib=m.memory_mib,
            memory_free_mib=m.memory_free_mib,
            gpus=tuple(Gpu.from_pb(g) for g in m.gpus),
            labels=dict(m.labels),
            last_heartbeat_ms=m.last_heartbeat_ms,
            jobs=tuple(m.jobs),
            address=m.address,
            worker_slots=m.worker_slots or "gpu",
        )


@dataclass(frozen=True)
class Resources:
    """An amount of GPUs, CPUs (both may be fractional) and memory in MiB.

    In quotas and borrowing limits a negative field means unlimited (the protocol's rule).
    """

    gpus: float = 0.0
    cpus: float = 0.0
    memory_mib: int = 0

    @classmethod
    def from_pb(cls, m: pb.Resources) -> Resources:
        """From the protocol message."""
        return cls(m.gpus, m.cpus, m.memory_mib)

    def to_pb(self) -> pb.Resources:
        """As the protocol message."""
        return pb.Resources(gpus=self.gpus, cpus=self.cpus, memory_mib=self.memory_mib)


@dataclass(frozen=True)
class QueueInfo:
    """A queue: its guaranteed quota, what its jobs use, its cohort and fair-share standing.

    ``borrowing_limit`` is None when the queue may borrow without limit from its cohort.
    ``dominant_share`` is the queue's weighted DRF share (0..1 of the cluster).
    """

    name: str
    cohort: str = ""
    quota: Resources = Resources()
    used: Resources = Resources()
    borrowing_limit: Resources | None = None
    weight: float = 0.0
    pending: int = 0
    running: int = 0
    dominant_share: float = 0.0

    @classmethod
    def from_pb(cls, m: pb.Queue) -> QueueInfo:
        """From the protocol message."""
        limit = Resources.from_pb(m.borrowing_limit) if m.HasField("borrowing_limit") else None
        if limit is not None and max(limit.gpus, limit.cpus, limit.memory_mib) < 0:
            limit = None  # unlimited in every resource
        return cls(
            name=m.name,
            cohort=m.cohort,
            quota=Resources.from_pb(m.quota),
            used=Resources.from_pb(m.used),
            borrowing_limit=limit,
            weight=m.weight,
            pending=m.pending,
            running=m.running,
            dominant_share=m.dominant_share,
        )


@dataclass(frozen=True)
class UsageRow:
    """What one user, queue or pool (``key``) consumed over a window, in hours."""

    key: str
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    queueing_hours: float = 0.0  #: hours its jobs spent waiting to start
    jobs: int = 0

    @classmethod
    def from_pb(cls, m: pb.UsageRow) -> UsageRow:
        """From the protocol message."""
        return cls(m.key, m.gpu_hours, m.cpu_hours, m.queueing_hours, m.jobs)


__all__ = [
    "JOB_STATES",
    "TERMINAL_STATES",
    "Gpu",
    "JobEvent",
    "JobInfo",
    "JobProgress",
    "LogLine",
    "NodeInfo",
    "QueueInfo",
    "Resources",
    "SubmitResult",
    "UsageRow",
    "WorkerPlacement",
]
