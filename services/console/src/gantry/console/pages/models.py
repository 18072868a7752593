"""Models: the registry (models, their versions, where each came from) and the deployments
serving them — traffic weights, canary progress with the latency and error rate of each
check, promotions and rollbacks, and the promote and rollback actions for a role that may
deploy to the deployment's environment."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from gantry.client.governance import LineageEdge, ModelVersion
from gantry.client.serving import DeploymentInfo, HistoryItem
from gantry.console import charts
from gantry.console.apis import Apis
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.pages.data import human_bytes, lineage_graph
from gantry.console.render import page
from gantry.console.viewer import Viewer
from gantry.core import GantryError, InvalidInput, NotFound

router = APIRouter()

#: Models listed on the registry page.
MODEL_LIMIT = 200
#: The serving environments (``deploy`` on ``model`` is decided per environment).
ENVIRONMENTS = ("staging", "production")
#: The figures of a canary check as the serving service writes them in the history.
_FIGURES = re.compile(
    r"(?P<requests>\d+) requests, success (?P<success>[\d.]+)%, p99 (?P<p99>[\d.]+) ms"
)
_VERSION = re.compile(r"\bv(?P<version>\d+)\b")
_WEIGHT_STEP = re.compile(r"weight (?P<old>\d+)% -> (?P<new>\d+)%")
_STARTED = re.compile(r"\bv(?P<version>\d+) gets (?P<weight>\d+)%")
#: History actions that end a canary, with the colour of the band drawn over their span.
_OUTCOMES = {"promoted": "#1f8a4c", "rolled_back": "#c53030"}
_REASON_CHARS = 500


@dataclass(frozen=True)
class ModelRow:
    """A registered model: its versions, newest first."""

    name: str
    versions: tuple[ModelVersion, ...]

    @property
    def latest(self) -> ModelVersion:
        return self.versions[0]

    @property
    def first_created_ms(self) -> int:
        return min(v.created_ms for v in self.versions)


@dataclass(frozen=True)
class Check:
    """One canary analysis as the history records it."""

    at_ms: int
    version: int
    outcome: str  #: passed, failed, promoted, rolled_back, latest
    requests: int
    success_pct: float
    p99_ms: float

    @property
    def error_pct(self) -> float:
        return max(0.0, 100.0 - self.success_pct)


def group_models(versions: Sequence[ModelVersion]) -> list[ModelRow]:
    """Model versions grouped by model name, names sorted, versions newest first."""
    by_name: dict[str, list[ModelVersion]] = {}
    for v in versions:
        by_name.setdefault(v.name, []).append(v)
    return [
        ModelRow(name, tuple(sorted(vs, key=lambda v: v.version, reverse=True)))
        for name, vs in sorted(by_name.items())
    ]


def _history(d: DeploymentInfo) -> list[HistoryItem]:
    """The deployment's history, oldest first."""
    return sorted(d.history, key=lambda h: h.at_ms)


def canary_checks(d: DeploymentInfo) -> list[Check]:
    """The analysis points of every canary, from the history (and the current canary's last
    check when it is still progressing and that check changed nothing)."""
    checks: list[Check] = []
    outcome_of = {
        "canary.step": "passed",
        "canary.check_failed": "failed",
        "promoted": "promoted",
        "rolled_back": "rolled_back",
    }
    for h in _history(d):
        outcome = outcome_of.get(h.action)
        figures = _FIGURES.search(h.detail) if outcome else None
        version = _VERSION.search(h.detail)
        if outcome is None or figures is None or version is None:
            continue
        checks.append(_check(h.at_ms, int(version["version"]), outcome, figures))
    c = d.canary
    last = _FIGURES.search(c.last_check) if c.phase == "progressing" else None
    if last is not None and all(k.at_ms != c.updated_ms for k in checks):
        checks.append(_check(c.updated_ms, c.canary_version, "latest", last))
    return checks


def _check(at_ms: int, version: int, outcome: str, m: re.Match[str]) -> Check:
    return Check(at_ms, version, outcome, int(m["requests"]), float(m["success"]), float(m["p99"]))


def canary_weights(d: DeploymentInfo) -> dict[int, list[tuple[int, int]]]:
    """Per canary version, its weight over time (ms, percent) from the history."""
    out: dict[int, list[tuple[int, int]]] = {}
    current = 0
    for h in _history(d):
        if h.action == "canary.started" and (m := _STARTED.search(h.detail)):
            current = int(m["version"])
            out.setdefault(current, []).append((h.at_ms, int(m["weight"])))
        elif h.action == "canary.step" and current and (m := _WEIGHT_STEP.search(h.detail)):
            out.setdefault(current, []).append((h.at_ms, int(m["new"])))
        elif h.action == "promoted" and current:
            out.setdefault(current, []).append((h.at_ms, 100))
            current = 0
        elif h.action == "rolled_back" and current:
            out.setdefault(current, []).append((h.at_ms, 0))
            current = 0
    return out


