"""RBAC decisions: deny by default, wildcards, conditions, bindings, unknown roles."""

from __future__ import annotations

import datetime as dt

import pytest

from gantry.core import PermissionDenied
from gantry.security import Authorizer, Decision, Policy, Principal

POLICY = """
version: 1
roles:
  admin:
    rules:
      - actions: ["*"]
        resources: ["*"]
  ml-developer:
    rules:
      - actions: [read]
        resources: [dataset]
        when: {view: [deidentified]}
      - actions: [create, read, list, cancel]
        resources: [job]
      - actions: [deploy]
        resources: [model]
        when: {environment: [staging]}
      - actions: [update, delete]
        resources: [job]
        when: {owner: $subject}
  reader:
    rules:
      - actions: [read, list]
        resources: ["*"]
  janitor:
    rules:
      - actions: ["*"]
        resources: [tmp]
  two-keys:
    rules:
      - actions: [open]
        resources: [vault]
        when: {key1: ["yes"], key2: ["yes"]}
  either:
    rules:
      - actions: [read]
        resources: [report]
        when: {region: [eu]}
      - actions: [read]
        resources: [report]
        when: {tier: [gold]}
  service:
    rules:
      - actions: [publish]
        resources: [event]
bindings:
  svc-audit: [service]
  carol: [reader]
"""


@pytest.fixture(scope="module")
def authz() -> Authorizer:
    return Authorizer(Policy.from_yaml(POLICY))


def test_deny_by_default(authz: Authorizer) -> None:
    decision = authz.decide("alice", ["ml-developer"], "delete", "dataset")
    assert decision == Decision(
        False, "no role of 'alice' (ml-developer) allows delete on dataset", None
    )


def test_allow_names_the_role(authz: Authorizer) -> None:
    decision = authz.decide("alice", ["ml-developer"], "create", "job")
    assert decision == Decision(True, "allowed by role ml-developer", "ml-developer")


def test_no_roles_at_all(authz: Authorizer) -> None:
    decision = authz.decide("nobody", [], "read", "job")
    assert not decision.allowed
    assert decision.reason == "no role of 'nobody' (none) allows read on job"


@pytest.mark.parametrize(
    ("action", "resource", "allowed"),
    [
        ("anything", "anything", True),
        ("delete", "dataset", True),
        ("*", "*", True),
    ],
)
def test_full_wildcard(authz: Authorizer, action: str, resource: str, allowed: bool) -> None:
    assert authz.decide("root", ["admin"], action, resource).allowed is allowed


@pytest.mark.parametrize(
    ("action", "resource", "allowed"),
    [
        ("read", "dataset", True),
        ("list", "brand-new-kind", True),
        ("delete", "dataset", False),
        ("write", "brand-new-kind", False),
    ],
)
def test_resource_wildcard(authz: Authorizer, action: str, resource: str, allowed: bool) -> None:
    assert authz.decide("r", ["reader"], action, resource).allowed is allowed


@pytest.mark.parametrize(
    ("action", "resource", "allowed"),
    [("purge", "tmp", True), ("read", "tmp", True), ("purge", "dataset", False)],
)
def test_action_wildcard(authz: Authorizer, action: str, resource: str, allowed: bool) -> None:
    assert authz.decide("j", ["janitor"], action, resource).allowed is allowed


def test_wildcard_and_exact_rules_merge_across_roles(authz: Authorizer) -> None:
    # reader allows read on anything; ml-developer only conditionally reads datasets
    decision = authz.decide("x", ["ml-developer", "reader"], "read", "dataset", {"view": "raw"})
    assert decision.allowed
    assert decision.role == "reader"


def test_membership_condition(authz: Authorizer) -> None:
    ok = authz.decide("a", ["ml-developer"], "read", "dataset", {"view": "deidentified"})
    assert ok.allowed
    raw = authz.decide("a", ["ml-developer"], "read", "dataset", {"view": "raw"})
    assert not raw.allowed
    assert raw.reason == "condition view in [deidentified] not met (role ml-developer)"
    missing = authz.decide("a", ["ml-developer"], "read", "dataset")
    assert not missing.allowed
    assert "condition view in [deidentified] not met" in missing.reason
    assert not authz.decide("a", ["ml-developer"], "read", "dataset", {"other": "x"}).allowed


