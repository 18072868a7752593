"""The event catalog: every event type Gantry knows, its data model, version and stream.

Types under ``gantry.`` must be registered here (or by a service at start-up through
:func:`register`); their ``data`` is validated against the model. Types under ``ext.`` are
outside services' own events: the envelope is validated, ``data`` must be a JSON object.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gantry.core import InvalidInput
from gantry.events.envelope import EventEnvelope
from gantry.events.streams import stream_for_type


class EventData(BaseModel):
    """Base for every event's data model: unknown fields are kept (forward compatible)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class AuthzDecision(EventData):
    """An RBAC decision taken by a service (allow and deny alike)."""

    principal: str
    roles: list[str] = Field(default_factory=list)
    action: str
    resource_kind: str
    resource_name: str = "*"
    decision: Literal["allow", "deny"]
    reason: str
    service: str = ""
    method: str = ""
    via: str = Field(
        default="",
        description="the service that made the call on the principal's behalf ('' if none)",
    )
    address: str = Field(
        default="",
        max_length=256,
        description="where the call came from: the caller's network address as the service "
        "saw it ('' if unknown)",
    )


class TokenRevoked(EventData):
    """An identity token was revoked before it expired; every service refuses it from now on."""

    jti: str = Field(description="the token's id (its 'jti' claim)")
    subject: str = Field(default="", description="whom the token named, when it was given")
    expires_ms: int = Field(default=0, description="when the token would have expired")
    reason: str = ""


class AuditCheckpoint(EventData):
    """A signed tree head of the audit log."""

    tree_size: int = Field(ge=0)
    root_hash: str = Field(description="hex SHA-256")
    timestamp_ms: int
    key_id: str
    signature: str = Field(description="base64 Ed25519 signature over the tree head")


class AuditQueried(EventData):
    """A compliance query ran against the audit log (queries are audited too)."""

    query: str
    filters: dict[str, Any] = Field(default_factory=dict)
    results: int = Field(ge=0)


class DataAccessed(EventData):
    """A dataset was read (by a service, or by an outside system reporting its own reads)."""

    dataset: str
    version: str = ""
    view: Literal["raw", "deidentified"] = "deidentified"
    rows: int = Field(default=0, ge=0)
    decision: Literal["allow", "deny"] = "allow"
    purpose: str = ""
    shards: list[str] = Field(default_factory=list, description="shard ids read")
    grant: str = Field(default="", description="the grant id the read used, if any")
    job_id: str = Field(default="", description="the job the grant was issued for, if any")
    policy_version: int = Field(
        default=0, ge=0, description="view policy version applied (0: raw, or the default)"
    )
    reason: str = Field(default="", description="why a read was denied")
    address: str = Field(
        default="",
        max_length=256,
        description="where the read came from: the reader's network address or node "
        "('' if unknown)",
    )


class AuditAnomaly(EventData):
    """Access behaviour that departs from a principal's normal behaviour, with the evidence;
    or a change of an earlier one's state (acknowledged or dismissed, by whom and why)."""

    anomaly_id: str
    kind: str = Field(description="bulk_read, first_sensitive_access, denial_storm, ...")
    principal: str
    state: Literal["raised", "acknowledged", "dismissed"] = "raised"
    severity: float = Field(ge=0, description="how far past the threshold (1 = at it)")
    reason: str = Field(description="why, in words and numbers")
    evidence: dict[str, Any] = Field(default_factory=dict)
    event_ids: list[str] = Field(default_factory=list, description="the audited events")
    by: str = Field(default="", description="who acknowledged or dismissed it")
    note: str = ""


class AuditReportReady(EventData):
    """A compliance report was generated, signed and stored (encrypted) for auditors."""

    report_id: str
    period: Literal["daily", "weekly", "monthly", "custom"]
    since_ms: int = Field(ge=0)
    until_ms: int = Field(ge=0)
    tree_size: int = Field(ge=0, description="the signed tree head the figures were read from")
    root_hash: str
    digest: str = Field(description="SHA-256 of the report's canonical JSON")
    formats: list[str] = Field(default_factory=list, description="json, csv, pdf")
    by: str = Field(default="", description="who asked for it ('' for a scheduled report)")


class AuditArchived(EventData):
    """A segment of old audit events moved to the object store with its proof."""

    first_seq: int = Field(ge=0)
    end_seq: int = Field(ge=0, description="one past the last event of the segment")
    events: int = Field(ge=0)
    object: str
    segment_root: str = Field(description="Merkle root of the segment's leaves (hex)")
    tree_size: int = Field(ge=0, description="the signed tree head the proof leads to")


