"""The event catalog: every event type Gantry knows, its data model, version and stream.

Types under ``gantry.`` must be registered here (or by a service at start-up through
:func:`register`); their ``data`` is validated against the model. Types under ``ext.`` are
outside services' own events: the envelope is validated, ``data`` must be a JSON object.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gantry.core import InvalidInput
from gantry.events.envelope import EventEnvelope
from gantry.events.streams import stream_for_type


class EventData(BaseModel):
    """Base for every event's data model: unknown fields are kept (forward compatible)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class AuthzDecision(EventData):
    """An RBAC decision taken by a service (allow and deny alike)."""

    principal: str
    roles: list[str] = Field(default_factory=list)
    action: str
    resource_kind: str
    resource_name: str = "*"
    decision: Literal["allow", "deny"]
    reason: str
    service: str = ""
    method: str = ""


class AuditCheckpoint(EventData):
    """A signed tree head of the audit log."""

    tree_size: int = Field(ge=0)
    root_hash: str = Field(description="hex SHA-256")
    timestamp_ms: int
    key_id: str
    signature: str = Field(description="base64 Ed25519 signature over the tree head")


class AuditQueried(EventData):
    """A compliance query ran against the audit log (queries are audited too)."""

    query: str
    filters: dict[str, Any] = Field(default_factory=dict)
    results: int = Field(ge=0)


class DataAccessed(EventData):
    """A dataset was read (by a service, or by an outside system reporting its own reads)."""

    dataset: str
    version: str = ""
    view: Literal["raw", "deidentified"] = "deidentified"
    rows: int = Field(default=0, ge=0)
    decision: Literal["allow", "deny"] = "allow"
    purpose: str = ""
    shards: list[str] = Field(default_factory=list, description="shard ids read")
    grant: str = Field(default="", description="the grant id the read used, if any")
    job_id: str = Field(default="", description="the job the grant was issued for, if any")
    policy_version: int = Field(
        default=0, ge=0, description="view policy version applied (0: raw, or the default)"
    )
    reason: str = Field(default="", description="why a read was denied")


class DatasetCreated(EventData):
    """A dataset was registered with its schema and column classifications."""

    dataset: str
    format: Literal["table", "files"]
    owner: str
    columns: list[dict[str, Any]] = Field(default_factory=list)
    sensitivity: Literal["public", "internal", "pii", "sensitive"] = Field(
        default="internal",
        description="the highest classification of its columns (or of its files); the "
        "scheduler keeps jobs reading pii/sensitive data on trusted pools",
    )


class VersionCommitted(EventData):
    """An immutable dataset version was committed (a rollback commits a new version too)."""

    dataset: str
    version: str
    parents: list[str] = Field(default_factory=list)
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    shards: int = Field(ge=0)
    message: str = ""
    rollback_of: str = ""


class ViewPolicyChanged(EventData):
    """A dataset's de-identification policy got a new version."""

    dataset: str
    policy_version: int = Field(ge=1)
    rules: list[dict[str, Any]] = Field(default_factory=list)


class GrantIssued(EventData):
    """A short-lived read grant was issued to a job (the token itself is never in events)."""

    grant_id: str
    job_id: str
    view: Literal["raw", "deidentified"]
    versions: list[dict[str, str]] = Field(default_factory=list)
    expires_ms: int


class GrantRevoked(EventData):
    """A grant was revoked before it expired; its token opens nothing any more."""

    grant_id: str
    job_id: str
    reason: str = ""


class KeysRotated(EventData):
    """The object store's key-encryption key was rotated and data keys re-wrapped."""

    active_version: int = Field(ge=1)
    rewrapped: int = Field(ge=0)
    retired: list[int] = Field(default_factory=list)


class GarbageCollected(EventData):
    """Unreferenced dataset content was removed."""

    removed_objects: int = Field(ge=0)
    removed_bytes: int = Field(ge=0)
    kept_objects: int = Field(ge=0)


class ModelRegistered(EventData):
    """A model version (checkpoint or export) was registered in the model registry."""

    name: str
    version: int = Field(ge=1)
    digest: str
    bytes: int = Field(ge=0)
    framework: str = ""
    job_id: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    trained_on: list[dict[str, str]] = Field(default_factory=list)


class DatasetUse(EventData):
    """One dataset version a job reads, in the view its spec names."""

    dataset: str
    version: str
    view: Literal["raw", "deidentified"] = "deidentified"


class JobScheduled(EventData):
    """A job was placed on nodes (the scheduler's decision); governance issues its data grant."""

    job_id: str
    owner: str = ""
    owner_roles: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    datasets: list[DatasetUse] = Field(default_factory=list)


