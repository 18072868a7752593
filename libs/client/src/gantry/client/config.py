"""Where the client finds the platform and its credentials."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gantry.core import CommonSettings, ConfigError
from gantry.core.runfile import grpc_address, run_file


class ClientSettings(CommonSettings):
    """Client settings: ``GANTRY_TOKEN``, ``GANTRY_AUDIT_ADDR``, ``GANTRY_GOVERNANCE_ADDR``,
    ``GANTRY_SCHEDULER_ADDR``, ``GANTRY_SERVING_ADDR``, ``GANTRY_PROFILER_ADDR``,
    ``GANTRY_WORKFLOWS_ADDR``, ``GANTRY_DATA_DIR``, and ``GANTRY_TLS__*`` (:attr:`tls`, for the
    clients' ``tls=``)."""

    token: str | None = Field(
        default=None,
        description="Bearer token; default: the file <data_dir>/admin.token if it exists.",
    )
    audit_addr: str | None = Field(
        default=None,
        description="host:port of the audit gRPC API; default: from <data_dir>/run/audit.json.",
    )
    governance_addr: str | None = Field(
        default=None,
        description="host:port of the governance gRPC API; default: from "
        "<data_dir>/run/governance.json.",
    )

    scheduler_addr: str | None = Field(
        default=None,
        description="host:port of the scheduler gRPC API; default: from "
        "<data_dir>/run/scheduler.json.",
    )

    serving_addr: str | None = Field(
        default=None,
        description="host:port of the serving gRPC API (management and inference); default: "
        "from <data_dir>/run/serving.json.",
    )

    profiler_addr: str | None = Field(
        default=None,
        description="host:port of the profiler gRPC API; default: from "
        "<data_dir>/run/profiler.json.",
    )

    workflows_addr: str | None = Field(
        default=None,
        description="host:port of the workflows gRPC API (pipelines and their runs); default: "
        "from <data_dir>/run/workflows.json.",
    )

    def address(self, service: str) -> str:
        """host:port of ``service``: the explicit setting, else the running platform's file."""
        explicit = getattr(self, f"{service}_addr", None)
        if explicit:
            return str(explicit)
        found = grpc_address(self.data_dir, service)
        if found is None:
            raise ConfigError(
                f"don't know where the {service} service is: no {run_file(self.data_dir, service)}",
                hint=f"start the platform with 'gantry up' or set GANTRY_{service.upper()}_ADDR",
            )
        return found

    def bearer(self) -> str:
        """The token to send."""
        if self.token:
            return self.token
        path: Path = self.data_dir / "admin.token"
        if path.exists():
            return path.read_text().strip()
        raise ConfigError(
            "no token: set GANTRY_TOKEN",
            hint="create one with 'gantry admin token create --user U --role R'",
        )


__all__ = ["ClientSettings"]
