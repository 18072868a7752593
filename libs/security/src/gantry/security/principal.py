"""The authenticated caller: who it is, which roles its token carries, and until when."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

PrincipalKind = Literal["user", "service"]
ANONYMOUS = "anonymous"
#: Gantry's own service identities. No outside service account may take one of these names,
#: and no service may act as one (see :mod:`gantry.security.interceptor`).
SERVICE_SUBJECTS: frozenset[str] = frozenset(
    {
        "audit",
        "gantry",
        "supervisor",
        "governance",
        "scheduler",
        "serving",
        "profiler",
        "training-agent",
        "workflows",
    }
)


@dataclass(frozen=True)
class Principal:
    """An identity proven by a verified token; immutable.

    ``roles`` are the roles named in the token (bindings in the RBAC policy may add more at
    decision time); ``token_id`` is the token's ``jti``; ``expires_at`` is timezone-aware UTC.
    ``via`` is empty for a caller that presented its own token. For a principal a service acts
    as (``x-gantry-act-as`` metadata) it names that service; ``roles`` are then the ones the
    service asserted, ``token_id`` and ``expires_at`` those of the service's own token.
    ``address`` is where the call came from (the gRPC peer's host) while a call is served.
    """

    subject: str
    roles: tuple[str, ...]
    token_id: str
    expires_at: dt.datetime
    kind: PrincipalKind = "user"
    via: str = ""
    address: str = ""

    def has_role(self, role: str) -> bool:
        """True when the token names ``role``."""
        return role in self.roles


__all__ = ["ANONYMOUS", "SERVICE_SUBJECTS", "Principal", "PrincipalKind"]