class AuditPurged(EventData):
    """Audit events whose retention expired (and that no legal hold covers) were deleted;
    their leaf hashes stay, so the log still verifies."""

    purge_id: str
    by: str
    events: int = Field(ge=0)
    ranges: list[list[int]] = Field(
        default_factory=list, description="[first, end) ranges of the deleted leaf indexes"
    )
    by_type: dict[str, int] = Field(default_factory=dict)
    held_back: int = Field(default=0, ge=0, description="expired events kept by a legal hold")


class AuditHoldChanged(EventData):
    """A legal hold was placed or released."""

    hold_id: str
    name: str
    state: Literal["active", "released"]
    by: str
    reason: str = ""
    principals: list[str] = Field(default_factory=list)
    datasets: list[str] = Field(default_factory=list)
    since_ms: int = Field(default=0, ge=0)
    until_ms: int = Field(default=0, ge=0)


class AuditRetentionChanged(EventData):
    """A retention rule for an event type was set or removed."""

    event_type: str = Field(description="a type, a prefix ending in '*', or '*'")
    keep_days: int = Field(ge=0, description="0 = the rule was removed")
    by: str


class SubjectErased(EventData):
    """A data subject was erased: new dataset versions without their rows were committed and
    the models trained on data that held them are named for retraining. The identifier itself
    is never in the event, only a keyed reference to it."""

    erasure_id: str
    subject_ref: str = Field(description="keyed hash of the identifier (not reversible)")
    requested_by: str
    reason: str = ""
    datasets: list[dict[str, Any]] = Field(
        default_factory=list,
        description="per dataset: dataset, old_version, new_version, rows_removed",
    )
    models_to_retrain: list[str] = Field(
        default_factory=list, description="'<model>:<version>' trained on data holding them"
    )


class DatasetCreated(EventData):
    """A dataset was registered with its schema and column classifications."""

    dataset: str
    format: Literal["table", "files"]
    owner: str
    columns: list[dict[str, Any]] = Field(default_factory=list)
    sensitivity: Literal["public", "internal", "pii", "sensitive"] = Field(
        default="internal",
        description="the highest classification of its columns (or of its files); the "
        "scheduler keeps jobs reading pii/sensitive data on trusted pools",
    )


class VersionCommitted(EventData):
    """An immutable dataset version was committed (a rollback commits a new version too)."""

    dataset: str
    version: str
    parents: list[str] = Field(default_factory=list)
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    shards: int = Field(ge=0)
    message: str = ""
    rollback_of: str = ""


class ViewPolicyChanged(EventData):
    """A dataset's de-identification policy got a new version."""

    dataset: str
    policy_version: int = Field(ge=1)
    rules: list[dict[str, Any]] = Field(default_factory=list)


class GrantIssued(EventData):
    """A short-lived read grant was issued to a job (the token itself is never in events)."""

    grant_id: str
    job_id: str
    view: Literal["raw", "deidentified"]
    versions: list[dict[str, str]] = Field(default_factory=list)
    expires_ms: int


class GrantRevoked(EventData):
    """A grant was revoked before it expired; its token opens nothing any more."""

    grant_id: str
    job_id: str
    reason: str = ""


class KeysRotated(EventData):
    """The object store's key-encryption key was rotated and data keys re-wrapped."""

    active_version: int = Field(ge=1)
    rewrapped: int = Field(ge=0)
    retired: list[int] = Field(default_factory=list)


class GarbageCollected(EventData):
    """Unreferenced dataset content was removed."""

    removed_objects: int = Field(ge=0)
    removed_bytes: int = Field(ge=0)
    kept_objects: int = Field(ge=0)


class ModelRegistered(EventData):
    """A model version (checkpoint or export) was registered in the model registry."""

    name: str
    version: int = Field(ge=1)
    digest: str
    bytes: int = Field(ge=0)
    framework: str = ""
    job_id: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    trained_on: list[dict[str, str]] = Field(default_factory=list)
    code_version: str = ""


class DatasetUse(EventData):
    """One dataset version a job reads, in the view its spec names."""

    dataset: str
    version: str
    view: Literal["raw", "deidentified"] = "deidentified"


class WorkerPlacement(EventData):
    """Where one worker of a job runs: the node and the GPUs (index, milli-GPU) it takes."""

    worker: int = Field(ge=0, description="the worker's rank in this attempt")
    node: str
    gpus: list[tuple[int, int]] = Field(default_factory=list)
    cpu_milli: int = Field(default=0, ge=0)
    memory_mib: int = Field(default=0, ge=0)


