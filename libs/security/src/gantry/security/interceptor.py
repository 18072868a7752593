"""The gRPC (asyncio) server interceptor that authenticates and authorizes every call.

For each call :class:`AuthInterceptor` reads ``authorization: Bearer <token>`` metadata,
verifies the token, maps the method to an action with its :class:`MethodRule` table (a method
without a rule is denied), asks the :class:`Authorizer`, and records the decision, allow or
deny, as an :class:`AuthzDecision` on a :class:`DecisionSink`. Allowed handlers run with
:func:`current_principal` set; refused calls end with UNAUTHENTICATED or PERMISSION_DENIED and
a message saying why. Health-check and reflection methods are public and not recorded.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from gantry.core import PermissionDenied, Unauthenticated
from gantry.events.catalog import AuthzDecision
from gantry.security.principal import ANONYMOUS, Principal
from gantry.security.rbac import Authorizer
from gantry.security.tokens import TokenVerifier

PUBLIC_METHOD_PREFIXES: frozenset[str] = frozenset({"/grpc.health.v1.Health/", "/grpc.reflection."})
_LOGIN_HINT = "create a token with `gantry admin token create`"
_UNMAPPED_ACTION = "call"
_UNMAPPED_KIND = "method"

_principal: ContextVar[Principal | None] = ContextVar("gantry_security_principal", default=None)


def current_principal() -> Principal:
    """The caller of the gRPC call being handled; :class:`Unauthenticated` outside of one."""
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated(
            "no authenticated caller here",
            hint="current_principal() works only inside a handler served behind AuthInterceptor",
        )
    return principal


@dataclass(frozen=True)
class MethodRule:
    """What calling one gRPC method means to the policy: ``action`` on ``resource_kind``."""

    action: str
    resource_kind: str


class DecisionSink(Protocol):
    """Where authorization decisions go; ``record`` must not block (publish in the background)."""

    def record(self, decision: AuthzDecision, *, actor: str) -> None:
        """Accept one decision taken on behalf of ``actor`` (the subject, or 'anonymous')."""
        ...


class MemoryDecisionSink:
    """A :class:`DecisionSink` that keeps every decision in memory, in order (for tests)."""

    def __init__(self) -> None:
        self.decisions: list[AuthzDecision] = []
        self.actors: list[str] = []

    def record(self, decision: AuthzDecision, *, actor: str) -> None:
        """Append ``decision`` and its ``actor``."""
        self.decisions.append(decision)
        self.actors.append(actor)

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self.decisions.clear()
        self.actors.clear()


@dataclass(frozen=True, slots=True)
class _Refusal:
    code: grpc.StatusCode
    message: str


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates, authorizes and records every call to the server it is installed on.

    ``rules`` maps full method names (``/pkg.Service/Method``) to :class:`MethodRule`; methods
    without a rule are denied (deny by default). Methods starting with one of
    ``public_methods`` (health checks and reflection by default) need no token and are not
    recorded. ``service`` names this service in the recorded decisions. A method the server
    does not implement is left to gRPC (UNIMPLEMENTED) and not recorded.

    Decisions are taken on the method alone (no request attributes), so a rule with a
    ``when`` condition never allows at this level: check such conditions in the handler with
    :meth:`Authorizer.check` and map the method to an unconditional action here.
    """

    def __init__(
        self,
        verifier: TokenVerifier,
        authorizer: Authorizer,
        rules: Mapping[str, MethodRule],
        sink: DecisionSink,
        service: str,
        public_methods: frozenset[str] = PUBLIC_METHOD_PREFIXES,
    ) -> None:
        self._verifier = verifier
        self._authorizer = authorizer
        self._rules = dict(rules)
        self._sink = sink
        self._service = service
        self._public = tuple(sorted(public_methods))

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        """Return the method's handler, bound to the caller, or one that refuses the call."""
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(self._public):
            return handler
        outcome = self._authorize(method, handler_call_details.invocation_metadata)
        if isinstance(outcome, _Refusal):
            return _refusing_handler(handler, outcome)
        return _bound_handler(handler, outcome)

    def _authorize(self, method: str, metadata: Iterable[Any] | None) -> Principal | _Refusal:
        rule = self._rules.get(method)
        try:
            principal = self._verifier.verify(_bearer_token(metadata))
        except Unauthenticated as exc:
            self._record(method, rule, ANONYMOUS, (), allowed=False, reason=str(exc))
            return _Refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        roles = (*principal.roles, *self._authorizer.policy.bindings.get(principal.subject, ()))
        if rule is None:
            reason = f"method {method} has no authorization rule, so it is denied by default"
            self._record(method, rule, principal.subject, roles, allowed=False, reason=reason)
            error = PermissionDenied(
                principal.subject,
                _UNMAPPED_ACTION,
                method,
                reason=reason,
                hint=f"the {self._service} service must map {method} to an action",
            )
            return _Refusal(grpc.StatusCode.PERMISSION_DENIED, str(error))
        decision = self._authorizer.decide(
            principal.subject, principal.roles, rule.action, rule.resource_kind
        )
        self._record(
            method, rule, principal.subject, roles, allowed=decision.allowed, reason=decision.reason
        )
        if not decision.allowed:
            error = PermissionDenied(
                principal.subject, rule.action, rule.resource_kind, reason=decision.reason
            )
            return _Refusal(grpc.StatusCode.PERMISSION_DENIED, str(error))
        return principal

    def _record(
        self,
        method: str,
        rule: MethodRule | None,
        actor: str,
        roles: Iterable[str],
        *,
        allowed: bool,
        reason: str,
    ) -> None:
        decision = AuthzDecision(
            principal=actor,
            roles=list(dict.fromkeys(roles)),
            action=rule.action if rule else _UNMAPPED_ACTION,
            resource_kind=rule.resource_kind if rule else _UNMAPPED_KIND,
            resource_name="*" if rule else method,
            decision="allow" if allowed else "deny",
            reason=reason,
            service=self._service,
            method=method,
        )
        self._sink.record(decision, actor=actor)


