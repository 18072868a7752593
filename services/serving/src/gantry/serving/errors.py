"""Errors of the inference protocol, each with its HTTP status and gRPC code.

Every error a caller of the inference endpoints can see is an :class:`InferenceError`. The
REST front end answers ``{"error": "<message>"}`` with :attr:`~InferenceError.http_status`
(the Open Inference Protocol's error shape); the gRPC front end aborts with
:attr:`~InferenceError.grpc_code` and the same message. Each message says what was wrong and
what to do about it.
"""

from __future__ import annotations

from gantry.core import GantryError


class InferenceError(GantryError):
    """A request that cannot be answered; the base of the inference errors."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class BadRequest(InferenceError):
    """Malformed JSON, a wrong shape or datatype, a missing input: resending fails again."""


class PayloadTooLarge(InferenceError):
    """The request body is larger than the service accepts."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class ModelNotFound(InferenceError):
    """No deployment (or no such version in it) has this name."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class ModelNotReady(InferenceError):
    """The model exists but no version of it can answer yet (loading, or failed to load)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    temporary = True


class Overloaded(InferenceError):
    """The version's queue is full: come back after ``retry_after_s`` (HTTP 503 + Retry-After)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    temporary = True

    def __init__(self, message: str, *, retry_after_s: float, hint: str | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, hint=hint)


class RequestTimedOut(InferenceError):
    """The request was not answered within its timeout (it was dropped from the queue)."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    temporary = True


class ModelFailed(InferenceError):
    """The model raised while computing this request's batch; the server stays up."""

    http_status = 500
    grpc_code = "INTERNAL"


class NotAuthenticated(InferenceError):
    """No token, or a token that does not verify."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class Forbidden(InferenceError):
    """RBAC refused the call."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


__all__ = [
    "BadRequest",
    "Forbidden",
    "InferenceError",
    "ModelFailed",
    "ModelNotFound",
    "ModelNotReady",
    "NotAuthenticated",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimedOut",
]