class JobScheduled(EventData):
    """A job was placed on nodes (the scheduler's decision); governance issues its data grant
    and the node agents named in ``placements`` start the workers."""

    job_id: str
    owner: str = ""
    owner_roles: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    datasets: list[DatasetUse] = Field(default_factory=list)
    name: str = ""
    queue: str = ""
    attempt: int = Field(default=1, ge=1, description="1 for the first run, +1 per requeue")
    placements: list[WorkerPlacement] = Field(default_factory=list)
    spec: dict[str, Any] = Field(
        default_factory=dict, description="the job's TrainingJob spec section, as submitted"
    )
    resume: bool = Field(default=False, description="resume from the last checkpoint")
    master_addr: str = Field(
        default="",
        description="address of rank 0's node, where the workers rendezvous ('' = the "
        "agents' loopback, for jobs on one node)",
    )
    master_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="rendezvous port of this attempt (0 = the agents derive one from the job id)",
    )


class JobSubmitted(EventData):
    """A job was accepted by the scheduler (validated, queued)."""

    job_id: str
    name: str
    queue: str
    owner: str
    priority: int
    replicas: int = Field(ge=1)
    min_replicas: int = Field(ge=1)
    gpu_milli: int = Field(ge=0, description="milli-GPU per worker")
    request_id: str = ""


class JobStateChanged(EventData):
    """A job moved to a new state (pending, scheduled, running, stopping, succeeded, failed,
    cancelled), with the reason in words."""

    job_id: str
    state: str
    previous: str = ""
    reason: str = ""
    attempt: int = Field(default=0, ge=0)
    model: str = Field(
        default="", description="on succeeded: the model version registered, as name:version"
    )
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="on succeeded: the metrics rank 0 wrote (metrics.json), finite floats",
    )
    dataset_version: str = Field(
        default="",
        description="on succeeded: the dataset version the job committed, as dataset@version",
    )


class JobStopRequested(EventData):
    """The scheduler asks the job's node agents to checkpoint and stop its workers."""

    job_id: str
    attempt: int = Field(ge=1)
    reason: Literal[
        "preempted",
        "cancelled",
        "shrink",
        "resize",
        "max-runtime",
        "gang-timeout",
        "node-lost",
        "failed",
    ]
    nodes: list[str] = Field(default_factory=list)
    workers: list[int] = Field(default_factory=list, description="ranks to stop; empty = all")
    grace_s: float = Field(default=30.0, ge=0)


class JobWorkersReported(EventData):
    """A node agent's report on a job's workers it runs: started, checkpointed or stopped."""

    job_id: str
    attempt: int = Field(ge=1)
    node: str
    workers: list[int] = Field(default_factory=list)
    status: Literal["started", "checkpointed", "restarted", "succeeded", "failed", "stopped"]
    exit_code: int = 0
    message: str = ""
    step: int = Field(default=0, ge=0, description="training step of a checkpoint")
    restarts: int = Field(
        default=0, ge=0, description="times the agent restarted the workers in this attempt"
    )
    model: str = Field(
        default="", description="on success: the model version registered, as name:version"
    )
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="on success: the metrics rank 0 wrote to $GANTRY_OUTPUT_DIR/metrics.json "
        "(finite floats only)",
    )
    dataset_version: str = Field(
        default="",
        description="on success: the dataset version committed for spec.output, as "
        "dataset@version (the full version id)",
    )


class JobUsage(EventData):
    """Resources a job attempt consumed (on every stop): the basis of usage accounting."""

    job_id: str
    owner: str
    queue: str
    pools: list[str] = Field(default_factory=list)
    attempt: int = Field(ge=1)
    gpu_seconds: float = Field(ge=0)
    cpu_seconds: float = Field(ge=0)
    queueing_s: float = Field(ge=0)
    run_s: float = Field(ge=0)


class JobLogLines(EventData):
    """Lines a job's worker wrote (batched by the node agent; on the LOGS stream)."""

    job_id: str
    attempt: int = Field(default=1, ge=1)
    node: str
    worker: int = Field(default=0, ge=0)
    stream: Literal["stdout", "stderr", "gantry"] = "stdout"
    lines: list[str] = Field(default_factory=list)
    at_ms: int = 0


class JobProgress(EventData):
    """How far a job's training is (rank 0's view; on METRICS, a few per job per minute)."""

    job_id: str
    attempt: int = Field(default=1, ge=1)
    step: int = Field(ge=0)
    total_steps: int = Field(default=0, ge=0, description="0 when unknown")
    epoch: int = Field(default=0, ge=0)
    loss: float | None = None
    samples_per_s: float = Field(default=0.0, ge=0)
    eta_s: float | None = Field(default=None, ge=0)
    at_ms: int = 0


