"""Loading RBAC policies: the shape is validated and every error says where and what."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.core import ConfigError
from gantry.security import Policy, Rule

GOOD = """
version: 1
roles:
  ml-developer:
    description: trains models
    rules:
      - actions: [read]
        resources: [dataset]
        when: {view: [deidentified]}
      - actions: [update, delete]
        resources: [job]
        when: {owner: $subject}
      - actions: [deploy]
        resources: [model]
        when: {environment: staging}
  service:
    rules:
      - actions: ["*"]
        resources: [event]
bindings:
  svc-audit: [service]
"""


def test_good_policy_loads() -> None:
    policy = Policy.from_yaml(GOOD, source="test.yaml")
    assert policy.roles == frozenset({"ml-developer", "service"})
    assert policy.bindings == {"svc-audit": ("service",)}
    assert policy.description("ml-developer") == "trains models"
    assert policy.description("service") == ""
    assert policy.source == "test.yaml"
    assert policy.rules[0] == Rule(
        "ml-developer", ("read",), ("dataset",), (("view", ("deidentified",)),)
    )
    assert policy.rules[1].when == (("owner", ("$subject",)),)
    assert policy.rules[2].when == (("environment", ("staging",)),)  # a scalar is a one-item list
    assert len(policy.rules) == 4


def test_policy_is_immutable() -> None:
    policy = Policy.from_yaml(GOOD)
    with pytest.raises(AttributeError):
        policy.roles = frozenset()  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.bindings["x"] = ("service",)  # type: ignore[index]


def test_from_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    assert Policy.from_file(path).source == str(path)
    with pytest.raises(ConfigError, match="cannot read RBAC policy"):
        Policy.from_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "messages"),
    [
        ("version: 1\nroles: {a: [}\n", ["not valid YAML at line 2, column 13"]),
        ("- a\n- b", ["must be a YAML mapping, got list"]),
        ("", ["must be a YAML mapping, got NoneType"]),
        ("version: 2\nroles: {a: {}}", ["version: Input should be 1"]),
        ("version: 1", ["roles: Field required"]),
        ("version: 1\nroles: {}", ["roles: ", "at least 1 item"]),
        (
            "version: 1\nrole: {}\nroles: {a: {}}",
            ["role: unknown field; allowed fields here: version, roles, bindings"],
        ),
        ("version: 1\nroles: {a: }", ["roles.a: expected a mapping, got NoneType"]),
        (
            "version: 1\nroles: {a: {rule: []}}",
            ["roles.a.rule: unknown field; allowed fields here: description, rules"],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [read], resource: [x]}]}}",
            [
                "roles.a.rules[0].resources: Field required",
                "roles.a.rules[0].resource: unknown field; allowed fields here: actions, "
                "resources, when",
            ],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [], resources: [x]}]}}",
            ["roles.a.rules[0].actions", "at least 1 item"],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [read, 7], resources: [x]}]}}",
            ["roles.a.rules[0].actions[1]: Input should be a valid string"],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [re*], resources: [x]}]}}",
            ["roles.a.rules[0].actions: 're*': only a lone '*' is a wildcard"],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [r], resources: [x], when: {v: []}}]}}",
            ["roles.a.rules[0].when: v: a condition is a non-empty list of strings or $subject"],
        ),
        (
            "version: 1\nroles: {a: {rules: [{actions: [r], resources: [x], when: {o: $owner}}]}}",
            ["roles.a.rules[0].when: o: '$owner' is not a known reference; use $subject"],
        ),
        ("version: 1\nroles: {'a b': {}}", ["'a b' is not a valid role name"]),
        ("version: 1\nroles: {'*': {}}", ["'*' is not a valid role name"]),
        (
            "version: 1\nroles: {a: {}}\nbindings: {svc: [a, ghost]}",
            ["bindings.svc names undefined role(s) ghost", "defined roles: a"],
        ),
    ],
)
def test_bad_policies_say_where_and_what(text: str, messages: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_yaml(text, source="p.yaml")
    rendered = str(info.value)
    assert "p.yaml" in rendered
    for message in messages:
        assert message in rendered
    assert info.value.hint  # always says what a policy looks like / what is allowed


def test_yaml_is_loaded_safely() -> None:
    text = "version: 1\nroles: !!python/object/apply:os.system ['echo pwned']"
    with pytest.raises(ConfigError, match="not valid YAML"):
        Policy.from_yaml(text)
