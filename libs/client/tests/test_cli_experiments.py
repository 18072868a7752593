"""``gantry experiments`` (and experiment steps in ``gantry pipelines``) against a fake
workflows service on a free local port, found through the data directory's run file like the
real one.

The fake answers with one canned search, ``churn-hpo``: eight trials of the HPO document of
the service's tests, some pruned after an epoch or two, one failed, one still running; it can
be scripted to move on from poll to poll. It also holds the ``tuned`` pipeline (an experiment
step whose best model a gated deploy step serves) and a run of it. Every request is recorded,
so tests can check what the CLI sent, and that bad input was refused before anything was sent.
"""

from __future__ import annotations

import json
import math
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.client.cli import _experiments, _pipeline_runs
from gantry.client.workflows import RunInfo
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
HPO = """\
apiVersion: gantry/v1
kind: Experiment
metadata: {name: churn-hpo}
spec:
  objective: {metric: accuracy, goal: maximize}
  pruner: {kind: asha}
  budget: {trials: 12, gpuHours: 2}
  parallelism: 3
  space:
    lr: {logUniform: [0.0001, 1.0]}
    hidden: {int: [16, 128], step: 16}
    act: {choice: [relu, tanh]}
  trial:
    entrypoint:
      task: gantry.training.examples.tabular:task
      args: ["lr=${trial.lr}", "hidden=${trial.hidden}", "act=${trial.act}", "epochs=9"]
"""
TUNED = textwrap.dedent(
    """\
    apiVersion: gantry/v1
    kind: Pipeline
    metadata: {name: tuned}
    spec:
      steps:
        - name: search
          experiment:
            objective: {metric: accuracy}
            budget: {trials: 3}
            space: {lr: {logUniform: [0.001, 0.1]}}
            trial: {entrypoint: {task: "m:task", args: ["lr=${trial.lr}"]}}
        - name: deploy
          gate: {metric: "${steps.search.outputs.metrics.accuracy}", atLeast: 0.5}
          deploy: {deployment: tuned, model: "${steps.search.outputs.model}"}
    """
)
T0 = 1_767_232_800_000  # 2026-01-01 02:00:00 UTC
#: (lr, hidden, act, state, epochs)
TRIALS = [
    (0.01, 64, "relu", "succeeded", 9),
    (0.0002, 32, "tanh", "pruned", 1),
    (0.03, 128, "relu", "succeeded", 9),
    (0.5, 16, "tanh", "pruned", 2),
    (0.008, 96, "relu", "succeeded", 9),
    (0.001, 48, "relu", "failed", 0),
    (0.2, 80, "tanh", "succeeded", 9),
    (0.004, 112, "relu", "running", 4),
]


def _trial(number: int, state: str = "") -> pb.Trial:
    lr, hidden, act, planned, epochs = TRIALS[number]
    state = state or planned
    final = 0.95 - 0.12 * (math.log10(lr) + 2) ** 2 + 0.01 * hidden / 128 - 0.02 * (act == "tanh")
    curve = [pb.CurvePoint(epoch=e, value=final * (1 - 0.5**e)) for e in range(1, epochs + 1)]
    reasons = {
        "succeeded": f"accuracy {final * (1 - 0.5**epochs):.4g}",
        "pruned": f"pruned at epoch {epochs}: accuracy was behind the other trials (asha)",
        "failed": "job j-5 failed: CUDA out of memory",
        "running": f"job j-{number}",
        "cancelled": "cancelled by dev: wrong data",
    }
    t = pb.Trial(
        number=number, state=state, job_id=f"j-{number}", curve=curve, reason=reasons[state],
        values={"lr": repr(lr), "hidden": str(hidden), "act": act}, device_s=epochs * 100.0,
    )  # fmt: skip
    if state in ("succeeded", "pruned"):
        t.value, t.has_value = curve[-1].value, True
    if state == "succeeded":
        t.model = f"churn-hpo:{number + 1}"
    return t


