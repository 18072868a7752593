"""The shipped policy: what each built-in role may and may not do."""

from __future__ import annotations

import pytest

from gantry.security import Authorizer, default_policy

AUDIT_ACTIONS = ["query", "export", "report", "verify", "prove", "checkpoint"]


@pytest.fixture(scope="module")
def authz() -> Authorizer:
    return Authorizer(default_policy())


def _allowed(
    authz: Authorizer, role: str, action: str, kind: str, attrs: dict[str, str] | None = None
) -> bool:
    return authz.decide(f"user-{role}", [role], action, kind, attrs).allowed


def test_defines_the_built_in_roles() -> None:
    assert default_policy().roles == frozenset(
        {
            "platform-admin",
            "data-steward",
            "annotator",
            "ml-developer",
            "model-consumer",
            "auditor",
            "service",
            "orchestrator",
        }
    )
    assert default_policy() is default_policy()  # loaded once


def test_every_role_is_described() -> None:
    policy = default_policy()
    assert all(policy.description(role) for role in policy.roles)


@pytest.mark.parametrize(
    ("action", "kind"), [("delete", "dataset"), ("query", "audit_log"), ("rotate", "key")]
)
def test_platform_admin_may_do_everything(authz: Authorizer, action: str, kind: str) -> None:
    assert _allowed(authz, "platform-admin", action, kind)


def test_ml_developer_reads_only_deidentified_data(authz: Authorizer) -> None:
    view = {"view": "deidentified"}
    assert _allowed(authz, "ml-developer", "read", "dataset", view)
    raw = authz.decide("dev", ["ml-developer"], "read", "dataset", {"view": "raw"})
    assert not raw.allowed
    assert raw.reason == "condition view in [deidentified] not met (role ml-developer)"
    assert not _allowed(authz, "ml-developer", "read", "dataset")  # no view given: no read


@pytest.mark.parametrize("action", ["create", "read", "list", "cancel", "watch", "logs"])
def test_ml_developer_runs_jobs(authz: Authorizer, action: str) -> None:
    assert _allowed(authz, "ml-developer", action, "job")


def test_ml_developer_models_and_deployments(authz: Authorizer) -> None:
    for action in ["read", "list", "register"]:
        assert _allowed(authz, "ml-developer", action, "model")
    assert _allowed(authz, "ml-developer", "deploy", "model", {"environment": "staging"})
    assert not _allowed(authz, "ml-developer", "deploy", "model", {"environment": "production"})


@pytest.mark.parametrize("action", AUDIT_ACTIONS)
def test_ml_developer_has_no_audit_access(authz: Authorizer, action: str) -> None:
    assert not _allowed(authz, "ml-developer", action, "audit_log")


def test_ml_developer_cannot_manage_grants_or_keys(authz: Authorizer) -> None:
    assert not _allowed(authz, "ml-developer", "create", "grant")
    assert not _allowed(authz, "ml-developer", "rotate", "key")
    assert not _allowed(authz, "ml-developer", "delete", "dataset")


@pytest.mark.parametrize("action", AUDIT_ACTIONS)
def test_auditor_uses_the_audit_api(authz: Authorizer, action: str) -> None:
    assert _allowed(authz, "auditor", action, "audit_log")


@pytest.mark.parametrize(
    ("action", "kind"),
    [("create", "job"), ("read", "job"), ("read", "dataset"), ("deploy", "model"),
     ("delete", "audit_log"), ("publish", "event")],
)  # fmt: skip
def test_auditor_does_nothing_else(authz: Authorizer, action: str, kind: str) -> None:
    decision = authz.decide("eve", ["auditor"], action, kind, {"view": "deidentified"})
    assert not decision.allowed
    assert decision.reason == f"no role of 'eve' (auditor) allows {action} on {kind}"


def test_data_steward_manages_data_and_reads_raw(authz: Authorizer) -> None:
    assert _allowed(authz, "data-steward", "read", "dataset", {"view": "raw"})
    assert _allowed(authz, "data-steward", "grant", "dataset")
    assert _allowed(authz, "data-steward", "revoke", "grant")
    assert _allowed(authz, "data-steward", "rotate", "key")
    assert not _allowed(authz, "data-steward", "create", "job")
    assert not _allowed(authz, "data-steward", "query", "audit_log")


def test_annotator_reads_both_views_and_writes_labels(authz: Authorizer) -> None:
    assert _allowed(authz, "annotator", "read", "dataset", {"view": "raw"})
    assert _allowed(authz, "annotator", "read", "dataset", {"view": "deidentified"})
    assert _allowed(authz, "annotator", "create", "label")
    assert _allowed(authz, "annotator", "update", "label")
    assert not _allowed(authz, "annotator", "delete", "dataset")
    assert not _allowed(authz, "annotator", "create", "job")


def test_service_account_role(authz: Authorizer) -> None:
    assert _allowed(authz, "service", "publish", "event")
    assert _allowed(authz, "service", "read", "node")
    assert not _allowed(authz, "service", "query", "audit_log")
    assert not _allowed(authz, "service", "read", "dataset", {"view": "raw"})


def test_a_model_consumer_may_only_call_models() -> None:
    authz = Authorizer(default_policy())
    assert _allowed(authz, "model-consumer", "infer", "model")
    for action in ("read", "list", "register", "deploy"):  # never the weights or deployments
        assert not authz.decide("app", ["model-consumer"], action, "model").allowed
    assert not authz.decide("app", ["model-consumer"], "read", "dataset", {"view": "raw"}).allowed
    assert _allowed(authz, "ml-developer", "infer", "model")
    assert not authz.decide("eve", ["auditor"], "infer", "model").allowed


def test_compliance_actions_belong_to_auditors_only(authz: Authorizer) -> None:
    checks = [
        ("query", "subject"), ("erase", "subject"), ("list", "subject"),
        ("create", "report"), ("read", "report"), ("list", "report"), ("verify", "report"),
        ("list", "retention"), ("update", "retention"),
        ("create", "hold"), ("list", "hold"), ("delete", "hold"),
        ("archive", "audit_log"), ("purge", "audit_log"),
    ]  # fmt: skip
    for action, kind in checks:
        assert _allowed(authz, "auditor", action, kind), (action, kind)
        for role in ("service", "ml-developer", "data-steward", "annotator", "model-consumer"):
            assert not _allowed(authz, role, action, kind), (role, action, kind)


def test_only_the_workflows_and_audit_services_may_impersonate(authz: Authorizer) -> None:
    assert default_policy().bindings == {
        "workflows": ("orchestrator",),
        "audit": ("orchestrator",),
    }
    for service in ("workflows", "audit"):
        allowed = authz.decide(service, ["service"], "impersonate", "principal")
        assert (allowed.allowed, allowed.reason) == (True, "allowed by role orchestrator")
    assert not authz.decide("governance", ["service"], "impersonate", "principal").allowed
    for role in ("service", "ml-developer", "data-steward", "auditor", "model-consumer"):
        assert not _allowed(authz, role, "impersonate", "principal")


def test_the_orchestrator_may_do_nothing_but_impersonate(authz: Authorizer) -> None:
    assert default_policy().description("orchestrator").startswith("Runs pipelines")
    for action, kind in [("create", "job"), ("deploy", "model"), ("read", "dataset"),
                         ("update", "queue"), ("query", "audit_log")]:  # fmt: skip
        assert not _allowed(authz, "orchestrator", action, kind, {"view": "deidentified"})