def canary_bands(d: DeploymentInfo, origin_ms: int) -> list[tuple[float, float, str]]:
    """Shaded spans: each canary from its start to its promotion (green) or rollback (red)."""
    bands: list[tuple[float, float, str]] = []
    start: int | None = None
    for h in _history(d):
        if h.action == "canary.started":
            start = h.at_ms
        elif h.action in _OUTCOMES and start is not None:
            bands.append(
                ((start - origin_ms) / 1000, (h.at_ms - origin_ms) / 1000, _OUTCOMES[h.action])
            )
            start = None
    return bands


def canary_charts(d: DeploymentInfo) -> dict[str, Markup]:
    """Latency, error rate and weight of every canary over time (seconds since the first
    canary started), from the analysis points the history recorded."""
    checks = canary_checks(d)
    weights = canary_weights(d)
    starts = [h.at_ms for h in _history(d) if h.action == "canary.started"]
    times = starts + [c.at_ms for c in checks]
    if not times:
        message = "no canary has run on this deployment"
        return {"latency": charts.empty(message), "errors": charts.empty(message)}
    origin = min(times)
    bands = canary_bands(d, origin)
    versions = sorted({c.version for c in checks} | set(weights))

    def series(pick: str) -> list[charts.Series]:
        out = []
        for v in versions:
            points = [
                ((c.at_ms - origin) / 1000, c.p99_ms if pick == "p99" else c.error_pct)
                for c in checks
                if c.version == v
            ]
            out.append(charts.Series(f"v{v}", points))
        return out

    x_label = "seconds since the first canary started"
    result = {
        "latency": charts.line_chart(
            series("p99"),
            title="Canary p99 latency per check",
            x_label=x_label,
            y_label="p99 ms",
            y_min=0,
            bands=bands,
        ),
        "errors": charts.line_chart(
            series("errors"),
            title="Canary error rate per check",
            x_label=x_label,
            y_label="errors %",
            y_min=0,
            bands=bands,
        ),
    }
    if weights:
        result["weight"] = charts.line_chart(
            [
                charts.Series(f"v{v}", [((t - origin) / 1000, float(w)) for t, w in points])
                for v, points in sorted(weights.items())
            ],
            title="Canary traffic weight",
            x_label=x_label,
            y_label="weight %",
            y_min=0,
            y_max=100,
            bands=bands,
        )
    return result


def traffic_bar(d: DeploymentInfo) -> Markup:
    """One bar: the routed traffic split between the deployment's versions."""
    weights = d.weights()
    return charts.stacked_bars(
        ["traffic"],
        [f"v{v}" for v in weights],
        [[float(w) for w in weights.values()]],
        title="Traffic weights",
        unit="%",
    )


def may_deploy_anywhere(viewer: Viewer) -> bool:
    """True when ``viewer`` may deploy to some environment."""
    return any(viewer.may("deploy", "model", environment=e) for e in ENVIRONMENTS)


