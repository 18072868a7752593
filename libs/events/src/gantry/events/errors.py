"""Errors a handler raises to tell the consumer runner what to do with an event.

    GantryError (gantry.core)
    └── HandlerError
        ├── TemporaryError   NAK with a delay; redelivered up to max_deliver, then dead-lettered
        └── PermanentError   dead-lettered at once with the reason; never retried

Any :class:`gantry.core.GantryError` with ``temporary = True`` (e.g. ``Unavailable``) counts as
temporary, any other :class:`GantryError` (e.g. ``InvalidInput``) as permanent, and any other
exception as temporary (a bug may be fixed by a redeploy; max_deliver still bounds it).
"""

from __future__ import annotations

from gantry.core import GantryError


class HandlerError(GantryError):
    """An event handler could not process an event."""


class TemporaryError(HandlerError):
    """Processing may succeed later: NAK with a delay (``delay_s`` overrides the backoff)."""

    temporary = True

    def __init__(self, message: str, *, delay_s: float | None = None) -> None:
        self.delay_s = delay_s
        super().__init__(message)


class PermanentError(HandlerError):
    """Processing can never succeed: send the event to the dead-letter subject."""


class EventTooLarge(PermanentError):
    """An event's canonical bytes exceed the configured maximum."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        super().__init__(
            f"event of {size} bytes exceeds the maximum of {max_bytes} bytes; "
            "put large payloads in the object store and send a reference"
        )


def is_temporary(exc: BaseException) -> bool:
    """Whether the runner should retry after ``exc``."""
    if isinstance(exc, GantryError):
        return exc.temporary
    return True


__all__ = ["EventTooLarge", "HandlerError", "PermanentError", "TemporaryError", "is_temporary"]