@dataclass(frozen=True)
class EventSpec:
    """One catalog entry."""

    type: str
    schema_version: int
    model: builtins.type[EventData]
    description: str

    @property
    def stream(self) -> str:
        """The JetStream stream that stores this type."""
        return stream_for_type(self.type)


_CATALOG: dict[tuple[str, int], EventSpec] = {}


def register(
    type_: str, schema_version: int, model: type[EventData], description: str
) -> EventSpec:
    """Add an event type to the catalog (idempotent for the same model)."""
    key = (type_, schema_version)
    existing = _CATALOG.get(key)
    if existing is not None and existing.model is not model:
        raise InvalidInput(f"event type {type_} v{schema_version} is already registered")
    spec = EventSpec(type_, schema_version, model, description)
    _CATALOG[key] = spec
    return spec


def lookup(type_: str, schema_version: int) -> EventSpec | None:
    """The catalog entry for a type and version, or None."""
    return _CATALOG.get((type_, schema_version))


def catalog() -> list[EventSpec]:
    """Every registered event type, sorted by type."""
    return sorted(_CATALOG.values(), key=lambda s: (s.type, s.schema_version))


def validate_event(event: EventEnvelope) -> EventData | dict[str, Any]:
    """Check ``event.data`` against the catalog; raise :class:`InvalidInput` if it does not fit."""
    if event.type.startswith("ext."):
        return event.data
    spec = lookup(event.type, event.schema_version)
    if spec is None:
        known = sorted({t for t, _ in _CATALOG})
        raise InvalidInput(
            f"unknown event type {event.type} v{event.schema_version}",
            hint=f"known gantry types: {', '.join(known)}; "
            "outside services use 'ext.<service>.<name>'",
        )
    try:
        return spec.model.model_validate(event.data)
    except ValidationError as exc:
        problems = "; ".join(
            f"data.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"{event.type} v{event.schema_version}: {problems}") from None


AUTHZ_DECISION = register(
    "gantry.authz.decision", 1, AuthzDecision, "An RBAC decision (allow or deny) on an API call."
)
AUDIT_CHECKPOINT = register(
    "gantry.audit.checkpoint", 1, AuditCheckpoint, "A signed tree head of the audit log."
)
AUDIT_QUERIED = register(
    "gantry.audit.queried", 1, AuditQueried, "A compliance query against the audit log."
)
DATA_ACCESSED = register("gantry.data.accessed", 1, DataAccessed, "A dataset was read.")
DATASET_CREATED = register(
    "gantry.data.dataset.created", 1, DatasetCreated, "A dataset was registered."
)
VERSION_COMMITTED = register(
    "gantry.data.version.committed", 1, VersionCommitted, "A dataset version was committed."
)
VIEW_POLICY_CHANGED = register(
    "gantry.data.policy.changed", 1, ViewPolicyChanged, "A view policy got a new version."
)
GRANT_ISSUED = register("gantry.data.grant.issued", 1, GrantIssued, "A job got a read grant.")
GRANT_REVOKED = register(
    "gantry.data.grant.revoked", 1, GrantRevoked, "A job's read grant was revoked."
)
KEYS_ROTATED = register(
    "gantry.data.keys.rotated", 1, KeysRotated, "The storage key-encryption key was rotated."
)
GARBAGE_COLLECTED = register(
    "gantry.data.gc.completed", 1, GarbageCollected, "Unreferenced content was removed."
)
MODEL_REGISTERED = register(
    "gantry.model.registered", 1, ModelRegistered, "A model version was registered."
)
JOB_SCHEDULED = register("gantry.job.scheduled", 1, JobScheduled, "A job was placed on nodes.")

__all__ = [
    "AUDIT_CHECKPOINT",
    "AUDIT_QUERIED",
    "AUTHZ_DECISION",
    "DATASET_CREATED",
    "DATA_ACCESSED",
    "GARBAGE_COLLECTED",
    "GRANT_ISSUED",
    "GRANT_REVOKED",
    "JOB_SCHEDULED",
    "KEYS_ROTATED",
    "MODEL_REGISTERED",
    "VERSION_COMMITTED",
    "VIEW_POLICY_CHANGED",
    "AuditCheckpoint",
    "AuditQueried",
    "AuthzDecision",
    "DataAccessed",
    "DatasetCreated",
    "DatasetUse",
    "EventData",
    "EventSpec",
    "GarbageCollected",
    "GrantIssued",
    "GrantRevoked",
    "JobScheduled",
    "KeysRotated",
    "ModelRegistered",
    "VersionCommitted",
    "ViewPolicyChanged",
    "catalog",
    "lookup",
    "register",
    "validate_event",
]
