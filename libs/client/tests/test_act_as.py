"""``act_as``: a service client calling on behalf of a user, against the real auth interceptor."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gantry.client._rpc import RpcClient
from gantry.client.governance import DataClient, GovernanceClient
from gantry.client.model_registry import ModelsClient
from gantry.client.profiler import ProfilerClient
from gantry.client.scheduler import SchedulerClient
from gantry.client.serving import ServingClient
from gantry.core import InvalidInput
from gantry.security import (
    AuthInterceptor,
    Authorizer,
    MemoryDecisionSink,
    MethodRule,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    current_principal,
    default_policy,
)
from gantry.security.interceptor import ACT_AS_METADATA, ACT_AS_ROLES_METADATA

WHO, WATCH = "/test.Who/Who", "/test.Who/Watch"
ACT_AS = ("alice", ["ml-developer", "annotator"])


class WhoClient(RpcClient):
    service = "who"

    def __init__(self, address: str, token: str, **kw: Any) -> None:
        super().__init__(address, token, timeout_s=10, **kw)
        self._stub = type("Stub", (), {"Who": self._channel.unary_unary(WHO)})()

    def who(self) -> str:
        return bytes(self._call("Who", b"")).decode()

    def watch(self) -> list[str]:  # a server stream, sent the way the service clients send one
        stream = self._channel.unary_stream(WATCH)(b"", metadata=self._metadata, timeout=10)
        return [bytes(reply).decode() for reply in stream]


def _who() -> bytes:
    p = current_principal()
    return f"{p.subject} {','.join(p.roles)} via={p.via}".encode()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, str, MemoryDecisionSink]]:
    """(address, a workflows service token, the decisions) of a server with the shipped policy."""
    key = SigningKey.generate("test-issuer")
    policy = default_policy()
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}), known_roles=policy.roles
    )
    sink = MemoryDecisionSink()
    rules = {WHO: MethodRule("create", "job"), WATCH: MethodRule("read", "job")}
    aio = grpc.aio.server(
        interceptors=[AuthInterceptor(verifier, Authorizer(policy), rules, sink, "t")]
    )

    async def who(request: bytes, context: Any) -> bytes:
        return _who()

    async def watch(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield _who()

    aio.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Who",
                {
                    "Who": grpc.unary_unary_rpc_method_handler(who),
                    "Watch": grpc.unary_stream_rpc_method_handler(watch),
                },
            ),
        )
    )
    port = aio.add_insecure_port("127.0.0.1:0")
    await aio.start()
    token = TokenIssuer(key).issue("workflows", ["service"], dt.timedelta(hours=1), kind="service")
    try:
        yield f"127.0.0.1:{port}", token, sink
    finally:
        await aio.stop(None)


async def test_act_as_reaches_the_server_on_unary_and_streaming_calls(
    server: tuple[str, str, MemoryDecisionSink],
) -> None:
    address, token, sink = server
    with WhoClient(address, token, act_as=ACT_AS) as client:
        # the client is synchronous: run it off the loop that serves the calls
        assert await asyncio.to_thread(client.who) == "alice ml-developer,annotator via=workflows"
        assert await asyncio.to_thread(client.watch) == [
            "alice ml-developer,annotator via=workflows"
        ]
    assert [(d.principal, d.action, d.via) for d in sink.decisions] == [
        ("workflows", "impersonate", ""),
        ("alice", "create", "workflows"),
        ("workflows", "impersonate", ""),
        ("alice", "read", "workflows"),
    ]


async def test_without_act_as_the_client_calls_as_itself(
    server: tuple[str, str, MemoryDecisionSink],
) -> None:
    address, token, sink = server
    with WhoClient(address, token) as client:
        assert await asyncio.to_thread(client.watch) == ["workflows service via="]
    assert [(d.principal, d.action) for d in sink.decisions] == [("workflows", "read")]


@pytest.mark.parametrize(
    "cls",
    [SchedulerClient, ServingClient, ProfilerClient, GovernanceClient, DataClient, ModelsClient],
)
def test_every_service_client_passes_act_as_on(cls: Any) -> None:
    with cls("127.0.0.1:1", "t", act_as=ACT_AS) as client:
        assert client._metadata == (
            ("authorization", "Bearer t"),
            (ACT_AS_METADATA, "alice"),
            (ACT_AS_ROLES_METADATA, "ml-developer,annotator"),
        )
    with cls("127.0.0.1:1", "t") as client:
        assert client._metadata == (("authorization", "Bearer t"),)


def test_an_empty_role_list_is_sent_as_an_empty_value() -> None:
    with SchedulerClient("127.0.0.1:1", "t", act_as=("bob", [])) as client:
        assert client._metadata[-1] == (ACT_AS_ROLES_METADATA, "")


@pytest.mark.parametrize(
    ("act_as", "message"),
    [
        (("alice", "ml-developer"), "must be a list of role names, got the string"),
        (("", ["ml-developer"]), "names the subject to act as"),
        (("al ice", ["ml-developer"]), "names the subject to act as"),
        (("alice", ["a,b"]), "without ',' or spaces"),
        (("alice", [""]), "without ',' or spaces"),
    ],
)
def test_a_malformed_act_as_is_refused_before_any_call(act_as: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        SchedulerClient("127.0.0.1:1", "t", act_as=act_as)
