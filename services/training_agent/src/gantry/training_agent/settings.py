"""The training agent's settings: ``GANTRY_*`` for everything shared, ``GANTRY_AGENT__*`` for
the agent's own options. Loaded once, in :func:`gantry.training_agent.__main__.main`."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

from gantry.core import CommonSettings
from gantry.storage.settings import StorageSettings


class AgentOptions(BaseModel):
    """Options of the node agent itself (environment ``GANTRY_AGENT__*``)."""

    heartbeat_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between heartbeats (5): the scheduler declares a node lost after "
        "a few missed ones, so this bounds how fast node loss is noticed.",
    )
    fence_after_s: float = Field(
        default=10.0,
        ge=0,
        description="When no heartbeat could be delivered for this long, the agent stops its "
        "workers (10; 0 = never): the scheduler will declare the node lost and place the jobs "
        "elsewhere, and two attempts must not train side by side. Keep it below the "
        "scheduler's heartbeat_timeout_s (15).",
    )
    checkpoint_root: Path | None = Field(
        default=None,
        description="Parent of every job's local working directory (step marker, spec, "
        "exported model); default <data_dir>/checkpoints. The checkpoints themselves go to "
        "the encrypted object store.",
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="Seconds workers get to checkpoint after SIGTERM when the agent itself "
        "shuts down (10), before SIGKILL.",
    )
    log_flush_s: float = Field(
        default=0.5, gt=0, description="Seconds worker output waits to be batched (0.5)."
    )
    log_batch_lines: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Most lines per gantry.log.job event (100): with lines cut at 4096 "
        "characters a batch of ordinary output stays well under the 256 KiB event limit.",
    )
    restart_limit: int = Field(
        default=3,
        ge=0,
        description="Times a crashed gang is restarted from its last checkpoint within one "
        "attempt (3) before the job is reported failed. Only crashes after training began "
        "are restarted: a worker that fails before its first step fails the job at once.",
    )
    restart_backoff_s: float = Field(
        default=1.0, ge=0, description="Seconds between a crash and the restart (1)."
    )
    progress_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="Fewest seconds between two progress events of one job (2).",
    )
    governance_addr: str = Field(
        default="",
        description="host:port of the governance gRPC API, for data grants and model "
        "registration; empty = read <data_dir>/run/governance.json (the embedded default).",
    )
    token: SecretStr = Field(
        default=SecretStr(""),
        description="The agent's service token for governance and the profiler; empty = "
        "sign one with the agent's own key (keys/services/training-agent.pem, the default).",
    )
    profiler_addr: str = Field(
        default="",
        description="host:port of the profiler gRPC API, where the workers' deep traces are "
        "uploaded; empty = read <data_dir>/run/profiler.json (the embedded default).",
    )
    trace_wait_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest wait for the workers' deep trace of one request (600): a minute "
        "per traced step, at most this; a rank with none by then is reported failed.",
    )
    grant_ttl_s: int = Field(
        default=3600,
        ge=60,
        description="Lifetime asked for each data grant (1 h); the agent renews a job's grant "
        "when two thirds of it have passed.",
    )
    advertise_address: str = Field(
        default="",
        description="Address other nodes reach this one at (gang rendezvous); empty = the "
        "local address of the route to the NATS server.",
    )
    worker_data_dir: Path | None = Field(
        default=None,
        description="GANTRY_DATA_DIR of the workers: their checkpoint store and its key live "
        "here, apart from the services' keys and data (workers read data only through their "
        "grant). Default <data_dir>/workers, shared by the agents of one machine so a job "
        "resumes on any of them; on a cluster point GANTRY_STORAGE__* at a shared bucket.",
    )
    health_host: str = Field(
        default="127.0.0.1",
        description="Address of the agent's HTTP health server (/healthz, /readyz, /metrics); "
        "0.0.0.0 where a kubelet or Prometheus probes it from outside the host.",
    )
    health_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of the health server; 0 (default) = any free port, because `gantry "
        "up` runs several agents on one machine. Deployments set 9037 (one agent per node).",
    )
    cuda_mps: bool = Field(
        default=False,
        description="The node runs the CUDA MPS daemon: fractional-GPU workers get a compute "
        "share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) as well as a memory cap.",
    )


class AgentSettings(CommonSettings):
    """Everything the agent reads from the environment (``GANTRY_*``), loaded once in main."""

    agent: AgentOptions = Field(default_factory=AgentOptions)
    storage: StorageSettings = Field(default_factory=StorageSettings)

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"

    @property
    def worker_data_dir(self) -> Path:
        """The workers' data directory (their checkpoint store and its key)."""
        return self.agent.worker_data_dir or self.data_dir / "workers"

    @property
    def checkpoint_root(self) -> Path:
        """Parent of every job's local directory."""
        return self.agent.checkpoint_root or self.data_dir / "checkpoints"


__all__ = ["AgentOptions", "AgentSettings"]