def _bearer_token(metadata: Iterable[Any] | None) -> str:
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if not values:
        raise Unauthenticated(
            "no token: send metadata 'authorization: Bearer <token>'", hint=_LOGIN_HINT
        )
    if len(values) > 1:
        raise Unauthenticated("more than one 'authorization' metadata entry; send exactly one")
    value = values[0]
    scheme, _, token = value.partition(" ") if isinstance(value, str) else ("", "", "")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated(
            "the 'authorization' metadata must be 'Bearer <token>'", hint=_LOGIN_HINT
        )
    return token.strip()


def _handler_kind(handler: Any) -> str:
    request = "stream" if handler.request_streaming else "unary"
    response = "stream" if handler.response_streaming else "unary"
    return f"{request}_{response}"


_FACTORIES: dict[str, Callable[..., Any]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _rebuild(handler: Any, kind: str, behavior: Callable[..., Any]) -> Any:
    return _FACTORIES[kind](
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _refusing_handler(handler: Any, refusal: _Refusal) -> Any:
    """A handler of the same kind as ``handler`` that aborts with ``refusal``."""

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(refusal.code, refusal.message)

    return _rebuild(handler, _handler_kind(handler), refuse)


def _bound_handler(handler: Any, principal: Principal) -> Any:
    """``handler`` with :func:`current_principal` returning ``principal`` while it runs.

    The wrapper keeps the behaviour's flavour (coroutine, async generator, generator or plain
    function),
    since grpc.aio dispatches on it.
    """
    kind = _handler_kind(handler)
    behavior: Callable[..., Any] = getattr(handler, kind)

    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            token = _principal.set(principal)
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                with contextlib.suppress(ValueError):  # closed from another context
                    _principal.reset(token)

        return _rebuild(handler, kind, stream)

    if inspect.iscoroutinefunction(behavior):

        async def call(request: Any, context: Any) -> Any:
            token = _principal.set(principal)
            try:
                return await behavior(request, context)
            finally:
                _principal.reset(token)

        return _rebuild(handler, kind, call)

    if inspect.isgeneratorfunction(behavior):

        def iterate(request: Any, context: Any) -> Iterator[Any]:
            token = _principal.set(principal)
            try:
                yield from behavior(request, context)
            finally:
                with contextlib.suppress(ValueError):
                    _principal.reset(token)

        return _rebuild(handler, kind, iterate)

    def run(request: Any, context: Any) -> Any:
        token = _principal.set(principal)
        try:
            return behavior(request, context)
        finally:
            _principal.reset(token)

    return _rebuild(handler, kind, run)


__all__ = [
    "PUBLIC_METHOD_PREFIXES",
    "AuthInterceptor",
    "DecisionSink",
    "MemoryDecisionSink",
    "MethodRule",
    "current_principal",
]
