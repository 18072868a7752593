"""Rules and the grant index they compile into: resource kind -> action -> role -> grant.

The index is built once when a policy is loaded, with wildcards merged in, so that deciding a
request is two or three dict lookups to find who may do it, then one dict lookup per role the
caller holds. Decisions (allow per role, deny per condition) are prebuilt here too, so an
allow or a failed condition allocates nothing at decision time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gantry.security.decision import Decision

WILDCARD = "*"
SUBJECT_REF = "$subject"


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a role, as written: it grants ``actions`` on ``resources`` when ``when`` holds.

    ``when`` is ``((attribute, allowed values), ...)``, every entry must hold;
    ``("owner", ("$subject",))`` means the attribute must equal the caller's subject.
    """

    role: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()


class _Condition:
    """A compiled ``when`` entry of one role's rule, with its prebuilt denial."""

    __slots__ = ("allowed", "attr", "denial", "is_subject")

    def __init__(self, role: str, attr: str, allowed: tuple[str, ...]) -> None:
        self.attr = attr
        self.is_subject = allowed == (SUBJECT_REF,)
        self.allowed: frozenset[str] = frozenset() if self.is_subject else frozenset(allowed)
        text = (
            f"{attr} == {SUBJECT_REF}" if self.is_subject else f"{attr} in [{', '.join(allowed)}]"
        )
        self.denial = Decision(False, f"condition {text} not met (role {role})")


class Grant:
    """What one role may do for one (resource kind, action): always, or under conditions.

    ``alternatives`` are the condition sets of the matching rules (any one set, all of its
    conditions holding, allows); ``unconditional`` is true when some rule has no conditions.
    """

    __slots__ = ("allow", "alternatives", "unconditional")

    def __init__(self, allow: Decision, alternatives: list[tuple[_Condition, ...]]) -> None:
        self.allow = allow
        self.unconditional = any(not alt for alt in alternatives)
        self.alternatives: tuple[tuple[_Condition, ...], ...] = (
            () if self.unconditional else tuple(dict.fromkeys(alternatives))
        )

    def evaluate(self, subject: str, attrs: Mapping[str, str] | None) -> Decision:
        """The role's allow if some condition set holds, else the first failed condition's deny."""
        if self.unconditional:
            return self.allow
        first_failed: Decision | None = None
        for alternative in self.alternatives:
            for condition in alternative:
                if attrs is None:
                    holds = False
                elif condition.is_subject:
                    holds = attrs.get(condition.attr) == subject
                else:
                    holds = attrs.get(condition.attr) in condition.allowed
                if not holds:
                    if first_failed is None:
                        first_failed = condition.denial
                    break
            else:
                return self.allow
        assert first_failed is not None  # a conditional grant has at least one condition
        return first_failed


GrantsByRole = dict[str, Grant]


class GrantIndex:
    """Every rule of a policy compiled to ``by_resource[kind][action][role] -> Grant``.

    A resource kind no rule names falls back to ``any_resource`` (the ``*`` resource rules);
    within a kind, an action no rule names falls back to the ``"*"`` key. Each entry already
    holds every rule that can match it (exact and wildcard), so the first hit is complete.
    """

    __slots__ = ("any_resource", "by_resource")

    def __init__(self, rules: Iterable[Rule]) -> None:
        allow: dict[str, Decision] = {}
        # (action, resource) -> role -> condition sets, as written (wildcards not yet merged)
        raw: dict[tuple[str, str], dict[str, list[tuple[_Condition, ...]]]] = {}
        actions_of: dict[str, set[str]] = {WILDCARD: {WILDCARD}}
        for rule in rules:
            if rule.role not in allow:
                allow[rule.role] = Decision(True, f"allowed by role {rule.role}", rule.role)
            conditions = tuple(_Condition(rule.role, a, v) for a, v in rule.when)
            for action in rule.actions:
                for resource in rule.resources:
                    by_role = raw.setdefault((action, resource), {})
                    by_role.setdefault(rule.role, []).append(conditions)
                    actions_of.setdefault(resource, {WILDCARD}).add(action)
        self.by_resource: dict[str, dict[str, GrantsByRole]] = {
            resource: _compile_actions(raw, allow, resource, actions | actions_of[WILDCARD])
            for resource, actions in actions_of.items()
            if resource != WILDCARD
        }
        self.any_resource: dict[str, GrantsByRole] = _compile_actions(
            raw, allow, WILDCARD, actions_of[WILDCARD]
        )

    def lookup(self, resource_kind: str, action: str) -> GrantsByRole | None:
        """The roles that may (perhaps conditionally) do ``action`` on ``resource_kind``."""
        actions = self.by_resource.get(resource_kind, self.any_resource)
        grants = actions.get(action)
        return actions.get(WILDCARD) if grants is None else grants


def _compile_actions(
    raw: dict[tuple[str, str], dict[str, list[tuple[_Condition, ...]]]],
    allow: dict[str, Decision],
    resource: str,
    actions: set[str],
) -> dict[str, GrantsByRole]:
    resources = (resource, WILDCARD) if resource != WILDCARD else (WILDCARD,)
    table: dict[str, GrantsByRole] = {}
    for action in sorted(actions):
        keys = [(a, r) for a in dict.fromkeys((action, WILDCARD)) for r in resources]
        merged: dict[str, list[tuple[_Condition, ...]]] = {}
        for key in keys:
            for role, alternatives in raw.get(key, {}).items():
                merged.setdefault(role, []).extend(alternatives)
        if merged:
            table[action] = {role: Grant(allow[role], alts) for role, alts in merged.items()}
    return table


__all__ = ["SUBJECT_REF", "WILDCARD", "Grant", "GrantIndex", "GrantsByRole", "Rule"]
