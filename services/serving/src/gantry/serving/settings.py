"""The serving service's settings (environment ``GANTRY_SERVING__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from gantry.core import CommonSettings


class ServingOptions(BaseModel):
    """Options of the serving service itself."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the deployments database; default "
        "sqlite:///<data_dir>/serving.db. Use postgresql+psycopg://... on clusters.",
    )
    grpc_host: str = Field(default="127.0.0.1", description="gRPC listen address.")
    grpc_port: int = Field(
        default=7034,
        ge=0,
        le=65535,
        description="gRPC port (inference.GRPCInferenceService and the management API); "
        "0 = any free.",
    )
    http_host: str = Field(default="127.0.0.1", description="REST (Open Inference) address.")
    http_port: int = Field(
        default=8034, ge=0, le=65535, description="REST port (/v2/...); 0 = any free."
    )
    metrics_port: int = Field(
        default=9034, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free."
    )
    governance_addr: str = Field(
        default="",
        description="host:port of the governance service (the model registry); default: the "
        "embedded platform's run file.",
    )
    token: SecretStr = Field(
        default=SecretStr(""),
        description="The service's own token for the registry; default: signed with the "
        "service's own key (keys/services/serving.pem), valid for this service only.",
    )
    allow_anonymous: bool = Field(
        default=False,
        description="Whether a deployment may serve inference without a token (its spec must "
        "also say anonymous: true). Off: every inference call needs a token.",
    )
    max_request_bytes: int = Field(
        default=64 << 20, ge=1024, description="Largest request body or gRPC message (64 MiB)."
    )
    max_batch_size: int = Field(default=32, ge=1, description="Default rows per batch.")
    max_queue_delay_us: int = Field(
        default=2000, ge=0, description="Default wait for a batch to fill (µs)."
    )
    queue_capacity: int = Field(
        default=512, ge=1, description="Default requests waiting per version; then 503."
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Default time a request may take in all."
    )
    min_instances: int = Field(default=1, ge=1, description="Default model instances.")
    max_instances: int = Field(default=2, ge=1, description="Default most model instances.")
    torch_threads: int = Field(
        default=0,
        ge=0,
        description="Intra-op threads of each model instance (torch.set_num_threads); "
        "0 = the CPU count divided by the default max instances, at least 1.",
    )
    autoscale_interval_s: float = Field(
        default=2.0, gt=0, description="How often load is sampled and instances adjusted."
    )
    canary_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="Default time between canary checks (Flagger: 1 minute); a deployment's "
        "canary spec may set its own.",
    )
    drain_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest a removed version waits for its requests."
    )
    policy_file: Path | None = Field(
        default=None, description="RBAC policy YAML; default: the shipped policy."
    )


class ServingSettings(CommonSettings):
    """All settings of one serving-service process."""

    serving: ServingOptions = Field(default_factory=ServingOptions)

    @property
    def database_url(self) -> str:
        """The effective database URL."""
        return self.serving.database_url or f"sqlite:///{self.data_dir / 'serving.db'}"

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"


__all__ = ["ServingOptions", "ServingSettings"]
