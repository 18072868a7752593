"""The Jobs section: the list, a job's page and its live fragments, submitting from the YAML
editor, cancelling; what each role is offered and what is refused."""

from __future__ import annotations

import builtins
import html
import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gantry.client.errors import RemoteNotFound, RemotePermissionDenied
from gantry.client.profiler import (
    FindingInfo,
    JobProfileInfo,
    PhaseTimesInfo,
    RankInfo,
    RankPointInfo,
)
from gantry.client.scheduler import (
    JobEvent,
    JobInfo,
    JobProgress,
    LogLine,
    QueueInfo,
    SubmitResult,
    WorkerPlacement,
)
from gantry.console.pages.jobs import EXAMPLE_SPEC, spec_problems
from gantry.core import InvalidInput, Unavailable
from gantry.sched.spec import parse_job
from gantry.testing.console import ORIGIN, Closing, FakeApis

Console = tuple[TestClient, FakeApis, Callable[..., str]]
T0 = 1_796_132_000_000
POST = {"origin": ORIGIN}
HTMX = {"hx-request": "true"}


def _job(
    id: str = "j-000000000001",
    *,
    name: str = "train-a",
    owner: str = "dev",
    state: str = "running",
    **kw: Any,
) -> JobInfo:
    done = state in ("succeeded", "failed", "cancelled")
    fields: dict[str, Any] = {
        "queue": "research",
        "priority": 500,
        "reason": "2 worker(s) running" if not done else "all workers finished",
        "replicas": 2,
        "workers": 2,
        "attempt": 1,
        "submitted_ms": T0,
        "started_ms": T0 + 1000,
        "finished_ms": T0 + 60_000 if done else 0,
        "placements": (
            WorkerPlacement(0, "gpu-1", (0,), (1000,)),
            WorkerPlacement(1, "gpu-1", (1,), (500,)),
        ),
        "history": (
            JobEvent(T0, "pending", "queued", 0),
            JobEvent(T0 + 500, "scheduled", "placed 2 worker(s) on gpu-1", 1),
            JobEvent(T0 + 1000, "running", "2 worker(s) running", 1),
        ),
        "gpu_milli": 1000,
        "spec_yaml": "kind: TrainingJob\n",
        "progress": JobProgress(
            step=50,
            total_steps=200,
            loss=0.4321,
            samples_per_s=120.0,
            eta_s=30.0,
            updated_ms=T0 + 30_000,
            attempt=1,
        ),
    }
    fields.update(kw)
    return JobInfo(id=id, name=name, owner=owner, state=state, **fields)


class _Stream(list[LogLine]):
    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Sched:
    """The scheduler, with two jobs: dev's running ``train-a`` and ada's finished ``eval-b``."""

    def __init__(self) -> None:
        self.jobs = {
            "j-000000000001": _job(),
            "j-000000000002": _job(
                "j-000000000002",
                name="eval-b",
                owner="ada",
                state="succeeded",
                model="churn-classifier:3",
                metrics={"accuracy": 0.83},
            ),
        }
        self.list_args: dict[str, Any] = {}
        self.submitted: list[tuple[str, str, bool]] = []
        self.cancelled: list[tuple[str, str]] = []
        self.logs_error: Exception | None = None

    def list(
        self, queue: str = "", state: str = "", owner: str = "", limit: int = 100
    ) -> builtins.list[JobInfo]:
        self.list_args = {"queue": queue, "state": state, "owner": owner, "limit": limit}
        return list(self.jobs.values())

    def queues(self) -> builtins.list[QueueInfo]:
        return [QueueInfo(name="research")]

    def get(self, id: str) -> JobInfo:
        for j in self.jobs.values():
            if id in (j.id, j.name):
                return j
        raise RemoteNotFound(f"job {id!r} not found")

    def logs(self, id: str, follow: bool = False, tail: int = 0) -> _Stream:
        assert not follow
        if self.logs_error is not None:
            raise self.logs_error
        lines = [LogLine(T0 + i, "gpu-1", i % 2, "stdout", f"step {i} <b>") for i in range(5)]
        return _Stream(lines[-tail:])

    def submit(self, spec_yaml: str, *, request_id: str = "", dry_run: bool = False) -> Any:
        self.submitted.append((spec_yaml, request_id, dry_run))
        if "replicas: 0" in spec_yaml:
            raise InvalidInput(
                "the job spec is invalid:\n  spec.replicas: Input should be greater than or "
                "equal to 1\n  spec.foo: is not a known field (check its spelling and "
                "indentation) — see docs/jobs.md for every field and what it allows"
            )
        duplicate = any(r == request_id for _s, r, d in self.submitted[:-1] if r and not d)
        return SubmitResult(
            _job("j-00000000000a", name="console-example", state="pending"), duplicate
        )

    def cancel(self, id: str, reason: str = "") -> JobInfo:
        job = self.get(id)
        if job.owner != "dev":
            raise RemotePermissionDenied(f"the job belongs to {job.owner}; only its owner may")
        self.cancelled.append((id, reason))
        return job


