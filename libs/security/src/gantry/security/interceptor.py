"""The gRPC (asyncio) server interceptor that authenticates and authorizes every call.

For each call :class:`AuthInterceptor` reads ``authorization: Bearer <token>`` metadata,
verifies the token, maps the method to an action with its :class:`MethodRule` table (a method
without a rule is denied), asks the :class:`Authorizer`, and records the decision, allow or
deny, as an :class:`AuthzDecision` on a :class:`DecisionSink`. Allowed handlers run with
:func:`current_principal` set; refused calls end with UNAUTHENTICATED or PERMISSION_DENIED and
a message saying why. Health-check and reflection methods are public and not recorded.

A service may act on behalf of a user (the Kubernetes ``Impersonate-User`` pattern): with the
metadata ``x-gantry-act-as: <subject>`` and ``x-gantry-act-as-roles: <role>,<role>`` a caller
whose token is of kind ``service`` and whom the policy allows ``impersonate`` on ``principal``
is taken for that subject, holding exactly those roles (kind ``user``, ``via`` naming the
service, the service's token expiry). That ``impersonate`` decision is recorded for the
service; the method's own decision is then taken and recorded for the acted-as principal, with
``via`` set, so the owner's rights (never the service's) decide the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from gantry.core import PermissionDenied, Unauthenticated
from gantry.events.catalog import AuthzDecision
from gantry.security.bootstrap import ADMIN_SUBJECT
from gantry.security.principal import ANONYMOUS, SERVICE_SUBJECTS, Principal
from gantry.security.rbac import Authorizer
from gantry.security.tokens import TokenVerifier

PUBLIC_METHOD_PREFIXES: frozenset[str] = frozenset({"/grpc.health.v1.Health/", "/grpc.reflection."})
_LOGIN_HINT = "create a token with `gantry admin token create`"
_UNMAPPED_ACTION = "call"
_UNMAPPED_KIND = "method"
#: The subject a service acts as, and that subject's roles (comma-separated, may be empty).
ACT_AS_METADATA = "x-gantry-act-as"
ACT_AS_ROLES_METADATA = "x-gantry-act-as-roles"
# Identities nobody may act as: Gantry's own services, the platform admin, and 'anonymous'.
_NOT_ACTABLE: frozenset[str] = SERVICE_SUBJECTS | {ADMIN_SUBJECT, ANONYMOUS}

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


#: What acting as another principal means to the policy (the resource name is the subject).
IMPERSONATE_RULE = MethodRule("impersonate", "principal")


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
        decisions: list[AuthzDecision] = []
        collecting = _collecting.set(decisions)
        try:
            outcome = self._authorize(method, handler_call_details.invocation_metadata)
        finally:
            _collecting.reset(collecting)
        flush = _Flush(self._sink, decisions)
        if isinstance(outcome, _Refusal):
            return _refusing_handler(handler, outcome, flush)
        return _bound_handler(handler, outcome, flush)

    def _authorize(self, method: str, metadata: Iterable[Any] | None) -> Principal | _Refusal:
        rule = self._rules.get(method)
        try:
            principal = self._verifier.verify(_bearer_token(metadata))
        except Unauthenticated as exc:
            self._record(method, rule, ANONYMOUS, (), allowed=False, reason=str(exc))
            return _Refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        subjects, role_lists = _act_as_metadata(metadata)
        if subjects or role_lists:
            acted = self._impersonate(method, principal, subjects, role_lists)
            if isinstance(acted, _Refusal):
                return acted
            principal = acted
        via = principal.via
        roles = (*principal.roles, *self._authorizer.policy.bindings.get(principal.subject, ()))
        if rule is None:
            reason = f"method {method} has no authorization rule, so it is denied by default"
            self._record(
                method, rule, principal.subject, roles, allowed=False, reason=reason, via=via
            )
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
            method,
            rule,
            principal.subject,
            roles,
            allowed=decision.allowed,
            reason=decision.reason,
            via=via,
        )
        if not decision.allowed:
            error = PermissionDenied(
                principal.subject,
                rule.action,
                rule.resource_kind,
                reason=decision.reason,
                hint=(
                    f"{via} called on behalf of {principal.subject!r}, so the call was decided "
                    f"with the roles {via} asserted for {principal.subject!r}"
                    if via
                    else None
                ),
            )
            return _Refusal(grpc.StatusCode.PERMISSION_DENIED, str(error))
        return principal

    def _impersonate(
        self, method: str, caller: Principal, subjects: list[str], role_lists: list[str]
    ) -> Principal | _Refusal:
        """The principal ``caller`` acts as, or why it may not; the decision is recorded."""
        target = subjects[0].strip() if len(subjects) == 1 else ""
        caller_roles = (*caller.roles, *self._authorizer.policy.bindings.get(caller.subject, ()))

        def refuse(code: grpc.StatusCode, reason: str, hint: str | None = None) -> _Refusal:
            self._record(
                method,
                IMPERSONATE_RULE,
                caller.subject,
                caller_roles,
                allowed=False,
                reason=reason,
                resource_name=target or "*",
            )
            if code == denied:
                resource = f"principal {target!r}" if target else "principal"
                message = str(
                    PermissionDenied(
                        caller.subject, "impersonate", resource, reason=reason, hint=hint
                    )
                )
            else:
                message = str(Unauthenticated(reason, hint=hint))
            return _Refusal(code, message)

        denied, unauthenticated = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED
        if caller.kind != "service":
            return refuse(
                denied,
                f"only a service may act on behalf of another principal; {caller.subject!r} "
                f"presented a {caller.kind} token",
                hint=f"call without the '{ACT_AS_METADATA}' and '{ACT_AS_ROLES_METADATA}' metadata",
            )
        if len(subjects) > 1 or len(role_lists) > 1:
            return refuse(
                unauthenticated,
                f"more than one '{ACT_AS_METADATA}' or '{ACT_AS_ROLES_METADATA}' metadata "
                "entry; send exactly one of each",
            )
        if not subjects or not role_lists:
            present, missing = (
                (ACT_AS_ROLES_METADATA, ACT_AS_METADATA)
                if not subjects
                else (ACT_AS_METADATA, ACT_AS_ROLES_METADATA)
            )
            return refuse(
                unauthenticated,
                f"metadata '{present}' was sent without '{missing}'",
                hint=f"send both: '{ACT_AS_METADATA}: <subject>' and "
                f"'{ACT_AS_ROLES_METADATA}: <role>,<role>' (the roles may be empty)",
            )
        if not target or not target.isprintable() or any(c.isspace() for c in target):
            return refuse(
                unauthenticated,
                f"'{ACT_AS_METADATA}' must name a subject (no spaces), got {subjects[0]!r}",
            )
        if target in _NOT_ACTABLE:
            return refuse(
                denied,
                f"{target!r} is a reserved identity (a Gantry service, the platform admin or "
                "anonymous), which no service may act as",
            )
        roles = tuple(dict.fromkeys(r.strip() for r in role_lists[0].split(",") if r.strip()))
        known = self._authorizer.policy.roles
        unknown = [role for role in roles if role not in known]
        if unknown:
            return refuse(
                unauthenticated,
                f"'{ACT_AS_ROLES_METADATA}' names role(s) the RBAC policy does not define: "
                f"{', '.join(map(repr, unknown))}",
                hint=f"roles defined by the policy: {', '.join(sorted(known))}",
            )
        decision = self._authorizer.decide(
            caller.subject, caller.roles, IMPERSONATE_RULE.action, IMPERSONATE_RULE.resource_kind
        )
        if not decision.allowed:
            return refuse(
                denied,
                decision.reason,
                hint="bind the service to a role that allows impersonate on principal "
                "(the shipped policy's orchestrator)",
            )
        self._record(
            method,
            IMPERSONATE_RULE,
            caller.subject,
            caller_roles,
            allowed=True,
            reason=decision.reason,
            resource_name=target,
        )
        return Principal(
            subject=target,
            roles=roles,
            token_id=caller.token_id,
            expires_at=caller.expires_at,
            kind="user",
            via=caller.subject,
        )

    def _record(
        self,
        method: str,
        rule: MethodRule | None,
        actor: str,
        roles: Iterable[str],
        *,
        allowed: bool,
        reason: str,
        resource_name: str = "*",
        via: str = "",
    ) -> None:
        decision = AuthzDecision(
            principal=actor,
            roles=list(dict.fromkeys(roles)),
            action=rule.action if rule else _UNMAPPED_ACTION,
            resource_kind=rule.resource_kind if rule else _UNMAPPED_KIND,
            resource_name=resource_name if rule else method,
            decision="allow" if allowed else "deny",
            reason=reason,
            service=self._service,
            method=method,
            via=via,
        )
        pending = _collecting.get()
        if pending is not None:  # recorded once the call's peer is known (see _Flush)
            pending.append(decision)
            return
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


def _act_as_metadata(metadata: Iterable[Any] | None) -> tuple[list[str], list[str]]:
    """The values of the act-as metadata entries: (subjects, role lists), usually empty."""
    subjects: list[str] = []
    role_lists: list[str] = []
    for key, value in metadata or ():
        if key == ACT_AS_METADATA:
            subjects.append(value if isinstance(value, str) else "")
        elif key == ACT_AS_ROLES_METADATA:
            role_lists.append(value if isinstance(value, str) else "")
    return subjects, role_lists


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


def _rebuild(handler: Any, kind: str, behavior: Callable[..., Any], flush: _Flush) -> Any:
    read = handler.request_deserializer

    def deserialize(raw: bytes) -> Any:
        try:
            return read(raw)
        except Exception:  # the behaviour never runs: record the decisions now
            flush(None)
            raise

    return _FACTORIES[kind](
        behavior,
        request_deserializer=deserialize if read is not None else None,
        response_serializer=handler.response_serializer,
    )


_collecting: ContextVar[list[AuthzDecision] | None] = ContextVar(
    "gantry_authz_collecting", default=None
)


class _Flush:
    """Records a call's decisions exactly once, with the caller's address: when its handler
    starts (the context tells the peer), or — if the request cannot even be read — without."""

    def __init__(self, sink: DecisionSink, decisions: list[AuthzDecision]) -> None:
        self._sink = sink
        self._decisions = decisions
        self._done = False

    def __call__(self, context: Any | None) -> None:
        if self._done:
            return
        self._done = True
        address = peer_address(context.peer()) if context is not None else ""
        for d in self._decisions:
            record = d.model_copy(update={"address": address}) if address else d
            self._sink.record(record, actor=d.principal)


def peer_address(peer: str | None) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.1.7:5123`` → ``10.0.1.7``, ``ipv6:[::1]:80``
    → ``::1``); other forms (``unix:...``) as they are."""
    if not peer:
        return ""
    scheme, _, rest = peer.partition(":")
    if scheme == "ipv4":
        return rest.rsplit(":", 1)[0]
    if scheme == "ipv6":
        host = rest.rsplit(":", 1)[0] if rest.startswith("[") else rest
        return host.strip("[]")
    return peer[:256]


