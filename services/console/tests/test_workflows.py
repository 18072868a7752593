"""The workflows section: pipelines and runs (a run as a graph, refreshed while it runs),
cron schedules, experiments and dev sessions, over a stand-in workflows client returning the
client's real records."""

from __future__ import annotations

import builtins
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gantry.client.errors import RemoteNotFound, RemotePermissionDenied
from gantry.client.workflows import (
    ExperimentInfo,
    PipelineInfo,
    RunInfo,
    ScheduleInfo,
    SessionGenerationInfo,
    SessionInfo,
    StartRunResult,
    StepAttemptInfo,
    StepRunInfo,
    TrialInfo,
)
from gantry.testing.console import ORIGIN, Closing, FakeApis

Console = tuple[TestClient, FakeApis, Callable[..., str]]
NOW = int(time.time() * 1000)
RUN_ID = "01a231d2-3eab-7569-9dc9-7154ca4197a6"
SPEC = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: CronPipeline
    metadata: {name: churn}
    spec:
      params: {min_accuracy: 0.7}
      schedule: {cron: "0 3 * * 1", timezone: Europe/Paris}
      steps:
        - name: model
          train: {entrypoint: {task: "x:task"}}
        - name: evaluate
          evaluate: {model: "${steps.model.outputs.model}"}
        - name: release
          gate: {metric: "${steps.evaluate.outputs.metrics.accuracy}", atLeast: 0.7}
          deploy: {deployment: churn, model: "${steps.evaluate.outputs.model}"}
    """
)


def _step(
    name: str, kind: str, state: str, job: str = "", after: tuple[str, ...] = ()
) -> StepRunInfo:
    return StepRunInfo(
        name=name,
        kind=kind,
        state=state,
        reason=f"{name} is {state}",
        attempt=1 if state != "pending" else 0,
        job_id=job,
        depends_on=after,
        outputs={"job": job} if job else {},
        metrics={"accuracy": 0.83} if kind == "evaluate" and state == "succeeded" else {},
        inputs=(),
        produced=(),
        attempts=(StepAttemptInfo(1, job, state, "", NOW - 60_000, 0),) if job else (),
        started_ms=NOW - 60_000 if state != "pending" else 0,
        finished_ms=NOW - 30_000 if state in ("succeeded", "failed") else 0,
    )


def _run(state: str = "running", *, owner: str = "dev", deps: bool = True) -> RunInfo:
    done = state in ("succeeded", "failed", "cancelled")
    steps = (
        _step("model", "train", "succeeded", "j-model1"),
        _step(
            "evaluate",
            "evaluate",
            "failed" if state == "failed" else "running",
            "j-eval1",
            ("model",) if deps else (),
        ),
        _step("release", "deploy", "pending", "", ("evaluate",) if deps else ()),
    )
    return RunInfo(
        id=RUN_ID,
        pipeline="churn",
        revision=2,
        owner=owner,
        state=state,
        reason="step evaluate failed" if state == "failed" else "",
        trigger="manual",
        params={"min_accuracy": "0.7"},
        steps=steps,
        scheduled_ms=0,
        created_ms=NOW - 120_000,
        started_ms=NOW - 120_000,
        finished_ms=NOW if done else 0,
    )


def _pipeline(cron: bool = True) -> PipelineInfo:
    return PipelineInfo(
        name="churn",
        kind="CronPipeline" if cron else "Pipeline",
        owner="dev",
        revision=2,
        spec_yaml=SPEC,
        description="train, evaluate, release",
        steps=("model", "evaluate", "release"),
        params={"min_accuracy": "0.7"},
        schedule=ScheduleInfo("0 3 * * 1", "Europe/Paris", "skip", 1796608800000, False, 1)
        if cron
        else None,
        created_ms=NOW - 86_400_000,
        updated_ms=NOW - 3_600_000,
        last_run_id=RUN_ID,
        last_run_state="running",
    )


def _trial(n: int, state: str, value: float | None, job: str = "") -> TrialInfo:
    curve = ((1, (value or 0.5) - 0.01), (2, value or 0.5)) if value is not None else ()
    return TrialInfo(
        number=n,
        state=state,
        job_id=job or f"j-trial{n}",
        values={"lr": f"0.00{n + 1}5"},
        value=value,
        curve=curve,
        metrics={},
        model=f"churn:{n + 1}" if state == "succeeded" else "",
        reason="pruned at epoch 2" if state == "pruned" else "",
        device_s=12.5,
        started_ms=NOW - 60_000,
        finished_ms=NOW if state != "running" else 0,
    )


def _experiment(state: str = "running", owner: str = "dev") -> ExperimentInfo:
    return ExperimentInfo(
        name="churn-hpo",
        owner=owner,
        state=state,
        reason="searching",
        spec_yaml="spec:\n  space:\n    lr: {logUniform: [0.0001, 0.1]}\n",
        metric="accuracy",
        goal="maximize",
        method="random",
        pruner="asha",
        budget_trials=4,
        budget_gpu_hours=None,
        parallelism=2,
        run_id="",
        best_trial=2,
        trials=(
            _trial(0, "succeeded", 0.81),
            _trial(1, "pruned", 0.74),
            _trial(2, "succeeded", 0.86),
            _trial(3, "running", None),
        ),
        device_s=50.0,
        parameters=("lr",),
        created_ms=NOW - 120_000,
        finished_ms=0,
    )


def _session(state: str = "running", owner: str = "dev") -> SessionInfo:
    now = int(time.time() * 1000)  # now, not at import: the page counts from the real clock
    ended = state in ("culled", "expired", "stopped", "failed")
    return SessionInfo(
        name="scratch",
        owner=owner,
        state=state,
        reason="the server is up" if not ended else "idle past its idleTimeout",
        spec_yaml="kind: DevSession\n",
        interface="jupyter",
        url="http://127.0.0.1:9999/" if state == "running" else "",
        token="s3cret-token",
        generation=1,
        job_id="j-sess1",
        endpoint="",
        active_s=0.0,
        history=(
            SessionGenerationInfo(
                1, "j-sess1", now - 600_000, now if ended else 0, state if ended else "", 30.0
            ),
        ),
        created_ms=now - 600_000,
        started_ms=now - 600_000,
        ended_ms=now if ended else 0,
        idle_timeout_s=1800.0,
        lifetime_s=8 * 3600.0,
        gpus=0.25,
        dataset="churn",
    )


class _Wf:
    """The workflows service as a plain object: records what it was asked."""

    def __init__(self, run: RunInfo | None = None) -> None:
        self.the_run = run or _run()
        self.the_experiment = _experiment()
        self.the_session = _session()
        self.asked: list[tuple[Any, ...]] = []
        self.refuse = False

    def _check(self) -> None:
        if self.refuse:
            raise RemotePermissionDenied("it belongs to dev; only its owner may change it")

    def list(self) -> builtins.list[PipelineInfo]:
        return [_pipeline(), replace(_pipeline(cron=False), name="adhoc", last_run_id="")]

    def get(self, name: str) -> PipelineInfo:
        self.asked.append(("get", name))
        if name != "churn":
            raise RemoteNotFound(f"pipeline {name!r} not found")
        return _pipeline()

    def runs(self, pipeline: str = "", state: str = "", limit: int = 100) -> builtins.list[RunInfo]:
        self.asked.append(("runs", pipeline, state, limit))
        return [self.the_run]

    def run(self, run_id: str) -> RunInfo:
        if run_id != RUN_ID:
            raise RemoteNotFound(f"run {run_id!r} not found")
        return self.the_run

    def cancel(self, run_id: str, reason: str = "") -> RunInfo:
        self._check()
        self.asked.append(("cancel", run_id, reason))
        return self.the_run

    def retry(self, run_id: str, from_step: str = "") -> RunInfo:
        self._check()
        self.asked.append(("retry", run_id, from_step))
        return self.the_run

    def start(
        self, pipeline: str, params: dict[str, str] | None = None, *, request_id: str = ""
    ) -> StartRunResult:
        self.asked.append(("start", pipeline, params, request_id))
        return StartRunResult(self.the_run)

    def experiments(self, state: str = "") -> builtins.list[ExperimentInfo]:
        return [self.the_experiment]

    def experiment(self, name: str) -> ExperimentInfo:
        return self.the_experiment

    def cancel_experiment(self, name: str, reason: str = "") -> ExperimentInfo:
        self._check()
        self.asked.append(("cancel_experiment", name, reason))
        return self.the_experiment

    def sessions(self, state: str = "") -> builtins.list[SessionInfo]:
        return [self.the_session]

    def session(self, name: str) -> SessionInfo:
        s = self.the_session
        return s if self._viewer == s.owner else replace(s, token="")

    def stop_session(self, name: str, reason: str = "") -> SessionInfo:
        self._check()
        self.asked.append(("stop_session", name, reason))
        return self.the_session

    def resume_session(self, name: str) -> SessionInfo:
        self._check()
        self.asked.append(("resume_session", name))
        return self.the_session

    _viewer = ""


@pytest.fixture
def wf(console: Console) -> _Wf:
    _client, apis, _login = console
    stand_in = _Wf()

    def open_for(viewer: Any) -> Closing:
        stand_in._viewer = viewer.subject
        return Closing(stand_in)

    apis.factories["workflows"] = open_for
    return stand_in


def _post(client: TestClient, url: str, data: dict[str, Any] | None = None) -> Any:
    return client.post(url, data=data or {}, headers={"origin": ORIGIN})


# ---------------------------------------------------------------------- the overview


def test_the_overview_lists_pipelines_with_their_schedule_and_recent_runs(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows")
    assert page.status_code == 200
    assert {"pipelines", "experiments", "sessions"} <= set(
        re.findall(r'data-tab="(\w+)"', page.text)
    )
    assert 'data-pipeline="churn"' in page.text and 'data-pipeline="adhoc"' in page.text
    assert "0 3 * * 1" in page.text and "Europe/Paris" in page.text
    assert f'data-run="{RUN_ID}"' in page.text
    assert f'href="/workflows/runs/{RUN_ID}"' in page.text
    assert ("runs", "", "", 50) in wf.asked


def test_the_overview_filters_runs_and_says_what_is_wrong_with_bad_input(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    assert client.get("/workflows?state=failed").status_code == 200
    assert ("runs", "", "failed", 50) in wf.asked
    bad = client.get("/workflows?state=exploded")
    assert bad.status_code == 400 and "unknown run state" in bad.text and "succeeded" in bad.text
    bad = client.get("/workflows?tab=nope")
    assert bad.status_code == 400 and "no workflows tab" in bad.text


def test_experiments_and_sessions_tabs(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows?tab=experiments")
    assert page.status_code == 200
    assert 'data-experiment="churn-hpo"' in page.text and "#2: 0.86" in page.text
    page = client.get("/workflows?tab=sessions")
    assert page.status_code == 200
    row = re.search(r'<tr data-session="scratch".*?</tr>', page.text, re.S)
    assert row is not None
    assert "culled after 30m 00s idle" in row.group(0)
    assert re.search(r"expires .*\(in 7h (49|50)m\)", row.group(0))  # 8h lifetime, 10 min up
    assert 'data-testid="session-stop"' in row.group(0)  # the viewer's own session


def test_roles_that_may_not_list_workflows_are_refused_before_the_service(
    console: Console, wf: _Wf
) -> None:
    client, apis, login = console
    login("aud", "auditor")
    page = client.get("/workflows")
    assert page.status_code == 403 and "Refused" in page.text
    for url in (f"/workflows/runs/{RUN_ID}/cancel", "/workflows/sessions/scratch/stop"):
        assert _post(client, url).status_code == 403
    assert apis.calls == []


# ---------------------------------------------------------------------- a run


def test_a_running_run_is_a_graph_of_its_steps_refreshed_every_two_seconds(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get(f"/workflows/runs/{RUN_ID}")
    assert page.status_code == 200
    graph = re.search(r'data-testid="run-graph">(.*?)</div>', page.text, re.S)
    assert graph is not None
    svg = graph.group(1)
    assert 'data-node="model" data-state="succeeded"' in svg
    assert 'data-node="evaluate" data-state="running"' in svg
    assert '<a href="/jobs/j-model1">' in svg and '<a href="/jobs/j-eval1">' in svg
    assert svg.count("marker-end") == 2  # model -> evaluate -> release
    assert 'hx-trigger="every 2s"' in page.text
    assert 'data-step="release" data-state="pending"' in page.text
    assert 'data-testid="run-cancel"' in page.text and 'data-testid="run-retry"' not in page.text

    fragment = client.get(f"/workflows/runs/{RUN_ID}", headers={"hx-request": "true"})
    assert fragment.status_code == 200
    assert "<html" not in fragment.text and fragment.text.lstrip().startswith('<div id="run-live"')
    assert "hx-swap-oob" not in fragment.text  # the actions stay as they are while it runs


def test_a_finished_run_stops_refreshing_and_offers_a_retry(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    wf.the_run = _run("failed")
    login("dev", "ml-developer")
    page = client.get(f"/workflows/runs/{RUN_ID}")
    assert "every 2s" not in page.text
    assert 'data-testid="run-retry"' in page.text and 'data-testid="run-cancel"' not in page.text
    assert '<option value="">the failed and not-run steps</option>' in page.text
    # the last refresh brings the actions up to date
    fragment = client.get(f"/workflows/runs/{RUN_ID}", headers={"hx-request": "true"})
    assert 'id="run-actions"' in fragment.text and 'hx-swap-oob="true"' in fragment.text
    assert 'data-testid="run-retry"' in fragment.text


def test_dependencies_come_from_the_pipeline_when_the_run_does_not_carry_them(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    wf.the_run = _run(deps=False)
    login("dev", "ml-developer")
    page = client.get(f"/workflows/runs/{RUN_ID}")
    assert ("get", "churn") in wf.asked
    assert page.text.count("marker-end") == 2


def test_only_the_owner_or_an_admin_is_offered_cancel_and_a_forced_one_is_refused(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("other", "ml-developer")
    page = client.get(f"/workflows/runs/{RUN_ID}")
    assert page.status_code == 200 and 'data-testid="run-cancel"' not in page.text
    wf.refuse = True
    forced = _post(client, f"/workflows/runs/{RUN_ID}/cancel")
    assert forced.status_code == 403 and "only its owner" in forced.text
    wf.refuse = False
    login("ada", "platform-admin")
    page = client.get(f"/workflows/runs/{RUN_ID}")
    assert 'data-testid="run-cancel"' in page.text


def test_cancel_and_retry_go_to_the_service_and_back_to_the_run(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    reply = _post(client, f"/workflows/runs/{RUN_ID}/cancel", {"reason": "wrong data"})
    assert reply.status_code == 303 and reply.headers["location"] == f"/workflows/runs/{RUN_ID}"
    assert ("cancel", RUN_ID, "wrong data") in wf.asked
    reply = _post(client, f"/workflows/runs/{RUN_ID}/retry", {"from_step": "evaluate"})
    assert reply.status_code == 303
    assert ("retry", RUN_ID, "evaluate") in wf.asked
    bad = _post(client, f"/workflows/runs/{RUN_ID}/retry", {"from_step": "Not A Step!"})
    assert bad.status_code == 400 and "is not a step name" in bad.text


def test_an_unknown_run_is_a_404_page(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows/runs/nope")
    assert page.status_code == 404 and "not found" in page.text


# ---------------------------------------------------------------------- a pipeline


def test_a_cron_pipeline_shows_its_schedule_its_steps_and_its_history(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows/pipelines/churn")
    assert page.status_code == 200
    schedule = re.search(r'data-testid="schedule">(.*?)</dl>', page.text, re.S)
    assert schedule is not None
    assert "0 3 * * 1" in schedule.group(1) and "Europe/Paris" in schedule.group(1)
    assert "2026-12-07 02:00:00 UTC" in schedule.group(1)
    assert "2026-12-07 03:00 CET" in schedule.group(1)  # the next fire in its own timezone
    assert "evaluate.accuracy &gt;= 0.7" in page.text  # the gate, from the document
    assert ("runs", "churn", "", 100) in wf.asked
    assert f'data-run="{RUN_ID}"' in page.text
    assert 'data-testid="start-run"' in page.text and 'data-param="min_accuracy"' in page.text


def test_starting_a_run_passes_the_parameters_and_checks_them(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    reply = _post(
        client,
        "/workflows/pipelines/churn/runs",
        {"param_name": ["min_accuracy"], "param_value": ["0.8"], "request_id": "r1"},
    )
    assert reply.status_code == 303 and reply.headers["location"] == f"/workflows/runs/{RUN_ID}"
    assert ("start", "churn", {"min_accuracy": "0.8"}, "r1") in wf.asked
    empty = _post(
        client,
        "/workflows/pipelines/churn/runs",
        {"param_name": ["min_accuracy"], "param_value": [" "]},
    )
    assert empty.status_code == 400 and "parameter &#39;min_accuracy&#39; is empty" in empty.text
    uneven = _post(
        client, "/workflows/pipelines/churn/runs", {"param_name": ["a", "b"], "param_value": ["1"]}
    )
    assert uneven.status_code == 400


def test_a_viewer_who_may_not_run_pipelines_gets_no_start_form(
    console: Console, wf: _Wf, data_dir: Any
) -> None:
    client, apis, login = console
    login("steward", "data-steward")
    reply = _post(client, "/workflows/pipelines/churn/runs")
    assert reply.status_code == 403
    assert apis.calls == []


# ---------------------------------------------------------------------- an experiment


def test_an_experiment_shows_the_objective_the_best_trial_and_every_trial(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows/experiments/churn-hpo")
    assert page.status_code == 200
    chart = re.search(r'data-testid="objective-chart">(.*?)</div>', page.text, re.S)
    assert chart is not None
    assert chart.group(1).count("<polyline") == 2  # the objective and the best so far
    assert "best so far" in chart.group(1)
    best = re.search(r'data-testid="best-trial">(.*?)</div>', page.text, re.S)
    assert best is not None and "#2" in best.group(1) and "0.86" in best.group(1)
    assert 'data-trial="2" data-state="succeeded" data-best="true"' in page.text
    assert 'data-trial="1" data-state="pruned"' in page.text
    assert 'href="/jobs/j-trial3"' in page.text
    assert "logUniform [0.0001, 0.1]" in page.text
    assert 'hx-trigger="every 2s"' in page.text and 'data-testid="experiment-cancel"' in page.text
    fragment = client.get("/workflows/experiments/churn-hpo", headers={"hx-request": "true"})
    assert "<html" not in fragment.text and "hx-swap-oob" not in fragment.text


def test_an_experiment_is_cancelled_only_by_its_owner_or_an_admin(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    login("other", "ml-developer")
    page = client.get("/workflows/experiments/churn-hpo")
    assert 'data-testid="experiment-cancel"' not in page.text
    login("dev", "ml-developer")
    reply = _post(client, "/workflows/experiments/churn-hpo/cancel", {"reason": "enough"})
    assert reply.status_code == 303
    assert ("cancel_experiment", "churn-hpo", "enough") in wf.asked
    wf.the_experiment = replace(_experiment(), state="succeeded")
    page = client.get("/workflows/experiments/churn-hpo")
    assert "every 2s" not in page.text and 'data-testid="experiment-cancel"' not in page.text


# ---------------------------------------------------------------------- dev sessions


def test_a_session_shows_its_token_only_to_its_owner(console: Console, wf: _Wf) -> None:
    client, _apis, login = console
    login("dev", "ml-developer")
    page = client.get("/workflows/sessions/scratch")
    assert page.status_code == 200
    assert "s3cret-token" in page.text and 'data-testid="session-stop"' in page.text
    assert 'data-generation="1"' in page.text
    login("other", "ml-developer")
    page = client.get("/workflows/sessions/scratch")
    assert "s3cret-token" not in page.text
    assert 'data-testid="session-stop"' not in page.text


def test_an_ended_session_offers_resume_and_stop_and_resume_reach_the_service(
    console: Console, wf: _Wf
) -> None:
    client, _apis, login = console
    wf.the_session = _session("culled")
    login("dev", "ml-developer")
    page = client.get("/workflows/sessions/scratch")
    assert 'data-testid="session-resume"' in page.text
    assert 'data-testid="session-stop"' not in page.text
    assert _post(client, "/workflows/sessions/scratch/resume").status_code == 303
    assert ("resume_session", "scratch") in wf.asked
    reply = _post(client, "/workflows/sessions/scratch/stop", {"reason": "done for today"})
    assert reply.headers["location"] == "/workflows/sessions/scratch"
    assert ("stop_session", "scratch", "done for today") in wf.asked
    wf.refuse = True
    assert _post(client, "/workflows/sessions/scratch/resume").status_code == 403
