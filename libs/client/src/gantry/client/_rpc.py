"""What every service client shares: one channel, the bearer token, deadlines, typed errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import grpc

from gantry.client.errors import from_rpc_error
from gantry.core import GantryError, InvalidInput, TlsSettings
from gantry.security.tls import secure_or_insecure_channel

#: The metadata a service sends to act on behalf of a user (the same keys as
#: ``gantry.security.interceptor.ACT_AS_METADATA`` and ``ACT_AS_ROLES_METADATA``).
ACT_AS_METADATA = "x-gantry-act-as"
ACT_AS_ROLES_METADATA = "x-gantry-act-as-roles"

ActAs = tuple[str, Sequence[str]]


class RpcClient:
    """A synchronous gRPC client of one Gantry service, authenticated with a bearer token.

    Subclasses name their ``service`` and make their stub from :attr:`_channel`; ``_call``
    makes a request/response call within ``timeout_s`` and raises Gantry's typed errors
    (:func:`~gantry.client.errors.from_rpc_error`) instead of gRPC's.

    ``act_as=(subject, roles)`` makes every call on behalf of that user, with those roles: only
    a service token the policy allows to ``impersonate`` (the ``workflows`` service) may do so,
    and the service then decides each call as it would for the user.

    ``tls`` (``ClientSettings().tls``, from ``GANTRY_TLS__*``) makes the channel TLS — with
    this client's certificate where the settings name one (mutual TLS); None or disabled
    settings: plaintext.
    """

    service = ""

    def __init__(
        self,
        address: str,
        token: str | None,
        *,
        timeout_s: float,
        options: Sequence[tuple[str, Any]] = (),
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        acting = _act_as_metadata(act_as)  # checked before a channel is opened
        self.address = address
        self._channel = secure_or_insecure_channel(address, tls, options)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        ) + acting
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


def _act_as_metadata(act_as: ActAs | None) -> tuple[tuple[str, str], ...]:
    """The two act-as metadata entries for ``(subject, roles)``; none for ``None``."""
    if act_as is None:
        return ()
    subject, roles = act_as
    if isinstance(roles, str):  # a str is a Sequence[str] too, and would be sent letter by letter
        raise InvalidInput(
            f"act_as roles must be a list of role names, got the string {roles!r}",
            hint=f"pass act_as=({subject!r}, [{roles!r}])",
        )
    if not isinstance(subject, str) or not subject.strip() or any(c.isspace() for c in subject):
        raise InvalidInput(
            f"act_as names the subject to act as, got {subject!r}",
            hint="pass act_as=(user, roles), e.g. ('alice', ['ml-developer'])",
        )
    bad = [role for role in roles if not role or "," in role or role != role.strip()]
    if bad:
        raise InvalidInput(
            f"act_as roles must be role names without ',' or spaces, got {bad!r}",
            hint="pass the user's roles as a list, e.g. ['ml-developer', 'annotator']",
        )
    return ((ACT_AS_METADATA, subject), (ACT_AS_ROLES_METADATA, ",".join(roles)))


__all__ = ["ACT_AS_METADATA", "ACT_AS_ROLES_METADATA", "ActAs", "RpcClient"]