def _experiment(
    state: str = "running", upto: int = 8, running: tuple[int, ...] = (), **extra: Any
) -> pb.Experiment:
    """churn-hpo with its first ``upto`` trials, those in ``running`` still running."""
    trials = [_trial(n, "running" if n in running else "") for n in range(upto)]
    done = [t for t in trials if t.state == "succeeded"]
    fields: dict[str, Any] = {
        "name": "churn-hpo", "owner": "dev", "state": state, "spec_yaml": HPO,
        "metric": "accuracy", "goal": "maximize", "method": "tpe", "pruner": "asha",
        "budget_trials": 12, "budget_gpu_hours": 2.0, "parallelism": 3, "trials": trials,
        "device_s": sum(t.device_s for t in trials),
        "best_trial": max(done, key=lambda t: t.value).number if done else -1,
        "created_ms": T0, "finished_ms": 0 if state in ("running", "checked") else T0 + 3_600_000,
        "parameters": ["lr", "hidden", "act"], "reason": "searching 12 trials with tpe",
    }  # fmt: skip
    return pb.Experiment(**{**fields, **extra})


SUCCEEDED = _experiment(
    "succeeded",
    upto=7,
    reason="best trial 4: accuracy 0.9545 with lr=0.008, hidden=96, act=relu; 7 trials "
    "(2 pruned), 3900 device-seconds",
)
FAILED = _experiment("failed", upto=0, reason="no trial succeeded: job j-0 failed")
TUNED_RUN = pb.Run(
    id="run-1", pipeline="tuned", revision=1, owner="dev", state="succeeded", trigger="manual",
    reason="all 2 steps succeeded", created_ms=T0, started_ms=T0, finished_ms=T0 + 600_000,
    steps=[
        pb.StepRun(
            name="search", kind="experiment", state="succeeded", attempt=1,
            reason="best trial 2: accuracy 0.8 with lr=0.01", started_ms=T0,
            finished_ms=T0 + 500_000, metrics={"accuracy": 0.8},
            outputs={"experiment": "tuned-search-12345678", "job": "j-9", "trial": "2",
                     "model": "tuned:3"},
            produced=[pb.Artifact(kind="model", name="tuned", version="3")],
            attempts=[pb.StepAttempt(number=1, state="running")],
        ),
        pb.StepRun(
            name="deploy", kind="deploy", state="succeeded", attempt=1, depends_on=["search"],
            reason="tuned v3 serving at 100%", outputs={"deployment": "tuned", "version": "3"},
            inputs=[pb.Artifact(kind="model", name="tuned", version="3")],
        ),
    ],
)  # fmt: skip


@dataclass
class FakeWorkflows(pb_grpc.WorkflowServiceServicer):
    """Canned answers; ``GetExperiment`` of churn-hpo answers from ``script``, one per poll."""

    script: list[pb.Experiment] = field(default_factory=lambda: [_experiment()])
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitExperiment(self, request: Any, context: Any) -> pb.Experiment:
        if "{choice: []}" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "experiment 'churn-hpo' is invalid: spec.space.act: choice [] has no values to "
                "choose from — fix these and submit again; see docs/workflows.md",
            )
        if request.dry_run:
            return _experiment("checked", upto=0, reason="", created_ms=0, device_s=0)
        return _experiment(upto=3, running=(2,))

    def GetExperiment(self, request: Any, context: Any) -> pb.Experiment:
        if request.name != "churn-hpo":
            context.abort(grpc.StatusCode.NOT_FOUND, f"experiment {request.name!r} not found")
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        return self.script[min(poll, len(self.script) - 1)]

    def ListExperiments(self, request: Any, context: Any) -> pb.ListExperimentsResponse:
        return pb.ListExperimentsResponse(experiments=[_experiment(), SUCCEEDED, FAILED])

    def CancelExperiment(self, request: Any, context: Any) -> pb.Experiment:
        e = _experiment("cancelled", reason=request.reason or "cancelled by dev")
        e.trials[7].CopyFrom(_trial(7, "cancelled"))
        return e

    def SubmitPipeline(self, request: Any, context: Any) -> pb.SubmitPipelineResponse:
        p = pb.Pipeline(
            name="tuned", kind="Pipeline", owner="dev", revision=1, spec_yaml=request.spec_yaml,
            steps=["search", "deploy"],
        )  # fmt: skip
        return pb.SubmitPipelineResponse(pipeline=p)

    def GetRun(self, request: Any, context: Any) -> pb.Run:
        return TUNED_RUN


#: ``gantry ARGS`` -> its exit status, stdout and stderr (conftest's ``CliResult``).
Gantry = Callable[..., Any]


