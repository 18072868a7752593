"""Jobs: the list with filters, a job's page (summary, timeline, placements, live progress, loss
curve, per-rank phases and the straggler verdict, log tail with follow), submitting a
TrainingJob from a YAML editor validated as it is typed, and cancelling.

Live parts poll fragments with htmx (no script of the console's own): progress every 2 s while
the job runs (the page reloads once when it finishes), the profile every 5 s, the log tail every
2 s while "follow" is on.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from gantry.client.profiler import PHASES, FindingInfo, JobProfileInfo
from gantry.client.scheduler import JOB_STATES, JobInfo, LogLine
from gantry.console import charts
from gantry.console.apis import Apis
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.render import is_htmx, page, status_of
from gantry.console.viewer import Viewer
from gantry.core import GantryError, InvalidInput

router = APIRouter()

#: Rows of the job list.
LIST_LIMIT = 200
#: Jobs searched by name or id (newest first) when the list is searched.
SEARCH_LIMIT = 1000
#: Log lines shown by default, and the most a viewer may ask for.
LOG_TAIL = 200
MAX_TAIL = 5000
#: The longest spec the editor sends on (the service has its own limit).
MAX_SPEC_CHARS = 256 * 1024
#: The state filter's choices: ``active`` is every job not finished.
STATE_FILTERS = ("active", *JOB_STATES)

#: The editor's starting text: two CPU workers train a small sequence model for 200 steps (a
#: few seconds); rank 1's data loader is slowed, so the profiler names it a straggler.
EXAMPLE_SPEC = """\
apiVersion: gantry/v1
kind: TrainingJob
metadata:
  name: console-example
  priority: normal
  labels: {source: console}
spec:
  replicas: 2
  resources: {gpus: 0, cpus: 1, memory: 1Gi}
  entrypoint:
    task: gantry.training.examples.sequences:task
    args: [max_steps=200, slow_rank=1, slow_ms=1.5]
  training: {precision: fp32}
  maxRuntime: 10m
"""


@dataclass(frozen=True)
class SpecProblems:
    """What the service found wrong with a spec: a heading, the problems, what to do."""

    heading: str
    problems: list[str]
    hint: str = ""


def spec_problems(error: InvalidInput) -> SpecProblems:
    """The service's refusal of a spec as a list: ``the job spec is invalid:`` is followed by
    one problem a line; any other message is one problem (a YAML error keeps its lines)."""
    message, hint = error.message, error.hint or ""
    if not hint and " — " in message:
        message, _, hint = message.rpartition(" — ")
    head, _, rest = message.partition("\n")
    if head.rstrip().endswith(":") and rest.strip():
        problems = [line.strip() for line in rest.splitlines() if line.strip()]
        return SpecProblems(head.rstrip().removesuffix(":"), problems, hint)
    return SpecProblems("", [message.strip()], hint)


def _request_id() -> str:
    """A fresh id for one rendering of the editor: submitting twice makes one job."""
    return f"console-{secrets.token_hex(8)}"


def may_touch(viewer: Viewer, job: JobInfo) -> bool:
    """Whether the scheduler lets ``viewer`` cancel ``job`` or read its logs: its owner, or a
    principal allowed ``update job`` (platform admins)."""
    return job.owner == viewer.subject or viewer.may("update", "job")


def may_cancel(viewer: Viewer, job: JobInfo) -> bool:
    """Whether to offer cancelling ``job`` to ``viewer``."""
    return not job.terminal and viewer.may("cancel", "job") and may_touch(viewer, job)


def may_read_logs(viewer: Viewer, job: JobInfo) -> bool:
    """Whether to show ``job``'s log tail to ``viewer``."""
    return viewer.may("logs", "job") and may_touch(viewer, job)


def _tail(text: str) -> int:
    """The ``tail`` parameter: how many log lines (1..MAX_TAIL)."""
    if not text.strip():
        return LOG_TAIL
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= MAX_TAIL:
        raise InvalidInput(
            f"tail must be a number of lines from 1 to {MAX_TAIL}, not {text!r}",
            hint=f"e.g. ?tail={LOG_TAIL}",
        )
    return value


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "on", "yes")


