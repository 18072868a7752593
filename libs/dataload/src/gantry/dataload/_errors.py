"""The errors a training script sees from the loader, and how gRPC failures map onto them.

Every error is a :class:`gantry.core.GantryError`; the loader adds one kind::

    GantryError
    ├── InvalidInput          bad arguments, too few shards for the ranks and workers
    ├── Unauthenticated       the service token was refused (the server's message)
    ├── PermissionDenied
    │   └── GrantRefused      the job's grant does not allow this read (the server's message)
    ├── Unavailable           the governance service is unreachable (retried first)
    └── IntegrityError        the service sent no data or undecodable data for a shard

Each class can be rebuilt from its message alone, so an error raised inside a DataLoader worker
process comes back to the training script as the same type instead of a ``RuntimeError``.
"""

from __future__ import annotations

import grpc

from gantry.client.errors import from_rpc_error
from gantry.core import GantryError, PermissionDenied, Unauthenticated

_GRANT_HINT = (
    "the job's grant (GANTRY_DATA_GRANT) must name this dataset version and view and must not "
    "have expired; ask the dataset owner for a new grant"
)
_SERVICE_IDENTITY_HINT = (
    "the service token (GANTRY_TOKEN) is missing, expired or not trusted by the governance "
    "service; the node agent renews it"
)


class GrantRefused(PermissionDenied):
    """The governance service refused to serve data under the job's grant.

    ``reason`` is the server's own explanation (expired, revoked, another dataset or view);
    the message quotes it as is, adding a hint only when the server gave none.
    """

    def __init__(
        self, reason: str, *, resource: str = "the dataset", hint: str | None = None
    ) -> None:
        self.subject = "this job's grant"
        self.action = "read"
        self.resource = resource
        self.reason = reason
        if hint is None and " — " not in reason:
            hint = _GRANT_HINT
        GantryError.__init__(self, f"governance refused to serve {resource}: {reason}", hint=hint)


def map_rpc_error(exc: grpc.RpcError, *, address: str, resource: str) -> GantryError:
    """The typed error for a failed governance call, carrying the server's message.

    ``resource`` names what was being read (``dataset 'x' version 'y'``) for the message.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = (exc.details() if hasattr(exc, "details") else None) or ""
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return GrantRefused(detail or "permission denied", resource=resource)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(detail or "not authenticated", hint=_SERVICE_IDENTITY_HINT)
    return from_rpc_error(exc, service="governance", address=address)


__all__ = ["GrantRefused", "map_rpc_error"]
