"""The event envelope (CloudEvents 1.0 attributes plus Gantry's own) and its canonical bytes.

On the wire and in the audit log an event is its *canonical bytes*: the envelope as JSON with
keys sorted, no insignificant whitespace, UTF-8 — the same event always gives the same bytes,
so hashes and signatures over them are stable.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gantry.core import InvalidInput, is_uuid, new_id, utc

TYPE_PATTERN = re.compile(r"^(gantry|ext)(\.[a-z][a-z0-9_-]*){2,4}$")
_KNOWN_GOOD_TYPES: set[str] = set()  # types that matched TYPE_PATTERN (a bounded cache)


class EventEnvelope(BaseModel):
    """One event: who did what to which resource, when, and why (correlation/causation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(
        default_factory=new_id, max_length=64, description="A UUID (v7); also the Nats-Msg-Id."
    )
    type: str = Field(max_length=128, description="e.g. gantry.job.scheduled; the NATS subject.")
    source: str = Field(min_length=1, max_length=256, description="Producer, e.g. gantry/audit.")
    subject: str | None = Field(default=None, max_length=512, description="Resource id.")
    time: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    actor: str = Field(min_length=1, max_length=256, description="Principal that caused it.")
    correlation_id: str = Field(default_factory=new_id, max_length=128)
    causation_id: str | None = Field(default=None, max_length=128)
    schema_version: int = Field(default=1, ge=1)
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not is_uuid(value):
            raise ValueError("event id must be a canonical lower-case UUID (use UUIDv7)")
        return value

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        if value in _KNOWN_GOOD_TYPES:
            return value
        if not TYPE_PATTERN.match(value):
            raise ValueError(
                "event type must look like 'gantry.<domain>.<name>' or 'ext.<service>.<name>' "
                "(lower case letters, digits, '-' and '_')"
            )
        if len(_KNOWN_GOOD_TYPES) < 10_000:
            _KNOWN_GOOD_TYPES.add(value)
        return value

    @field_validator("time")
    @classmethod
    def _utc(cls, value: dt.datetime) -> dt.datetime:
        return utc(value)

    def canonical_bytes(self) -> bytes:
        """The envelope as canonical JSON bytes (sorted keys, compact, UTC times)."""
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_bytes(cls, raw: bytes) -> EventEnvelope:
        """Parse and validate an envelope; raises :class:`InvalidInput` saying what is wrong."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidInput(
                f"malformed event envelope: {problems}",
                hint="build events with gantry.events.EventEnvelope or the SDK's emit()",
            ) from None


def canonical_json(value: Any) -> bytes:
    """Canonical JSON: sorted keys, compact separators, UTF-8."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


__all__ = ["TYPE_PATTERN", "EventEnvelope", "canonical_json"]
