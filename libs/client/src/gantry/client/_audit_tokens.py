"""Token revocation calls of the audit API (platform admins), mixed into :class:`AuditClient`."""

from __future__ import annotations

from typing import Any

from gantry.protos.v1 import audit_pb2 as pb


class TokenCalls:
    """RevokeToken and ListRevokedTokens."""

    def _call(self, method: str, request: Any) -> Any:
        raise NotImplementedError

    def revoke_token(self, *, reason: str, token: str = "", jti: str = "") -> pb.TokenRevocation:
        """Revoke a token (given itself, or its id): every service refuses it from now on."""
        request = pb.RevokeTokenRequest(token=token, jti=jti, reason=reason)
        result: pb.TokenRevocation = self._call("RevokeToken", request)
        return result

    def revoked_tokens(self) -> list[pb.TokenRevocation]:
        """The revoked tokens that have not expired yet, oldest first."""
        response = self._call("ListRevokedTokens", pb.ListRevokedTokensRequest())
        return list(response.revocations)


__all__ = ["TokenCalls"]
