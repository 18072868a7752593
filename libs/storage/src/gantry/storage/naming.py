"""Object names, and where an object's two blobs live in a backend.

A user-visible object ``<name>`` is stored as two backend blobs::

    _head/<name>                      the small header; written last, so its presence = committed
    _body/<name>.<object id, 32 hex>  the immutable encrypted body

The body's name carries the object id so that a replacement never overwrites the body a
reader may be streaming; the header says which body is current. Names whose first segment
starts with ``_`` are reserved for these internal prefixes.
"""

from __future__ import annotations

import re

from gantry.storage.errors import InvalidObjectName

MAX_NAME_LENGTH = 1024
HEAD_PREFIX = "_head/"
BODY_PREFIX = "_body/"

_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")
_PREFIX_CHARS = re.compile(r"[A-Za-z0-9._=/-]*")
_OBJECT_ID = re.compile(r"[0-9a-f]{32}")


def _check_path(name: str, *, internal: bool) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidObjectName(str(name), "it is empty")
    if len(name) > MAX_NAME_LENGTH + (64 if internal else 0):
        raise InvalidObjectName(name[:64] + "...", f"it is longer than {MAX_NAME_LENGTH} chars")
    if "\\" in name:
        raise InvalidObjectName(name, "it contains a backslash")
    if name.startswith("/"):
        raise InvalidObjectName(name, "it is absolute (starts with '/')")
    for segment in name.split("/"):
        if not segment:
            raise InvalidObjectName(name, "it has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise InvalidObjectName(name, f"it has a {segment!r} segment")
        if not _SEGMENT.fullmatch(segment):
            raise InvalidObjectName(
                name, f"segment {segment!r} has a character outside A-Za-z0-9._=-"
            )
    if not internal and name.startswith("_"):
        raise InvalidObjectName(name, "names starting with '_' are reserved for the store")


def check_object_name(name: str) -> str:
    """Return ``name`` if it is a valid user object name, else raise :class:`InvalidObjectName`.

    Valid: relative, '/'-separated segments of ``[A-Za-z0-9._=-]``, no ``.``/``..`` or empty
    segment, no leading ``/``, no backslash, at most 1024 chars, not starting with ``_``.
    """
    _check_path(name, internal=False)
    return name


def check_blob_name(name: str) -> str:
    """Return ``name`` if a backend may store a blob under it (object rules, ``_`` allowed)."""
    _check_path(name, internal=True)
    return name


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a valid object name ("" lists everything)."""
    if not isinstance(prefix, str) or not _PREFIX_CHARS.fullmatch(prefix):
        raise InvalidObjectName(str(prefix), "a list prefix may only use A-Za-z0-9._=- and '/'")
    if prefix.startswith(("/", "_")) or "//" in prefix:
        raise InvalidObjectName(prefix, "a list prefix must be the start of a valid object name")
    if any(seg in (".", "..") for seg in prefix.split("/")[:-1]):
        raise InvalidObjectName(prefix, "a list prefix may not contain '.' or '..' segments")
    return prefix


def head_name(name: str) -> str:
    """The backend blob holding ``name``'s header."""
    return HEAD_PREFIX + name


def body_name(name: str, object_id: bytes) -> str:
    """The backend blob holding the body with ``object_id`` of object ``name``."""
    return f"{BODY_PREFIX}{name}.{object_id.hex()}"


def parse_body_name(blob: str) -> tuple[str, bytes] | None:
    """``(object name, object id)`` for a body blob name, or ``None`` if it is not one."""
    if not blob.startswith(BODY_PREFIX) or len(blob) < len(BODY_PREFIX) + 34:
        return None
    name, dot, hex_id = blob[len(BODY_PREFIX) : -33], blob[-33], blob[-32:]
    if dot != "." or not _OBJECT_ID.fullmatch(hex_id):
        return None
    return name, bytes.fromhex(hex_id)


__all__ = [
    "BODY_PREFIX",
    "HEAD_PREFIX",
    "MAX_NAME_LENGTH",
    "body_name",
    "check_blob_name",
    "check_object_name",
    "check_prefix",
    "head_name",
    "parse_body_name",
]
