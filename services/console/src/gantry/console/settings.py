"""The console's settings (environment ``GANTRY_CONSOLE__*`` and ``GANTRY_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from gantry.core import CommonSettings


class ConsoleOptions(BaseModel):
    """Options of the console itself."""

    http_host: str = Field(default="127.0.0.1", description="Address the console listens on.")
    http_port: int = Field(
        default=8040, ge=0, le=65535, description="Port of the console's pages; 0 = any free."
    )
    public_url: str = Field(
        default="",
        description="The address users open (behind a proxy or ingress); default: "
        "http://<http_host>:<port>. An https:// address marks the login cookie Secure.",
    )
    audit_addr: str = Field(default="", description="host:port of audit; default: run file.")
    governance_addr: str = Field(
        default="", description="host:port of governance; default: run file."
    )
    scheduler_addr: str = Field(
        default="", description="host:port of scheduler; default: run file."
    )
    serving_addr: str = Field(default="", description="host:port of serving; default: run file.")
    profiler_addr: str = Field(default="", description="host:port of profiler; default: run file.")
    workflows_addr: str = Field(
        default="", description="host:port of workflows; default: run file."
    )
    call_timeout_s: float = Field(
        default=10.0, gt=0, description="Longest a page waits for one call to a service."
    )
    session_hours: float = Field(
        default=12.0,
        gt=0,
        description="Longest a login lasts (the token's own expiry ends it sooner).",
    )
    policy_file: Path | None = Field(
        default=None,
        description="RBAC policy YAML (the same file the services use); default: the shipped "
        "policy. It only decides what is offered: the services decide what is done.",
    )


class ConsoleSettings(CommonSettings):
    """Settings of the console process."""

    console: ConsoleOptions = Field(default_factory=ConsoleOptions)

    @property
    def keys_dir(self) -> Path:
        """Where the platform's keys are (the token issuers' public keys are read)."""
        return self.data_dir / "keys"


__all__ = ["ConsoleOptions", "ConsoleSettings"]
