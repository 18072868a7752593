"""Workflows: pipelines and their runs (each run drawn as a graph of its steps, refreshed while
it runs), cron schedules and their history, experiments (the objective over trials, the best
trial) and dev sessions (their state and timers).

What a viewer may do is offered only when the policy allows it *and* the thing is the viewer's
own or the viewer may change others' (``update`` on the kind, for platform admins), which is
what the workflows service checks.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from gantry.client.workflows import (
    RUN_STATES,
    ExperimentInfo,
    PipelineInfo,
    RunInfo,
    SessionInfo,
    StepRunInfo,
)
from gantry.console import charts
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.render import is_htmx, page
from gantry.console.viewer import Viewer
from gantry.core import GantryError, InvalidInput

router = APIRouter()

#: The overview's tabs: (key, title, policy kind listed).
TABS = (
    ("pipelines", "Pipelines & runs", "pipeline"),
    ("experiments", "Experiments", "experiment"),
    ("sessions", "Dev sessions", "devsession"),
)
#: How many runs the overview and a pipeline's page show (newest first).
RUNS_SHOWN = 50
HISTORY_SHOWN = 100
#: At most this many rows in the experiments and sessions lists.
ROWS_SHOWN = 200
#: Learning curves drawn at most (the best trial and the latest ones).
CURVES_SHOWN = 12

_STEP_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _own_or_admin(viewer: Viewer, owner: str, kind: str) -> bool:
    """Whether the service would let ``viewer`` change something of ``owner``'s."""
    return viewer.subject == owner or viewer.may("update", kind)


def local_time(ms: int, timezone: str) -> str:
    """``ms`` (Unix milliseconds) in ``timezone`` as ``YYYY-MM-DD HH:MM TZ`` ('' for none)."""
    if not ms:
        return ""
    try:
        zone = ZoneInfo(timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ""
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).astimezone(zone)
    return when.strftime("%Y-%m-%d %H:%M %Z")


# ---------------------------------------------------------------------- runs


def step_parents(run: RunInfo, pipeline: PipelineInfo | None) -> dict[str, tuple[str, ...]]:
    """Each step's dependencies: as the run says, else as the pipeline's document declares
    them (``dependsOn`` and ``${steps.X.outputs...}`` references)."""
    parents = {s.name: tuple(s.depends_on) for s in run.steps}
    if any(parents.values()) or pipeline is None:
        return parents
    declared = {p.name: p.depends_on for p in pipeline.step_graph()}
    return {name: declared.get(name, ()) for name in parents}


def step_href(step: StepRunInfo) -> str:
    """Where a step's box leads: its job, or the experiment it ran ('' for none)."""
    job = step.job_id or (step.outputs.get("job", "") if step.kind != "deploy" else "")
    if step.kind == "experiment" and step.outputs.get("experiment"):
        return f"/workflows/experiments/{step.outputs['experiment']}"
    return f"/jobs/{job}" if job else ""


def run_graph(run: RunInfo, parents: Mapping[str, Sequence[str]]) -> Markup:
    """The run as a graph: one box per step coloured by its state, arrows from what it waits
    for, each box linking to its job."""
    nodes = [
        charts.Node(
            id=s.name,
            label=s.name,
            state=s.state,
            href=step_href(s),
            detail=f"{s.kind} · {s.state}" + (f" (try {s.attempt})" if s.attempt > 1 else ""),
        )
        for s in run.steps
    ]
    edges = [
        charts.Edge(source=p, target=s.name, label=f"{s.name} waits for {p}")
        for s in run.steps
        for p in parents.get(s.name, ())
    ]
    return charts.graph(nodes, edges, title=f"{run.pipeline} · run {run.id[:8]}")


