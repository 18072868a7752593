"""RBAC decisions: deny by default, evaluated in-process against a precompiled :class:`Policy`.

:meth:`Authorizer.decide` is on the path of every API call, so it does only dict and frozenset
lookups in the :class:`~gantry.security.grants.GrantIndex` built when the policy was loaded.
Allows and failed conditions return a :class:`Decision` prebuilt at load time (no
allocation); only the "no role allows this" deny builds its reason string per call.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping
from importlib import resources

from gantry.core import PermissionDenied
from gantry.security.decision import Decision
from gantry.security.grants import WILDCARD, Rule
from gantry.security.policy import Policy
from gantry.security.principal import Principal

DEFAULT_POLICY_RESOURCE = "default_policy.yaml"
_ROLE_COLLECTIONS = (tuple, list, frozenset, set)


class Authorizer:
    """Decides whether a subject with some roles may perform an action on a kind of resource.

    Deny by default: only a rule of one of the caller's roles (token roles plus the policy's
    bindings for the subject) whose conditions all hold allows an action. Roles the policy
    does not define are ignored, and named in the deny reason.
    """

    __slots__ = ("_any_resource", "_bound", "_bound_text", "_by_resource", "_policy", "_roles")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._by_resource = policy.grants.by_resource
        self._any_resource = policy.grants.any_resource
        self._roles = policy.roles
        self._bound: dict[str, tuple[str, ...]] = dict(policy.bindings)
        self._bound_text = {s: ", ".join(names) for s, names in policy.bindings.items()}

    @property
    def policy(self) -> Policy:
        """The policy decisions are taken against."""
        return self._policy

    def decide(
        self,
        subject: str,
        roles: Iterable[str],
        action: str,
        resource_kind: str,
        attrs: Mapping[str, str] | None = None,
    ) -> Decision:
        """Allow or deny ``action`` on ``resource_kind`` for ``subject`` holding ``roles``.

        ``attrs`` are request attributes that rule conditions (``when``) test, e.g.
        ``{"view": "deidentified"}``; a condition on an attribute not given does not hold.
        Never raises for a deny; see :meth:`check` for the raising form.
        """
        if not isinstance(roles, _ROLE_COLLECTIONS):
            roles = tuple(roles)
        actions = self._by_resource.get(resource_kind, self._any_resource)
        grants = actions.get(action)
        if grants is None:
            grants = actions.get(WILDCARD)
        failed: Decision | None = None
        if grants is not None:
            for name in roles:
                grant = grants.get(name)
                if grant is not None:
                    if grant.unconditional:
                        return grant.allow
                    outcome = grant.evaluate(subject, attrs)
                    if outcome.allowed:
                        return outcome
                    failed = failed or outcome
            bound = self._bound.get(subject)
            if bound is not None:
                for name in bound:
                    grant = grants.get(name)
                    if grant is not None:
                        outcome = grant.evaluate(subject, attrs)
                        if outcome.allowed:
                            return outcome
                        failed = failed or outcome
        if failed is not None:
            return failed
        return self._no_rule(subject, roles, action, resource_kind)

    def check(
        self,
        principal: Principal,
        action: str,
        resource_kind: str,
        resource_name: str = "*",
        attrs: Mapping[str, str] | None = None,
    ) -> Decision:
        """Like :meth:`decide` for a verified principal; raise :class:`PermissionDenied` on deny.

        ``resource_name`` only names the resource in the error message.
        """
        decision = self.decide(principal.subject, principal.roles, action, resource_kind, attrs)
        if not decision.allowed:
            resource = resource_kind if resource_name == "*" else f"{resource_kind} {resource_name}"
            raise PermissionDenied(principal.subject, action, resource, reason=decision.reason)
        return decision

    def _no_rule(
        self, subject: str, roles: Collection[str], action: str, resource_kind: str
    ) -> Decision:
        """The deny when no role has a rule for the request (kept cheap: the common deny)."""
        bound_text = self._bound_text.get(subject)
        known = self._roles
        if (not roles or bound_text is None) and known.issuperset(roles):
            held = ", ".join(roles) or bound_text or "none"
            suffix = ""
        else:
            names = list(dict.fromkeys([*roles, *self._bound.get(subject, ())]))
            held = ", ".join(r for r in names if r in known) or "none"
            ignored = ", ".join(r for r in names if r not in known)
            suffix = f"; roles not defined by the policy were ignored: {ignored}" if ignored else ""
        return Decision(
            False, f"no role of {subject!r} ({held}) allows {action} on {resource_kind}{suffix}"
        )


@functools.cache
def default_policy() -> Policy:
    """The policy shipped with Gantry (``gantry/security/default_policy.yaml``).

    Roles: platform-admin, data-steward, annotator, ml-developer, model-consumer, auditor,
    service and orchestrator (bound to the ``workflows`` service: it may act as users).
    """
    text = resources.files("gantry.security").joinpath(DEFAULT_POLICY_RESOURCE).read_text("utf-8")
    return Policy.from_yaml(text, source=f"gantry.security/{DEFAULT_POLICY_RESOURCE}")


__all__ = ["Authorizer", "Decision", "Policy", "Rule", "default_policy"]