def test_subject_condition(authz: Authorizer) -> None:
    mine = authz.decide("alice", ["ml-developer"], "delete", "job", {"owner": "alice"})
    assert mine.allowed
    theirs = authz.decide("alice", ["ml-developer"], "delete", "job", {"owner": "bob"})
    assert not theirs.allowed
    assert theirs.reason == "condition owner == $subject not met (role ml-developer)"


def test_all_conditions_of_a_rule_must_hold(authz: Authorizer) -> None:
    both = {"key1": "yes", "key2": "yes"}
    assert authz.decide("v", ["two-keys"], "open", "vault", both).allowed
    one = authz.decide("v", ["two-keys"], "open", "vault", {"key1": "yes", "key2": "no"})
    assert not one.allowed
    assert "key2 in [yes]" in one.reason


def test_any_rule_may_allow(authz: Authorizer) -> None:
    assert authz.decide("e", ["either"], "read", "report", {"region": "eu"}).allowed
    assert authz.decide("e", ["either"], "read", "report", {"tier": "gold"}).allowed
    assert not authz.decide("e", ["either"], "read", "report", {"region": "us"}).allowed


def test_bindings_add_roles(authz: Authorizer) -> None:
    decision = authz.decide("svc-audit", [], "publish", "event")
    assert decision.allowed
    assert decision.role == "service"
    assert not authz.decide("someone-else", [], "publish", "event").allowed
    denied = authz.decide("carol", ["ml-developer"], "delete", "model")
    assert denied.reason == "no role of 'carol' (ml-developer, reader) allows delete on model"
    bound_only = authz.decide("svc-audit", (), "delete", "model")
    assert bound_only.reason == "no role of 'svc-audit' (service) allows delete on model"


def test_unknown_roles_are_ignored_and_named(authz: Authorizer) -> None:
    decision = authz.decide("alice", ["wizard", "ml-developer"], "delete", "dataset")
    assert not decision.allowed
    assert decision.reason == (
        "no role of 'alice' (ml-developer) allows delete on dataset; "
        "roles not defined by the policy were ignored: wizard"
    )
    assert not authz.decide("alice", ["wizard"], "anything", "anything").allowed


def test_roles_may_be_any_iterable(authz: Authorizer) -> None:
    assert authz.decide("a", iter(["ml-developer"]), "create", "job").allowed
    denied = authz.decide("a", (r for r in ["ml-developer"]), "drop", "job")
    assert denied.reason == "no role of 'a' (ml-developer) allows drop on job"


def test_allow_decisions_are_prebuilt(authz: Authorizer) -> None:
    first = authz.decide("a", ["ml-developer"], "create", "job")
    assert authz.decide("b", ["ml-developer"], "list", "job") is first


def _principal(subject: str, *roles: str) -> Principal:
    expires = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    return Principal(subject=subject, roles=roles, token_id="t", expires_at=expires)


def test_check_returns_the_decision_or_raises(authz: Authorizer) -> None:
    alice = _principal("alice", "ml-developer")
    assert authz.check(alice, "cancel", "job").role == "ml-developer"
    assert authz.check(alice, "deploy", "model", "m1", {"environment": "staging"}).allowed
    with pytest.raises(PermissionDenied) as info:
        authz.check(alice, "deploy", "model", "m1", {"environment": "production"})
    error = info.value
    assert error.subject == "alice"
    assert error.action == "deploy"
    assert error.resource == "model m1"
    assert error.reason == "condition environment in [staging] not met (role ml-developer)"
    assert "'alice' may not deploy model m1" in str(error)


def test_grant_index_lookup_merges_wildcards() -> None:
    grants = Policy.from_yaml(POLICY).grants
    assert set(grants.lookup("tmp", "purge") or {}) == {"admin", "janitor"}
    assert set(grants.lookup("dataset", "read") or {}) == {"admin", "ml-developer", "reader"}
    assert set(grants.lookup("unheard-of", "list") or {}) == {"admin", "reader"}
    assert set(grants.lookup("unheard-of", "zap") or {}) == {"admin"}
