"""Who publishes and who consumes what on the bus: the source of the NATS permissions.

Each platform service connects to NATS as its own user (``audit``, ``governance``, ...,
``training-agent``); outside services share ``external``; ``admin`` manages streams. What a
user may publish comes from the event catalog (each type names its ``publishers``); what it
may read comes from :data:`CONSUMERS`, the durable consumers each service runs. From the two,
:func:`permissions` derives the exact NATS subjects a user may publish and subscribe to, and
:mod:`gantry.events.nats_auth` writes them into the server's configuration.

So an agent's credentials cannot publish ``gantry.job.scheduled`` (only the scheduler is its
publisher) nor read the DATA stream (no agent consumer is declared on it): NATS refuses both,
before any consumer sees them. Replies come back on a per-user inbox prefix
(:func:`inbox_prefix`), so one user cannot subscribe to another's replies either.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.core import InvalidInput
from gantry.events.catalog import catalog
from gantry.events.streams import (
    AUDITED_STREAMS,
    DEAD_LETTER_PREFIX,
    REVOCATIONS_BUCKET,
    STREAMS,
)

#: Platform services, each its own NATS user.
SERVICE_USERS: tuple[str, ...] = (
    "audit",
    "governance",
    "scheduler",
    "serving",
    "profiler",
    "workflows",
    "training-agent",
)
#: Outside services emitting ``ext.<service>.*`` events (and data access reports).
EXTERNAL_USER = "external"
#: Stream management and operators' tools: not restricted.
ADMIN_USER = "admin"
USERS: tuple[str, ...] = (*SERVICE_USERS, EXTERNAL_USER, ADMIN_USER)

#: A durable name that stands for "one per node" (the node agents' consumers).
PER_NODE = "*"
#: Services with an API check tokens, so they watch the revocation list; audit writes it.
REVOCATION_WATCHERS: tuple[str, ...] = tuple(u for u in SERVICE_USERS if u != "training-agent")
REVOCATION_WRITER = "audit"


@dataclass(frozen=True)
class ConsumerDecl:
    """A durable pull consumer a service runs."""

    user: str
    durable: str
    stream: str
    filter_subject: str | None = None


CONSUMERS: tuple[ConsumerDecl, ...] = (
    *(ConsumerDecl("audit", "audit", stream) for stream in AUDITED_STREAMS),
    ConsumerDecl("governance", "governance-jobs", "JOBS", "gantry.job.scheduled"),
    ConsumerDecl("scheduler", "scheduler-nodes", "NODES", "gantry.node.>"),
    ConsumerDecl("scheduler", "scheduler-heartbeats", "METRICS", "gantry.metrics.node.heartbeat"),
    ConsumerDecl("scheduler", "scheduler-progress", "METRICS", "gantry.metrics.job.progress"),
    ConsumerDecl("scheduler", "scheduler-workers", "JOBS", "gantry.job.workers"),
    ConsumerDecl("scheduler", "scheduler-datasets", "DATA", "gantry.data.dataset.created"),
    ConsumerDecl("scheduler", "scheduler-logs", "LOGS", "gantry.log.job"),
    ConsumerDecl("serving", "serving-models", "MODELS", "gantry.model.registered"),
    ConsumerDecl("profiler", "profiler-steps", "METRICS", "gantry.metrics.job.step"),
    ConsumerDecl("profiler", "profiler-heartbeats", "METRICS", "gantry.metrics.node.heartbeat"),
    ConsumerDecl("profiler", "profiler-jobs", "JOBS", "gantry.job.>"),
    ConsumerDecl("profiler", "profiler-nodes", "NODES", "gantry.node.registered"),
    ConsumerDecl("workflows", "workflows-jobs", "JOBS", "gantry.job.state"),
    ConsumerDecl("workflows", "workflows-evaluations", "METRICS", "gantry.metrics.job.evaluation"),
    ConsumerDecl("workflows", "workflows-erasures", "DATA", "gantry.data.subject.erased"),
    ConsumerDecl("training-agent", PER_NODE, "JOBS", "gantry.job.>"),
)


@dataclass(frozen=True)
class Permissions:
    """The subjects one NATS user may publish to and subscribe to (allow lists)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def _known(user: str) -> None:
    if user not in USERS:
        raise InvalidInput(f"unknown NATS user {user!r}", hint=f"users: {', '.join(USERS)}")


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix ``user`` connects with (the only one it may subscribe to)."""
    _known(user)
    return f"_INBOX_{user}"


def published_types(user: str) -> tuple[str, ...]:
    """The catalog event types ``user`` may publish."""
    _known(user)
    return tuple(sorted({spec.type for spec in catalog() if user in spec.publishers}))


def consumers_of(user: str) -> tuple[ConsumerDecl, ...]:
    """The durable consumers ``user`` runs."""
    _known(user)
    return tuple(c for c in CONSUMERS if c.user == user)


def readable_streams(user: str) -> tuple[str, ...]:
    """The streams ``user`` may read (through its declared consumers)."""
    return tuple(sorted({c.stream for c in consumers_of(user)}))


def _consumer_subjects(c: ConsumerDecl) -> list[str]:
    api = "$JS.API.CONSUMER"
    name = c.durable
    return [
        f"{api}.DURABLE.CREATE.{c.stream}.{name}",
        f"{api}.CREATE.{c.stream}.{name}",
        f"{api}.CREATE.{c.stream}.{name}.>",
        f"{api}.INFO.{c.stream}.{name}",
        f"{api}.MSG.NEXT.{c.stream}.{name}",
        f"$JS.ACK.{c.stream}.{name}.>",
        f"{DEAD_LETTER_PREFIX}.{name}",
    ]


def permissions(user: str) -> Permissions | None:
    """What ``user`` may publish and subscribe to; None for the unrestricted admin."""
    _known(user)
    if user == ADMIN_USER:
        return None
    publish: list[str] = list(published_types(user))
    if user == EXTERNAL_USER:
        publish.append("ext.>")
    publish.append("$JS.API.INFO")
    # Every process checks at start-up that the streams exist (stream info only; creating
    # and changing streams is the admin's).
    publish.extend(f"$JS.API.STREAM.INFO.{s.name}" for s in STREAMS)
    publish.append(f"$JS.API.STREAM.INFO.KV_{REVOCATIONS_BUCKET}")
    for consumer in consumers_of(user):
        publish.extend(_consumer_subjects(consumer))
    if user in REVOCATION_WATCHERS:
        # Watching the bucket: an ordered (ephemeral) consumer on its stream, which holds
        # nothing but revocations, and its flow-control replies.
        kv = f"KV_{REVOCATIONS_BUCKET}"
        publish += [
            f"$JS.API.CONSUMER.CREATE.{kv}",
            f"$JS.API.CONSUMER.CREATE.{kv}.>",
            f"$JS.API.CONSUMER.INFO.{kv}.*",
            f"$JS.API.CONSUMER.DELETE.{kv}.*",
            f"$JS.FC.{kv}.>",
        ]
    if user == REVOCATION_WRITER:
        publish.append(f"$KV.{REVOCATIONS_BUCKET}.>")
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=(f"{inbox_prefix(user)}.>",),
    )


def env_name(user: str) -> str:
    """The environment variable holding ``user``'s password in deployments."""
    _known(user)
    short = "AGENT" if user == "training-agent" else user.upper().replace("-", "_")
    return f"GANTRY_NATS_{short}_PASSWORD"


__all__ = [
    "ADMIN_USER",
    "CONSUMERS",
    "EXTERNAL_USER",
    "PER_NODE",
    "REVOCATION_WATCHERS",
    "REVOCATION_WRITER",
    "SERVICE_USERS",
    "USERS",
    "ConsumerDecl",
    "Permissions",
    "consumers_of",
    "env_name",
    "inbox_prefix",
    "permissions",
    "published_types",
    "readable_streams",
]