def _at(principal: Principal, context: Any) -> Principal:
    """``principal`` with the address the call came from."""
    return dataclasses.replace(principal, address=peer_address(context.peer()))


def _refusing_handler(handler: Any, refusal: _Refusal, flush: _Flush) -> Any:
    """A handler of the same kind as ``handler`` that aborts with ``refusal``."""

    async def refuse(request: Any, context: Any) -> None:
        flush(context)
        await context.abort(refusal.code, refusal.message)

    return _rebuild(handler, _handler_kind(handler), refuse, flush)


def _bound_handler(handler: Any, principal: Principal, flush: _Flush) -> Any:
    """``handler`` with :func:`current_principal` returning ``principal`` while it runs.

    The wrapper keeps the behaviour's flavour (coroutine, async generator, generator or plain
    function),
    since grpc.aio dispatches on it.
    """
    kind = _handler_kind(handler)
    behavior: Callable[..., Any] = getattr(handler, kind)

    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            flush(context)
            token = _principal.set(_at(principal, context))
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                with contextlib.suppress(ValueError):  # closed from another context
                    _principal.reset(token)

        return _rebuild(handler, kind, stream, flush)

    if inspect.iscoroutinefunction(behavior):

        async def call(request: Any, context: Any) -> Any:
            flush(context)
            token = _principal.set(_at(principal, context))
            try:
                return await behavior(request, context)
            finally:
                _principal.reset(token)

        return _rebuild(handler, kind, call, flush)

    if inspect.isgeneratorfunction(behavior):

        def iterate(request: Any, context: Any) -> Iterator[Any]:
            flush(context)
            token = _principal.set(_at(principal, context))
            try:
                yield from behavior(request, context)
            finally:
                with contextlib.suppress(ValueError):
                    _principal.reset(token)

        return _rebuild(handler, kind, iterate, flush)

    def run(request: Any, context: Any) -> Any:
        flush(context)
        token = _principal.set(_at(principal, context))
        try:
            return behavior(request, context)
        finally:
            _principal.reset(token)

    return _rebuild(handler, kind, run, flush)


__all__ = [
    "ACT_AS_METADATA",
    "ACT_AS_ROLES_METADATA",
    "IMPERSONATE_RULE",
    "PUBLIC_METHOD_PREFIXES",
    "AuthInterceptor",
    "DecisionSink",
    "MemoryDecisionSink",
    "MethodRule",
    "current_principal",
]
