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

__all__ = [
    "AUDIT_CHECKPOINT",
    "AUDIT_QUERIED",
    "AUTHZ_DECISION",
    "DATA_ACCESSED",
    "AuditCheckpoint",
    "AuditQueried",
    "AuthzDecision",
    "DataAccessed",
    "EventData",
    "EventSpec",
    "catalog",
    "lookup",
    "register",
    "validate_event",
]