# ---------------------------------------------------------------------- the list


@router.get("/jobs", response_class=HTMLResponse)
def jobs(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    state: str = "",
    queue: str = "",
    owner: str = "",
    q: str = "",
) -> HTMLResponse:
    """The job list: newest first, filtered by state, queue, owner and a name or id search."""
    state, queue, owner, q = state.strip(), queue.strip(), owner.strip(), q.strip()
    if state and state not in STATE_FILTERS:
        raise InvalidInput(
            f"there is no job state {state!r}", hint=f"use one of {', '.join(STATE_FILTERS)}"
        )
    with apis.scheduler(viewer) as sched:
        found = sched.list(
            queue=queue, state=state, owner=owner, limit=SEARCH_LIMIT if q else LIST_LIMIT + 1
        )
        queue_names: list[str] = []
        if viewer.may("list", "queue"):
            try:
                queue_names = sorted(x.name for x in sched.queues())
            except GantryError:  # only the filter's suggestions are missing
                queue_names = []
    if q:
        needle = q.lower()
        found = [j for j in found if needle in j.id.lower() or needle in j.name.lower()]
    return page(
        request,
        viewer,
        "jobs.html",
        section="jobs",
        title="Jobs",
        jobs=found[:LIST_LIMIT],
        more=len(found) > LIST_LIMIT,
        limit=LIST_LIMIT,
        filters={"state": state, "queue": queue, "owner": owner, "q": q},
        states=STATE_FILTERS,
        queue_names=queue_names,
        may_create=viewer.may("create", "job"),
    )


# ---------------------------------------------------------------------- submitting


