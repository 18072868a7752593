"""What every service client shares: one channel, the bearer token, deadlines, typed errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import grpc

from gantry.client.errors import from_rpc_error
from gantry.core import GantryError


class RpcClient:
    """A synchronous gRPC client of one Gantry service, authenticated with a bearer token.

    Subclasses name their ``service`` and make their stub from :attr:`_channel`; ``_call``
    makes a request/response call within ``timeout_s`` and raises Gantry's typed errors
    (:func:`~gantry.client.errors.from_rpc_error`) instead of gRPC's.
    """

    service = ""

    def __init__(
        self,
        address: str,
        token: str | None,
        *,
        timeout_s: float,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=list(options))
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = timeout_s
        self._stub: Any = None

    def _error(self, exc: grpc.RpcError) -> GantryError:
        return from_rpc_error(exc, service=self.service, address=self.address)

    def _call(self, method: str, request: Any, stub: Any = None) -> Any:
        try:
            return getattr(stub or self._stub, method)(
                request, metadata=self._metadata, timeout=self._timeout
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Close the channel (streams still open end with it)."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RpcClient"]
