"""What a training job's environment tells the loader (set by the node agent for each job)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gantry.core import CommonSettings, ConfigError


class DataSettings(CommonSettings):
    """``GANTRY_DATA_GRANT``, ``GANTRY_GOVERNANCE_ADDR``, ``GANTRY_TOKEN`` and the node cache.

    Loaded once, by :meth:`GovernedDataset.from_env`; nothing below it reads the environment.
    """

    data_grant: str | None = Field(
        default=None, description="The job's read grant token, issued by governance for the job."
    )
    data_grant_file: Path | None = Field(
        default=None,
        description="A file holding the job's current grant token: the node agent rewrites it "
        "when it renews the grant, and readers send what it holds.",
    )
    governance_addr: str | None = Field(
        default=None, description="host:port of the data-governance gRPC API."
    )
    token: str | None = Field(
        default=None, description="The node agent's service token, sent as the bearer token."
    )
    data_cache_dir: Path | None = Field(
        default=None,
        description="Directory of the node's shard cache; unset = no cache. Shared by the "
        "jobs on a node so a dataset is fetched once per node, not once per job.",
    )
    data_cache_bytes: int = Field(
        default=50 << 30,
        gt=0,
        description="Bytes the node cache may hold before evicting the least recently used "
        "shards (50 GiB: a few epochs' worth of typical datasets on a node's local disk).",
    )

    def require(self) -> tuple[str, str, str]:
        """``(address, token, grant)``, or :class:`ConfigError` naming what is missing."""
        missing = [
            name
            for name, value in (
                ("GANTRY_GOVERNANCE_ADDR", self.governance_addr),
                ("GANTRY_TOKEN", self.token),
                ("GANTRY_DATA_GRANT", self.data_grant),
            )
            if not value
        ]
        if missing:
            raise ConfigError(
                f"the job's environment lacks {', '.join(missing)}",
                hint="run the script as a Gantry job (the node agent sets these) or export them",
            )
        assert self.governance_addr and self.token and self.data_grant
        return self.governance_addr, self.token, self.data_grant


__all__ = ["DataSettings"]