def _run_context(
    viewer: Viewer, run: RunInfo, parents: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    mine = _own_or_admin(viewer, run.owner, "pipeline")
    return {
        "run": run,
        "graph": run_graph(run, parents),
        "may_cancel": not run.done and mine and viewer.may("cancel", "pipeline"),
        "may_retry": run.done and mine and viewer.may("run", "pipeline"),
    }


def _live(
    request: Request, viewer: Viewer, kind: str, title: str, done: bool, ctx: dict[str, Any]
) -> HTMLResponse:
    """A page whose live part htmx refreshes (``workflows_<kind>.html``): for htmx, only the
    part (``_workflows_<kind>.html``), which swaps the actions too once the thing is done."""
    if is_htmx(request):
        return page(request, viewer, f"_workflows_{kind}.html", oob=done, **ctx)
    return page(
        request,
        viewer,
        f"workflows_{kind}.html",
        section="workflows",
        title=title,
        oob=False,
        **ctx,
    )


@router.get("/workflows/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, viewer: ViewerDep, apis: ApisDep, run_id: str) -> HTMLResponse:
    """One run: its steps as a graph and a table; htmx asks for the live part every 2 s while
    the run has not finished (the last answer also brings the actions up to date)."""
    with apis.workflows(viewer) as wf:
        run = wf.run(run_id)
        pipeline: PipelineInfo | None = None
        if len(run.steps) > 1 and not any(s.depends_on for s in run.steps):
            try:  # an older service: read the dependencies from the pipeline's document
                pipeline = wf.get(run.pipeline)
            except GantryError:
                pipeline = None
    ctx = _run_context(viewer, run, step_parents(run, pipeline))
    return _live(request, viewer, "run", f"Run {run.id[:8]} of {run.pipeline}", run.done, ctx)


@router.post("/workflows/runs/{run_id}/cancel")
def cancel_run(
    run_id: str, viewer: ViewerDep, apis: ApisDep, reason: str = Form(default="")
) -> Response:
    """Cancel an active run (its running jobs are cancelled, pending steps never start)."""
    viewer.require("cancel", "pipeline", run_id)
    with apis.workflows(viewer) as wf:
        wf.cancel(
            run_id, reason=reason.strip() or f"cancelled from the console by {viewer.subject}"
        )
    return RedirectResponse(f"/workflows/runs/{run_id}", status_code=303)


@router.post("/workflows/runs/{run_id}/retry")
def retry_run(
    run_id: str, viewer: ViewerDep, apis: ApisDep, from_step: str = Form(default="")
) -> Response:
    """Run a finished run's failed and not-run steps again, or ``from_step`` and after."""
    viewer.require("run", "pipeline", run_id)
    step = from_step.strip()
    if step and not _STEP_NAME.match(step):
        raise InvalidInput(
            f"{step!r} is not a step name",
            hint="choose one of the run's steps, or none to retry what failed",
        )
    with apis.workflows(viewer) as wf:
        run = wf.retry(run_id, from_step=step)
    return RedirectResponse(f"/workflows/runs/{run.id or run_id}", status_code=303)


# ---------------------------------------------------------------------- pipelines


@router.get("/workflows/pipelines/{name}", response_class=HTMLResponse)
def pipeline_page(request: Request, viewer: ViewerDep, apis: ApisDep, name: str) -> HTMLResponse:
    """A pipeline: its steps, its schedule (cron pipelines) and the history of its runs."""
    with apis.workflows(viewer) as wf:
        pipeline = wf.get(name)
        runs = wf.runs(pipeline=name, limit=HISTORY_SHOWN)
    steps = pipeline.step_graph()
    graph = charts.graph(
        [charts.Node(id=s.name, label=s.name, detail=s.kind) for s in steps],
        [
            charts.Edge(source=p, target=s.name, label=s.gate or f"{s.name} waits for {p}")
            for s in steps
            for p in s.depends_on
        ],
        title=f"{pipeline.name} · revision {pipeline.revision}",
    )
    schedule = pipeline.schedule
    return page(
        request,
        viewer,
        "workflows_pipeline.html",
        section="workflows",
        title=f"Pipeline {pipeline.name}",
        pipeline=pipeline,
        steps=steps,
        graph=graph,
        runs=runs,
        runs_shown=HISTORY_SHOWN,
        next_local=local_time(schedule.next_fire_ms, schedule.timezone) if schedule else "",
        may_start=viewer.may("run", "pipeline"),
        request_id=uuid.uuid4().hex,
    )


@router.post("/workflows/pipelines/{name}/runs")
def start_run(
    name: str,
    viewer: ViewerDep,
    apis: ApisDep,
    param_name: list[str] = Form(default=[]),
    param_value: list[str] = Form(default=[]),
    request_id: str = Form(default=""),
) -> Response:
    """Start a run of the pipeline as the viewer, with the parameters given."""
    viewer.require("run", "pipeline", name)
    if len(param_name) != len(param_value):
        raise InvalidInput(
            "each parameter needs a name and a value",
            hint="reload the pipeline's page and start the run from its form",
        )
    params: dict[str, str] = {}
    for key, value in zip(param_name, param_value, strict=True):
        if not key.strip():
            raise InvalidInput("a parameter has no name", hint="reload the page and try again")
        if not value.strip():
            raise InvalidInput(
                f"parameter {key.strip()!r} is empty",
                hint="give it a value (the form starts with the pipeline's default)",
            )
        params[key.strip()] = value.strip()
    with apis.workflows(viewer) as wf:
        started = wf.start(name, params, request_id=request_id.strip())
    return RedirectResponse(f"/workflows/runs/{started.run.id}", status_code=303)


# ---------------------------------------------------------------------- experiments


def objective_chart(exp: ExperimentInfo) -> Markup:
    """The objective of each trial (where a pruned one stopped) and the best so far."""
    values = [(float(t.number), t.value) for t in exp.trials if t.value is not None]
    best = [(float(n), v) for n, v in exp.best_so_far()]
    return charts.line_chart(
        [
            charts.Series("objective", values),
            charts.Series("best so far", best, colour=charts.PALETTE[2]),
        ],
        title=f"{exp.metric} by trial ({exp.goal})",
        x_label="trial",
        y_label=exp.metric,
    )


def curves_chart(exp: ExperimentInfo) -> Markup:
    """Learning curves (objective after each epoch) of the best trial and the latest ones."""
    with_curves = [t for t in exp.trials if t.curve]
    shown = with_curves[-CURVES_SHOWN:]
    best = exp.best
    if best is not None and best.curve and best not in shown:
        shown = [best, *shown[1:]]
    series = [
        charts.Series(f"#{t.number}", [(float(e), v) for e, v in t.curve])
        for t in sorted(shown, key=lambda t: t.number)
    ]
    return charts.line_chart(
        series, title=f"{exp.metric} by epoch", x_label="epoch", y_label=exp.metric
    )


def _experiment_context(viewer: Viewer, exp: ExperimentInfo) -> dict[str, Any]:
    run_id = exp.run_id.split("/", 1)[0] if exp.run_id else ""
    return {
        "exp": exp,
        "objective": objective_chart(exp),
        "curves": curves_chart(exp),
        "space": exp.space(),
        "from_run": run_id,
        "may_cancel": not exp.done
        and _own_or_admin(viewer, exp.owner, "experiment")
        and viewer.may("cancel", "experiment"),
    }


@router.get("/workflows/experiments/{name}", response_class=HTMLResponse)
def experiment_page(request: Request, viewer: ViewerDep, apis: ApisDep, name: str) -> HTMLResponse:
    """An experiment: the objective over trials, the best trial, every trial; refreshed every
    2 s by htmx while the search runs."""
    with apis.workflows(viewer) as wf:
        exp = wf.experiment(name)
    ctx = _experiment_context(viewer, exp)
    return _live(request, viewer, "experiment", f"Experiment {exp.name}", exp.done, ctx)


@router.post("/workflows/experiments/{name}/cancel")
def cancel_experiment(
    name: str, viewer: ViewerDep, apis: ApisDep, reason: str = Form(default="")
) -> Response:
    """Cancel a running experiment (its running trials' jobs are cancelled)."""
    viewer.require("cancel", "experiment", name)
    with apis.workflows(viewer) as wf:
        wf.cancel_experiment(
            name, reason=reason.strip() or f"cancelled from the console by {viewer.subject}"
        )
    return RedirectResponse(f"/workflows/experiments/{name}", status_code=303)


# ---------------------------------------------------------------------- dev sessions


@dataclass(frozen=True)
class SessionRow:
    """A session with its timers and what the viewer may do with it."""

    session: SessionInfo
    now_ms: int
    may_stop: bool
    may_resume: bool

    @property
    def generation_started_ms(self) -> int:
        """When the current generation started (else the session)."""
        s = self.session
        if s.history and s.history[-1].started_ms:
            return s.history[-1].started_ms
        return s.started_ms or s.created_ms

    @property
    def expires_ms(self) -> int:
        """When the current generation reaches its lifetime (0 once it has ended)."""
        s = self.session
        if s.done or not s.lifetime_s:
            return 0
        return self.generation_started_ms + int(s.lifetime_s * 1000)

    @property
    def left_s(self) -> float:
        """Seconds until it expires at the latest (0 once it has ended)."""
        return max((self.expires_ms - self.now_ms) / 1000, 0.0) if self.expires_ms else 0.0

    @property
    def up_s(self) -> float:
        """How long the current generation has been up (0 once it has ended)."""
        if self.session.done:
            return 0.0
        return max((self.now_ms - self.generation_started_ms) / 1000, 0.0)


def session_row(viewer: Viewer, s: SessionInfo, now_ms: int) -> SessionRow:
    """The row of ``s`` as ``viewer`` sees it."""
    mine = _own_or_admin(viewer, s.owner, "devsession")
    return SessionRow(
        session=s,
        now_ms=now_ms,
        may_stop=not s.done and mine and viewer.may("cancel", "devsession"),
        may_resume=s.done and mine and viewer.may("run", "devsession"),
    )


@router.get("/workflows/sessions/{name}", response_class=HTMLResponse)
def session_page(request: Request, viewer: ViewerDep, apis: ApisDep, name: str) -> HTMLResponse:
    """A dev session: state, where to reach it (its token only for its owner), its timers and
    every generation."""
    with apis.workflows(viewer) as wf:
        s = wf.session(name)
    return page(
        request,
        viewer,
        "workflows_session.html",
        section="workflows",
        title=f"Dev session {s.name}",
        row=session_row(viewer, s, _now_ms()),
        mine=s.owner == viewer.subject,
    )


@router.post("/workflows/sessions/{name}/stop")
def stop_session(
    name: str, viewer: ViewerDep, apis: ApisDep, reason: str = Form(default="")
) -> Response:
    """Stop an active session: its files are saved and its GPU freed; it can be resumed."""
    viewer.require("cancel", "devsession", name)
    with apis.workflows(viewer) as wf:
        wf.stop_session(
            name, reason=reason.strip() or f"stopped from the console by {viewer.subject}"
        )
    return RedirectResponse(f"/workflows/sessions/{name}", status_code=303)


@router.post("/workflows/sessions/{name}/resume")
def resume_session(name: str, viewer: ViewerDep, apis: ApisDep) -> Response:
    """Start the next generation of an ended session, with its files."""
    viewer.require("run", "devsession", name)
    with apis.workflows(viewer) as wf:
        wf.resume_session(name)
    return RedirectResponse(f"/workflows/sessions/{name}", status_code=303)


# ---------------------------------------------------------------------- the overview


@router.get("/workflows", response_class=HTMLResponse)
def overview(
    request: Request, viewer: ViewerDep, apis: ApisDep, tab: str = "", state: str = ""
) -> HTMLResponse:
    """Pipelines and recent runs, experiments, or dev sessions: one tab per part the viewer
    may list (``?tab=``); runs may be filtered by ``?state=``."""
    tabs = [(key, title) for key, title, kind in TABS if viewer.may("list", kind)]
    kinds = {key: kind for key, _title, kind in TABS}
    if tab and tab not in kinds:
        raise InvalidInput(f"there is no workflows tab {tab!r}", hint=f"one of {', '.join(kinds)}")
    chosen = tab or (tabs[0][0] if tabs else "pipelines")
    viewer.require("list", kinds[chosen])
    if state and state not in RUN_STATES:
        raise InvalidInput(f"unknown run state {state!r}", hint=f"one of {', '.join(RUN_STATES)}")
    ctx: dict[str, Any] = {"pipelines": [], "runs": [], "experiments": [], "rows": []}
    with apis.workflows(viewer) as wf:
        if chosen == "pipelines":
            ctx["pipelines"] = wf.list()[:ROWS_SHOWN]
            ctx["runs"] = wf.runs(state=state, limit=RUNS_SHOWN)
        elif chosen == "experiments":
            ctx["experiments"] = wf.experiments()[:ROWS_SHOWN]
        else:
            now = _now_ms()
            ctx["rows"] = [session_row(viewer, s, now) for s in wf.sessions()[:ROWS_SHOWN]]
    return page(
        request,
        viewer,
        "workflows.html",
        section="workflows",
        title="Workflows",
        tabs=tabs,
        tab=chosen,
        state=state,
        run_states=RUN_STATES,
        runs_shown=RUNS_SHOWN,
        rows_shown=ROWS_SHOWN,
        may_start=viewer.may("run", "pipeline"),
        **ctx,
    )


__all__ = [
    "SessionRow",
    "curves_chart",
    "local_time",
    "objective_chart",
    "router",
    "run_graph",
    "session_row",
    "step_href",
    "step_parents",
]
