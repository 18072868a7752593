"""The RBAC policy: roles, their rules and subject bindings, loaded from YAML and precompiled.

A policy file looks like::

    version: 1
    roles:
      ml-developer:
        description: trains and deploys models
        rules:
          - actions: [read]
            resources: [dataset]
            when: {view: [deidentified]}   # request attribute 'view' must be one of these
          - actions: [update, delete]
            resources: [job]
            when: {owner: $subject}        # attribute 'owner' must equal the caller
    bindings:                              # optional: subject -> extra roles
      svc-audit: [service]

``"*"`` in ``actions`` or ``resources`` matches anything. Loading validates the shape (every
problem is a :class:`ConfigError` naming the role, rule and field) and compiles the rules into
a :class:`~gantry.security.grants.GrantIndex`, so a decision is a handful of dict lookups
(see :mod:`gantry.security.rbac`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from gantry.core import ConfigError
from gantry.security.grants import SUBJECT_REF, WILDCARD, GrantIndex, Rule

# yaml.safe_load's loader, in C when libyaml is there (10x faster on large policies).
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SHAPE_HINT = (
    "a policy is `version: 1`, `roles: {<role>: {description: str, rules: [{actions: [..], "
    "resources: [..], when: {<attribute>: [values] | $subject}}]}}` and optional "
    "`bindings: {<subject>: [roles]}`; see gantry/security/default_policy.yaml"
)


def _check_names(values: list[str], what: str) -> list[str]:
    for value in values:
        if not value.strip():
            raise ValueError(f"{what} must be non-empty strings")
        if WILDCARD in value and value != WILDCARD:
            raise ValueError(f"{value!r}: only a lone '*' is a wildcard (no partial patterns)")
    return values


class _RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    actions: list[str] = Field(min_length=1)
    resources: list[str] = Field(min_length=1)
    when: dict[str, Any] = Field(default_factory=dict)

    @field_validator("actions")
    @classmethod
    def _actions(cls, value: list[str]) -> list[str]:
        return _check_names(value, "actions")

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: list[str]) -> list[str]:
        return _check_names(value, "resources")

    @field_validator("when")
    @classmethod
    def _when(cls, value: dict[str, Any]) -> dict[str, Any]:
        for attr, allowed in value.items():
            if isinstance(allowed, str):
                if allowed.startswith("$") and allowed != SUBJECT_REF:
                    raise ValueError(f"{attr}: {allowed!r} is not a known reference; use $subject")
            elif not (
                isinstance(allowed, list)
                and allowed
                and all(isinstance(v, str) and not v.startswith("$") for v in allowed)
            ):
                raise ValueError(
                    f"{attr}: a condition is a non-empty list of strings or $subject, "
                    f"got {allowed!r}"
                )
        return value


class _RoleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    description: str = ""
    rules: list[_RuleSpec] = Field(default_factory=list)


class _PolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Literal[1]
    roles: dict[str, _RoleSpec] = Field(min_length=1)
    bindings: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("roles")
    @classmethod
    def _role_names(cls, value: dict[str, _RoleSpec]) -> dict[str, _RoleSpec]:
        for name in value:
            if not name or WILDCARD in name or any(c.isspace() or c == "," for c in name):
                raise ValueError(f"{name!r} is not a valid role name (no spaces, ',' or '*')")
        return value


class Policy:
    """An immutable, validated RBAC policy (deny by default), compiled when loaded."""

    __slots__ = ("_bindings", "_descriptions", "_grants", "_roles", "_rules", "_source")

    def __init__(self, spec: _PolicySpec, source: str) -> None:
        """Build from a validated spec; use :meth:`from_yaml` or :meth:`from_file` instead."""
        self._source = source
        self._rules = tuple(
            Rule(
                role=name,
                actions=tuple(dict.fromkeys(rule.actions)),
                resources=tuple(dict.fromkeys(rule.resources)),
                when=tuple(
                    (attr, (v,) if isinstance(v, str) else tuple(v))
                    for attr, v in sorted(rule.when.items())
                ),
            )
            for name, role in spec.roles.items()
            for rule in role.rules
        )
        self._roles = frozenset(spec.roles)
        self._descriptions = MappingProxyType({n: r.description for n, r in spec.roles.items()})
        self._grants = GrantIndex(self._rules)
        for subject, names in spec.bindings.items():
            unknown = sorted(set(names) - self._roles)
            if unknown:
                raise ConfigError(
                    f"invalid RBAC policy {source}: bindings.{subject} names undefined "
                    f"role(s) {', '.join(unknown)}",
                    hint=f"defined roles: {', '.join(sorted(self._roles))}",
                )
        self._bindings: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {subject: tuple(dict.fromkeys(names)) for subject, names in spec.bindings.items()}
        )

    @classmethod
    def from_yaml(cls, text: str, source: str = "<policy>") -> Policy:
        """Parse (``yaml.safe_load``), validate and compile a policy, or raise ConfigError."""
        try:
            raw = yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - the safe loader
        except yaml.YAMLError as exc:
            mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(
                f"RBAC policy {source} is not valid YAML{where}: {problem or exc}",
                hint=_SHAPE_HINT,
            ) from None
        if not isinstance(raw, dict):
            raise ConfigError(
                f"RBAC policy {source} must be a YAML mapping, got {type(raw).__name__}",
                hint=_SHAPE_HINT,
            )
        try:
            spec = _PolicySpec.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(_problem(error) for error in exc.errors())
            raise ConfigError(
                f"invalid RBAC policy {source}: {problems}", hint=_SHAPE_HINT
            ) from None
        return cls(spec, source)

    @classmethod
    def from_file(cls, path: Path | str) -> Policy:
        """Load a policy file; :class:`ConfigError` if it cannot be read or is invalid."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"cannot read RBAC policy {path}: {exc}",
                hint="check the service's policy_file setting (GANTRY_<SERVICE>__POLICY_FILE)",
            ) from None
        return cls.from_yaml(text, source=str(path))

    @property
    def source(self) -> str:
        """Where the policy came from (a path or ``<policy>``)."""
        return self._source

    @property
    def roles(self) -> frozenset[str]:
        """Every role the policy defines."""
        return self._roles

    @property
    def bindings(self) -> Mapping[str, tuple[str, ...]]:
        """Extra roles per subject (read-only)."""
        return self._bindings

    @property
    def grants(self) -> GrantIndex:
        """The rules compiled for fast decisions (what :class:`Authorizer` looks things up in)."""
        return self._grants

    @property
    def rules(self) -> tuple[Rule, ...]:
        """Every rule of every role, in file order."""
        return self._rules

    def description(self, role: str) -> str:
        """The role's description ('' if none); KeyError for an undefined role."""
        return self._descriptions[role]

    def __repr__(self) -> str:
        return f"Policy(source={self._source!r}, roles={len(self._roles)})"


def _problem(error: ErrorDetails) -> str:
    """One validation error as '<path>: <what is wrong>', with the fields allowed there."""
    loc, kind, message = error["loc"], error["type"], error["msg"]
    message = message.removeprefix("Value error, ")
    if kind == "model_type":
        message = f"expected a mapping, got {type(error['input']).__name__}"
    elif kind == "extra_forbidden":
        model = _RuleSpec if "rules" in loc else _RoleSpec if len(loc) > 1 else _PolicySpec
        message = f"unknown field; allowed fields here: {', '.join(model.model_fields)}"
    return f"{_loc(loc)}: {message}"


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "policy"


__all__ = ["SUBJECT_REF", "WILDCARD", "Policy", "Rule"]