class JobStepMetrics(EventData):
    """One worker's step timings over a window of steps (aggregated: never one per step).

    Times are means per step in milliseconds; ``step_ms_max`` is the slowest step in the window.
    """

    job_id: str
    attempt: int = Field(default=1, ge=1)
    node: str
    worker: int = Field(ge=0)
    first_step: int = Field(ge=0)
    last_step: int = Field(ge=0)
    step_ms: float = Field(ge=0)
    step_ms_max: float = Field(ge=0)
    data_ms: float = Field(default=0.0, ge=0, description="waiting for the next batch")
    compute_ms: float = Field(default=0.0, ge=0, description="forward and backward")
    forward_ms: float = Field(default=0.0, ge=0, description="of compute: forward and loss")
    backward_ms: float = Field(default=0.0, ge=0, description="of compute: backward")
    comm_ms: float = Field(
        default=0.0,
        ge=0,
        description="waiting on other ranks: gradient all-reduce not overlapped with the "
        "backward pass, and the per-step agreement",
    )
    optimizer_ms: float = Field(default=0.0, ge=0)
    samples: int = Field(default=0, ge=0, description="samples this worker processed")
    tokens: int = Field(default=0, ge=0, description="tokens it processed (sequence data)")
    loss: float | None = None
    memory_mib: int = Field(default=0, ge=0, description="peak accelerator (or RSS) memory")
    at_ms: int = 0


class GpuUsage(EventData):
    """One GPU's utilisation at a heartbeat (NVML where available)."""

    index: int = Field(ge=0)
    util: float = Field(default=0.0, ge=0, le=1)
    memory_used_mib: int = Field(default=0, ge=0)
    temperature_c: float = 0.0
    power_w: float = Field(default=0.0, ge=0)
    throttled: bool = False


class GpuDevice(EventData):
    """One GPU of a node."""

    index: int = Field(ge=0)
    model: str
    memory_mib: int = Field(default=0, ge=0)
    numa: int = -1
    nvlink_domain: str = ""


class NodeRegistered(EventData):
    """A node agent registered (or re-registered) its node's inventory."""

    node: str
    pool: str = "default"
    cpu_milli: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    gpus: list[GpuDevice] = Field(default_factory=list)
    labels: dict[str, str] = Field(
        default_factory=dict, description="topology labels: rack, zone, nvlink, numa, ..."
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="how often it will heartbeat")
    agent: str = Field(
        default="",
        description="the agent and its boot id: a new value means the agent restarted and the "
        "workers it ran are gone",
    )
    address: str = Field(
        default="", description="where other nodes reach this one (rendezvous of gangs)"
    )
    worker_slots: str = Field(
        default="gpu",
        description="'gpu' when workers run on GPUs, 'cpu' when the node has none and offers "
        "CPU worker slots",
    )


class NodeHeartbeat(EventData):
    """A node agent is alive (on the METRICS stream: frequent, short-lived, not audited)."""

    node: str
    seq: int = Field(ge=0)
    jobs: list[str] = Field(default_factory=list, description="jobs with workers running here")
    gpu_util: float = Field(default=0.0, ge=0, le=1)
    cpu_util: float = Field(default=0.0, ge=0, le=1)
    memory_used_mib: int = Field(default=0, ge=0)
    gpus: list[GpuUsage] = Field(default_factory=list)
    net_rx_bytes_per_s: float = Field(default=0.0, ge=0, description="network received")
    net_tx_bytes_per_s: float = Field(default=0.0, ge=0, description="network sent")


class NodeLost(EventData):
    """A node missed its heartbeats; its jobs were requeued."""

    node: str
    last_seen_ms: int
    requeued: list[str] = Field(default_factory=list)


class NodeHealth(EventData):
    """A node was marked degraded (slow, throttling) or recovered, e.g. by the profiler."""

    node: str
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)


class JobProfileFinding(EventData):
    """The profiler found a problem in a running job, or saw it end (``state: cleared``).

    ``kind``: ``straggler`` (a rank holds the gang back; ``rank``, ``node``, ``phase`` and
    ``cause`` say which, where, in what and why), ``data_imbalance`` (ranks get unequal work),
    ``input_bound`` (the gang waits for data) or ``comm_bound`` (it waits on communication).
    ``summary`` says it in words, ``evidence`` in numbers.
    """

    job_id: str
    attempt: int = Field(default=1, ge=1)
    kind: Literal["straggler", "data_imbalance", "input_bound", "comm_bound"]
    state: Literal["raised", "cleared"] = "raised"
    rank: int | None = Field(default=None, ge=0)
    node: str = ""
    phase: str = Field(default="", description="data, forward, backward, optimizer, comm")
    cause: str = Field(
        default="", description="slow_data_loading, longer_samples, more_samples, slow_compute"
    )
    summary: str = ""
    step: int = Field(default=0, ge=0, description="the last step the verdict saw")
    evidence: dict[str, Any] = Field(default_factory=dict)


