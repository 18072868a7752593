"""Short-lived identity tokens: EdDSA (Ed25519) JWTs naming a subject and its roles.

:class:`TokenIssuer` signs tokens with a :class:`SigningKey`; :class:`TokenVerifier` checks
them against a :class:`TrustStore` and a clock, and refuses every bad token with
:class:`gantry.core.Unauthenticated` and a message saying exactly what was wrong.
"""

from __future__ import annotations

import binascii
import datetime as dt
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import jwt
from jwt.utils import base64url_decode

from gantry.core import Clock, InvalidInput, SystemClock, Unauthenticated, new_id
from gantry.security.keyring import SERVICE_KID_PREFIX
from gantry.security.keys import SigningKey, TrustStore
from gantry.security.principal import Principal, PrincipalKind
from gantry.security.revocations import RevocationList

ALGORITHM = "EdDSA"
DEFAULT_ISSUER = "gantry"
MAX_TTL = dt.timedelta(days=30)
REQUIRED_CLAIMS = ("sub", "roles", "exp", "iat", "nbf", "jti", "iss", "kind")
_MAX_EPOCH_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the last time datetime can hold
_KINDS: frozenset[str] = frozenset({"user", "service"})
_TTL_PATTERN = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_TTL_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_CACHE_SIZE = 4096
_RENEW_HINT = "create a new one with `gantry admin token create`"
# The signature is checked by the TrustStore first; every time-based and claim check is ours,
# against the injected clock.
_DECODE_OPTIONS: Any = {
    "verify_signature": False,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}


def parse_ttl(text: str) -> dt.timedelta:
    """Parse a token lifetime such as ``30s``, ``15m``, ``12h`` or ``7d`` (a positive number)."""
    match = _TTL_PATTERN.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) == 0:
        raise InvalidInput(
            f"invalid duration {text!r}",
            hint="use a positive whole number followed by s, m, h or d, e.g. 30s, 15m, 12h, 7d",
        )
    return dt.timedelta(**{_TTL_UNITS[match.group(2)]: int(match.group(1))})


class TokenIssuer:
    """Issues signed identity tokens with the key ``key`` and the time from ``clock``."""

    def __init__(
        self, key: SigningKey, clock: Clock = SystemClock(), issuer: str = DEFAULT_ISSUER
    ) -> None:
        self._key = key
        self._clock = clock
        self._issuer = issuer

    @property
    def kid(self) -> str:
        """The key id written into every token's header."""
        return self._key.kid

    def issue(
        self,
        subject: str,
        roles: Iterable[str],
        ttl: dt.timedelta,
        kind: PrincipalKind = "user",
    ) -> str:
        """A compact JWT for ``subject`` with ``roles``, valid from now for ``ttl``.

        Raises :class:`InvalidInput` for an empty subject, no roles, a non-positive ttl or one
        longer than 30 days, or an unknown kind.
        """
        if not isinstance(subject, str) or not subject.strip():
            raise InvalidInput("a token needs a subject", hint="pass the user or service name")
        role_list = _clean_roles(roles)
        if ttl <= dt.timedelta(0):
            raise InvalidInput(
                f"token lifetime must be positive, got {ttl}",
                hint="pass e.g. parse_ttl('12h') (tokens are short-lived)",
            )
        if ttl > MAX_TTL:
            raise InvalidInput(
                f"token lifetime {ttl} is longer than the 30-day maximum",
                hint="pass 30d or less and issue a new token when it expires",
            )
        if kind not in _KINDS:
            raise InvalidInput(f"unknown principal kind {kind!r}", hint="pass 'user' or 'service'")
        now = self._clock.now()
        issued = int(now.timestamp())
        claims = {
            "sub": subject,
            "roles": role_list,
            "iat": issued,
            "nbf": issued,
            "exp": int((now + ttl).timestamp()),
            "jti": new_id(),
            "iss": self._issuer,
            "kind": kind,
        }
        return jwt.encode(
            claims, self._key.private_key, algorithm=ALGORITHM, headers={"kid": self._key.kid}
        )


def _clean_roles(roles: Iterable[str]) -> list[str]:
    if isinstance(roles, str):
        raise InvalidInput(
            f"roles must be a list of role names, got the string {roles!r}",
            hint=f"pass [{roles!r}]",
        )
    cleaned: list[str] = []
    for role in roles:
        if not isinstance(role, str) or not role.strip():
            raise InvalidInput(
                f"invalid role name {role!r}", hint="role names are non-empty strings"
            )
        if role not in cleaned:
            cleaned.append(role)
    if not cleaned:
        raise InvalidInput(
            "a token needs at least one role", hint="pass e.g. roles=['ml-developer']"
        )
    return cleaned


