"""Turning gRPC failures into Gantry's typed errors on the client side."""

from __future__ import annotations

import grpc

from gantry.core import (
    AlreadyExists,
    Conflict,
    GantryError,
    IntegrityError,
    InvalidInput,
    Unauthenticated,
    Unavailable,
)


class RemoteNotFound(GantryError):
    """The server said the resource does not exist."""

    grpc_code = "NOT_FOUND"


class RemotePermissionDenied(GantryError):
    """The server's policy refused the call (the message says which rule and why)."""

    grpc_code = "PERMISSION_DENIED"


_BY_CODE: dict[grpc.StatusCode, type[GantryError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.NOT_FOUND: RemoteNotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: IntegrityError,
}


def from_rpc_error(exc: grpc.RpcError, *, service: str, address: str) -> GantryError:
    """The typed error for a failed call, with the server's message."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return RemotePermissionDenied(detail or "permission denied")
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(
            f"the {service} service at {address} is unreachable: {detail}",
            hint="is the platform running? start it with 'gantry up'",
        )
    cls = _BY_CODE.get(code, GantryError)
    return cls(detail or code.name)


__all__ = ["RemoteNotFound", "RemotePermissionDenied", "from_rpc_error"]
