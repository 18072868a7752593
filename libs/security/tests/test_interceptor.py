"""The auth interceptor end to end, on a real grpc.aio server with generic (bytes) handlers."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gantry.core import ManualClock, Unauthenticated
from gantry.security import (
    AuthInterceptor,
    Authorizer,
    MemoryDecisionSink,
    MethodRule,
    Policy,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    current_principal,
)
from gantry.security.interceptor import peer_address

NOW = dt.datetime(2026, 6, 1, 9, 0, tzinfo=dt.UTC)
POLICY = """
version: 1
roles:
  ml-developer:
    rules:
      - actions: [read, list, create, watch]
        resources: [job]
  auditor:
    rules:
      - actions: [query]
        resources: [audit_log]
  service:
    rules:
      - actions: [read]
        resources: [job]
bindings:
  svc-bound: [service]
"""
RULES = {
    "/test.Echo/Echo": MethodRule("read", "job"),
    "/test.Echo/Stream": MethodRule("list", "job"),
    "/test.Echo/Collect": MethodRule("create", "job"),
    "/test.Echo/Chat": MethodRule("watch", "job"),
    "/test.Echo/Strict": MethodRule("read", "job"),
}


@dataclass
class Env:
    port: int
    sink: MemoryDecisionSink
    issuer: TokenIssuer
    clock: ManualClock
    calls: list[str] = field(default_factory=list)

    def token(self, subject: str, *roles: str, ttl: dt.timedelta | None = None) -> str:
        return self.issuer.issue(subject, list(roles), ttl or dt.timedelta(hours=1))


def _strict(raw: bytes) -> bytes:
    """A request reader that refuses what it cannot parse."""
    if raw.startswith(b"bad"):
        raise ValueError("not a request")
    return raw


def _handlers(env_calls: list[str]) -> tuple[Any, Any]:
    async def echo(request: bytes, context: Any) -> bytes:
        env_calls.append("echo")
        return request + b" from " + current_principal().subject.encode()

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        env_calls.append("stream")
        for part in (request, current_principal().subject.encode()):
            yield part

    async def collect(requests: AsyncIterator[bytes], context: Any) -> bytes:
        env_calls.append("collect")
        parts = [part async for part in requests]
        return b"+".join(parts) + b" by " + current_principal().subject.encode()

    async def chat(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        env_calls.append("chat")
        async for part in requests:
            yield part.upper() + b"/" + ",".join(current_principal().roles).encode()

    async def health(request: bytes, context: Any) -> bytes:
        return b"SERVING"

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Unruled": grpc.unary_unary_rpc_method_handler(echo),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Collect": grpc.stream_unary_rpc_method_handler(collect),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Strict": grpc.unary_unary_rpc_method_handler(echo, request_deserializer=_strict),
        },
    ), grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(health)}
    )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    key = SigningKey.generate("test-issuer")
    clock = ManualClock(NOW)
    policy = Policy.from_yaml(POLICY)
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}), clock, known_roles=policy.roles
    )
    sink = MemoryDecisionSink()
    interceptor = AuthInterceptor(verifier, Authorizer(policy), RULES, sink, "test-svc")
    server = grpc.aio.server(interceptors=[interceptor])
    calls: list[str] = []
    server.add_generic_rpc_handlers(_handlers(calls))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Env(port, sink, TokenIssuer(key, clock), clock, calls)
    finally:
        await server.stop(None)


async def _call(env: Env, method: str, payload: Any, token: str | None, **kw: Any) -> Any:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    metadata = kw.pop("metadata", metadata)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{env.port}") as channel:
        kind = kw.pop("kind", "unary_unary")
        stub = getattr(channel, kind)(method)
        call = stub(payload, metadata=metadata, timeout=10)
        if kind.endswith("_stream"):
            return [item async for item in call]
        return await call


async def _refused(env: Env, method: str, token: str | None, **kw: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(env, method, b"hi", token, **kw)
    return info.value


async def test_allowed_call_runs_with_the_principal(env: Env) -> None:
    reply = await _call(env, "/test.Echo/Echo", b"hello", env.token("alice", "ml-developer"))
    assert reply == b"hello from alice"
    [decision] = env.sink.decisions
    assert decision.decision == "allow"
    assert decision.principal == "alice"
    assert decision.roles == ["ml-developer"]
    assert (decision.action, decision.resource_kind) == ("read", "job")
    assert decision.reason == "allowed by role ml-developer"
    assert (decision.service, decision.method) == ("test-svc", "/test.Echo/Echo")
    assert decision.address == "127.0.0.1"  # where the call came from
    assert env.sink.actors == ["alice"]
    with pytest.raises(Unauthenticated):
        current_principal()  # nothing leaks out of the call


async def test_a_request_that_cannot_be_read_is_still_recorded_once(env: Env) -> None:
    token = env.token("alice", "ml-developer")
    assert await _call(env, "/test.Echo/Strict", b"fine", token) == b"fine from alice"
    with pytest.raises(grpc.aio.AioRpcError):
        await _call(env, "/test.Echo/Strict", b"bad bytes", token)
    with pytest.raises(grpc.aio.AioRpcError):
        await _call(env, "/test.Echo/Strict", b"bad bytes", None)
    decisions = [(d.principal, d.decision, d.address) for d in env.sink.decisions]
    assert decisions == [
        ("alice", "allow", "127.0.0.1"),
        ("alice", "allow", ""),  # the handler never ran: recorded without the peer
        ("anonymous", "deny", ""),
    ]


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.1.7:51234", "10.0.1.7"),
        ("ipv6:[::1]:443", "::1"),
        ("unix:/run/gantry.sock", "unix:/run/gantry.sock"),
        ("", ""),
    ],
)
def test_peer_addresses(peer: str, address: str) -> None:
    assert peer_address(peer) == address


async def test_missing_token_is_unauthenticated(env: Env) -> None:
    error = await _refused(env, "/test.Echo/Echo", None)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no token" in (error.details() or "")
    assert env.calls == []
    [decision] = env.sink.decisions
    assert (decision.decision, decision.principal, decision.roles) == ("deny", "anonymous", [])
    assert (decision.action, decision.resource_kind) == ("read", "job")
    assert "no token" in decision.reason
    assert env.sink.actors == ["anonymous"]


@pytest.mark.parametrize("value", ["Basic YWxpY2U6cHc=", "Bearer", "token-without-scheme"])
async def test_malformed_authorization_is_unauthenticated(env: Env, value: str) -> None:
    error = await _refused(env, "/test.Echo/Echo", None, metadata=(("authorization", value),))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "must be 'Bearer <token>'" in (error.details() or "")
    assert env.sink.decisions[0].decision == "deny"


async def test_expired_token_is_unauthenticated(env: Env) -> None:
    token = env.token("alice", "ml-developer", ttl=dt.timedelta(minutes=5))
    env.clock.advance(3600)
    error = await _refused(env, "/test.Echo/Echo", token)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "token expired at 2026-06-01T09:05:00Z" in (error.details() or "")
    [decision] = env.sink.decisions
    assert (decision.decision, decision.principal) == ("deny", "anonymous")
    assert decision.reason.startswith("token expired at 2026-06-01T09:05:00Z")
    assert env.calls == []


async def test_garbage_token_is_unauthenticated(env: Env) -> None:
    error = await _refused(env, "/test.Echo/Echo", "garbage")
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "malformed token" in (error.details() or "")


async def test_role_without_permission_is_denied(env: Env) -> None:
    error = await _refused(env, "/test.Echo/Echo", env.token("eve", "auditor"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    details = error.details() or ""
    assert "'eve' may not read job" in details
    assert "no role of 'eve' (auditor) allows read on job" in details
    assert env.calls == []
    [decision] = env.sink.decisions
    assert (decision.decision, decision.principal, decision.roles) == ("deny", "eve", ["auditor"])
    assert decision.reason == "no role of 'eve' (auditor) allows read on job"


async def test_method_without_rule_is_denied(env: Env) -> None:
    error = await _refused(env, "/test.Echo/Unruled", env.token("alice", "ml-developer"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "has no authorization rule" in (error.details() or "")
    assert env.calls == []
    [decision] = env.sink.decisions
    assert decision.decision == "deny"
    assert decision.principal == "alice"
    assert decision.method == "/test.Echo/Unruled"
    assert decision.resource_name == "/test.Echo/Unruled"
    assert decision.reason == (
        "method /test.Echo/Unruled has no authorization rule, so it is denied by default"
    )


async def test_bindings_apply_and_are_recorded(env: Env) -> None:
    reply = await _call(env, "/test.Echo/Echo", b"x", env.token("svc-bound", "auditor"))
    assert reply == b"x from svc-bound"
    [decision] = env.sink.decisions
    assert decision.roles == ["auditor", "service"]
    assert decision.reason == "allowed by role service"


async def test_public_health_method_needs_no_token_and_is_not_recorded(env: Env) -> None:
    reply = await _call(env, "/grpc.health.v1.Health/Check", b"", None)
    assert reply == b"SERVING"
    assert env.sink.decisions == []


async def test_unary_stream(env: Env) -> None:
    token = env.token("alice", "ml-developer")
    parts = await _call(env, "/test.Echo/Stream", b"hi", token, kind="unary_stream")
    assert parts == [b"hi", b"alice"]
    error = await _refused(
        env, "/test.Echo/Stream", env.token("eve", "auditor"), kind="unary_stream"
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [d.decision for d in env.sink.decisions] == ["allow", "deny"]


def _requests(*parts: bytes) -> Iterable[bytes]:
    return iter(parts)


async def test_stream_unary(env: Env) -> None:
    token = env.token("alice", "ml-developer")
    reply = await _call(
        env, "/test.Echo/Collect", _requests(b"a", b"b"), token, kind="stream_unary"
    )
    assert reply == b"a+b by alice"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(env, "/test.Echo/Collect", _requests(b"a"), None, kind="stream_unary")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert [d.decision for d in env.sink.decisions] == ["allow", "deny"]
    assert env.calls == ["collect"]


async def test_stream_stream(env: Env) -> None:
    token = env.token("alice", "ml-developer")
    replies = await _call(
        env, "/test.Echo/Chat", _requests(b"a", b"b"), token, kind="stream_stream"
    )
    assert replies == [b"A/ml-developer", b"B/ml-developer"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(
            env,
            "/test.Echo/Chat",
            _requests(b"a"),
            env.token("eve", "auditor"),
            kind="stream_stream",
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [d.decision for d in env.sink.decisions] == ["allow", "deny"]
    assert env.calls == ["chat"]


def test_current_principal_outside_a_call_is_unauthenticated() -> None:
    with pytest.raises(Unauthenticated, match="no authenticated caller"):
        current_principal()
