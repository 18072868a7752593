"""A service acting on behalf of a user (x-gantry-act-as), on a real grpc.aio server.

The server runs the shipped policy, so the ``workflows`` binding to ``orchestrator`` is the
one Gantry deploys with.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import jwt
import pytest

from gantry.core import ManualClock
from gantry.events.catalog import AuthzDecision
from gantry.security import (
    AuthInterceptor,
    Authorizer,
    MemoryDecisionSink,
    MethodRule,
    PrincipalKind,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    current_principal,
    default_policy,
)
from gantry.security.interceptor import ACT_AS_METADATA, ACT_AS_ROLES_METADATA

NOW = dt.datetime(2026, 6, 1, 9, 0, tzinfo=dt.UTC)
SUBMIT, SET_QUOTA, WATCH = "/test.Jobs/Submit", "/test.Jobs/SetQuota", "/test.Jobs/Watch"
RULES = {
    SUBMIT: MethodRule("create", "job"),  # ml-developer may
    SET_QUOTA: MethodRule("update", "queue"),  # platform-admin only
    WATCH: MethodRule("read", "job"),  # ml-developer and the service role may
}


@dataclass
class Env:
    port: int
    sink: MemoryDecisionSink
    issuer: TokenIssuer
    clock: ManualClock
    seen: list[dict[str, Any]] = field(default_factory=list)

    def token(self, subject: str, *roles: str, kind: PrincipalKind = "user") -> str:
        return self.issuer.issue(subject, list(roles), dt.timedelta(hours=1), kind=kind)

    def service_token(self, subject: str = "workflows") -> str:
        return self.token(subject, "service", kind="service")


def _seen() -> dict[str, Any]:
    p = current_principal()
    return {
        "subject": p.subject,
        "roles": list(p.roles),
        "kind": p.kind,
        "via": p.via,
        "token_id": p.token_id,
        "expires_at": p.expires_at.isoformat(),
    }


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    key = SigningKey.generate("test-issuer")
    clock = ManualClock(NOW)
    policy = default_policy()
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}), clock, known_roles=policy.roles
    )
    sink = MemoryDecisionSink()
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(verifier, Authorizer(policy), RULES, sink, "test-svc")]
    )
    seen: list[dict[str, Any]] = []

    async def unary(request: bytes, context: Any) -> bytes:
        seen.append(_seen())
        return json.dumps(seen[-1]).encode()

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        seen.append(_seen())
        yield json.dumps(seen[-1]).encode()

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Jobs",
                {
                    "Submit": grpc.unary_unary_rpc_method_handler(unary),
                    "SetQuota": grpc.unary_unary_rpc_method_handler(unary),
                    "Watch": grpc.unary_stream_rpc_method_handler(stream),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Env(port, sink, TokenIssuer(key, clock), clock, seen)
    finally:
        await server.stop(None)


def _metadata(token: str, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), *extra)


def _act_as(subject: str, roles: str) -> tuple[tuple[str, str], ...]:
    return ((ACT_AS_METADATA, subject), (ACT_AS_ROLES_METADATA, roles))


async def _call(env: Env, method: str, metadata: tuple[tuple[str, str], ...]) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{env.port}") as channel:
        if method == WATCH:
            return [
                json.loads(r)
                async for r in channel.unary_stream(method)(b"", metadata=metadata, timeout=10)
            ]
        return json.loads(await channel.unary_unary(method)(b"", metadata=metadata, timeout=10))


async def _refused(
    env: Env, method: str, metadata: tuple[tuple[str, str], ...]
) -> grpc.aio.AioRpcError:
    handled = len(env.seen)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(env, method, metadata)
    assert len(env.seen) == handled  # the handler never ran
    return info.value


PEER = "127.0.0.1"


def _impersonation(
    decision: Literal["allow", "deny"],
    reason: str,
    *,
    caller: str = "workflows",
    target: str = "alice",
) -> AuthzDecision:
    roles = ["service", "orchestrator"] if caller == "workflows" else ["service"]
    return AuthzDecision(
        principal=caller,
        roles=roles,
        action="impersonate",
        resource_kind="principal",
        resource_name=target,
        decision=decision,
        reason=reason,
        service="test-svc",
        method=SUBMIT,
        address=PEER,  # the caller's address, as the server saw it
    )


async def test_the_workflows_service_acts_as_the_pipeline_owner(env: Env) -> None:
    token = env.service_token()
    reply = await _call(env, SUBMIT, _metadata(token, *_act_as("alice", "ml-developer")))
    assert reply == {  # the service token's id and expiry are kept
        "subject": "alice",
        "roles": ["ml-developer"],
        "kind": "user",
        "via": "workflows",
        "token_id": jwt.decode(token, options={"verify_signature": False})["jti"],
        "expires_at": (NOW + dt.timedelta(hours=1)).isoformat(),
    }
    assert env.sink.decisions == [
        _impersonation("allow", "allowed by role orchestrator"),
        AuthzDecision(
            principal="alice",
            roles=["ml-developer"],
            action="create",
            resource_kind="job",
            decision="allow",
            reason="allowed by role ml-developer",
            service="test-svc",
            method=SUBMIT,
            via="workflows",
            address=PEER,
        ),
    ]
    assert env.sink.actors == ["workflows", "alice"]


async def test_the_call_is_decided_for_the_user_not_the_service(env: Env) -> None:
    act = _act_as("alice", "ml-developer")
    error = await _refused(env, SET_QUOTA, _metadata(env.service_token(), *act))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    details = error.details() or ""
    assert "'alice' may not update queue" in details
    assert "workflows called on behalf of 'alice'" in details
    allow, deny = env.sink.decisions
    assert (allow.action, allow.decision, allow.resource_name) == ("impersonate", "allow", "alice")
    assert (deny.principal, deny.via, deny.decision) == ("alice", "workflows", "deny")
    assert (deny.action, deny.resource_kind, deny.method) == ("update", "queue", SET_QUOTA)
    assert deny.reason == "no role of 'alice' (ml-developer) allows update on queue"


async def test_the_service_lends_none_of_its_own_rights(env: Env) -> None:
    # the service role may read jobs, a user acting with no roles may not
    error = await _refused(env, WATCH, _metadata(env.service_token(), *_act_as("bob", "")))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    deny = env.sink.decisions[-1]
    assert (deny.principal, deny.roles, deny.via) == ("bob", [], "workflows")
    assert deny.reason == "no role of 'bob' (none) allows read on job"


async def test_streaming_calls_act_as_the_user_too(env: Env) -> None:
    metadata = _metadata(env.service_token(), *_act_as("alice", " ml-developer , annotator"))
    [reply] = await _call(env, WATCH, metadata)
    assert (reply["subject"], reply["via"]) == ("alice", "workflows")
    assert reply["roles"] == ["ml-developer", "annotator"]
    assert env.sink.decisions[-1].via == "workflows"


async def test_a_service_without_the_binding_is_refused(env: Env) -> None:
    token = env.service_token("ci-runner")
    error = await _refused(env, SUBMIT, _metadata(token, *_act_as("alice", "ml-developer")))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    reason = "no role of 'ci-runner' (service) allows impersonate on principal"
    assert f"'ci-runner' may not impersonate principal 'alice': {reason}" in (error.details() or "")
    assert env.sink.decisions == [_impersonation("deny", reason, caller="ci-runner")]


@pytest.mark.parametrize("roles", [("ml-developer",), ("platform-admin",)])
async def test_a_user_token_may_not_act_as_anyone(env: Env, roles: tuple[str, ...]) -> None:
    metadata = _metadata(env.token("workflows", *roles), *_act_as("alice", "ml-developer"))
    error = await _refused(env, SUBMIT, metadata)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only a service may act on behalf of another principal" in (error.details() or "")
    [decision] = env.sink.decisions
    assert (decision.principal, decision.action, decision.decision) == (
        "workflows",
        "impersonate",
        "deny",
    )


async def test_a_role_the_policy_does_not_know_is_refused(env: Env) -> None:
    metadata = _metadata(env.service_token(), *_act_as("alice", "ml-developer,root"))
    error = await _refused(env, SUBMIT, metadata)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "names role(s) the RBAC policy does not define: 'root'" in (error.details() or "")
    [decision] = env.sink.decisions
    assert (decision.action, decision.decision, decision.resource_name) == (
        "impersonate",
        "deny",
        "alice",
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ((ACT_AS_METADATA, "alice"),),
            "'x-gantry-act-as' was sent without 'x-gantry-act-as-roles'",
        ),
        (((ACT_AS_ROLES_METADATA, "ml-developer"),), "'x-gantry-act-as-roles' was sent without"),
        (
            (*_act_as("alice", "ml-developer"), (ACT_AS_METADATA, "bob")),
            "more than one 'x-gantry-act-as'",
        ),
        (_act_as("", "ml-developer"), "must name a subject"),
        (_act_as("al ice", "ml-developer"), "must name a subject"),
    ],
)
async def test_malformed_act_as_metadata_is_refused(
    env: Env, extra: tuple[tuple[str, str], ...], message: str
) -> None:
    error = await _refused(env, SUBMIT, _metadata(env.service_token(), *extra))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in (error.details() or "")
    [decision] = env.sink.decisions
    assert (decision.principal, decision.action, decision.decision) == (
        "workflows",
        "impersonate",
        "deny",
    )


@pytest.mark.parametrize("target", ["scheduler", "workflows", "admin", "anonymous"])
async def test_reserved_identities_may_not_be_acted_as(env: Env, target: str) -> None:
    metadata = _metadata(env.service_token(), *_act_as(target, "platform-admin"))
    error = await _refused(env, SUBMIT, metadata)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"{target!r} is a reserved identity" in (error.details() or "")
    [decision] = env.sink.decisions
    assert (decision.resource_name, decision.decision) == (target, "deny")


async def test_a_bad_token_is_refused_before_any_impersonation(env: Env) -> None:
    error = await _refused(env, SUBMIT, _metadata("garbage", *_act_as("alice", "ml-developer")))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    [decision] = env.sink.decisions
    assert (decision.principal, decision.action, decision.via) == ("anonymous", "create", "")


async def test_without_the_metadata_nothing_changes(env: Env) -> None:
    token = env.token("alice", "ml-developer")
    reply = await _call(env, SUBMIT, _metadata(token))
    assert (reply["subject"], reply["kind"], reply["via"]) == ("alice", "user", "")
    assert env.sink.decisions == [
        AuthzDecision(
            principal="alice",
            roles=["ml-developer"],
            action="create",
            resource_kind="job",
            decision="allow",
            reason="allowed by role ml-developer",
            service="test-svc",
            method=SUBMIT,
            address=PEER,
        )
    ]
    # a service calling as itself keeps its own rights (the binding adds only impersonate)
    env.sink.clear()
    error = await _refused(env, SUBMIT, _metadata(env.service_token()))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    [decision] = env.sink.decisions
    assert decision.reason == "no role of 'workflows' (service, orchestrator) allows create on job"
    assert (decision.principal, decision.via) == ("workflows", "")
