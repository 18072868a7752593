"""The outcome of an authorization check, shared by the policy compiler and the authorizer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one authorization check.

    ``allowed`` is the verdict; ``reason`` says why in words a user can act on (e.g. "allowed
    by role ml-developer", "condition view in [deidentified] not met (role ml-developer)");
    ``role`` is the role that granted the action, None on deny.
    """

    allowed: bool
    reason: str
    role: str | None = None


__all__ = ["Decision"]
