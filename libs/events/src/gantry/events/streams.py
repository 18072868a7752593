"""JetStream stream definitions: one stream per domain, subject = event type."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.core import InvalidInput


@dataclass(frozen=True)
class StreamDef:
    """A stream Gantry creates (or updates) at start-up."""

    name: str
    subjects: tuple[str, ...]
    max_age_s: float = 0.0  # 0 = keep until limits
    max_bytes: int = -1
    description: str = ""


DEAD_LETTER_PREFIX = "gantry.deadletter"
#: The JetStream key-value bucket of revoked identity tokens (key: the token's jti), written by
#: the audit service and watched by every service with an API (gantry.security.revocations).
REVOCATIONS_BUCKET = "gantry-revocations"

STREAMS: tuple[StreamDef, ...] = (
    StreamDef("JOBS", ("gantry.job.>",), description="Job lifecycle"),
    StreamDef("NODES", ("gantry.node.>",), description="Node registration, heartbeats, health"),
    StreamDef("DATA", ("gantry.data.>",), description="Datasets, versions, reads"),
    StreamDef("MODELS", ("gantry.model.>",), description="Model registry"),
    StreamDef("SERVING", ("gantry.serving.>",), description="Deployments and traffic"),
    StreamDef("AUTHZ", ("gantry.authz.>",), description="Authorisation decisions"),
    StreamDef("AUDIT", ("gantry.audit.>",), description="Audit checkpoints and queries"),
    StreamDef(
        "WORKFLOWS", ("gantry.workflow.>",), description="Pipeline runs, experiments, sessions"
    ),
    StreamDef("EXTERNAL", ("ext.>",), description="Events emitted by outside services"),
    StreamDef(
        "LOGS",
        ("gantry.log.>",),
        max_age_s=7 * 86400.0,
        description="Worker log lines, kept a week",
    ),
    StreamDef(
        "METRICS",
        ("gantry.metrics.>",),
        max_age_s=3600.0,
        description="Raw metrics, short retention",
    ),
    StreamDef(
        "DEADLETTER",
        (f"{DEAD_LETTER_PREFIX}.>",),
        max_age_s=30 * 86400.0,
        description="Events a consumer refused, with the reason",
    ),
)

_PREFIXES = [(s.subjects[0][:-1], s.name) for s in STREAMS]  # "gantry.job." -> JOBS

AUDITED_STREAMS: tuple[str, ...] = tuple(
    s.name for s in STREAMS if s.name not in ("METRICS", "LOGS", "DEADLETTER")
)


def stream_for_type(type_: str) -> str:
    """Name of the stream that holds events of ``type_``."""
    for prefix, name in _PREFIXES:
        if type_.startswith(prefix):
            return name
    raise InvalidInput(
        f"no stream takes event type {type_!r}",
        hint="use a gantry.<domain>.* type of a known domain or ext.<service>.<name>",
    )


def stream(name: str) -> StreamDef:
    """The stream definition called ``name``."""
    for s in STREAMS:
        if s.name == name:
            return s
    raise InvalidInput(f"unknown stream {name!r}", hint=f"streams: {[s.name for s in STREAMS]}")


__all__ = [
    "AUDITED_STREAMS",
    "DEAD_LETTER_PREFIX",
    "REVOCATIONS_BUCKET",
    "STREAMS",
    "StreamDef",
    "stream",
    "stream_for_type",
]
