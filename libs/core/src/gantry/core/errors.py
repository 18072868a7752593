"""The Gantry error tree.

Every error a user can see is a :class:`GantryError`. Each kind maps to one gRPC status code
and builds its own message from typed fields, ending with what to do about it::

    GantryError
    ├── InvalidInput          INVALID_ARGUMENT   bad request, bad file, bad event
    │   └── ConfigError       INVALID_ARGUMENT   a setting is missing or malformed
    ├── NotFound              NOT_FOUND
    ├── AlreadyExists         ALREADY_EXISTS
    ├── Conflict              FAILED_PRECONDITION / ABORTED
    ├── Unauthenticated       UNAUTHENTICATED    no token, bad signature, expired
    ├── PermissionDenied      PERMISSION_DENIED  RBAC said no
    ├── Unavailable           UNAVAILABLE        a dependency is down; retrying may help
    └── IntegrityError        DATA_LOSS          stored data failed verification (tampering)
"""

from __future__ import annotations


class GantryError(Exception):
    """Root of every error Gantry raises on purpose.

    ``message`` says what went wrong; ``hint`` says what the user can do about it.
    ``grpc_code`` names the ``grpc.StatusCode`` member the error maps to.
    """

    grpc_code: str = "UNKNOWN"
    temporary: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


class InvalidInput(GantryError):
    """The caller sent something malformed; resending the same thing will fail again."""

    grpc_code = "INVALID_ARGUMENT"


class ConfigError(InvalidInput):
    """A setting is missing or malformed."""


class NotFound(GantryError):
    """The named resource does not exist."""

    grpc_code = "NOT_FOUND"

    def __init__(self, kind: str, name: str, *, hint: str | None = None) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} not found", hint=hint)


class AlreadyExists(GantryError):
    """A resource with this identity already exists."""

    grpc_code = "ALREADY_EXISTS"


class Conflict(GantryError):
    """The request conflicts with the current state of the resource."""

    grpc_code = "FAILED_PRECONDITION"


class Unauthenticated(GantryError):
    """The caller could not be identified: no token, a bad signature, or an expired token."""

    grpc_code = "UNAUTHENTICATED"


class PermissionDenied(GantryError):
    """The caller is known but the policy does not allow the action."""

    grpc_code = "PERMISSION_DENIED"

    def __init__(
        self, subject: str, action: str, resource: str, *, reason: str, hint: str | None = None
    ) -> None:
        self.subject = subject
        self.action = action
        self.resource = resource
        self.reason = reason
        super().__init__(
            f"{subject!r} may not {action} {resource}: {reason}",
            hint=hint or "ask a platform-admin for a role that grants this action",
        )


class Unavailable(GantryError):
    """A dependency (NATS, the database, another service) is unreachable; retry later."""

    grpc_code = "UNAVAILABLE"
    temporary = True


class IntegrityError(GantryError):
    """Stored data failed verification: it was altered, deleted or reordered."""

    grpc_code = "DATA_LOSS"


__all__ = [
    "AlreadyExists",
    "ConfigError",
    "Conflict",
    "GantryError",
    "IntegrityError",
    "InvalidInput",
    "NotFound",
    "PermissionDenied",
    "Unauthenticated",
    "Unavailable",
]
