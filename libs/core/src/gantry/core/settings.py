"""Settings: pydantic-settings with the ``GANTRY_`` prefix, loaded once at the entry point.

Each service subclasses :class:`CommonSettings` and calls :func:`load_settings` in its
``main()``; everything below receives the settings object explicitly. A nested field is set
with a double underscore, e.g. ``GANTRY_NATS__URL``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from gantry.core.errors import ConfigError


class NatsSettings(BaseModel):
    """How to reach NATS."""

    url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URL(s), comma separated; `gantry up` sets it for its services.",
    )
    user: str | None = Field(
        default=None, description="NATS user for this service (cluster deployments)."
    )
    password: str | None = Field(default=None, description="Password for `user`.")
    connect_timeout_s: float = Field(
        default=5.0, gt=0, description="Seconds to wait for one connection attempt (default 5)."
    )
    initial_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a process waits at start-up for NATS to come up (default 30).",
    )
    reconnect_wait_s: float = Field(
        default=0.5,
        gt=0,
        description="Seconds between reconnect attempts after a disconnect (default 0.5).",
    )
    max_reconnect_attempts: int = Field(
        default=-1, description="Reconnect attempts before giving up; -1 means forever (default)."
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="JetStream replicas per stream: 1 embedded, 3 on clusters.",
    )


class CommonSettings(BaseSettings):
    """Settings every Gantry process shares."""

    model_config = SettingsConfigDict(
        env_prefix="GANTRY_", env_nested_delimiter="__", extra="ignore", validate_default=True
    )

    data_dir: Path = Field(
        default=Path(".gantry"),
        description="Directory for databases, keys and the embedded NATS store (default .gantry).",
    )
    log_level: str = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR (default INFO)."
    )
    log_json: bool = Field(default=True, description="JSON log lines (default true).")
    nats: NatsSettings = Field(default_factory=NatsSettings, description="The event bus.")


S = TypeVar("S", bound=BaseSettings)


def load_settings(cls: type[S], **overrides: object) -> S:
    """Load ``cls`` from the environment (and ``overrides``), or raise :class:`ConfigError`.

    The error names every bad field with its environment variable and what was wrong.
    """
    try:
        return cls(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        problems = []
        for err in exc.errors():
            path = "__".join(str(p) for p in err["loc"]).upper()
            problems.append(f"{prefix}{path}: {err['msg']}")
        raise ConfigError(
            "invalid settings: " + "; ".join(problems),
            hint="fix these environment variables (see docs/ops.md for every setting)",
        ) from None


__all__ = ["CommonSettings", "NatsSettings", "load_settings"]
