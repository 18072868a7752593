"""The workflows service's settings (environment variables ``GANTRY_WORKFLOWS__*`` and
``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from gantry.core import CommonSettings


class WorkflowOptions(BaseModel):
    """Options of the workflows service."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of its database; default sqlite:///<data_dir>/workflows.db. "
        "Use postgresql+psycopg://... on clusters.",
    )
    study_database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the experiments' Optuna studies; default "
        "sqlite:///<data_dir>/studies.db (the same PostgreSQL database on clusters is fine).",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(default=7036, ge=0, le=65535, description="gRPC port; 0 = any free.")
    metrics_port: int = Field(
        default=9036, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free."
    )
    scheduler_addr: str = Field(
        default="",
        description="host:port of the scheduler (the steps' jobs); default: the embedded "
        "platform's run file.",
    )
    serving_addr: str = Field(
        default="",
        description="host:port of the serving service (deploy steps); default: the embedded "
        "platform's run file.",
    )
    token: SecretStr = Field(
        default=SecretStr(""),
        description="The service's own token; empty = signed here with the service's own key.",
    )
    tick_s: float = Field(
        default=0.5, gt=0, description="How often runs and schedules are checked."
    )
    resync_s: float = Field(
        default=30.0, gt=0, description="Every active run is looked at this often, events or not."
    )
    poll_s: float = Field(
        default=2.0, gt=0, description="Rollouts and submissions waiting on a service: poll period."
    )
    call_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one service call.")
    deploy_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest wait for a model version to load when deploying."
    )
    ack_wait_s: float = Field(default=30.0, gt=0, description="JetStream ack wait.")
    policy_file: Path | None = Field(
        default=None, description="An RBAC policy file; default: the policy shipped with Gantry."
    )


class WorkflowSettings(CommonSettings):
    """Settings of ``gantry-workflows``."""

    workflows: WorkflowOptions = Field(default_factory=WorkflowOptions)

    @property
    def database_url(self) -> str:
        return self.workflows.database_url or f"sqlite:///{self.data_dir / 'workflows.db'}"

    @property
    def study_database_url(self) -> str:
        return self.workflows.study_database_url or f"sqlite:///{self.data_dir / 'studies.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["WorkflowOptions", "WorkflowSettings"]
