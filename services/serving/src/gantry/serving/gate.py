"""Who may call a deployment (domain): token verification and RBAC for inference calls.

Management calls go through the gRPC :class:`~gantry.security.AuthInterceptor` like every
other service's. Inference calls are checked here, per deployment: ``infer`` on ``model`` for
inference and for the model's metadata and readiness (whoever may call a model may learn how;
``read`` on ``model`` would also let them download its weights from the registry). A
deployment may serve callers without a token only when both the service (``allow_anonymous``)
and the deployment's spec (``anonymous: true``) say so.

Every decision becomes an ``authz.decision`` event, but not once per request: at thousands of
requests per second that would bury the audit log. A decision is remembered per (token,
deployment, action) for ``ttl_s`` and recorded when first taken — so the log holds who called
which model, allowed or refused, at least once per minute they kept calling. Calls without a
token that are refused are recorded once per (deployment, action) and window.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from gantry.core import Unauthenticated
from gantry.events.catalog import AuthzDecision
from gantry.security import ANONYMOUS, Authorizer, TokenVerifier
from gantry.security.interceptor import DecisionSink
from gantry.serving.errors import Forbidden, NotAuthenticated

SERVICE_NAME = "serving"
_LOGIN_HINT = "send 'Authorization: Bearer <token>' (create one with `gantry admin token create`)"
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class _Remembered:
    subject: str
    allowed: bool
    reason: str
    until: float
    jti: str = ""


class Gate:
    """Authenticates and authorises inference calls, remembering decisions for ``ttl_s``."""

    def __init__(
        self,
        verifier: TokenVerifier,
        authorizer: Authorizer,
        sink: DecisionSink,
        *,
        allow_anonymous: bool,
        ttl_s: float = 60.0,
    ) -> None:
        self._verifier = verifier
        self._authorizer = authorizer
        self._sink = sink
        self._allow_anonymous = allow_anonymous
        self._ttl_s = ttl_s
        self._cache: dict[tuple[str, str, str], _Remembered] = {}
        self._anonymous_recorded: dict[tuple[str, str], float] = {}

    def check(
        self, token: str | None, deployment: str, action: str, *, anonymous_ok: bool, method: str
    ) -> str:
        """The caller's subject if it may ``action`` the deployment's model; raise otherwise."""
        if token is None:
            if anonymous_ok and self._allow_anonymous:
                return ANONYMOUS
            # refused callers without a token are recorded once per deployment and window too
            now = time.monotonic()
            if self._anonymous_recorded.get((deployment, action), 0.0) < now:
                self._anonymous_recorded[(deployment, action)] = now + self._ttl_s
                self._record(ANONYMOUS, (), action, deployment, False, "no token", method)
            raise NotAuthenticated(
                f"model {deployment!r} needs a token for {action}", hint=_LOGIN_HINT
            )
        now = time.monotonic()
        key = (hashlib.blake2b(token.encode(), digest_size=16).hexdigest(), deployment, action)
        remembered = self._cache.get(key)
        if remembered is not None and self._revoked(remembered):
            remembered = None  # revoked since: decided again (and refused) at once
        if remembered is None or remembered.until < now:
            remembered = self._decide(token, deployment, action, method, now)
            if len(self._cache) >= _MAX_CACHED:
                self._cache = {k: v for k, v in self._cache.items() if v.until >= now}
                if len(self._cache) >= _MAX_CACHED:
                    self._cache.clear()
            self._cache[key] = remembered
        if not remembered.allowed:
            if remembered.subject == ANONYMOUS:
                raise NotAuthenticated(remembered.reason, hint=_LOGIN_HINT)
            raise Forbidden(
                f"{remembered.subject} may not {action} model {deployment!r}: {remembered.reason}",
                hint="ask a platform admin for a role that may, e.g. model-consumer",
            )
        return remembered.subject

    def _decide(
        self, token: str, deployment: str, action: str, method: str, now: float
    ) -> _Remembered:
        try:
            principal = self._verifier.verify(token)
        except Unauthenticated as exc:
            self._record(ANONYMOUS, (), action, deployment, False, str(exc), method)
            # a bad token is not remembered for long: it may be fixed at once
            return _Remembered(ANONYMOUS, False, str(exc), now + 1.0)
        decision = self._authorizer.decide(
            principal.subject, principal.roles, action, "model", {"model": deployment}
        )
        self._record(
            principal.subject, principal.roles, action, deployment, decision.allowed,
            decision.reason, method,
        )  # fmt: skip
        expires = principal.expires_at.timestamp() - time.time() + now
        return _Remembered(
            principal.subject,
            decision.allowed,
            decision.reason,
            min(now + self._ttl_s, expires),
            principal.token_id,
        )

    def _revoked(self, remembered: _Remembered) -> bool:
        revocations = self._verifier.revocations
        return bool(
            remembered.jti and revocations is not None and revocations.revoked(remembered.jti)
        )

    def _record(
        self,
        subject: str,
        roles: tuple[str, ...] | list[str],
        action: str,
        deployment: str,
        allowed: bool,
        reason: str,
        method: str,
    ) -> None:
        self._sink.record(
            AuthzDecision(
                principal=subject,
                roles=list(roles),
                action=action,
                resource_kind="model",
                resource_name=deployment,
                decision="allow" if allowed else "deny",
                reason=reason,
                service=SERVICE_NAME,
                method=method,
            ),
            actor=subject,
        )


__all__ = ["SERVICE_NAME", "Gate"]