class TraceRequested(EventData):
    """Someone asked for a deep trace (``torch.profiler``) of the next ``steps`` steps of a job;
    the agents running its workers pass it on and upload what the workers record."""

    trace_id: str
    job_id: str
    attempt: int = Field(default=1, ge=1)
    steps: int = Field(ge=1, le=1000)
    ranks: list[int] = Field(default_factory=list, description="empty: every rank")
    requested_by: str = ""


class TraceReady(EventData):
    """A deep trace of one rank was stored (or could not be recorded: ``state: failed``)."""

    trace_id: str
    job_id: str
    attempt: int = Field(default=1, ge=1)
    rank: int = Field(ge=0)
    node: str = ""
    state: Literal["ready", "failed"] = "ready"
    bytes: int = Field(default=0, ge=0)
    sha256: str = ""
    first_step: int = Field(default=0, ge=0)
    steps: int = Field(default=0, ge=0)
    reason: str = ""


class QueueChanged(EventData):
    """A queue was created or its quota changed."""

    queue: str
    cohort: str = ""
    quota: dict[str, float] = Field(default_factory=dict)
    weight: float = 1.0


class ServingVersionWeight(EventData):
    """One version of a deployment and its share of the traffic."""

    version: int = Field(ge=1)
    weight: int = Field(ge=0, le=100)
    role: str = "stable"


class ServingChanged(EventData):
    """A deployment changed: deployed, traffic moved, a canary stepped, promoted, rolled back,
    a version was added, removed or swapped, or the deployment was removed."""

    deployment: str
    model: str
    action: str
    versions: list[ServingVersionWeight] = Field(default_factory=list)
    detail: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)


class ServingVersionState(EventData):
    """A deployed version was loaded (ready) or could not be (failed)."""

    deployment: str
    model: str
    version: int = Field(ge=1)
    state: str
    reason: str = ""
    device: str = "cpu"
    quantized: bool = False
    load_s: float = Field(default=0.0, ge=0)


class ServingScaled(EventData):
    """The autoscaler changed how many instances of a version run batches."""

    deployment: str
    model: str
    version: int = Field(ge=1)
    instances_from: int = Field(ge=0)
    instances_to: int = Field(ge=0)
    reason: str = ""


class WorkflowRunChanged(EventData):
    """A pipeline run changed state (``gantry.workflow.run.changed``)."""

    run_id: str
    pipeline: str
    revision: int = Field(ge=1)
    state: str
    previous: str = ""
    reason: str = ""
    trigger: str = Field(default="manual", description="manual, schedule, retry")
    owner: str = ""


class WorkflowStepChanged(EventData):
    """A step of a pipeline run changed state (``gantry.workflow.step.changed``)."""

    run_id: str
    pipeline: str
    step: str
    kind: str
    state: str
    previous: str = ""
    attempt: int = Field(default=0, ge=0)
    job_id: str = ""
    reason: str = ""
    outputs: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    inputs: list[str] = Field(default_factory=list, description="kind name@version it used")
    produced: list[str] = Field(default_factory=list, description="kind name@version it made")


class ExperimentChanged(EventData):
    """An experiment (hyperparameter search) changed state (``gantry.workflow.experiment``)."""

    experiment: str
    state: str
    previous: str = ""
    reason: str = ""
    owner: str = ""
    objective: str = ""
    best_trial: int = -1
    best_value: float | None = None
    trials: int = Field(default=0, ge=0, description="trials started so far")


class TrialChanged(EventData):
    """A trial of an experiment changed state (``gantry.workflow.trial.changed``)."""

    experiment: str
    number: int = Field(ge=0)
    state: str
    job_id: str = ""
    values: dict[str, Any] = Field(default_factory=dict, description="the parameters tried")
    value: float | None = None
    epoch: int = Field(default=0, ge=0, description="the last epoch it reported")
    reason: str = ""


class JobEvaluation(EventData):
    """A job's rank 0 evaluated the model during training (``gantry.metrics.job.evaluation``):
    the held-out metrics after an epoch, for early stopping and search."""

    job_id: str
    attempt: int = Field(default=1, ge=1)
    node: str = ""
    step: int = Field(ge=0)
    epoch: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    at_ms: int = 0


class DevSessionChanged(EventData):
    """A dev session changed state (``gantry.workflow.session.changed``)."""

    session: str
    state: str
    previous: str = ""
    reason: str = ""
    owner: str = ""
    generation: int = Field(default=1, ge=1, description="1, +1 per resume")
    job_id: str = ""
    endpoint: str = Field(default="", description="host:port of its server while it runs")