def _editor(
    request: Request,
    viewer: Viewer,
    *,
    spec: str,
    request_id: str,
    problems: SpecProblems | None = None,
    error: GantryError | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    return page(
        request,
        viewer,
        "jobs_new.html",
        section="jobs",
        title="Submit a job",
        spec=spec,
        request_id=request_id,
        problems=problems,
        error=error,
        status_code=status_code,
    )


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job(request: Request, viewer: ViewerDep) -> HTMLResponse:
    """The YAML editor, with a small example job that runs in seconds on CPUs."""
    viewer.require("create", "job")
    return _editor(request, viewer, spec=EXAMPLE_SPEC, request_id=_request_id())


def _too_long(spec: str) -> InvalidInput | None:
    if len(spec) > MAX_SPEC_CHARS:
        return InvalidInput(
            f"the spec is {len(spec):,} characters; the editor takes at most {MAX_SPEC_CHARS:,}",
            hint="a TrainingJob document is a few dozen lines: move data into datasets",
        )
    return None


@router.post("/jobs/validate", response_class=HTMLResponse)
def validate(
    request: Request, viewer: ViewerDep, apis: ApisDep, spec: str = Form(default="")
) -> HTMLResponse:
    """Inline validation (a dry run): the service's problems as a list, or what would run.

    Always a 200 fragment (htmx swaps only those): the outcome is in the fragment."""
    viewer.require("create", "job")
    ctx: dict[str, Any] = {"job": None, "problems": None, "error": None}
    try:
        bad = _too_long(spec)
        if bad is not None:
            raise bad
        with apis.scheduler(viewer) as sched:
            ctx["job"] = sched.submit(spec, dry_run=True).job
    except InvalidInput as exc:
        ctx["problems"] = spec_problems(exc)
    except GantryError as exc:  # e.g. the scheduler is down: say so where the verdict goes
        ctx["error"] = exc
    return page(request, viewer, "_job_validation.html", **ctx)


@router.post("/jobs", response_class=HTMLResponse)
def submit(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    spec: str = Form(default=""),
    request_id: str = Form(default=""),
) -> Response:
    """Submit for real; the job's page (303). A refused spec re-renders the editor with the
    text as typed and the problems (400); any other failure also keeps the text."""
    viewer.require("create", "job")
    request_id = request_id.strip()[:128] or _request_id()
    try:
        bad = _too_long(spec)
        if bad is not None:
            raise bad
        with apis.scheduler(viewer) as sched:
            result = sched.submit(spec, request_id=request_id)
    except InvalidInput as exc:
        return _editor(
            request,
            viewer,
            spec=spec,
            request_id=request_id,
            problems=spec_problems(exc),
            status_code=400,
        )
    except GantryError as exc:  # refused or unavailable: keep the user's text on the page
        return _editor(
            request,
            viewer,
            spec=spec,
            request_id=request_id,
            error=exc,
            status_code=status_of(exc),
        )
    target = f"/jobs/{result.job.id}" + ("?duplicate=1" if result.duplicate else "")
    return RedirectResponse(target, status_code=303)


# ---------------------------------------------------------------------- one job


@dataclass
class ProfileView:
    """What the page shows of a job's profile: charts, verdicts, or why there are none."""

    profile: JobProfileInfo | None = None
    loss: Markup | None = None
    phases: Markup | None = None
    straggler: FindingInfo | None = None
    past_straggler: FindingInfo | None = None
    standing: list[FindingInfo] = field(default_factory=list)
    cleared: list[FindingInfo] = field(default_factory=list)
    missing: str = ""
    error: GantryError | None = None


def _rank_label(rank: int) -> str:
    return f"rank {rank}"  # short: the chart's label column is narrow (nodes: placements)


def loss_curve(profile: JobProfileInfo) -> Markup:
    """Loss against step, one line per rank (each timeline window's last step)."""
    series = [
        charts.Series(
            f"rank {r.rank}",
            [
                (float(p.last_step), float(p.loss))
                for p in r.timeline
                if p.loss is not None and math.isfinite(p.loss)
            ],
        )
        for r in sorted(profile.ranks, key=lambda r: r.rank)
    ]
    return charts.line_chart(
        [s for s in series if s.points], title="Loss", x_label="step", y_label="loss"
    )


def last_straggler(profile: JobProfileInfo) -> FindingInfo | None:
    """The standing straggler verdict, else the newest cleared one (the profiler clears its
    findings when a job ends, so a finished job's straggler is a cleared one)."""
    if profile.straggler is not None:
        return profile.straggler
    return next((f for f in profile.cleared if f.kind == "straggler"), None)


def phase_bars(profile: JobProfileInfo) -> Markup:
    """Per rank, milliseconds per step in each phase (recent steps); the straggler (standing,
    else the last one) in red."""
    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    straggler = last_straggler(profile)
    marked = [
        _rank_label(r.rank) for r in ranks if straggler is not None and r.rank == straggler.rank
    ]
    return charts.stacked_bars(
        [_rank_label(r.rank) for r in ranks],
        list(PHASES),
        [[r.recent.phase(p) for p in PHASES] for r in ranks],
        title="Time per step by phase (recent steps)",
        unit="ms",
        marked=marked,
        width=720,
    )


def profile_view(viewer: Viewer, apis: Apis, job: JobInfo) -> ProfileView:
    """The profiler's view of ``job``; its failures are shown, never fail the page."""
    if not job.started_ms:
        return ProfileView(missing="The job has not started: nothing to profile yet.")
    try:
        with apis.profiler(viewer) as prof:
            profile = prof.job_profile(job.id)
    except GantryError as exc:
        if exc.grpc_code == "NOT_FOUND":  # NotFound, or the client's RemoteNotFound
            return ProfileView(
                missing="The profiler has no steps of this job (it reports none, or not yet)."
            )
        return ProfileView(error=exc)
    return ProfileView(
        profile=profile,
        loss=loss_curve(profile),
        phases=phase_bars(profile),
        straggler=profile.straggler,
        past_straggler=None if profile.straggler else last_straggler(profile),
        standing=list(profile.standing),
        cleared=list(profile.cleared),
    )


@dataclass
class LogView:
    """The log tail: lines, or why there are none."""

    allowed: bool
    tail: int
    follow: bool
    lines: list[LogLine] = field(default_factory=list)
    error: GantryError | None = None


def log_view(viewer: Viewer, apis: Apis, job: JobInfo, *, tail: int, follow: bool) -> LogView:
    """The last ``tail`` lines of ``job``'s log; following only while the job runs."""
    view = LogView(may_read_logs(viewer, job), tail, follow and not job.terminal)
    if not view.allowed:
        return view
    try:
        with apis.scheduler(viewer) as sched, sched.logs(job.id, follow=False, tail=tail) as s:
            view.lines = list(s)
    except GantryError as exc:
        view.error = exc
    return view


def _job(viewer: Viewer, apis: Apis, job_id: str) -> JobInfo:
    with apis.scheduler(viewer) as sched:
        return sched.get(job_id)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request,
    job_id: str,
    viewer: ViewerDep,
    apis: ApisDep,
    tail: str = "",
    follow: str = "",
    duplicate: str = "",
) -> HTMLResponse:
    """A job's page (``job_id`` may also be a name: the newest job of that name)."""
    lines = _tail(tail)
    job = _job(viewer, apis, job_id)
    return page(
        request,
        viewer,
        "job.html",
        section="jobs",
        title=f"Job {job.name or job.id}",
        job=job,
        duplicate=_flag(duplicate),
        prof=profile_view(viewer, apis, job),
        logs=log_view(viewer, apis, job, tail=lines, follow=_flag(follow)),
        may_cancel=may_cancel(viewer, job),
    )