class TokenVerifier:
    """Verifies identity tokens against trusted keys and a clock; returns the :class:`Principal`.

    Every refusal is :class:`Unauthenticated` with a message specific to the problem: malformed
    token, missing or unknown key id, bad signature, expired, not yet valid, missing or
    malformed claims, wrong issuer, (when ``known_roles`` is given) a role the RBAC policy
    does not define, or (with ``revocations``) a token revoked before its expiry.
    ``leeway_s`` tolerates clock skew on the time checks.
    """

    def __init__(
        self,
        trust: TrustStore,
        clock: Clock = SystemClock(),
        known_roles: frozenset[str] | None = None,
        leeway_s: float = 5,
        issuer: str = DEFAULT_ISSUER,
        revocations: RevocationList | None = None,
        service_trust: TrustStore | None = None,
    ) -> None:
        self._trust = trust
        self.revocations = revocations
        self._service_trust = service_trust
        self._clock = clock
        self._known_roles = known_roles
        self._leeway = leeway_s
        self._issuer = issuer
        # token -> its claims, once the signature checked out: a token is re-sent with every
        # call, and an Ed25519 check costs far more than the claim checks, which rerun each time.
        self._verified: dict[str, dict[str, Any]] = {}

    def verify(self, token: str) -> Principal:
        """The principal ``token`` proves, or :class:`Unauthenticated` saying why not."""
        claims = self._verified.get(token) if isinstance(token, str) else None
        if claims is None:
            claims = self._verify_signature(token)
            principal = self._principal(claims)
            if len(self._verified) >= _CACHE_SIZE:
                self._verified.clear()
            self._verified[token] = claims
            return principal
        return self._principal(claims)

    def inspect(self, token: str) -> tuple[str, str, int]:
        """The ``(jti, sub, exp)`` of a token whose signature checks out, expired or not.

        For revoking a token: its claims are read only once its signature proves it is one of
        ours; Unauthenticated otherwise.
        """
        claims = self._verify_signature(token)
        jti, sub = claims.get("jti"), claims.get("sub")
        if not isinstance(jti, str) or not jti:
            raise Unauthenticated("token has no 'jti' claim", hint=_RENEW_HINT)
        return jti, sub if isinstance(sub, str) else "", _int_claim(claims, "exp")

    def _verify_signature(self, token: str) -> dict[str, Any]:
        if not isinstance(token, str) or not token.isascii() or token.count(".") != 2:
            raise Unauthenticated(
                "malformed token: expected a JWT (three base64url segments separated by '.')",
                hint=_RENEW_HINT,
            )
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"malformed token header: {exc}", hint=_RENEW_HINT) from None
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthenticated("token has no key id ('kid' header)", hint=_RENEW_HINT)
        if header.get("alg") != ALGORITHM:
            raise Unauthenticated(
                f"token algorithm {header.get('alg')!r} is not accepted; only {ALGORITHM} is",
                hint=_RENEW_HINT,
            )
        service_kid = kid.startswith(SERVICE_KID_PREFIX) and self._service_trust is not None
        signing_input, _, encoded_signature = token.rpartition(".")
        try:
            signature = base64url_decode(encoded_signature)
        except (binascii.Error, ValueError):
            raise Unauthenticated(
                "malformed token: the signature segment is not base64url", hint=_RENEW_HINT
            ) from None
        trust = self._service_trust if service_kid and self._service_trust else self._trust
        try:
            # Through TrustStore.verify, so stores that reload keys on demand work here too.
            trust.verify(kid, signing_input.encode("ascii"), signature)
        except Unauthenticated as exc:
            raise Unauthenticated(f"token refused: {exc.message}", hint=exc.hint) from None
        try:
            claims: dict[str, Any] = jwt.decode(
                token, algorithms=[ALGORITHM], options=_DECODE_OPTIONS
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"malformed token: {exc}", hint=_RENEW_HINT) from None
        if service_kid:
            _check_self_signed(kid, claims)
        return claims

    def _principal(self, claims: dict[str, Any]) -> Principal:
        missing = [name for name in REQUIRED_CLAIMS if claims.get(name) is None]
        if missing:
            raise Unauthenticated(
                f"token is missing claims: {', '.join(missing)}", hint=_RENEW_HINT
            )
        exp, nbf, iat = (
            _int_claim(claims, "exp"),
            _int_claim(claims, "nbf"),
            _int_claim(claims, "iat"),
        )
        subject, roles, jti, kind = claims["sub"], claims["roles"], claims["jti"], claims["kind"]
        if not isinstance(subject, str) or not subject or not isinstance(jti, str):
            raise Unauthenticated("token claims 'sub' and 'jti' must be non-empty strings")
        if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
            raise Unauthenticated("token claim 'roles' must be a non-empty list of role names")
        if kind not in _KINDS:
            raise Unauthenticated(f"token claim 'kind' must be 'user' or 'service', got {kind!r}")
        if claims["iss"] != self._issuer:
            raise Unauthenticated(
                f"token was issued by {claims['iss']!r}, expected {self._issuer!r}"
            )
        now = self._clock.now().timestamp()
        if now >= exp + self._leeway:
            raise Unauthenticated(f"token expired at {_iso(exp)}; {_RENEW_HINT}")
        if now + self._leeway < max(nbf, iat):
            raise Unauthenticated(
                f"token is not valid before {_iso(max(nbf, iat))}",
                hint="check this machine's clock, or wait until then",
            )
        if self.revocations is not None:
            revoked = self.revocations.revoked(jti)
            if revoked is not None:
                why = f": {revoked.reason}" if revoked.reason else ""
                raise Unauthenticated(
                    f"token {jti} was revoked{why}", hint="ask a platform-admin for a new token"
                )
        if self._known_roles is not None:
            for role in roles:
                if role not in self._known_roles:
                    raise Unauthenticated(
                        f"role {role!r} is not defined by the RBAC policy",
                        hint="ask a platform-admin for a token with roles the policy defines",
                    )
        return Principal(
            subject=subject,
            roles=tuple(roles),
            token_id=jti,
            expires_at=dt.datetime.fromtimestamp(exp, dt.UTC),
            kind=kind,
        )