@dataclass(frozen=True)
class EventSpec:
    """One catalog entry."""

    type: str
    schema_version: int
    model: builtins.type[EventData]
    description: str
    #: The NATS users (platform services, or ``external`` for outside services) that may
    #: publish this type: the source of the bus's publish permissions (gantry.events.topology).
    publishers: tuple[str, ...] = ()

    @property
    def stream(self) -> str:
        """The JetStream stream that stores this type."""
        return stream_for_type(self.type)


_CATALOG: dict[tuple[str, int], EventSpec] = {}


def register(
    type_: str,
    schema_version: int,
    model: type[EventData],
    description: str,
    *,
    publishers: tuple[str, ...],
) -> EventSpec:
    """Add an event type to the catalog (idempotent for the same model).

    ``publishers`` names who may publish it; NATS enforces that (gantry.events.topology).
    """
    key = (type_, schema_version)
    existing = _CATALOG.get(key)
    if existing is not None and existing.model is not model:
        raise InvalidInput(f"event type {type_} v{schema_version} is already registered")
    spec = EventSpec(type_, schema_version, model, description, publishers)
    _CATALOG[key] = spec
    return spec


def lookup(type_: str, schema_version: int) -> EventSpec | None:
    """The catalog entry for a type and version, or None."""
    return _CATALOG.get((type_, schema_version))


def catalog() -> list[EventSpec]:
    """Every registered event type, sorted by type."""
    return sorted(_CATALOG.values(), key=lambda s: (s.type, s.schema_version))


