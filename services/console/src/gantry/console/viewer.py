"""Who is looking: the login cookie, the verified token behind it, what the role may do.

The viewer logs in with a Gantry token (``gantry admin token create``). The console verifies
it against the platform's token issuers, keeps it in an HttpOnly, SameSite=Strict cookie and
sends it, unchanged, with every call it makes for that viewer: the services authorise each call
themselves. :meth:`Viewer.may` asks the same RBAC policy the services use, only to decide what
to offer (a button a role may not use is not drawn); a forced request is refused by the service.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from gantry.core import PermissionDenied, Unauthenticated
from gantry.security import Authorizer
from gantry.security.tokens import TokenVerifier

#: The cookie that carries the viewer's token.
COOKIE = "gantry_console"


@dataclass(frozen=True)
class Viewer:
    """A logged-in viewer: the token's subject and roles, the token itself, the policy."""

    subject: str
    roles: tuple[str, ...]
    token: str
    expires_at: dt.datetime
    authorizer: Authorizer = field(repr=False, compare=False)

    def may(self, action: str, kind: str, **attrs: str) -> bool:
        """True when the policy lets this viewer do ``action`` on ``kind`` (with ``attrs``)."""
        decision = self.authorizer.decide(self.subject, self.roles, action, kind, attrs or None)
        return decision.allowed

    def require(self, action: str, kind: str, name: str = "", **attrs: str) -> None:
        """:class:`PermissionDenied` (with the policy's reason) unless :meth:`may` allows it:
        a page refuses a forced request before any service is asked."""
        decision = self.authorizer.decide(self.subject, self.roles, action, kind, attrs or None)
        if not decision.allowed:
            resource = f"{kind} {name}" if name else kind
            raise PermissionDenied(self.subject, action, resource, reason=decision.reason)

    def may_any(self, pairs: Mapping[str, str] | list[tuple[str, str]]) -> bool:
        """True when any ``(action, kind)`` pair is allowed."""
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        return any(self.may(action, kind) for action, kind in items)


class Gatekeeper:
    """Turns the cookie into a :class:`Viewer`, or says why it cannot."""

    def __init__(self, verifier: TokenVerifier, authorizer: Authorizer) -> None:
        self.verifier = verifier
        self.authorizer = authorizer

    def viewer(self, token: str | None) -> Viewer:
        """The viewer ``token`` proves; :class:`Unauthenticated` saying why not."""
        if not token:
            raise Unauthenticated("not logged in", hint="log in with a Gantry token")
        principal = self.verifier.verify(token.strip())
        if principal.kind == "service":
            raise Unauthenticated(
                f"{principal.subject!r} is a service identity",
                hint="log in with a user's token ('gantry admin token create --user U --role R')",
            )
        return Viewer(
            subject=principal.subject,
            roles=tuple(principal.roles),
            token=token.strip(),
            expires_at=principal.expires_at,
            authorizer=self.authorizer,
        )


__all__ = ["COOKIE", "Gatekeeper", "Viewer"]