def _check_self_signed(kid: str, claims: dict[str, Any]) -> None:
    """A token signed by a service's own key proves that service and nothing more: its subject
    is the service (``svc-<name>`` signs for ``<name>``), its kind ``service``, its one role
    ``service`` (what the service may do comes from the policy's bindings). So no service
    needs the platform's token-signing key, and one cannot vouch for another."""
    name = kid[len(SERVICE_KID_PREFIX) :]
    if claims.get("sub") != name or claims.get("kind") != "service":
        raise Unauthenticated(
            f"a token signed by service key {kid} may only name service {name!r}, not "
            f"{claims.get('sub')!r} ({claims.get('kind')!r})"
        )
    if claims.get("roles") != ["service"]:
        raise Unauthenticated(
            f"a token signed by service key {kid} may only claim the role 'service'",
            hint="what a service may do comes from the RBAC policy's bindings",
        )


def _int_claim(claims: dict[str, Any], name: str) -> int:
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_EPOCH_S:
        raise Unauthenticated(f"token claim {name!r} must be an integer (seconds since the epoch)")
    return value


def _iso(epoch_s: int) -> str:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).isoformat().replace("+00:00", "Z")


class ServiceToken:
    """A service's own token: the configured one, else one it signs (and renews before it
    expires) with the key ``issuer`` loads — its own service key (``svc-<name>``), which
    verifiers given a ``service_trust`` accept for that service alone."""

    def __init__(
        self,
        name: str,
        issuer: Callable[[], SigningKey],
        *,
        configured: str = "",
        ttl: dt.timedelta = dt.timedelta(hours=12),
    ) -> None:
        self._name = name
        self._issuer = issuer
        self._ttl = ttl
        self._token = configured
        self._expires = float("inf") if configured else 0.0

    def get(self) -> str:
        """A token valid for at least ten more minutes."""
        if self._token and time.time() < self._expires - 600:
            return self._token
        self._token = TokenIssuer(self._issuer()).issue(
            self._name, ["service"], self._ttl, kind="service"
        )
        self._expires = time.time() + self._ttl.total_seconds()
        return self._token


__all__ = [
    "ALGORITHM",
    "DEFAULT_ISSUER",
    "MAX_TTL",
    "ServiceToken",
    "TokenIssuer",
    "TokenVerifier",
    "parse_ttl",
]
