"""The audit API's token revocation calls (platform admins), mixed into :class:`AuditApi`."""

from __future__ import annotations

from typing import Any

from gantry.audit.token_revocations import TokenRevocations
from gantry.core import Unavailable
from gantry.protos.v1 import audit_pb2 as pb
from gantry.security import MethodRule, current_principal
from gantry.security.revocations import Revocation
from gantry.security.rpc_errors import rpc_errors

SERVICE = "gantry.audit.v1.AuditService"

TOKEN_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/RevokeToken": MethodRule("revoke", "token"),
    f"/{SERVICE}/ListRevokedTokens": MethodRule("list", "token"),
}


def revocation_pb(r: Revocation) -> pb.TokenRevocation:
    """The wire form of a revocation."""
    return pb.TokenRevocation(
        jti=r.jti,
        subject=r.subject,
        expires_ms=r.expires_ms,
        reason=r.reason,
        revoked_by=r.revoked_by,
        revoked_ms=r.revoked_ms,
    )


class TokensApi:
    """RevokeToken and ListRevokedTokens."""

    _tokens: TokenRevocations | None

    def _revocations(self) -> TokenRevocations:
        if self._tokens is None:
            raise Unavailable("token revocation is not available on this audit service")
        return self._tokens

    @rpc_errors
    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: Any) -> pb.TokenRevocation:
        revocation = await self._revocations().revoke(
            token=request.token,
            jti=request.jti,
            reason=request.reason,
            actor=current_principal().subject,
        )
        return revocation_pb(revocation)

    @rpc_errors
    async def ListRevokedTokens(
        self, request: pb.ListRevokedTokensRequest, context: Any
    ) -> pb.ListRevokedTokensResponse:
        revocations = await self._revocations().list()
        return pb.ListRevokedTokensResponse(revocations=[revocation_pb(r) for r in revocations])


__all__ = ["TOKEN_RULES", "TokensApi", "revocation_pb"]
