"""Identity tokens: issue, verify, and every way a token is refused."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import jwt
import pytest

from gantry.core import InvalidInput, ManualClock, Unauthenticated, is_uuid
from gantry.security import (
    MAX_TTL,
    Principal,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    parse_ttl,
)

START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
ROLES = frozenset({"ml-developer", "auditor"})


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate("issuer-1")


@pytest.fixture
def issuer(key: SigningKey, clock: ManualClock) -> TokenIssuer:
    return TokenIssuer(key, clock)


@pytest.fixture
def verifier(key: SigningKey, clock: ManualClock) -> TokenVerifier:
    trust = TrustStore({key.kid: key.public_key_bytes()})
    return TokenVerifier(trust, clock, known_roles=ROLES)


def _segments(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    header, payload, signature = token.split(".")
    return json.loads(_b64d(header)), json.loads(_b64d(payload)), signature


def _b64d(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(key: SigningKey, claims: dict[str, Any], headers: dict[str, Any] | None = None) -> str:
    return jwt.encode(claims, key.private_key, algorithm="EdDSA", headers=headers)


def test_round_trip(issuer: TokenIssuer, verifier: TokenVerifier) -> None:
    token = issuer.issue("alice", ["ml-developer"], dt.timedelta(hours=12))
    principal = verifier.verify(token)
    assert isinstance(principal, Principal)
    assert principal.subject == "alice"
    assert principal.roles == ("ml-developer",)
    assert principal.kind == "user"
    assert principal.expires_at == START + dt.timedelta(hours=12)
    assert is_uuid(principal.token_id)
    assert verifier.verify(token) == principal  # second call (cached signature) agrees


def test_token_claims_and_header(issuer: TokenIssuer) -> None:
    token = issuer.issue("svc-audit", ["auditor", "auditor"], parse_ttl("15m"), kind="service")
    header, claims, _ = _segments(token)
    assert header["alg"] == "EdDSA"
    assert header["kid"] == "issuer-1"
    now = int(START.timestamp())
    assert claims["sub"] == "svc-audit"
    assert claims["roles"] == ["auditor"]
    assert claims["iss"] == "gantry"
    assert claims["kind"] == "service"
    assert (claims["iat"], claims["nbf"], claims["exp"]) == (now, now, now + 900)
    assert is_uuid(claims["jti"])


def test_each_token_gets_its_own_id(issuer: TokenIssuer, verifier: TokenVerifier) -> None:
    one = verifier.verify(issuer.issue("a", ["auditor"], dt.timedelta(minutes=1)))
    two = verifier.verify(issuer.issue("a", ["auditor"], dt.timedelta(minutes=1)))
    assert one.token_id != two.token_id


@pytest.mark.parametrize(
    ("subject", "roles", "ttl", "message"),
    [
        ("", ["auditor"], dt.timedelta(hours=1), "needs a subject"),
        ("alice", [], dt.timedelta(hours=1), "at least one role"),
        ("alice", "auditor", dt.timedelta(hours=1), "list of role names"),
        ("alice", ["auditor"], dt.timedelta(0), "must be positive"),
        ("alice", ["auditor"], dt.timedelta(seconds=-5), "must be positive"),
        ("alice", ["auditor"], MAX_TTL + dt.timedelta(seconds=1), "30-day maximum"),
    ],
)
def test_issue_validates_its_input(
    issuer: TokenIssuer, subject: str, roles: Any, ttl: dt.timedelta, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        issuer.issue(subject, roles, ttl)
    assert info.value.hint  # says what to pass instead


def test_thirty_days_is_allowed(issuer: TokenIssuer, verifier: TokenVerifier) -> None:
    principal = verifier.verify(issuer.issue("alice", ["auditor"], MAX_TTL))
    assert principal.expires_at == START + MAX_TTL


def test_expired_token_is_refused_with_its_expiry_time(
    issuer: TokenIssuer, verifier: TokenVerifier, clock: ManualClock
) -> None:
    token = issuer.issue("alice", ["ml-developer"], dt.timedelta(minutes=10))
    verifier.verify(token)  # valid now (and cached: the cache must not skip the expiry check)
    clock.advance(600 + 4)  # inside the 5 s leeway
    verifier.verify(token)
    clock.advance(2)
    with pytest.raises(Unauthenticated) as info:
        verifier.verify(token)
    assert str(info.value) == (
        "token expired at 2026-03-01T12:10:00Z; create a new one with `gantry admin token create`"
    )


def test_token_from_the_future_is_not_yet_valid(
    key: SigningKey, issuer: TokenIssuer, verifier: TokenVerifier, clock: ManualClock
) -> None:
    clock.advance(3600)
    token = issuer.issue("alice", ["auditor"], dt.timedelta(hours=2))
    clock.advance(-3600)
    with pytest.raises(Unauthenticated, match="not valid before 2026-03-01T13:00:00Z"):
        verifier.verify(token)


def test_token_signed_by_an_untrusted_key_names_the_unknown_kid(
    verifier: TokenVerifier, clock: ManualClock
) -> None:
    stranger = SigningKey.generate("stranger")
    token = TokenIssuer(stranger, clock).issue("mallory", ["auditor"], dt.timedelta(hours=1))
    with pytest.raises(Unauthenticated, match="unknown key id 'stranger'"):
        verifier.verify(token)


def test_token_with_a_known_kid_but_another_key_has_a_bad_signature(
    key: SigningKey, verifier: TokenVerifier, clock: ManualClock
) -> None:
    impostor = SigningKey(SigningKey.generate().private_key, kid=key.kid)
    token = TokenIssuer(impostor, clock).issue("mallory", ["auditor"], dt.timedelta(hours=1))
    with pytest.raises(Unauthenticated, match="bad signature"):
        verifier.verify(token)


def test_tampered_claims_have_a_bad_signature(issuer: TokenIssuer, verifier: TokenVerifier) -> None:
    token = issuer.issue("alice", ["ml-developer"], dt.timedelta(hours=1))
    header, payload, signature = token.split(".")
    claims = json.loads(_b64d(payload))
    claims["roles"] = ["auditor"]  # privilege escalation attempt
    forged = ".".join([header, _b64e(json.dumps(claims).encode()), signature])
    with pytest.raises(Unauthenticated, match="bad signature"):
        verifier.verify(forged)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "malformed token"),
        ("not-a-token", "malformed token"),
        ("a.b", "malformed token"),
        ("a.b.c.d", "malformed token"),
        ("a.b.c", "malformed token header"),
        ("é.b.c", "malformed token"),
    ],
)
def test_malformed_strings_are_refused(verifier: TokenVerifier, token: str, message: str) -> None:
    with pytest.raises(Unauthenticated, match=message):
        verifier.verify(token)


def test_token_without_kid_is_refused(key: SigningKey, verifier: TokenVerifier) -> None:
    token = _signed(key, {"sub": "alice"})
    assert "kid" not in _segments(token)[0]
    with pytest.raises(Unauthenticated, match="no key id"):
        verifier.verify(token)


def test_other_algorithms_are_refused(verifier: TokenVerifier) -> None:
    token = jwt.encode({"sub": "alice"}, "a-shared-secret-of-32-bytes-len!", "HS256", {"kid": "x"})
    with pytest.raises(Unauthenticated, match="'HS256' is not accepted"):
        verifier.verify(token)


def test_missing_claims_are_named(key: SigningKey, verifier: TokenVerifier) -> None:
    token = _signed(key, {"sub": "alice", "roles": ["auditor"]}, {"kid": key.kid})
    with pytest.raises(Unauthenticated, match="missing claims: exp, iat, nbf, jti, iss, kind"):
        verifier.verify(token)


def test_malformed_claims_are_refused(key: SigningKey, verifier: TokenVerifier) -> None:
    now = int(START.timestamp())
    claims = {
        "sub": "alice",
        "roles": "auditor",
        "exp": now + 60,
        "iat": now,
        "nbf": now,
        "jti": "j",
        "iss": "gantry",
        "kind": "user",
    }
    with pytest.raises(Unauthenticated, match="'roles' must be a non-empty list"):
        verifier.verify(_signed(key, claims, {"kid": key.kid}))
    with pytest.raises(Unauthenticated, match="'exp' must be an integer"):
        verifier.verify(
            _signed(key, {**claims, "roles": ["auditor"], "exp": "soon"}, {"kid": key.kid})
        )
    with pytest.raises(Unauthenticated, match="issued by 'elsewhere'"):
        verifier.verify(
            _signed(key, {**claims, "roles": ["auditor"], "iss": "elsewhere"}, {"kid": key.kid})
        )


def test_unknown_role_is_refused(issuer: TokenIssuer, verifier: TokenVerifier) -> None:
    token = issuer.issue("alice", ["ml-developer", "wizard"], dt.timedelta(hours=1))
    with pytest.raises(Unauthenticated, match="role 'wizard' is not defined by the RBAC policy"):
        verifier.verify(token)


def test_any_role_is_accepted_without_known_roles(key: SigningKey, issuer: TokenIssuer) -> None:
    verifier = TokenVerifier(TrustStore({key.kid: key.public_key_bytes()}), ManualClock(START))
    token = issuer.issue("alice", ["wizard"], dt.timedelta(hours=1))
    assert verifier.verify(token).roles == ("wizard",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", dt.timedelta(seconds=30)),
        ("15m", dt.timedelta(minutes=15)),
        ("12h", dt.timedelta(hours=12)),
        ("7d", dt.timedelta(days=7)),
        (" 1h ", dt.timedelta(hours=1)),
    ],
)
def test_parse_ttl(text: str, expected: dt.timedelta) -> None:
    assert parse_ttl(text) == expected


@pytest.mark.parametrize("text", ["", "12", "h", "1.5h", "-1h", "0s", "2w", "1 hour"])
def test_parse_ttl_refuses_other_forms(text: str) -> None:
    with pytest.raises(InvalidInput, match="invalid duration") as info:
        parse_ttl(text)
    assert "30s, 15m, 12h, 7d" in str(info.value)


# ---------------------------------------------------------------------- self-signed services


@pytest.fixture
def service_verifier(key: SigningKey, clock: ManualClock) -> tuple[TokenVerifier, SigningKey]:
    agent_key = SigningKey.generate("svc-training-agent")
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}),
        clock,
        service_trust=TrustStore({agent_key.kid: agent_key.public_key_bytes()}),
    )
    return verifier, agent_key


def test_a_service_signs_its_own_token_with_its_own_key(
    service_verifier: tuple[TokenVerifier, SigningKey], clock: ManualClock
) -> None:
    verifier, agent_key = service_verifier
    token = TokenIssuer(agent_key, clock).issue(
        "training-agent", ["service"], dt.timedelta(hours=1), kind="service"
    )
    principal = verifier.verify(token)
    assert principal.subject == "training-agent" and principal.kind == "service"


@pytest.mark.parametrize(
    ("subject", "roles", "kind", "message"),
    [
        ("scheduler", ["service"], "service", "may only name service 'training-agent'"),
        ("admin", ["service"], "user", "may only name service"),
        ("training-agent", ["platform-admin"], "service", "may only claim the role 'service'"),
        ("training-agent", ["service", "auditor"], "service", "may only claim the role"),
    ],
)
def test_a_service_key_cannot_vouch_for_anyone_else(
    service_verifier: tuple[TokenVerifier, SigningKey],
    clock: ManualClock,
    subject: str,
    roles: list[str],
    kind: Any,
    message: str,
) -> None:
    verifier, agent_key = service_verifier
    token = TokenIssuer(agent_key, clock).issue(subject, roles, dt.timedelta(hours=1), kind=kind)
    with pytest.raises(Unauthenticated, match=message):
        verifier.verify(token)


def test_service_keys_are_not_token_issuers_without_service_trust(
    key: SigningKey, clock: ManualClock
) -> None:
    agent_key = SigningKey.generate("svc-training-agent")
    verifier = TokenVerifier(TrustStore({key.kid: key.public_key_bytes()}), clock)
    token = TokenIssuer(agent_key, clock).issue(
        "training-agent", ["service"], dt.timedelta(hours=1), kind="service"
    )
    with pytest.raises(Unauthenticated):
        verifier.verify(token)
