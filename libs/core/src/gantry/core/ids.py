"""Identifiers: UUIDv7 (time-ordered, RFC 9562) as canonical strings."""

from __future__ import annotations

import uuid

import uuid_utils


def new_id() -> str:
    """Return a fresh UUIDv7 string; ids made later sort after ids made earlier."""
    return str(uuid_utils.uuid7())


def is_uuid(value: str) -> bool:
    """True when ``value`` is a canonical (lower-case, hyphenated) UUID string of any version."""
    try:
        return str(uuid.UUID(value)) == value
    except (ValueError, AttributeError, TypeError):
        return False


__all__ = ["is_uuid", "new_id"]