def _times(step_ms: float, data_ms: float) -> PhaseTimesInfo:
    comm = step_ms - data_ms - 6
    return PhaseTimesInfo(step_ms, data_ms, 2, 3, 1, comm, step_ms - comm, 16, 0)


def _profile() -> JobProfileInfo:
    straggler = FindingInfo(
        kind="straggler", state="raised", rank=1, node="gpu-1", phase="data",
        cause="slow_data_loading", summary="rank 1 on gpu-1 is a straggler: its loader is slow",
        evidence={"ratio": 2.6}, raised_step=60, step=90, raised_ms=T0, cleared_ms=0,
    )  # fmt: skip
    ranks = tuple(
        RankInfo(
            rank=r,
            node="gpu-1",
            recent=_times(40, 30 if r == 1 else 2),
            overall=_times(40, 20 if r == 1 else 2),
            last_step=90,
            memory_mib=100,
            timeline=tuple(
                RankPointInfo(s, s + 9, T0 + s, _times(40, 2), 1.0 / (s + 1), 100)
                for s in range(0, 90, 10)
            ),
        )
        for r in (0, 1)
    )
    return JobProfileInfo(
        job_id="j-000000000001", attempt=1, name="train-a", owner="dev", state="running",
        world_size=2, ranks=ranks, findings=(straggler,), samples_per_s=300, compute_fraction=0.2,
        gpu_util=0.5, last_step=90, started_ms=T0, updated_ms=T0, attempts=(1,),
    )  # fmt: skip


class _Prof:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def job_profile(self, job: str, **kw: Any) -> JobProfileInfo:
        if self.error is not None:
            raise self.error
        return _profile()


@pytest.fixture
def jobs(console: Console) -> tuple[TestClient, FakeApis, Callable[..., str], _Sched]:
    client, apis, login = console
    sched = _Sched()
    apis.factories["scheduler"] = lambda viewer: Closing(sched)
    apis.factories["profiler"] = lambda viewer: Closing(_Prof())
    return client, apis, login, sched


Jobs = tuple[TestClient, FakeApis, Callable[..., str], _Sched]


def _textarea(page: str) -> str:
    """The editor's text as the browser would show it."""
    found = re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S)
    assert found is not None
    return html.unescape(found[1])


# ---------------------------------------------------------------------- the list


def test_the_list_shows_jobs_with_their_state_and_passes_the_filters(jobs: Jobs) -> None:
    client, _apis, login, sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs", params={"state": "active", "queue": "research", "owner": "dev"})
    assert page.status_code == 200
    assert sched.list_args == {"queue": "research", "state": "active", "owner": "dev", "limit": 201}
    assert 'data-job="j-000000000001"' in page.text and 'data-job="j-000000000002"' in page.text
    assert '<span class="state running">running</span>' in page.text
    assert 'href="/jobs/j-000000000001"' in page.text
    assert "2/2" in page.text and "25%" in page.text  # workers/replicas, progress
    assert 'data-testid="new-job"' in page.text  # an ml-developer may submit
    assert '<option value="research">' in page.text  # queue suggestions


def test_the_list_searches_names_and_ids(jobs: Jobs) -> None:
    client, _apis, login, sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs", params={"q": "EVAL"})
    assert 'data-job="j-000000000002"' in page.text
    assert 'data-job="j-000000000001"' not in page.text
    assert sched.list_args["limit"] == 1000
    assert 'data-job="j-000000000001"' in client.get("/jobs?q=0001").text


