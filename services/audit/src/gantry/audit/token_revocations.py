"""Revoking identity tokens (domain): the revocation list and its audit trail.

A revocation goes into the ``gantry-revocations`` bucket (what every service watches) and is
announced as a signed ``gantry.authz.token.revoked`` event, which the audit log then records.
A token is named by itself (its signature must check out, so only our tokens can be listed)
or by its id; by id alone, its expiry is unknown, so the entry is kept for the longest token
lifetime.
"""

from __future__ import annotations

from gantry.core import Clock, InvalidInput, SystemClock
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import TOKEN_REVOKED, TokenRevoked
from gantry.security.revocations import Revocation, list_revocations, revoke
from gantry.security.tokens import MAX_TTL, TokenVerifier

SOURCE = "gantry/audit"
_MAX_REASON = 500


class TokenRevocations:
    """Revokes tokens and lists the revoked ones."""

    def __init__(
        self,
        bus: Bus,
        publisher: Publisher,
        verifier: TokenVerifier,
        clock: Clock = SystemClock(),
    ) -> None:
        self._bus = bus
        self._publisher = publisher
        self._verifier = verifier
        self._clock = clock

    async def revoke(self, *, token: str, jti: str, reason: str, actor: str) -> Revocation:
        """Revoke ``token`` (or the token with id ``jti``) for ``reason``."""
        reason = reason.strip()
        if not reason:
            raise InvalidInput(
                "a revocation needs a reason", hint="say why, e.g. --reason 'laptop stolen'"
            )
        if len(reason) > _MAX_REASON:
            raise InvalidInput(f"the reason is longer than {_MAX_REASON} characters")
        now = self._clock.now()
        if token.strip():
            if jti.strip():
                raise InvalidInput("give the token or its id, not both")
            jti, subject, exp_s = self._verifier.inspect(token.strip())
            expires_ms = exp_s * 1000
        elif jti.strip():
            jti, subject = jti.strip(), ""
            expires_ms = int((now + MAX_TTL).timestamp() * 1000)
        else:
            raise InvalidInput(
                "name the token to revoke", hint="pass the token itself or its id (jti)"
            )
        if len(jti) > 128 or not all(c.isalnum() or c in "-_" for c in jti):
            raise InvalidInput(f"{jti!r} is not a token id", hint="token ids are UUIDs")
        revocation = Revocation(
            jti=jti,
            expires_ms=expires_ms,
            reason=reason,
            subject=subject,
            revoked_by=actor,
            revoked_ms=int(now.timestamp() * 1000),
        )
        await revoke(self._bus, revocation)
        event = EventEnvelope(
            type=TOKEN_REVOKED.type,
            source=SOURCE,
            actor=actor,
            subject=f"token/{jti}",
            data=TokenRevoked(
                jti=jti, subject=subject, expires_ms=expires_ms, reason=reason
            ).model_dump(),
        )
        await self._publisher.publish(event)
        return revocation

    async def list(self) -> list[Revocation]:
        """Every revocation whose token has not expired yet, oldest first."""
        now_ms = int(self._clock.now().timestamp() * 1000)
        return [
            r
            for r in await list_revocations(self._bus)
            if not r.expires_ms or r.expires_ms >= now_ms
        ]


__all__ = ["TokenRevocations"]
