"""The profiler's settings (environment variables ``GANTRY_PROFILER__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from gantry.core import CommonSettings
from gantry.profiler.nodes import NodeHealthConfig
from gantry.profiler.stragglers import DetectionConfig
from gantry.storage import StorageSettings


class DetectionOptions(BaseModel):
    """Straggler, imbalance and bottleneck thresholds (``GANTRY_PROFILER__DETECTION__*``)."""

    threshold: float = Field(
        default=1.5, gt=1, description="A straggler's busy time over the other ranks' median."
    )
    clear_threshold: float = Field(
        default=1.25, gt=1, description="The straggler verdict clears below this ratio."
    )
    horizon_steps: int = Field(
        default=30, ge=2, description="Judge at least this many recent steps..."
    )
    min_segments: int = Field(default=2, ge=1, description="...in at least this many segments.")
    min_excess_ms: float = Field(
        default=1.0, ge=0, description="Ignore smaller excesses per step (timer noise)."
    )
    corroboration: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="The other ranks must wait this fraction of a straggler's excess.",
    )
    imbalance: float = Field(
        default=0.15, gt=0, description="Tokens/samples per step differing by this fraction."
    )
    input_bound: float = Field(
        default=0.3, gt=0, le=1, description="Share of the step waiting for data: input-bound."
    )
    comm_bound: float = Field(
        default=0.5, gt=0, le=1, description="Share of the step waiting on communication."
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> DetectionOptions:
        if self.clear_threshold >= self.threshold:
            raise ValueError(
                f"clear_threshold ({self.clear_threshold}) must be below threshold "
                f"({self.threshold}), or a verdict would clear as soon as it is raised"
            )
        return self

    def config(self) -> DetectionConfig:
        return DetectionConfig(**self.model_dump())


class NodeOptions(BaseModel):
    """Node health thresholds (``GANTRY_PROFILER__NODES__*``)."""

    slow_jobs: int = Field(
        default=2, ge=1, description="Distinct jobs a node must be the slow one in..."
    )
    slow_window_s: float = Field(default=3600.0, gt=0, description="...within this many seconds.")
    throttle_heartbeats: int = Field(
        default=3, ge=1, description="Throttled heartbeats in a row that degrade a node."
    )
    recover_heartbeats: int = Field(
        default=6, ge=1, description="Clean heartbeats in a row that recover a throttled node."
    )
    probation_s: float = Field(
        default=1800.0, gt=0, description="A node degraded for slowness gets work again after."
    )
    utilisation_window_s: float = Field(
        default=300.0, gt=0, description="Utilisation is averaged over this many seconds."
    )

    def config(self) -> NodeHealthConfig:
        return NodeHealthConfig(**self.model_dump())


class ProfilerOptions(BaseModel):
    """Options of the profiler itself."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of its database; default sqlite:///<data_dir>/profiler.db. "
        "Use postgresql+psycopg://... on clusters.",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(default=7035, ge=0, le=65535, description="gRPC port; 0 = any free.")
    metrics_port: int = Field(
        default=9035, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free."
    )
    min_window_interval_s: float = Field(
        default=0.2,
        ge=0,
        description="Rate limit: a rank's windows are analysed at most this often; sooner ones "
        "are merged into the next (nothing is lost).",
    )
    raw_retention_s: float = Field(
        default=3600.0, gt=0, description="Full-resolution windows and node samples kept (1 h)."
    )
    rollup_retention_s: float = Field(
        default=30 * 86400.0, gt=0, description="Per-minute rollups kept (30 days)."
    )
    compact_every_s: float = Field(
        default=300.0, gt=0, description="How often old rows are rolled up and expired."
    )
    max_jobs: int = Field(
        default=500, ge=1, description="Ended jobs kept in memory (all stay in the database)."
    )
    trace_expire_s: float = Field(
        default=660.0,
        gt=0,
        description="A trace whose ranks never all answered is reported expired after this "
        "(the agents give up on a rank after 600 s by default).",
    )
    max_trace_bytes: int = Field(
        default=512 * 1024 * 1024, ge=1024, description="Largest trace file accepted (512 MiB)."
    )
    ack_wait_s: float = Field(default=30.0, gt=0, description="JetStream ack wait.")
    unknown_job_retry_s: float = Field(
        default=2.0,
        gt=0,
        description="Metrics of a job not seen scheduled yet are retried after this long "
        "(3 times) before they are dead-lettered.",
    )
    policy_file: Path | None = Field(
        default=None, description="RBAC policy YAML; default: the shipped policy."
    )
    detection: DetectionOptions = Field(default_factory=DetectionOptions)
    nodes: NodeOptions = Field(default_factory=NodeOptions)


class ProfilerSettings(CommonSettings):
    """All settings of one profiler process."""

    profiler: ProfilerOptions = Field(default_factory=ProfilerOptions)
    storage: StorageSettings = Field(default_factory=StorageSettings)

    @property
    def database_url(self) -> str:
        """The effective database URL."""
        return self.profiler.database_url or f"sqlite:///{self.data_dir / 'profiler.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["DetectionOptions", "NodeOptions", "ProfilerOptions", "ProfilerSettings"]
