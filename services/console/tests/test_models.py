"""The Models section: the registry, deployments with their traffic, canary analysis and
history, and promote / rollback offered and allowed only to a role that may deploy to the
deployment's environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi.testclient import TestClient

from gantry.client.governance import LineageEdge, ModelVersion, VersionRef
from gantry.client.serving import CanaryInfo, DeploymentInfo, HistoryItem, VersionInfo
from gantry.console.pages.models import canary_checks, canary_weights, group_models
from gantry.core import Unavailable
from gantry.testing.console import ORIGIN, Closing, FakeApis

Console = tuple[TestClient, FakeApis, Callable[..., str]]
DS = "c" * 64

#: The demo's history: v2 promoted by the analysis, v3 rolled back automatically.
_SERVING = "gantry/serving"
_FAILED = "success 0.00%, p99 {p99} ms: success rate 0.00% < 99.00%"
HISTORY = (
    HistoryItem(1000, "deployed", "churn-classifier v1 serves 100%", "dev"),
    HistoryItem(2000, "canary.started", "canary churn-classifier v2 gets 20%, v1 keeps 80%", "dev"),
    HistoryItem(
        3000,
        "canary.step",
        "canary v2 passed (11 requests, success 100.00%, p99 6.1 ms); weight 20% -> 40%",
        _SERVING,
    ),
    HistoryItem(
        4000,
        "canary.step",
        "canary v2 passed (18 requests, success 100.00%, p99 5.7 ms); weight 40% -> 60%",
        _SERVING,
    ),
    HistoryItem(
        5000,
        "promoted",
        "v2 promoted to 100% (passed at 60%: 38 requests, success 100.00%, p99 6.9 ms); v1 removed",
        _SERVING,
    ),
    HistoryItem(6000, "canary.started", "canary churn-classifier v3 gets 20%, v2 keeps 80%", "dev"),
    HistoryItem(
        7000,
        "canary.check_failed",
        "canary v3 failed a check (1/3): 12 requests, " + _FAILED.format(p99=17.9),
        _SERVING,
    ),
    HistoryItem(
        8000,
        "canary.check_failed",
        "canary v3 failed a check (2/3): 15 requests, " + _FAILED.format(p99=7.8),
        _SERVING,
    ),
    HistoryItem(
        9000,
        "rolled_back",
        "canary v3 rolled back: 3 failed checks (threshold 3), last: 9 requests, "
        + _FAILED.format(p99=5.7)
        + "; v2 serves 100%",
        _SERVING,
    ),
)


def _version(v: int, weight: int, role: str = "stable") -> VersionInfo:
    return VersionInfo(v, weight, role, "ready", "loaded", 1, False, "cpu", 100, 2, 6.5, 0)


def _deployment(environment: str = "staging", *, progressing: bool = False) -> DeploymentInfo:
    versions: tuple[VersionInfo, ...]
    history: tuple[HistoryItem, ...]
    if progressing:
        versions = (_version(2, 80), _version(4, 20, "canary"))
        canary = CanaryInfo(
            "progressing", 4, 2, 20, 0, "5 requests, success 100.00%, p99 4.0 ms", 10_000, 11_000
        )
        started = "canary churn-classifier v4 gets 20%, v2 keeps 80%"
        history = (*HISTORY, HistoryItem(10_000, "canary.started", started, "dev"))
    else:
        versions = (_version(2, 100),)
        canary = CanaryInfo("rolled_back", 3, 2, 0, 3, "9 requests", 6000, 9000)
        history = HISTORY
    return DeploymentInfo(
        name="churn-classifier",
        model="churn-classifier",
        versions=versions,
        canary=canary,
        history=history,
        environment=environment,
        device="cpu",
        quantize=False,
        anonymous=False,
        sticky_header="",
        shadow_percent=0,
        settings={"canary": {"max_percent": 60, "failure_threshold": 3}},
    )


def _model(v: int, job: str = "j-1") -> ModelVersion:
    return ModelVersion(
        name="churn-classifier",
        version=v,
        digest="d" * 64,
        bytes=21_509,
        framework="pytorch",
        job_id=job,
        metrics={"accuracy": 0.8275},
        registered_by="dev",
        created_ms=1_700_000_000_000 + v,
        trained_on=(VersionRef("churn", DS),) if job else (),
        description=f"version {v}",
    )


class _Gov:
    def __init__(self) -> None:
        self.lineage_asked: list[dict[str, Any]] = []

    def list_models(self, name: str = "") -> list[ModelVersion]:
        found = [_model(1), _model(2), _model(3, job=""), replace(_model(1), name="other")]
        return [m for m in found if not name or m.name == name]

    def lineage(self, **kw: Any) -> list[LineageEdge]:
        self.lineage_asked.append(kw)
        return [
            LineageEdge("dataset_version", f"churn@{DS}", "job", "j-1", 1),
            LineageEdge(
                "job", "j-1", "model_version", f"churn-classifier:{kw['model_version']}", 2
            ),
        ]


class _Serving:
    def __init__(self, deployment: DeploymentInfo) -> None:
        self.deployment = deployment
        self.calls: list[tuple[str, str, str]] = []

    def list(self) -> list[DeploymentInfo]:
        return [self.deployment]

    def get(self, name: str) -> DeploymentInfo:
        self.calls.append(("get", name, ""))
        return self.deployment

    def promote(self, name: str) -> DeploymentInfo:
        self.calls.append(("promote", name, ""))
        return self.deployment

    def rollback(self, name: str, reason: str = "") -> DeploymentInfo:
        self.calls.append(("rollback", name, reason))
        return self.deployment


class _Down:
    def list(self) -> list[DeploymentInfo]:
        raise Unavailable("the serving service is unreachable", hint="start it")


def _use(apis: FakeApis, deployment: DeploymentInfo | None = None) -> tuple[_Gov, _Serving]:
    gov, serving = _Gov(), _Serving(deployment or _deployment())
    apis.factories["governance"] = lambda viewer: Closing(gov)
    apis.factories["serving"] = lambda viewer: Closing(serving)
    return gov, serving


def test_the_registry_groups_versions_and_links_jobs_and_datasets(console: Console) -> None:
    client, apis, login = console
    _use(apis)
    login("dev", "ml-developer")
    page = client.get("/models")
    assert page.status_code == 200
    text = page.text
    assert 'data-model="churn-classifier"' in text and 'data-model="other"' in text
    assert 'href="/models/churn-classifier?version=3"' in text
    assert f'href="/data/churn/lineage?version={DS}"' in text  # v1's, the other model's
    assert 'href="/jobs/j-1"' in text
    assert 'data-deployment="churn-classifier"' in text
    assert 'data-version="2" data-weight="100"' in text and "rolled back" in text


def test_the_registry_still_shows_when_serving_is_down(console: Console) -> None:
    client, apis, login = console
    _use(apis)
    apis.factories["serving"] = lambda viewer: Closing(_Down())
    login("dev", "ml-developer")
    page = client.get("/models")
    assert page.status_code == 200
    assert 'data-model="churn-classifier"' in page.text
    assert "the serving service is unreachable" in page.text


def test_a_role_without_models_is_refused_before_any_call(console: Console) -> None:
    client, apis, login = console
    _use(apis)
    login("sam", "data-steward")
    for path in ("/models", "/models/churn-classifier", "/models/deployments/churn-classifier"):
        reply = client.get(path)
        assert reply.status_code == 403, path
    assert apis.calls == []


def test_the_deployment_page_charts_the_canary_checks_and_lists_the_history(
    console: Console,
) -> None:
    client, apis, login = console
    _use(apis)
    login("dev", "ml-developer")
    page = client.get("/models/deployments/churn-classifier")
    assert page.status_code == 200
    text = page.text
    assert 'data-testid="traffic"' in text and 'data-weight="100"' in text
    assert 'data-testid="canary" data-phase="rolled_back"' in text
    for chart in ("canary-latency", "canary-errors", "canary-weight-chart", "traffic-chart"):
        assert f'data-testid="{chart}"><svg' in text, chart
    assert text.count('data-outcome="failed"') == 2 and 'data-outcome="promoted"' in text
    assert 'data-outcome="rolled_back"' in text and "17.9 ms" in text
    assert text.count("<tr data-action=") == len(HISTORY)
    assert text.index('data-action="rolled_back"') < text.index('data-action="deployed"')
    assert 'data-testid="promote"' not in text  # nothing in progress: nothing to promote
    assert "every 3s" not in text  # and nothing to poll


def test_actions_are_offered_to_who_may_deploy_to_the_environment(console: Console) -> None:
    client, apis, login = console
    _use(apis, _deployment("staging", progressing=True))
    login("dev", "ml-developer")
    page = client.get("/models/deployments/churn-classifier")
    assert 'data-testid="promote"' in page.text and 'data-testid="rollback"' in page.text
    assert 'hx-trigger="every 3s"' in page.text  # the live part refreshes during a canary
    assert 'data-outcome="latest"' in page.text  # the canary's last check, not yet in history
    _use(apis, _deployment("production", progressing=True))
    page = client.get("/models/deployments/churn-classifier")
    assert 'data-testid="promote"' not in page.text
    assert 'data-testid="no-actions"' in page.text
    login("ada", "platform-admin")
    page = client.get("/models/deployments/churn-classifier")
    assert 'data-testid="promote"' in page.text


def test_promote_and_rollback_by_an_allowed_role(console: Console) -> None:
    client, apis, login = console
    _gov, serving = _use(apis, _deployment("production", progressing=True))
    login("ada", "platform-admin")
    reply = client.post("/models/deployments/churn-classifier/promote", headers={"origin": ORIGIN})
    assert reply.status_code == 303
    assert reply.headers["location"] == "/models/deployments/churn-classifier"
    reply = client.post(
        "/models/deployments/churn-classifier/rollback",
        data={"reason": "  latency regression  "},
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 303
    assert ("promote", "churn-classifier", "") in serving.calls
    assert ("rollback", "churn-classifier", "latency regression") in serving.calls


def test_a_forced_promote_to_production_by_a_developer_is_refused(console: Console) -> None:
    client, apis, login = console
    _gov, serving = _use(apis, _deployment("production", progressing=True))
    login("dev", "ml-developer")
    for action in ("promote", "rollback"):
        reply = client.post(
            f"/models/deployments/churn-classifier/{action}", headers={"origin": ORIGIN}
        )
        assert reply.status_code == 403 and "Refused" in reply.text
    assert [c[0] for c in serving.calls] == ["get", "get"]  # looked up, never changed


def test_a_role_that_may_deploy_nowhere_is_refused_before_any_call(console: Console) -> None:
    client, apis, login = console
    _use(apis, _deployment(progressing=True))
    login("sam", "data-steward")
    reply = client.post("/models/deployments/churn-classifier/promote", headers={"origin": ORIGIN})
    assert reply.status_code == 403
    assert apis.calls == []


def test_an_overlong_rollback_reason_is_a_400(console: Console) -> None:
    client, apis, login = console
    _gov, serving = _use(apis, _deployment(progressing=True))
    login("ada", "platform-admin")
    reply = client.post(
        "/models/deployments/churn-classifier/rollback",
        data={"reason": "x" * 600},
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 400 and "at most 500 characters" in reply.text
    assert all(c[0] != "rollback" for c in serving.calls)


def test_the_model_page_shows_versions_lineage_and_deployments(console: Console) -> None:
    client, apis, login = console
    gov, _serving = _use(apis)
    login("dev", "ml-developer")
    page = client.get("/models/churn-classifier?version=2")
    assert page.status_code == 200
    assert 'data-testid="model-version-info" data-version="2"' in page.text
    assert gov.lineage_asked == [{"model": "churn-classifier", "model_version": 2}]
    assert 'data-node="job:j-1"' in page.text and 'href="/jobs/j-1"' in page.text
    assert 'data-deployment="churn-classifier"' in page.text
    latest = client.get("/models/churn-classifier")
    assert 'data-testid="model-version-info" data-version="3"' in latest.text
    missing = client.get("/models/churn-classifier?version=9")
    assert missing.status_code == 404 and "v3, v2, v1" in missing.text
    assert client.get("/models/churn-classifier?version=-1").status_code == 400


def test_canary_checks_and_weights_come_from_the_history() -> None:
    checks = canary_checks(_deployment())
    assert [(c.version, c.outcome) for c in checks] == [
        (2, "passed"), (2, "passed"), (2, "promoted"),
        (3, "failed"), (3, "failed"), (3, "rolled_back"),
    ]  # fmt: skip
    assert checks[3].p99_ms == 17.9 and checks[3].error_pct == 100.0
    assert checks[0].requests == 11 and checks[0].error_pct == 0.0
    weights = canary_weights(_deployment())
    assert weights == {
        2: [(2000, 20), (3000, 40), (4000, 60), (5000, 100)],
        3: [(6000, 20), (9000, 0)],
    }
    live = canary_checks(_deployment(progressing=True))
    assert live[-1].outcome == "latest" and live[-1].version == 4


def test_group_models_sorts_names_and_versions() -> None:
    rows = group_models([_model(1), replace(_model(1), name="a"), _model(3)])
    assert [r.name for r in rows] == ["a", "churn-classifier"]
    assert [v.version for v in rows[1].versions] == [3, 1] and rows[1].latest.version == 3


def test_a_fresh_deployment_without_any_canary_history_renders(console: Console) -> None:
    """A deployment whose history holds no canary check (just deployed) has no weight chart:
    the page must still render (found by the browser test)."""
    import dataclasses

    client, apis, login = console
    fresh = dataclasses.replace(
        _deployment(),
        canary=CanaryInfo("", 0, 0, 0, 0, "", 0, 0),
        history=(HistoryItem(1000, "deployed", "churn-classifier v1 deployed", "dev"),),
    )
    _use(apis, fresh)
    login("dev", "ml-developer")
    page = client.get("/models/deployments/churn-classifier")
    assert page.status_code == 200, page.text[-2000:]
    assert 'data-testid="traffic"' in page.text
    assert 'data-testid="canary-weight-chart"' not in page.text
