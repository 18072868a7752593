"""The scheduler service's settings (environment ``GANTRY_SCHEDULER__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from gantry.core import CommonSettings


class KubernetesOptions(BaseModel):
    """Where placed jobs run when ``backend`` is ``kubernetes``."""

    namespace: str = Field(default="gantry-jobs", description="Namespace of the job Pods.")
    image: str = Field(
        default="ghcr.io/gantry/training-agent:latest",
        description="Image the workers run (the training runtime and the user's code).",
    )
    kubeconfig: str | None = Field(
        default=None, description="Kubeconfig path; default: in-cluster config."
    )


class SchedulerOptions(BaseModel):
    """Options of the scheduler service itself."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the scheduler database; default "
        "sqlite:///<data_dir>/scheduler.db. Use postgresql+psycopg://... on clusters.",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(default=7033, ge=0, le=65535, description="gRPC port; 0 = any free.")
    metrics_port: int = Field(
        default=9033, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free."
    )
    placement: Literal["gantry", "fgd", "bestfit"] = Field(
        default="gantry", description="Placement policy (gantry = fragmentation-aware, ours)."
    )
    ordering: Literal["gantry", "fifo"] = Field(
        default="gantry",
        description="Queue order inside a priority: predicted run time with backfill "
        "(gantry) or submit order (fifo).",
    )
    las_thresholds_gpu_h: list[float] = Field(
        default_factory=list,
        description="Tiresias-style 2D-LAS levels in GPU-hours of service, e.g. [10]: a job "
        "past a level yields (checkpoint, requeue) to jobs below it at the same priority. "
        "Empty (default): equal priorities never preempt each other.",
    )
    queues_file: Path | None = Field(
        default=None,
        description="YAML of queues and quotas (see docs/queues.md); queues it names that the "
        "database lacks are created at start. Without it, one unlimited queue 'default'.",
    )
    pools: dict[str, bool] = Field(
        default_factory=lambda: {"default": True},
        description="Pool name -> trusted. Jobs reading pii/sensitive data run only in trusted "
        "pools; a pool not listed here is untrusted.",
    )
    heartbeat_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="A node silent this long is lost (3 missed 5 s heartbeats); its jobs are "
        "requeued and resume from their last checkpoint.",
    )
    gang_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A placed gang whose workers have not all started by then is requeued.",
    )
    stop_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="Time workers get to checkpoint and exit after a stop request.",
    )
    preemption_protect_s: float = Field(
        default=600.0,
        ge=0,
        description="A preempted job is not preempted again within this time (no thrashing).",
    )
    pass_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="Longest time between scheduling passes (a submit or a freed node "
        "triggers one at once).",
    )
    max_log_lines: int = Field(
        default=20_000, ge=100, description="Log lines kept per job (oldest dropped)."
    )
    backend: Literal["agents", "kubernetes"] = Field(
        default="agents",
        description="Run placed jobs on Gantry node agents (over NATS) or as Kubernetes Jobs.",
    )
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions)
    policy_file: Path | None = Field(
        default=None, description="RBAC policy YAML; default: the shipped policy."
    )


class SchedulerSettings(CommonSettings):
    """All settings of one scheduler-service process."""

    scheduler: SchedulerOptions = Field(default_factory=SchedulerOptions)

    @property
    def database_url(self) -> str:
        """The effective database URL."""
        return self.scheduler.database_url or f"sqlite:///{self.data_dir / 'scheduler.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["KubernetesOptions", "SchedulerOptions", "SchedulerSettings"]