@router.get("/jobs/{job_id}/progress", response_class=HTMLResponse)
def job_progress(request: Request, job_id: str, viewer: ViewerDep, apis: ApisDep) -> Response:
    """The live state and progress (polled every 2 s while the job is not finished). When a
    polled job has finished, the page is told to reload once (its other parts changed too)."""
    job = _job(viewer, apis, job_id)
    response = page(request, viewer, "_job_progress.html", job=job)
    if job.terminal and is_htmx(request):
        response.headers["HX-Refresh"] = "true"
    return response


@router.get("/jobs/{job_id}/profile", response_class=HTMLResponse)
def job_profile(request: Request, job_id: str, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """The loss curve, per-rank phases and verdicts (polled every 5 s while the job runs)."""
    job = _job(viewer, apis, job_id)
    return page(request, viewer, "_job_profile.html", job=job, prof=profile_view(viewer, apis, job))


@router.get("/jobs/{job_id}/logs", response_class=HTMLResponse)
def job_logs(
    request: Request,
    job_id: str,
    viewer: ViewerDep,
    apis: ApisDep,
    tail: str = "",
    follow: str = "",
) -> HTMLResponse:
    """The log tail (polled every 2 s with ``follow=1`` while the job is not finished)."""
    lines = _tail(tail)
    job = _job(viewer, apis, job_id)
    logs = log_view(viewer, apis, job, tail=lines, follow=_flag(follow))
    return page(request, viewer, "_job_logs.html", job=job, logs=logs)


@router.post("/jobs/{job_id}/cancel")
def cancel(
    job_id: str, viewer: ViewerDep, apis: ApisDep, reason: str = Form(default="")
) -> Response:
    """Cancel a job (its workers checkpoint and stop); back to its page."""
    viewer.require("cancel", "job", job_id)
    reason = reason.strip()
    if len(reason) > 500:
        raise InvalidInput(
            f"the reason is {len(reason)} characters; at most 500", hint="say it shorter"
        )
    with apis.scheduler(viewer) as sched:
        job = sched.cancel(job_id, reason)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


__all__ = [
    "EXAMPLE_SPEC",
    "LIST_LIMIT",
    "LogView",
    "ProfileView",
    "SpecProblems",
    "last_straggler",
    "loss_curve",
    "may_cancel",
    "may_read_logs",
    "may_touch",
    "phase_bars",
    "profile_view",
    "router",
    "spec_problems",
]
