"""The gate: inference calls need a token that verifies and a role that may ``infer`` (or
``read``) the model; callers without a token pass only when both the service and the
deployment allow it. Decisions are remembered per (token, deployment, action) for the TTL —
never past the token's expiry — and recorded as authz.decision events when taken, not on
every request."""

from __future__ import annotations

import datetime as dt

import pytest

from gantry.core import ManualClock
from gantry.security import (
    ANONYMOUS,
    Authorizer,
    MemoryDecisionSink,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    default_policy,
)
from gantry.serving import gate as gate_module
from gantry.serving.errors import Forbidden, NotAuthenticated
from gantry.serving.gate import SERVICE_NAME, Gate

START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


class FakeTime:
    """Stands in for the ``time`` module the gate reads: a monotonic and a wall clock that
    move together with the token verifier's clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.mono = 1000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.clock.now().timestamp()

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.clock.advance(seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def fake_time(clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime(clock)
    monkeypatch.setattr(gate_module, "time", fake)
    return fake


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate("serving-test")


@pytest.fixture
def issuer(key: SigningKey, clock: ManualClock) -> TokenIssuer:
    return TokenIssuer(key, clock)


@pytest.fixture
def sink() -> MemoryDecisionSink:
    return MemoryDecisionSink()


def make_gate(
    key: SigningKey,
    clock: ManualClock,
    sink: MemoryDecisionSink,
    *,
    allow_anonymous: bool = False,
    ttl_s: float = 60.0,
) -> Gate:
    policy = default_policy()
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}), clock, known_roles=policy.roles
    )
    return Gate(verifier, Authorizer(policy), sink, allow_anonymous=allow_anonymous, ttl_s=ttl_s)


@pytest.fixture
def gate(
    key: SigningKey, clock: ManualClock, sink: MemoryDecisionSink, fake_time: FakeTime
) -> Gate:
    return make_gate(key, clock, sink)


def test_a_consumer_may_infer_and_the_decision_is_recorded(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink
) -> None:
    token = issuer.issue("app-1", ["model-consumer"], HOUR, kind="service")
    assert gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer") == "app-1"
    (decision,) = sink.decisions
    assert decision.principal == "app-1"
    assert decision.roles == ["model-consumer"]
    assert (decision.action, decision.resource_kind, decision.resource_name) == (
        "infer",
        "model",
        "scorer",
    )
    assert decision.decision == "allow"
    assert decision.service == SERVICE_NAME == "serving"
    assert decision.method == "ModelInfer"
    assert sink.actors == ["app-1"]


def test_decisions_are_remembered_per_token_deployment_and_action(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink, fake_time: FakeTime
) -> None:
    token = issuer.issue("dev", ["ml-developer"], HOUR)
    for _ in range(50):
        gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert len(sink.decisions) == 1
    gate.check(token, "scorer", "read", anonymous_ok=False, method="Read")
    gate.check(token, "ranker", "infer", anonymous_ok=False, method="ModelInfer")
    other = issuer.issue("app-2", ["model-consumer"], HOUR)
    assert gate.check(other, "scorer", "infer", anonymous_ok=False, method="ModelInfer") == "app-2"
    assert [(d.principal, d.resource_name, d.action) for d in sink.decisions] == [
        ("dev", "scorer", "infer"),
        ("dev", "scorer", "read"),
        ("dev", "ranker", "infer"),
        ("app-2", "scorer", "infer"),
    ]
    # within the TTL nothing more is recorded; after it, the decision is taken again
    fake_time.advance(59)
    gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert len(sink.decisions) == 4
    fake_time.advance(2)
    gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert len(sink.decisions) == 5
    assert sink.decisions[-1].decision == "allow"


def test_a_remembered_decision_never_outlives_the_token(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink, fake_time: FakeTime
) -> None:
    token = issuer.issue("app-1", ["model-consumer"], dt.timedelta(seconds=30))
    gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    fake_time.advance(40)  # past the expiry (and the verifier's leeway), inside the gate's TTL
    with pytest.raises(NotAuthenticated, match="token expired") as info:
        gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert info.value.http_status == 401
    assert "Authorization: Bearer" in (info.value.hint or "")
    assert [d.decision for d in sink.decisions] == ["allow", "deny"]
    assert sink.decisions[-1].principal == ANONYMOUS


def test_a_role_without_the_action_is_forbidden_and_the_refusal_remembered(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink
) -> None:
    token = issuer.issue("bob", ["auditor"], HOUR)
    for _ in range(3):
        with pytest.raises(Forbidden, match="bob may not infer model 'scorer'") as info:
            gate.check(token, "scorer", "infer", anonymous_ok=True, method="ModelInfer")
        assert info.value.http_status == 403
        assert "model-consumer" in (info.value.hint or "")
    (decision,) = sink.decisions
    assert (decision.principal, decision.decision, decision.roles) == ("bob", "deny", ["auditor"])
    assert decision.reason


def test_read_and_infer_are_separate_rights(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink
) -> None:
    # a service account may read models (metadata, readiness) but not call them
    token = issuer.issue("svc", ["service"], HOUR, kind="service")
    assert gate.check(token, "scorer", "read", anonymous_ok=False, method="Read") == "svc"
    with pytest.raises(Forbidden):
        gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert [d.decision for d in sink.decisions] == ["allow", "deny"]


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("garbage", "malformed token"),
        ("a.b.c", "malformed token header"),
    ],
)
def test_a_token_that_does_not_verify_is_not_authenticated(
    gate: Gate, sink: MemoryDecisionSink, token: str, message: str
) -> None:
    with pytest.raises(NotAuthenticated, match=message):
        gate.check(token, "scorer", "infer", anonymous_ok=True, method="ModelInfer")
    (decision,) = sink.decisions
    assert (decision.principal, decision.decision) == (ANONYMOUS, "deny")
    assert message in decision.reason


def test_a_token_from_an_untrusted_key_is_refused(
    gate: Gate, clock: ManualClock, sink: MemoryDecisionSink
) -> None:
    stranger = TokenIssuer(SigningKey.generate("elsewhere"), clock)
    token = stranger.issue("mallory", ["platform-admin"], HOUR)
    with pytest.raises(NotAuthenticated, match="token refused"):
        gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert sink.decisions[-1].decision == "deny"


def test_a_bad_token_is_remembered_only_briefly(
    gate: Gate, sink: MemoryDecisionSink, fake_time: FakeTime
) -> None:
    for _ in range(5):
        with pytest.raises(NotAuthenticated):
            gate.check("garbage", "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert len(sink.decisions) == 1
    fake_time.advance(1.5)
    with pytest.raises(NotAuthenticated):
        gate.check("garbage", "scorer", "infer", anonymous_ok=False, method="ModelInfer")
    assert len(sink.decisions) == 2


@pytest.mark.parametrize(
    ("allow_anonymous", "anonymous_ok", "passes"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_no_token_passes_only_when_the_service_and_the_deployment_allow_it(
    key: SigningKey,
    clock: ManualClock,
    sink: MemoryDecisionSink,
    fake_time: FakeTime,
    allow_anonymous: bool,
    anonymous_ok: bool,
    passes: bool,
) -> None:
    gate = make_gate(key, clock, sink, allow_anonymous=allow_anonymous)
    if passes:
        assert gate.check(None, "scorer", "infer", anonymous_ok=anonymous_ok, method="M") == (
            ANONYMOUS
        )
        assert sink.decisions == []
        return
    with pytest.raises(NotAuthenticated, match="model 'scorer' needs a token for infer") as info:
        gate.check(None, "scorer", "infer", anonymous_ok=anonymous_ok, method="M")
    assert "gantry admin token create" in (info.value.hint or "")
    (decision,) = sink.decisions
    assert (decision.principal, decision.decision, decision.reason) == (
        ANONYMOUS,
        "deny",
        "no token",
    )
    assert decision.roles == []


def test_a_token_sent_to_an_anonymous_deployment_is_still_checked(
    key: SigningKey, clock: ManualClock, sink: MemoryDecisionSink, fake_time: FakeTime,
    issuer: TokenIssuer,
) -> None:  # fmt: skip
    gate = make_gate(key, clock, sink, allow_anonymous=True)
    token = issuer.issue("dev", ["ml-developer"], HOUR)
    assert gate.check(token, "scorer", "infer", anonymous_ok=True, method="M") == "dev"
    with pytest.raises(NotAuthenticated):
        gate.check("garbage", "scorer", "infer", anonymous_ok=True, method="M")


def test_the_cache_stays_bounded(
    gate: Gate, issuer: TokenIssuer, sink: MemoryDecisionSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "_MAX_CACHED", 5)
    token = issuer.issue("app-1", ["model-consumer"], HOUR)
    for i in range(12):
        gate.check(token, f"model-{i}", "infer", anonymous_ok=False, method="M")
        assert len(gate._cache) <= 5
    assert len(sink.decisions) == 12
    # still correct after the cache was cleared: a forgotten decision is simply taken again
    gate.check(token, "model-0", "infer", anonymous_ok=False, method="M")
    assert sink.decisions[-1].resource_name == "model-0"


def test_refused_calls_without_a_token_are_recorded_once_per_window(
    key: SigningKey, clock: ManualClock, sink: MemoryDecisionSink, fake_time: FakeTime
) -> None:
    gate = make_gate(key, clock, sink, ttl_s=60.0)
    for _ in range(50):  # a client hammering without a token does not flood the audit log
        with pytest.raises(NotAuthenticated):
            gate.check(None, "scorer", "infer", anonymous_ok=False, method="M")
    assert len(sink.decisions) == 1
    with pytest.raises(NotAuthenticated):
        gate.check(None, "ranker", "infer", anonymous_ok=False, method="M")
    assert len(sink.decisions) == 2  # another deployment: its own record
    fake_time.advance(61.0)
    with pytest.raises(NotAuthenticated):
        gate.check(None, "scorer", "infer", anonymous_ok=False, method="M")
    assert len(sink.decisions) == 3  # a new window: recorded again


def test_a_revoked_token_is_refused_at_once_despite_the_remembered_decision(
    key: SigningKey,
    clock: ManualClock,
    sink: MemoryDecisionSink,
    issuer: TokenIssuer,
    fake_time: FakeTime,
) -> None:
    from gantry.security.revocations import Revocation, RevocationList

    gate = make_gate(key, clock, sink)
    revocations = RevocationList(clock)
    gate._verifier.revocations = revocations
    token = issuer.issue("app-1", ["model-consumer"], HOUR, kind="service")
    assert gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer") == "app-1"
    jti = gate._verifier.verify(token).token_id
    revocations.add(Revocation(jti, int((START + HOUR).timestamp() * 1000), reason="leaked"))
    fake_time.advance(1)  # well inside the 60 s the allow is remembered for
    with pytest.raises(NotAuthenticated, match="revoked: leaked"):
        gate.check(token, "scorer", "infer", anonymous_ok=False, method="ModelInfer")