def validate_event(event: EventEnvelope) -> EventData | dict[str, Any]:
    """Check ``event.data`` against the catalog; raise :class:`InvalidInput` if it does not fit."""
    if event.type.startswith("ext."):
        return event.data
    spec = lookup(event.type, event.schema_version)
    if spec is None:
        known = sorted({t for t, _ in _CATALOG})
        raise InvalidInput(
            f"unknown event type {event.type} v{event.schema_version}",
            hint=f"known gantry types: {', '.join(known)}; "
            "outside services use 'ext.<service>.<name>'",
        )
    try:
        return spec.model.model_validate(event.data)
    except ValidationError as exc:
        problems = "; ".join(
            f"data.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"{event.type} v{event.schema_version}: {problems}") from None


AUTHZ_DECISION = register(
    "gantry.authz.decision",
    1,
    AuthzDecision,
    "An RBAC decision (allow or deny) on an API call.",
    publishers=("audit", "governance", "scheduler", "serving", "profiler", "workflows"),
)
TOKEN_REVOKED = register(
    "gantry.authz.token.revoked",
    1,
    TokenRevoked,
    "An identity token was revoked; services refuse it from then on.",
    publishers=("audit",),
)
AUDIT_CHECKPOINT = register(
    "gantry.audit.checkpoint",
    1,
    AuditCheckpoint,
    "A signed tree head of the audit log.",
    publishers=("audit",),
)
AUDIT_QUERIED = register(
    "gantry.audit.queried",
    1,
    AuditQueried,
    "A compliance query against the audit log.",
    publishers=("audit",),
)
AUDIT_ANOMALY = register(
    "gantry.audit.anomaly",
    1,
    AuditAnomaly,
    "Access behaviour departing from a principal's normal behaviour (raised, acknowledged, "
    "dismissed).",
    publishers=("audit",),
)
AUDIT_REPORT_READY = register(
    "gantry.audit.report.ready",
    1,
    AuditReportReady,
    "A signed compliance report was stored.",
    publishers=("audit",),
)
AUDIT_ARCHIVED = register(
    "gantry.audit.archived",
    1,
    AuditArchived,
    "Old audit events were archived with proofs.",
    publishers=("audit",),
)
AUDIT_PURGED = register(
    "gantry.audit.purged",
    1,
    AuditPurged,
    "Audit events past their retention were deleted.",
    publishers=("audit",),
)
AUDIT_HOLD_CHANGED = register(
    "gantry.audit.hold.changed",
    1,
    AuditHoldChanged,
    "A legal hold was placed or released.",
    publishers=("audit",),
)
AUDIT_RETENTION_CHANGED = register(
    "gantry.audit.retention.changed",
    1,
    AuditRetentionChanged,
    "A retention rule for audit events was set or removed.",
    publishers=("audit",),
)
SUBJECT_ERASED = register(
    "gantry.data.subject.erased",
    1,
    SubjectErased,
    "A data subject was erased from new dataset versions; models to retrain are named.",
    publishers=("governance",),
)
DATA_ACCESSED = register(
    "gantry.data.accessed",
    1,
    DataAccessed,
    "A dataset was read.",
    publishers=("governance", "external"),
)
DATASET_CREATED = register(
    "gantry.data.dataset.created",
    1,
    DatasetCreated,
    "A dataset was registered.",
    publishers=("governance",),
)
VERSION_COMMITTED = register(
    "gantry.data.version.committed",
    1,
    VersionCommitted,
    "A dataset version was committed.",
    publishers=("governance",),
)
VIEW_POLICY_CHANGED = register(
    "gantry.data.policy.changed",
    1,
    ViewPolicyChanged,
    "A view policy got a new version.",
    publishers=("governance",),
)
GRANT_ISSUED = register(
    "gantry.data.grant.issued",
    1,
    GrantIssued,
    "A job got a read grant.",
    publishers=("governance",),
)
GRANT_REVOKED = register(
    "gantry.data.grant.revoked",
    1,
    GrantRevoked,
    "A job's read grant was revoked.",
    publishers=("governance",),
)
KEYS_ROTATED = register(
    "gantry.data.keys.rotated",
    1,
    KeysRotated,
    "The storage key-encryption key was rotated.",
    publishers=("governance",),
)
GARBAGE_COLLECTED = register(
    "gantry.data.gc.completed",
    1,
    GarbageCollected,
    "Unreferenced content was removed.",
    publishers=("governance",),
)
MODEL_REGISTERED = register(
    "gantry.model.registered",
    1,
    ModelRegistered,
    "A model version was registered.",
    publishers=("governance",),
)
JOB_SCHEDULED = register(
    "gantry.job.scheduled", 1, JobScheduled, "A job was placed on nodes.", publishers=("scheduler",)
)
JOB_SUBMITTED = register(
    "gantry.job.submitted", 1, JobSubmitted, "A job was accepted.", publishers=("scheduler",)
)
JOB_STATE = register(
    "gantry.job.state", 1, JobStateChanged, "A job changed state.", publishers=("scheduler",)
)
JOB_STOP_REQUESTED = register(
    "gantry.job.stop.requested",
    1,
    JobStopRequested,
    "Workers are asked to checkpoint and stop.",
    publishers=("scheduler",),
)
JOB_WORKERS = register(
    "gantry.job.workers",
    1,
    JobWorkersReported,
    "A node agent reports on a job's workers.",
    publishers=("training-agent",),
)
JOB_LOG = register(
    "gantry.log.job", 1, JobLogLines, "Log lines of a job's worker.", publishers=("training-agent",)
)
JOB_USAGE = register(
    "gantry.job.usage", 1, JobUsage, "Resources a job attempt consumed.", publishers=("scheduler",)
)
JOB_PROGRESS = register(
    "gantry.metrics.job.progress",
    1,
    JobProgress,
    "How far a job's training is.",
    publishers=("training-agent",),
)
JOB_STEP_METRICS = register(
    "gantry.metrics.job.step",
    1,
    JobStepMetrics,
    "A worker's step timings over a window.",
    publishers=("training-agent",),
)
JOB_PROFILE_FINDING = register(
    "gantry.job.profile.finding",
    1,
    JobProfileFinding,
    "The profiler found a straggler, imbalance or bottleneck in a job, or saw it end.",
    publishers=("profiler",),
)
TRACE_REQUESTED = register(
    "gantry.job.trace.requested",
    1,
    TraceRequested,
    "A deep trace of a job was asked for.",
    publishers=("profiler",),
)
TRACE_READY = register(
    "gantry.job.trace.ready",
    1,
    TraceReady,
    "A deep trace of a rank was stored (or failed).",
    publishers=("profiler",),
)
NODE_REGISTERED = register(
    "gantry.node.registered",
    1,
    NodeRegistered,
    "A node agent registered its inventory.",
    publishers=("training-agent",),
)
NODE_HEARTBEAT = register(
    "gantry.metrics.node.heartbeat",
    1,
    NodeHeartbeat,
    "A node agent is alive.",
    publishers=("training-agent",),
)
NODE_LOST = register(
    "gantry.node.lost", 1, NodeLost, "A node missed its heartbeats.", publishers=("scheduler",)
)
NODE_DEGRADED = register(
    "gantry.node.degraded", 1, NodeHealth, "A node was marked degraded.", publishers=("profiler",)
)
NODE_RECOVERED = register(
    "gantry.node.recovered", 1, NodeHealth, "A node recovered.", publishers=("profiler",)
)
QUEUE_CHANGED = register(
    "gantry.job.queue.changed", 1, QueueChanged, "A queue quota changed.", publishers=("scheduler",)
)
SERVING_CHANGED = register(
    "gantry.serving.deployment.changed",
    1,
    ServingChanged,
    "A deployment or its traffic changed.",
    publishers=("serving",),
)
SERVING_VERSION = register(
    "gantry.serving.version.state",
    1,
    ServingVersionState,
    "A deployed version loaded or failed.",
    publishers=("serving",),
)
SERVING_SCALED = register(
    "gantry.serving.scaled",
    1,
    ServingScaled,
    "A deployed version's instances were scaled.",
    publishers=("serving",),
)
DEV_SESSION_CHANGED = register(
    "gantry.workflow.session.changed",
    1,
    DevSessionChanged,
    "A dev session started, was culled, expired, stopped, preempted or resumed.",
    publishers=("workflows",),
)
EXPERIMENT_CHANGED = register(
    "gantry.workflow.experiment.changed",
    1,
    ExperimentChanged,
    "An experiment (hyperparameter search) changed state.",
    publishers=("workflows",),
)
TRIAL_CHANGED = register(
    "gantry.workflow.trial.changed",
    1,
    TrialChanged,
    "A trial of an experiment changed state.",
    publishers=("workflows",),
)
JOB_EVALUATION = register(
    "gantry.metrics.job.evaluation",
    1,
    JobEvaluation,
    "A job evaluated its model during training (held-out metrics after an epoch).",
    publishers=("training-agent",),
)
WORKFLOW_RUN_CHANGED = register(
    "gantry.workflow.run.changed",
    1,
    WorkflowRunChanged,
    "A pipeline run changed state.",
    publishers=("workflows",),
)
WORKFLOW_STEP_CHANGED = register(
    "gantry.workflow.step.changed",
    1,
    WorkflowStepChanged,
    "A step of a pipeline run changed state (its job, outputs and lineage).",
    publishers=("workflows",),
)

__all__ = [
    "AUDIT_ANOMALY",
    "AUDIT_ARCHIVED",
    "AUDIT_CHECKPOINT",
    "AUDIT_HOLD_CHANGED",
    "AUDIT_PURGED",
    "AUDIT_QUERIED",
    "AUDIT_REPORT_READY",
    "AUDIT_RETENTION_CHANGED",
    "AUTHZ_DECISION",
    "DATASET_CREATED",
    "DATA_ACCESSED",
    "DEV_SESSION_CHANGED",
    "EXPERIMENT_CHANGED",
    "GARBAGE_COLLECTED",
    "GRANT_ISSUED",
    "GRANT_REVOKED",
    "JOB_EVALUATION",
    "JOB_LOG",
    "JOB_PROFILE_FINDING",
    "JOB_PROGRESS",
    "JOB_SCHEDULED",
    "JOB_STATE",
    "JOB_STEP_METRICS",
    "JOB_STOP_REQUESTED",
    "JOB_SUBMITTED",
    "JOB_USAGE",
    "JOB_WORKERS",
    "KEYS_ROTATED",
    "MODEL_REGISTERED",
    "NODE_DEGRADED",
    "NODE_HEARTBEAT",
    "NODE_LOST",
    "NODE_RECOVERED",
    "NODE_REGISTERED",
    "QUEUE_CHANGED",
    "SERVING_CHANGED",
    "SERVING_SCALED",
    "SERVING_VERSION",
    "SUBJECT_ERASED",
    "TOKEN_REVOKED",
    "TRACE_READY",
    "TRACE_REQUESTED",
    "TRIAL_CHANGED",
    "VERSION_COMMITTED",
    "VIEW_POLICY_CHANGED",
    "WORKFLOW_RUN_CHANGED",
    "WORKFLOW_STEP_CHANGED",
    "AuditAnomaly",
    "AuditArchived",
    "AuditCheckpoint",
    "AuditHoldChanged",
    "AuditPurged",
    "AuditQueried",
    "AuditReportReady",
    "AuditRetentionChanged",
    "AuthzDecision",
    "DataAccessed",
    "DatasetCreated",
    "DatasetUse",
    "DevSessionChanged",
    "EventData",
    "EventSpec",
    "ExperimentChanged",
    "GarbageCollected",
    "GpuDevice",
    "GpuUsage",
    "GrantIssued",
    "GrantRevoked",
    "JobEvaluation",
    "JobLogLines",
    "JobProfileFinding",
    "JobProgress",
    "JobScheduled",
    "JobStateChanged",
    "JobStepMetrics",
    "JobStopRequested",
    "JobSubmitted",
    "JobUsage",
    "JobWorkersReported",
    "KeysRotated",
    "ModelRegistered",
    "NodeHealth",
    "NodeHeartbeat",
    "NodeLost",
    "NodeRegistered",
    "QueueChanged",
    "ServingChanged",
    "ServingScaled",
    "ServingVersionState",
    "ServingVersionWeight",
    "SubjectErased",
    "TokenRevoked",
    "TraceReady",
    "TraceRequested",
    "TrialChanged",
    "VersionCommitted",
    "ViewPolicyChanged",
    "WorkerPlacement",
    "WorkflowRunChanged",
    "WorkflowStepChanged",
    "catalog",
    "lookup",
    "register",
    "validate_event",
]
