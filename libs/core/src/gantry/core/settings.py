"""Settings: pydantic-settings with the ``GANTRY_`` prefix, loaded once at the entry point.

Each service subclasses :class:`CommonSettings` and calls :func:`load_settings` in its
``main()``; everything below receives the settings object explicitly. A nested field is set
with a double underscore, e.g. ``GANTRY_NATS__URL``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator
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
    api_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds to wait for a JetStream API answer or publish ack (default 5).",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="JetStream replicas per stream: 1 embedded, 3 on clusters.",
    )


class TlsSettings(BaseModel):
    """TLS for gRPC between Gantry processes (``GANTRY_TLS__*``); off by default.

    The same settings serve a process as a server (its certificate and key, and with
    ``client_auth`` the CA its clients must be signed by) and as a client of other services
    (the CA it trusts, and its certificate for servers that require one). The files are read
    when a server or channel is made (``gantry.security.tls``), so a rotated certificate is
    picked up by the next channel; the paths should be absolute, as workers a node agent
    starts inherit them and run elsewhere. The layout of a cert-manager Secret
    (``ca.crt``, ``tls.crt``, ``tls.key``) fits as it is.
    """

    enabled: bool = Field(
        default=False,
        description="Serve and call gRPC over TLS (default false: plaintext, as on one machine).",
    )
    ca_file: Path | None = Field(
        default=None,
        description="PEM CA certificate(s) that signed the services' (and, with client_auth, "
        "the clients') certificates; required when enabled.",
    )
    cert_file: Path | None = Field(
        default=None,
        description="PEM certificate of this process: served by a server, presented by a "
        "client to servers that require client certificates.",
    )
    key_file: Path | None = Field(
        default=None, description="PEM private key of cert_file (keep it mode 0600)."
    )
    client_auth: bool = Field(
        default=False,
        description="Servers require and verify a client certificate signed by ca_file "
        "(mutual TLS; the cluster profile); false: any client that trusts the server may "
        "connect (its bearer token is still checked).",
    )
    server_name: str | None = Field(
        default=None,
        description="Name expected in the server's certificate instead of the host of the "
        "address called (tests, or services reached through an address not in the "
        "certificate).",
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        """An enabled configuration names every file it needs."""
        if not self.enabled:
            return self
        problems = []
        if self.ca_file is None:
            problems.append(
                "GANTRY_TLS__ENABLED is true but GANTRY_TLS__CA_FILE is not set: name the CA "
                "certificate that signed the services' certificates"
            )
        if (self.cert_file is None) != (self.key_file is None):
            problems.append(
                "GANTRY_TLS__CERT_FILE and GANTRY_TLS__KEY_FILE go together: set both or neither"
            )
        elif self.client_auth and self.cert_file is None:
            problems.append(
                "GANTRY_TLS__CLIENT_AUTH is true but GANTRY_TLS__CERT_FILE and "
                "GANTRY_TLS__KEY_FILE are not set: mutual TLS needs this process's certificate"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


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
    tls: TlsSettings = Field(
        default_factory=TlsSettings, description="TLS for gRPC between processes (off)."
    )


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


__all__ = ["CommonSettings", "NatsSettings", "TlsSettings", "load_settings"]
