"""The audit service's settings (environment variables ``GANTRY_AUDIT__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from gantry.audit.behaviour import AnomalySettings
from gantry.audit.reports import ReportSettings
from gantry.audit.retention import RetentionSettings
from gantry.core import CommonSettings
from gantry.storage import StorageSettings


class AuditOptions(BaseModel):
    """Options of the audit service itself."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the log database; default sqlite:///<data_dir>/audit.db. "
        "Use postgresql+psycopg://... on clusters.",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(default=7031, ge=0, le=65535, description="gRPC port; 0 = any free.")
    metrics_port: int = Field(
        default=9031, ge=0, le=65535, description="Prometheus /metrics and /healthz port; 0 = any."
    )
    checkpoint_every_events: int = Field(
        default=1000, ge=1, description="Sign a tree head after this many new events (1000)."
    )
    checkpoint_every_s: float = Field(
        default=5.0, gt=0, description="...or after this many seconds with new events (5 s)."
    )
    batch_size: int = Field(
        default=500, ge=1, le=10_000, description="Events fetched and appended per transaction."
    )
    ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds JetStream waits for an ack before redelivering (30 s): after a "
        "crash, events fetched but not yet stored come back this long after the restart.",
    )
    max_event_bytes: int = Field(
        default=256 * 1024, ge=1024, description="Larger events are dead-lettered (256 KiB)."
    )
    require_signed_events: bool = Field(
        default=True,
        description="Dead-letter events without a valid signature from a trusted key (true).",
    )
    signature_workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Processes that check event signatures beside ingest (Ed25519 verification "
        "holds the GIL); 0 (default) checks them inline, which measured faster on 2 cores "
        "(bench/audit_ingest.py); use 1-4 on machines with cores to spare.",
    )
    policy_file: Path | None = Field(
        default=None, description="RBAC policy YAML; default: the shipped policy."
    )
    governance_addr: str = Field(
        default="",
        description="host:port of the governance service (data-subject reports); default: the "
        "embedded platform's run file.",
    )
    token: SecretStr = Field(
        default=SecretStr(""),
        description="The service's own token (to ask governance for a data subject's findings "
        "as the auditor asking); empty = signed here with the service's own key.",
    )
    call_timeout_s: float = Field(
        default=30.0, gt=0, description="Timeout of one call to another service (30 s)."
    )
    anomaly: AnomalySettings = Field(
        default_factory=AnomalySettings,
        description="Access-behaviour anomaly detection (GANTRY_AUDIT__ANOMALY__*).",
    )
    reports: ReportSettings = Field(
        default_factory=ReportSettings,
        description="Scheduled, signed compliance reports (GANTRY_AUDIT__REPORTS__*).",
    )
    retention: RetentionSettings = Field(
        default_factory=RetentionSettings,
        description="Archival of old segments and purges of expired events "
        "(GANTRY_AUDIT__RETENTION__*).",
    )


class AuditSettings(CommonSettings):
    """All settings of one audit-service process."""

    audit: AuditOptions = Field(default_factory=AuditOptions)
    storage: StorageSettings = Field(
        default_factory=StorageSettings,
        description="The object store for archived log segments and compliance reports "
        "(GANTRY_STORAGE__*, the same store as the other services').",
    )

    @property
    def database_url(self) -> str:
        """The effective database URL."""
        return self.audit.database_url or f"sqlite:///{self.data_dir / 'audit.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["AuditOptions", "AuditSettings"]