def test_a_bad_state_filter_is_a_400_that_names_the_states(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs?state=bogus")
    assert page.status_code == 400
    assert "there is no job state" in html.unescape(page.text) and "succeeded" in page.text


# ---------------------------------------------------------------------- a job's page


def test_a_running_jobs_page_has_every_part_and_polls_its_progress(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs/train-a")  # a name works too
    assert page.status_code == 200
    text = page.text
    assert 'data-testid="job-summary"' in text and "research" in text
    assert 'data-event="scheduled"' in text and "placed 2 worker(s) on gpu-1" in text
    assert 'data-rank="1" data-node="gpu-1"' in text and "GPU 1 (0.5)" in text
    progress = re.search(r'<div id="job-progress".*?>', text)
    assert progress and 'hx-get="/jobs/j-000000000001/progress"' in progress.group(0)
    assert 'hx-trigger="every 2s"' in progress.group(0)
    assert "0.4321" in text and "50" in text and "30.0s" in text  # loss, step, ETA
    assert 'data-testid="loss-chart"><svg' in text
    assert 'data-testid="phase-chart"><svg' in text
    assert 'style="fill:#c53030;font-weight:600">rank 1<' in text  # the straggler, marked
    assert 'data-finding="straggler" data-rank="1"' in text
    assert "its loader is slow" in text
    # logs: dev owns it; the text is escaped
    assert "step 4 &lt;b&gt;" in text and 'data-testid="logs-follow"' in text
    assert 'data-testid="cancel-job"' in text  # dev owns a running job


def test_a_finished_job_shows_its_model_and_metrics_and_stops_polling(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("ada", "platform-admin")
    page = client.get("/jobs/j-000000000002")
    assert page.status_code == 200
    assert "churn-classifier:3" in page.text and 'data-metric="accuracy"' in page.text
    assert 'hx-trigger="every' not in page.text
    assert 'data-testid="cancel-job"' not in page.text  # finished: nothing to cancel
    assert 'data-testid="logs-follow"' not in page.text  # its log is complete


def test_cancel_and_logs_are_offered_only_to_whom_the_scheduler_allows(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    other = _job("j-000000000003", name="theirs", owner="bob")
    _sched.jobs[other.id] = other
    page = client.get("/jobs/theirs")
    assert page.status_code == 200
    assert 'data-testid="cancel-job"' not in page.text  # bob's job: only bob or an admin
    assert 'data-testid="logs-hidden"' in page.text and 'data-testid="log-lines"' not in page.text
    login("ada", "platform-admin")
    page = client.get("/jobs/theirs")
    assert 'data-testid="cancel-job"' in page.text and 'data-testid="log-lines"' in page.text


def test_profiler_trouble_is_shown_inline_and_the_page_still_renders(jobs: Jobs) -> None:
    client, apis, login, _sched = jobs
    login("dev", "ml-developer")
    apis.factories["profiler"] = lambda viewer: Closing(
        _Prof(Unavailable("the profiler is not reachable", hint="start it"))
    )
    page = client.get("/jobs/train-a")
    assert page.status_code == 200
    assert "the profiler is not reachable" in page.text and 'data-testid="job-summary"' in page.text
    apis.factories["profiler"] = lambda viewer: Closing(_Prof(RemoteNotFound("no profile")))
    page = client.get("/jobs/train-a")
    assert page.status_code == 200 and 'data-testid="profile-missing"' in page.text


def test_an_unknown_job_is_a_404(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs/nope")
    assert page.status_code == 404 and "not found" in page.text


def test_the_progress_fragment_reloads_the_page_once_the_job_finished(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    running = client.get("/jobs/j-000000000001/progress", headers=HTMX)
    assert running.status_code == 200 and "<html" not in running.text
    assert 'hx-trigger="every 2s"' in running.text and "hx-refresh" not in running.headers
    done = client.get("/jobs/j-000000000002/progress", headers=HTMX)
    assert done.headers["hx-refresh"] == "true" and "hx-trigger" not in done.text


def test_the_log_fragment_follows_only_while_the_job_runs(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("ada", "platform-admin")
    follow = client.get("/jobs/j-000000000001/logs?tail=2&follow=1", headers=HTMX)
    assert follow.status_code == 200 and "<html" not in follow.text
    assert 'hx-trigger="every 2s"' in follow.text and 'data-testid="logs-unfollow"' in follow.text
    assert follow.text.count('class="log-stdout"') == 2
    done = client.get("/jobs/j-000000000002/logs?follow=1", headers=HTMX)
    assert "hx-trigger" not in done.text and "its log is complete" in done.text
    assert client.get("/jobs/j-000000000001/logs?tail=lots").status_code == 400
    _sched.logs_error = RemotePermissionDenied("no logs for you")
    refused = client.get("/jobs/j-000000000001/logs", headers=HTMX)
    assert refused.status_code == 200 and "no logs for you" in refused.text
    assert "Refused" in refused.text


# ---------------------------------------------------------------------- submitting


def test_the_editor_starts_with_a_valid_example_and_a_request_id(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    page = client.get("/jobs/new")
    assert page.status_code == 200
    spec = _textarea(page.text)
    assert spec == EXAMPLE_SPEC
    job = parse_job(spec)  # the scheduler's own validation accepts it
    assert job.metadata.name == "console-example"
    assert re.search(r'name="request_id" value="console-[0-9a-f]{16}"', page.text)
    assert 'hx-post="/jobs/validate"' in page.text and "keyup changed delay:500ms" in page.text
    again = client.get("/jobs/new")
    assert re.findall(r'value="(console-[0-9a-f]+)"', page.text) != re.findall(
        r'value="(console-[0-9a-f]+)"', again.text
    )


def test_validation_lists_the_services_problems_or_says_valid(jobs: Jobs) -> None:
    client, apis, login, sched = jobs
    login("dev", "ml-developer")
    ok = client.post("/jobs/validate", data={"spec": EXAMPLE_SPEC}, headers={**POST, **HTMX})
    assert ok.status_code == 200 and 'data-testid="spec-valid"' in ok.text
    assert sched.submitted[-1][2] is True  # a dry run
    bad = client.post(
        "/jobs/validate", data={"spec": "spec:\n  replicas: 0\n"}, headers={**POST, **HTMX}
    )
    assert bad.status_code == 200 and 'data-testid="spec-problems"' in bad.text
    items = re.findall(r"<li[^>]*>(.*?)</li>", bad.text)
    assert items == [
        "spec.replicas: Input should be greater than or equal to 1",
        "spec.foo: is not a known field (check its spelling and indentation)",
    ]
    assert "see docs/jobs.md" in bad.text
    sched_down = _Sched()

    def down(*a: Any, **kw: Any) -> Any:
        raise Unavailable("the scheduler service is unreachable", hint="is it up?")

    sched_down.submit = down  # type: ignore[method-assign]
    apis.factories["scheduler"] = lambda viewer: Closing(sched_down)
    gone = client.post("/jobs/validate", data={"spec": "x: 1"}, headers={**POST, **HTMX})
    assert gone.status_code == 200 and "unreachable" in gone.text


def test_a_refused_submission_keeps_the_text_and_lists_the_problems(jobs: Jobs) -> None:
    client, _apis, login, _sched = jobs
    login("dev", "ml-developer")
    text = "# my notes <here>\nspec:\n  replicas: 0\n"
    reply = client.post("/jobs", data={"spec": text, "request_id": "console-abc"}, headers=POST)
    assert reply.status_code == 400
    assert _textarea(reply.text) == text
    assert 'value="console-abc"' in reply.text and 'data-testid="spec-problems"' in reply.text


def test_submitting_redirects_to_the_job_and_a_double_submit_is_one_job(jobs: Jobs) -> None:
    client, _apis, login, sched = jobs
    login("dev", "ml-developer")
    form = {"spec": EXAMPLE_SPEC, "request_id": "console-0123456789abcdef"}
    first = client.post("/jobs", data=form, headers=POST)
    assert first.status_code == 303 and first.headers["location"] == "/jobs/j-00000000000a"
    assert sched.submitted[-1] == (EXAMPLE_SPEC, "console-0123456789abcdef", False)
    second = client.post("/jobs", data=form, headers=POST)
    assert second.headers["location"] == "/jobs/j-00000000000a?duplicate=1"


def test_roles_that_may_not_submit_or_cancel_are_refused_before_the_service(
    jobs: Jobs,
) -> None:
    client, apis, login, sched = jobs
    login("aud", "auditor")
    assert client.get("/jobs/new").status_code == 403
    for path, data in (
        ("/jobs", {"spec": EXAMPLE_SPEC}),
        ("/jobs/validate", {"spec": EXAMPLE_SPEC}),
        ("/jobs/j-000000000001/cancel", {"reason": "x"}),
    ):
        reply = client.post(path, data=data, headers=POST)
        assert reply.status_code == 403, path
        assert "Refused" in reply.text
    assert apis.calls == [] and sched.submitted == [] and sched.cancelled == []


# ---------------------------------------------------------------------- cancelling


def test_cancelling_redirects_back_and_a_service_refusal_is_a_403(jobs: Jobs) -> None:
    client, _apis, login, sched = jobs
    login("dev", "ml-developer")
    reply = client.post("/jobs/j-000000000001/cancel", data={"reason": " wrong lr "}, headers=POST)
    assert reply.status_code == 303 and reply.headers["location"] == "/jobs/j-000000000001"
    assert sched.cancelled == [("j-000000000001", "wrong lr")]
    forced = client.post("/jobs/j-000000000002/cancel", data={}, headers=POST)
    assert forced.status_code == 403 and "belongs to ada" in forced.text
    long = client.post("/jobs/j-000000000001/cancel", data={"reason": "x" * 501}, headers=POST)
    assert long.status_code == 400


# ---------------------------------------------------------------------- helpers


def test_spec_problems_splits_the_services_list_and_keeps_other_messages_whole() -> None:
    listed = spec_problems(
        InvalidInput("the job spec is invalid:\n  a: bad\n  b: worse", hint="see docs")
    )
    assert listed.heading == "the job spec is invalid"
    assert listed.problems == ["a: bad", "b: worse"] and listed.hint == "see docs"
    yaml_error = spec_problems(InvalidInput("not valid YAML: x\nline 2, column 1"))
    assert yaml_error.problems == ["not valid YAML: x\nline 2, column 1"]
    assert yaml_error.heading == "" and yaml_error.hint == ""