@pytest.fixture
def fake(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeWorkflows(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def gantry(fake: Any, gantry_cli: Any, monkeypatch: pytest.MonkeyPatch) -> Gantry:
    """Run ``gantry ARGS`` against the fake; no traceback may reach the user."""
    monkeypatch.setattr(_experiments, "POLL_S", 0.01)
    return gantry_cli(TOKEN, workflows=fake)


# ---------------------------------------------------------------------- submit


def test_submit_starts_the_search_and_prints_its_settings(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    spec = tmp_path / "hpo.yaml"
    spec.write_text(HPO)
    r = gantry("experiments", "submit", spec)
    assert r.code == 0, r.err
    assert fake.last(pb.SubmitExperimentRequest).spec_yaml == HPO
    assert "started experiment churn-hpo: searching 12 trials with tpe" in r.out
    fields = r.fields()
    assert fields["objective"] == "maximize accuracy"
    assert fields["method"] == "tpe (Bayesian: TPE)"
    assert fields["pruner"] == "asha (successive halving)"
    assert fields["budget"] == "12 trials, 2 device-hours"
    assert fields["used"] == (
        "3 of 12 trials (1 pruned, 1 running); 0.53 of 2 device-hours (1900 device-seconds)"
    )
    assert fields["space"] == (
        "lr: logUniform [0.0001, 1]; hidden: int [16, 128] step 16; act: choice [relu, tanh]"
    )
    assert fields["best trial"].startswith("0: accuracy 0.9531 after 9 epochs (lr=0.01, hidden=64")
    assert "follow it with 'gantry experiments get churn-hpo'" in r.out

    r = gantry("experiments", "submit", spec, "--dry-run")
    assert r.code == 0, r.err
    assert fake.last(pb.SubmitExperimentRequest).dry_run
    assert "dry run: experiment churn-hpo is valid; nothing was stored or started" in r.out
    assert "used" not in r.fields() and "best trial" not in r.fields()

    r = gantry("experiments", "submit", spec, "--json")
    data = json.loads(r.out)
    assert data["name"] == "churn-hpo" and len(data["trials"]) == 3
    assert data["trials"][1]["curve"] == [[1, pytest.approx(0.2931, abs=1e-3)]]
    assert "started experiment churn-hpo" in r.err  # --json keeps stdout parseable


def test_submit_reports_bad_files_and_bad_documents_cleanly(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    r = gantry("experiments", "submit", tmp_path / "nope.yaml")
    assert r.code == 2
    assert r.err.splitlines() == [
        f"gantry: error: no experiment file {tmp_path / 'nope.yaml'}",
        "gantry: hint: give the path of an Experiment YAML file",
    ]
    r = gantry("experiments", "submit", tmp_path)
    assert r.code == 2 and "is a directory, not an experiment file" in r.err
    (tmp_path / "empty.yaml").write_text("\n")
    r = gantry("experiments", "submit", tmp_path / "empty.yaml")
    assert r.code == 2 and "gantry: error: the experiment document is empty" in r.err
    (tmp_path / "hpo.yaml").write_text(HPO)
    r = gantry("experiments", "submit", tmp_path / "hpo.yaml", "--dry-run", "--wait")
    assert r.code == 2 and "--dry-run starts nothing, so there is nothing to --wait for" in r.err
    assert fake.requests == []  # none of these reached the service

    bad = tmp_path / "bad.yaml"
    bad.write_text(HPO.replace("{choice: [relu, tanh]}", "{choice: []}"))
    r = gantry("experiments", "submit", bad)
    assert r.code == 2
    assert r.err.splitlines()[0] == (
        "gantry: error: experiment 'churn-hpo' is invalid: spec.space.act: choice [] has no "
        "values to choose from — fix these and submit again; see docs/workflows.md"
    )


def test_submit_wait_follows_the_trials_and_shows_the_best(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    spec = tmp_path / "hpo.yaml"
    spec.write_text(HPO)
    fake.service.script = [_experiment(upto=3, running=(2,)), _experiment(upto=5), SUCCEEDED]
    r = gantry("experiments", "submit", spec, "--wait")
    assert r.code == 0, r.err
    assert fake.service.polls == 3
    events = [line.split("  ", 1)[1] for line in r.err.splitlines()]  # after the time stamp
    assert events[:4] == [
        "trial 0 succeeded: accuracy 0.9531 after 9 epochs",
        "trial 1 pruned: pruned at epoch 1: accuracy was behind the other trials (asha)",
        "trial 2 started: lr=0.03, hidden=128, act=relu",
        "best so far: trial 0, accuracy 0.9531",
    ]
    assert "trial 2 succeeded: accuracy 0.9309 after 9 epochs" in events
    assert "trial 5 failed: job j-5 failed: CUDA out of memory" in events
    assert "best so far: trial 4, accuracy 0.9545" in events
    assert sum(e.startswith("trial 2 ") for e in events) == 2  # started, then succeeded

    assert "experiment churn-hpo: succeeded" in r.out
    assert "best trial 4: accuracy 0.9545 with lr=0.008" in r.out
    assert r.cells("4 ★") == [
        "4 ★", "succeeded", "lr=0.008, hidden=96, act=relu", "0.9545", "9", "900",
        "accuracy 0.9545",
    ]  # fmt: skip
    assert r.cells("1")[:6] == ["1", "pruned", "lr=0.0002, hidden=32, act=tanh",
                                      "0.2931", "1", "100"]  # fmt: skip


def test_submit_wait_exits_1_when_the_search_fails_or_takes_too_long(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    spec = tmp_path / "hpo.yaml"
    spec.write_text(HPO)
    fake.service.script = [_experiment(upto=1), FAILED]
    r = gantry("experiments", "submit", spec, "--wait")
    assert r.code == 1
    assert "experiment churn-hpo: failed" in r.out and "no trial succeeded" in r.out
    assert r.fields()["best trial"] == "none: no trial succeeded"

    fake.service.script, fake.service.polls = [_experiment(upto=4)], 0
    r = gantry("experiments", "submit", spec, "--wait", "--timeout", "0.2", "--json")
    assert r.code == 1
    assert len(json.loads(r.out)["trials"]) == 4  # stdout: the experiment as last seen
    assert "experiment churn-hpo is still running after 0.2s; it goes on: follow it" in r.err
    assert fake.service.polls >= 2  # polled again before giving up (how often depends on load)


# ---------------------------------------------------------------------- list, get, cancel


def test_list_shows_each_search_and_its_best(gantry: Gantry, fake: Any) -> None:
    r = gantry("experiments", "list", "--state", "running")
    assert r.code == 0, r.err
    assert fake.last(pb.ListExperimentsRequest).state == "running"
    assert "3 experiments running" in r.out
    lines = [line for line in r.out.splitlines() if line.startswith("│ churn-hpo")]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    assert rows[0][:10] == [
        "churn-hpo", "running", "maximize accuracy", "tpe", "asha", "8/12", "2", "0.9545 (#4)",
        "1.19", "2026-01-01 02:00:00",
    ]  # fmt: skip
    assert rows[2][1] == "failed" and rows[2][7] == ""
    data = json.loads(gantry("experiments", "list", "--json").out)
    assert [e["state"] for e in data] == ["running", "succeeded", "failed"]

    before = len(fake.requests)
    r = gantry("experiments", "list", "--state", "done")
    assert r.code == 2 and "gantry: error: unknown experiment state 'done'" in r.err
    assert "one of running, succeeded, failed, cancelled" in r.err
    assert len(fake.requests) == before


def test_get_shows_the_budget_the_best_trial_and_every_trial(gantry: Gantry) -> None:
    r = gantry("experiments", "get", "churn-hpo")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[:2] == ["experiment churn-hpo: running", "  searching 12 trials with tpe"]
    fields = r.fields()
    assert fields["used"] == (
        "8 of 12 trials (2 pruned, 1 failed, 1 running); 1.19 of 2 device-hours "
        "(4300 device-seconds)"
    )
    assert fields["parallelism"] == "up to 3 trials at a time"
    assert fields["best trial"] == (
        "4: accuracy 0.9545 after 9 epochs (lr=0.008, hidden=96, act=relu), model churn-hpo:5, "
        "job j-4"
    )
    assert "8 trials (maximize accuracy; ★ the best)" in r.out
    assert r.cells("5") == [
        "5", "failed", "lr=0.001, hidden=48, act=relu", "", "", "",
        "job j-5 failed: CUDA out of memory",
    ]  # fmt: skip
    assert r.cells("7")[:6] == ["7", "running", "lr=0.004, hidden=112, act=relu", "", "4",
                                      "400"]  # fmt: skip

    r = gantry("experiments", "get", "nope")
    assert r.code == 2 and r.err.strip() == "gantry: error: experiment 'nope' not found"
    assert json.loads(gantry("experiments", "get", "churn-hpo", "--json").out)["best_trial"] == 4


def test_get_plot_writes_the_picture_and_says_where(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    png, page = tmp_path / "out" / "hpo.png", tmp_path / "hpo.html"
    r = gantry("experiments", "get", "churn-hpo", "--plot", png, "--html", page)
    assert r.code == 0, r.err
    assert f"wrote the plot to {png}" in r.out and f"wrote the HTML page to {page}" in r.out
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 20_000
    assert page.read_text().count("<svg") == 1

    r = gantry("experiments", "get", "churn-hpo", "--json", "--plot", tmp_path / "j.png")
    assert r.code == 0 and json.loads(r.out)["name"] == "churn-hpo"
    assert "wrote the plot to" in r.err

    before = len(fake.requests)
    r = gantry("experiments", "get", "churn-hpo", "--plot", tmp_path / "hpo.jpg")
    assert r.code == 2 and f"--plot {tmp_path / 'hpo.jpg'} should end in .png" in r.err
    assert len(fake.requests) == before


def test_cancel_says_what_stopped(gantry: Gantry, fake: Any) -> None:
    r = gantry("experiments", "cancel", "churn-hpo", "--reason", "wrong data")
    assert r.code == 0, r.err
    sent = fake.last(pb.NameRequest)
    assert (sent.name, sent.reason) == ("churn-hpo", "wrong data")
    assert r.out.splitlines() == [
        "experiment churn-hpo: cancelled: wrong data",
        "  cancelled 1 running trial (7) and their jobs",
        "  the best trial so far stays: 4: accuracy 0.9545 after 9 epochs (lr=0.008, hidden=96, "
        "act=relu), model churn-hpo:5, job j-4",
    ]


def test_the_service_is_found_from_the_setting_or_said_missing(
    gantry: Gantry, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run" / "workflows.json").unlink()
    r = gantry("experiments", "list")
    assert r.code == 2 and "don't know where the workflows service is" in r.err
    assert "GANTRY_WORKFLOWS_ADDR" in r.err
    monkeypatch.setenv("GANTRY_WORKFLOWS_ADDR", f"127.0.0.1:{fake.port}")
    assert gantry("experiments", "list").code == 0


# ---------------------------------------------------------------------- experiment steps


def test_a_pipeline_with_an_experiment_step_shows_it(gantry: Gantry, tmp_path: Path) -> None:
    spec = tmp_path / "tuned.yaml"
    spec.write_text(TUNED)
    r = gantry("pipelines", "submit", spec)
    assert r.code == 0, r.err
    assert r.cells("1") == ["1", "search", "experiment", "-", "", ""]
    assert r.cells("2") == ["2", "deploy", "deploy", "search", "search.accuracy >= 0.5", ""]

    r = gantry("pipelines", "runs", "get", "run-1")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    at = lines.index("✓ search (experiment)")
    assert lines[at + 1] == "└─ ✓ deploy (deploy) ← search"
    # the best trial's job stands for the step's job
    assert r.cells("search")[:5] == ["search", "experiment", "succeeded", "1", "j-9"]
    at = lines.index("search:")
    assert lines[at + 1 : at + 5] == [
        "  outputs: experiment=tuned-search-12345678, job=j-9, model=tuned:3, trial=2",
        "  metrics: accuracy=0.8",
        "  lineage: nothing → model tuned@3",
        "  trials: best trial 2; see 'gantry experiments get tuned-search-12345678'",
    ]


def test_an_experiment_steps_job_is_its_best_trials() -> None:
    run = RunInfo.from_pb(TUNED_RUN)
    search, deploy = run.steps
    assert (_pipeline_runs.job_of(search), _pipeline_runs.job_of(deploy)) == ("j-9", "")
    line = _pipeline_runs.step_line(search, 6)
    assert line.split()[:4] == ["✓", "search", "experiment", "succeeded"]
