"""The authenticated caller: who it is, which roles its token carries, and until when."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

PrincipalKind = Literal["user", "service"]
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Principal:
    """An identity proven by a verified token; immutable.

    ``roles`` are the roles named in the token (bindings in the RBAC policy may add more at
    decision time); ``token_id`` is the token's ``jti``; ``expires_at`` is timezone-aware UTC.
    """

    subject: str
    roles: tuple[str, ...]
    token_id: str
    expires_at: dt.datetime
    kind: PrincipalKind = "user"

    def has_role(self, role: str) -> bool:
        """True when the token names ``role``."""
        return role in self.roles


__all__ = ["ANONYMOUS", "Principal", "PrincipalKind"]
