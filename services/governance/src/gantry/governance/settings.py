"""The governance service's settings (environment ``GANTRY_GOVERNANCE__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from gantry.core import CommonSettings
from gantry.storage import StorageSettings


class GovernanceOptions(BaseModel):
    """Options of the data-governance service itself."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the catalog database; default "
        "sqlite:///<data_dir>/governance.db. Use postgresql+psycopg://... on clusters.",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(default=7032, ge=0, le=65535, description="gRPC port; 0 = any free.")
    metrics_port: int = Field(
        default=9032, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free."
    )
    shard_bytes: int = Field(
        default=64 << 20,
        ge=64 << 10,
        le=256 << 20,
        description="Target size of a table shard in bytes of Arrow data (64 MiB): big enough "
        "that a shard is worth a request, small enough that loaders can spread shards over "
        "ranks and that one shard fits comfortably in a worker's memory.",
    )
    max_message_bytes: int = Field(
        default=16 << 20,
        ge=16 << 20,
        description="Largest gRPC message accepted or sent (16 MiB); uploads stream in "
        "fragments well under this.",
    )
    grant_ttl_s: int = Field(
        default=6 * 3600,
        ge=60,
        description="Default lifetime of a job's read grant (6 h): long enough for a typical "
        "job, short enough that a leaked token expires the same day.",
    )
    max_grant_ttl_s: int = Field(
        default=7 * 24 * 3600, ge=60, description="Longest grant anyone may ask for (7 days)."
    )
    upload_ttl_s: int = Field(
        default=24 * 3600,
        ge=60,
        description="Uploads not committed within this time (24 h) are discarded by garbage "
        "collection.",
    )
    view_cache_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="Memory for recently served view-applied shards (256 MiB); 0 disables.",
    )
    policy_file: Path | None = Field(
        default=None, description="RBAC policy YAML; default: the shipped policy."
    )

    @model_validator(mode="after")
    def _grant_ttls(self) -> GovernanceOptions:
        if self.grant_ttl_s > self.max_grant_ttl_s:
            raise ValueError(
                f"grant_ttl_s ({self.grant_ttl_s}) is longer than max_grant_ttl_s "
                f"({self.max_grant_ttl_s}); lower the default or raise the maximum"
            )
        return self


class GovernanceSettings(CommonSettings):
    """All settings of one governance-service process."""

    governance: GovernanceOptions = Field(default_factory=GovernanceOptions)
    storage: StorageSettings = Field(default_factory=StorageSettings)

    @property
    def database_url(self) -> str:
        """The effective database URL."""
        return self.governance.database_url or f"sqlite:///{self.data_dir / 'governance.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["GovernanceOptions", "GovernanceSettings"]