@router.get("/models", response_class=HTMLResponse)
def models(request: Request, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """Registered models and the deployments serving them."""
    if not viewer.may("read", "model"):
        viewer.require("list", "model")
    rows: list[ModelRow] = []
    deployments: list[DeploymentInfo] = []
    problems: list[GantryError] = []
    if viewer.may("list", "model"):
        with apis.governance(viewer) as gov:
            rows = group_models(gov.list_models())
    if viewer.may("read", "model"):
        try:
            with apis.serving(viewer) as serving:
                deployments = serving.list()
        except GantryError as exc:  # the registry still shows
            problems.append(exc)
    return page(
        request,
        viewer,
        "models.html",
        section="models",
        title="Models",
        rows=rows[:MODEL_LIMIT],
        more=max(0, len(rows) - MODEL_LIMIT),
        deployments=deployments,
        problems=problems,
        may_read_jobs=viewer.may("read", "job"),
        may_lineage=viewer.may("list", "dataset"),
        may_serving=viewer.may("read", "model"),
    )


@router.get("/models/deployments/{name}", response_class=HTMLResponse)
def deployment(request: Request, name: str, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """A deployment: traffic per version, canary progress and its charts, history, actions."""
    viewer.require("read", "model", name)
    with apis.serving(viewer) as serving:
        d = serving.get(name)
    may_act = viewer.may("deploy", "model", environment=d.environment)
    canary_settings = d.settings.get("canary", {})
    return page(
        request,
        viewer,
        "models_deployment.html",
        section="models",
        title=f"Deployment {name}",
        d=d,
        traffic=traffic_bar(d),
        charts=canary_charts(d),
        checks=canary_checks(d),
        history=list(reversed(_history(d))),
        canary_max=int(canary_settings.get("max_percent", 0) or 0) or 100,
        may_act=may_act,
        progressing=d.canary.phase == "progressing",
    )


def _require_deploy(viewer: Viewer, name: str, apis: Apis) -> None:
    """Refuse a viewer who may deploy nowhere before asking anything; else refuse one who
    may not deploy to this deployment's environment (the service decides again)."""
    if not may_deploy_anywhere(viewer):
        viewer.require("deploy", "model", name)
    with apis.serving(viewer) as serving:
        environment = serving.get(name).environment
    viewer.require("deploy", "model", f"{name} ({environment})", environment=environment)


@router.post("/models/deployments/{name}/promote")
def promote(name: str, viewer: ViewerDep, apis: ApisDep) -> Response:
    """Promote the deployment's canary now."""
    _require_deploy(viewer, name, apis)
    with apis.serving(viewer) as serving:
        serving.promote(name)
    return RedirectResponse(f"/models/deployments/{quote(name)}", status_code=303)


@router.post("/models/deployments/{name}/rollback")
def rollback(
    name: str, viewer: ViewerDep, apis: ApisDep, reason: str = Form(default="")
) -> Response:
    """Roll the deployment's canary back now, saying why."""
    _require_deploy(viewer, name, apis)
    why = reason.strip()
    if len(why) > _REASON_CHARS:
        raise InvalidInput(
            f"the reason is {len(why)} characters long",
            hint=f"say why in at most {_REASON_CHARS} characters",
        )
    with apis.serving(viewer) as serving:
        serving.rollback(name, why or "rolled back from the console")
    return RedirectResponse(f"/models/deployments/{quote(name)}", status_code=303)


@router.get("/models/{name}", response_class=HTMLResponse)
def model(
    request: Request, name: str, viewer: ViewerDep, apis: ApisDep, version: int = 0
) -> HTMLResponse:
    """A model: its versions, one version's metrics, signature and lineage, and the
    deployments serving it."""
    viewer.require("list", "model", name)
    if version < 0:
        raise InvalidInput(f"model version {version} does not exist", hint="versions start at 1")
    edges: list[LineageEdge] = []
    lineage_error: GantryError | None = None
    problems: list[GantryError] = []
    deployments: list[DeploymentInfo] = []
    may_lineage = viewer.may("list", "dataset")
    with apis.governance(viewer) as gov:
        versions = sorted(gov.list_models(name), key=lambda v: v.version, reverse=True)
        if not versions:
            raise NotFound("model", name, hint="see the registered models on /models")
        chosen = next((v for v in versions if v.version == version), None)
        if chosen is None:
            if version:
                raise NotFound(
                    "model version",
                    f"{name} v{version}",
                    hint=f"{name} has versions "
                    + ", ".join(f"v{v.version}" for v in versions[:20]),
                )
            chosen = versions[0]
        if may_lineage:
            try:
                edges = gov.lineage(model=name, model_version=chosen.version)
            except GantryError as exc:
                lineage_error = exc
    if viewer.may("read", "model"):
        try:
            with apis.serving(viewer) as serving:
                deployments = [d for d in serving.list() if d.model == name]
        except GantryError as exc:
            problems.append(exc)
    graph = (
        lineage_graph(edges, centre=f"model_version:{name}:{chosen.version}", viewer=viewer)
        if may_lineage
        else None
    )
    return page(
        request,
        viewer,
        "models_detail.html",
        section="models",
        title=f"Model {name}",
        name=name,
        versions=versions,
        chosen=chosen,
        graph=graph,
        edges=edges,
        lineage_error=lineage_error,
        deployments=deployments,
        problems=problems,
        size=human_bytes,
        may_read_jobs=viewer.may("read", "job"),
        may_lineage=may_lineage,
    )


__all__ = [
    "Check",
    "ModelRow",
    "canary_charts",
    "canary_checks",
    "canary_weights",
    "group_models",
    "may_deploy_anywhere",
    "router",
    "traffic_bar",
]
