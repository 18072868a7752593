"""``gantry pipelines`` against a fake workflows service (and a fake scheduler for job logs),
each on a free local port, found through the data directory's run files like the real ones.

The fakes answer in the protocol's shapes with canned pipelines and runs of the churn pipeline
(preprocess → train → evaluate → gated deploy) and a nightly cron pipeline; a run can be
scripted to move on from poll to poll. Every request is recorded, so tests can check what the
CLI sent, and that bad input was refused before anything was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.client.cli import _pipelines
from gantry.protos.v1 import scheduler_pb2 as spb
from gantry.protos.v1 import scheduler_pb2_grpc as spb_grpc
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
CHURN = """\
apiVersion: gantry/v1
kind: Pipeline
metadata: {name: churn}
spec:
  params: {epochs: 3, min_accuracy: 0.7}
  steps:
    - name: preprocess
      data: {commit: churn-features, entrypoint: {transform: "m:features"}}
    - name: train
      retries: 2
      train:
        entrypoint: {task: "m:task", args: ["epochs=${params.epochs}"]}
        data: [{dataset: churn-features, version: "${steps.preprocess.outputs.version}"}]
    - name: evaluate
      evaluate: {model: "${steps.train.outputs.model}", entrypoint: {task: "m:task"}}
    - name: deploy
      gate: {metric: "${steps.evaluate.outputs.metrics.accuracy}", atLeast: 0.8}
      deploy: {deployment: churn, model: "${steps.evaluate.outputs.model}"}
"""
ORDER = ("preprocess", "train", "evaluate", "deploy")
KINDS = dict(zip(ORDER, ("data", "train", "evaluate", "deploy"), strict=True))
PARENTS = {"preprocess": [], "train": ["preprocess"], "evaluate": ["train"], "deploy": ["evaluate"]}
T0 = 1_767_232_800_000  # 2026-01-01 02:00:00 UTC
NEXT_FIRE = 1_767_236_400_000  # 2026-01-01 03:00:00 UTC


def _pipeline(name: str = "churn", **extra: Any) -> pb.Pipeline:
    fields: dict[str, Any] = {
        "kind": "Pipeline", "owner": "dev", "revision": 2, "spec_yaml": CHURN, "steps": ORDER,
        "params": {"epochs": "3", "min_accuracy": "0.7"}, "created_ms": T0, "updated_ms": T0,
        "last_run_id": "run-1", "last_run_state": "succeeded",
    }  # fmt: skip
    return pb.Pipeline(name=name, **{**fields, **extra})


def _step(name: str, state: str, reason: str = "", **extra: Any) -> pb.StepRun:
    done = state in ("succeeded", "failed", "skipped", "cancelled")
    started = state not in ("pending", "skipped")
    return pb.StepRun(
        name=name, kind=KINDS[name], state=state, reason=reason, depends_on=PARENTS[name],
        attempt=extra.pop("attempt", 1 if started else 0),
        started_ms=T0 if started else 0, finished_ms=T0 + 90_000 if done and started else 0,
        **extra,
    )  # fmt: skip


def _run(state: str, steps: list[pb.StepRun], run_id: str = "run-1", **extra: Any) -> pb.Run:
    done = state not in ("queued", "running")
    extra.setdefault("trigger", "manual")
    return pb.Run(
        id=run_id, pipeline="churn", revision=2, owner="dev", state=state,
        params={"epochs": "3"}, steps=steps, created_ms=T0, started_ms=T0,
        finished_ms=T0 + 400_000 if done else 0, **extra,
    )  # fmt: skip


def _art(kind: str, name: str, version: str) -> pb.Artifact:
    return pb.Artifact(kind=kind, name=name, version=version)


PREPROCESSED = _step(
    "preprocess", "succeeded", "job j-1 succeeded", job_id="j-1",
    outputs={"job": "j-1", "dataset": "churn-features", "version": "9f3c"},
    inputs=[_art("dataset", "churn", "0123")], produced=[_art("dataset", "churn-features", "9f3c")],
)  # fmt: skip
TRAINED = _step(
    "train", "succeeded", "job j-3 succeeded (loss=0.31)", job_id="j-3", attempt=2,
    outputs={"job": "j-3", "model": "churn:4"}, metrics={"loss": 0.3141},
    inputs=[_art("dataset", "churn-features", "9f3c")], produced=[_art("model", "churn", "4")],
    attempts=[
        pb.StepAttempt(number=1, job_id="j-2", state="failed", reason="job j-2 failed: OOM"),
        pb.StepAttempt(number=2, job_id="j-3", state="succeeded"),
    ],
)  # fmt: skip
PENDING = [_step(n, "pending") for n in ORDER]
SUCCEEDED = _run(
    "succeeded",
    [
        PREPROCESSED,
        TRAINED,
        _step("evaluate", "succeeded", "job j-4 succeeded (accuracy=0.91)", job_id="j-4",
              outputs={"job": "j-4", "model": "churn:4"}, metrics={"accuracy": 0.91},
              inputs=[_art("model", "churn", "4")]),
        _step("deploy", "succeeded", "churn v4 canary at 20% in churn",
              outputs={"deployment": "churn", "version": "4"},
              inputs=[_art("model", "churn", "4")], produced=[_art("deployment", "churn", "4")]),
    ],
    reason="all 4 steps succeeded",
)  # fmt: skip
FAILED = _run(
    "failed",
    [
        PREPROCESSED,
        TRAINED,
        _step("evaluate", "failed", "job j-4 failed: evaluate() raised", job_id="j-4"),
        _step("deploy", "skipped", "not run: step evaluate failed"),
    ],
    reason="step evaluate failed: job j-4 failed: evaluate() raised",
)  # fmt: skip
RUNNING = [
    _run("running", [_step("preprocess", "running", "job j-1", job_id="j-1"), *PENDING[1:]]),
    _run("running", [PREPROCESSED, _step("train", "running", "job j-3", job_id="j-3"),
                     *PENDING[2:]]),
]  # fmt: skip
HISTORY = [
    _run("skipped", [_step(n, "skipped", "not run: the run was skipped") for n in ORDER],
         run_id="run-9", trigger="schedule", scheduled_ms=NEXT_FIRE,
         reason="skipped: run run-8 is still running (concurrency: skip)"),
    _run("running", RUNNING[1].steps, run_id="run-8", trigger="schedule",
         scheduled_ms=NEXT_FIRE - 86_400_000,
         reason="scheduled for 2025-12-31T03:00:00+00:00 (0 3 * * *)"),
]  # fmt: skip


@dataclass
class FakeWorkflows(pb_grpc.WorkflowServiceServicer):
    """Canned answers; ``GetRun`` of run-1 answers from ``script``, one run per poll."""

    script: list[pb.Run] = field(default_factory=lambda: [SUCCEEDED])
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitPipeline(self, request: Any, context: Any) -> pb.SubmitPipelineResponse:
        if "atLeast: oops" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the pipeline is invalid: spec.steps[3] (deploy).gate.atLeast: Input should be "
                "a valid number — see docs/workflows.md for the pipeline format",
            )
        p = _pipeline(spec_yaml=request.spec_yaml, revision=0 if request.dry_run else 2)
        return pb.SubmitPipelineResponse(pipeline=p, replaced=not request.dry_run)

    def GetPipeline(self, request: Any, context: Any) -> pb.Pipeline:
        if request.name == "nightly":
            schedule = pb.Schedule(
                cron="0 3 * * *",
                timezone="Europe/Paris",
                concurrency="skip",
                next_fire_ms=NEXT_FIRE,
                missed=11,
            )
            return _pipeline("nightly", kind="CronPipeline", schedule=schedule)  # fmt: skip
        if request.name != "churn":
            context.abort(grpc.StatusCode.NOT_FOUND, f"pipeline {request.name!r} not found")
        return _pipeline()

    def ListPipelines(self, request: Any, context: Any) -> pb.ListPipelinesResponse:
        schedule = pb.Schedule(cron="0 3 * * *", timezone="UTC", concurrency="queue",
                               next_fire_ms=NEXT_FIRE)  # fmt: skip
        return pb.ListPipelinesResponse(
            pipelines=[_pipeline(), _pipeline("nightly", kind="CronPipeline", schedule=schedule)]
        )

    def DeletePipeline(self, request: Any, context: Any) -> pb.Pipeline:
        if request.name == "nightly":
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "pipeline nightly has 1 active run(s)"
            )
        return _pipeline(request.name)

    def StartRun(self, request: Any, context: Any) -> pb.StartRunResponse:
        if "lr" in request.params:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "unknown parameter 'lr'; the pipeline declares epochs, min_accuracy",
            )
        return pb.StartRunResponse(
            run=_run("running", PENDING), duplicate=request.request_id == "x"
        )

    def GetRun(self, request: Any, context: Any) -> pb.Run:
        if request.id != "run-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.id!r} not found")
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        return self.script[min(poll, len(self.script) - 1)]

    def ListRuns(self, request: Any, context: Any) -> pb.ListRunsResponse:
        return pb.ListRunsResponse(runs=HISTORY)

    def CancelRun(self, request: Any, context: Any) -> pb.Run:
        steps = [_step("preprocess", "cancelled", request.reason), *PENDING[1:]]
        return _run("cancelled", steps, reason=request.reason)

    def RetryRun(self, request: Any, context: Any) -> pb.Run:
        if request.from_step == "tune":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "run run-1 has no step 'tune'")
        steps = [PREPROCESSED, TRAINED, _step("evaluate", "running", job_id="j-5"), PENDING[3]]
        return _run("running", steps, reason="retried by dev")


class FakeScheduler(spb_grpc.SchedulerServiceServicer):
    """Job logs only: a few lines of each job the churn run ran; j-4's logs are gone."""

    def JobLogs(self, request: spb.JobLogsRequest, context: Any) -> Iterator[spb.LogLine]:
        if request.id == "j-4":
            context.abort(grpc.StatusCode.NOT_FOUND, "job 'j-4' not found")
        lines = [f"{request.id} line {i}" for i in range(1, 6)]
        for text in lines[-request.tail :] if request.tail else lines:
            yield spb.LogLine(at_ms=T0, worker=0, stream="stdout", text=text + "\n")


@dataclass
class Fakes:
    """The two fakes on free local ports (each a ``Served``: the fake and the requests it
    got)."""

    workflows: Any
    scheduler: Any


#: ``gantry ARGS`` -> its exit status, stdout and stderr (conftest's ``CliResult``).
Gantry = Callable[..., Any]


@pytest.fixture
def fakes(serve_fake: Any) -> Fakes:
    return Fakes(
        serve_fake(FakeWorkflows(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN),
        serve_fake(FakeScheduler(), spb_grpc.add_SchedulerServiceServicer_to_server),
    )


@pytest.fixture
def gantry(fakes: Fakes, gantry_cli: Any, monkeypatch: pytest.MonkeyPatch) -> Gantry:
    """Run ``gantry ARGS`` against the fakes, found through the data directory's run files; no
    traceback may reach the user."""
    monkeypatch.setattr(_pipelines, "POLL_S", 0.01)
    return gantry_cli(TOKEN, workflows=fakes.workflows, scheduler=fakes.scheduler)


# ---------------------------------------------------------------------- pipelines


def test_submit_prints_the_steps_in_order_with_what_they_wait_for(
    gantry: Gantry, fakes: Fakes, tmp_path: Path
) -> None:
    spec = tmp_path / "churn.yaml"
    spec.write_text(CHURN)
    r = gantry("pipelines", "submit", spec)
    assert r.code == 0, r.err
    assert fakes.workflows.last(pb.SubmitPipelineRequest).spec_yaml == CHURN
    assert "submitted Pipeline churn revision 2 (4 steps), replacing revision 1" in r.out
    assert r.cells("1") == ["1", "preprocess", "data", "-", "", ""]
    assert r.cells("2") == ["2", "train", "train", "preprocess", "", "2"]
    assert r.cells("4") == [
        "4",
        "deploy",
        "deploy",
        "evaluate",
        "evaluate.accuracy >= 0.8",
        "",
    ]
    assert "start a run with 'gantry pipelines run churn'" in r.out

    r = gantry("pipelines", "submit", spec, "--dry-run")
    assert r.code == 0 and "dry run: Pipeline churn is valid (4 steps); nothing was stored" in r.out
    assert fakes.workflows.last(pb.SubmitPipelineRequest).dry_run

    data = json.loads(gantry("pipelines", "submit", spec, "--json").out)
    assert data["name"] == "churn" and data["replaced"] is True and data["steps"] == list(ORDER)


def test_submit_reports_bad_files_and_bad_documents_cleanly(
    gantry: Gantry, fakes: Fakes, tmp_path: Path
) -> None:
    r = gantry("pipelines", "submit", tmp_path / "nope.yaml")
    assert r.code == 2 and f"gantry: error: no pipeline file {tmp_path / 'nope.yaml'}" in r.err
    r = gantry("pipelines", "submit", tmp_path)
    assert r.code == 2 and "is a directory, not a pipeline file" in r.err
    (tmp_path / "empty.yaml").write_text("\n")
    r = gantry("pipelines", "submit", tmp_path / "empty.yaml")
    assert r.code == 2 and "the pipeline document is empty" in r.err
    assert fakes.workflows.requests == []  # none of these reached the service

    bad = tmp_path / "bad.yaml"
    bad.write_text(CHURN.replace("atLeast: 0.8", "atLeast: oops"))
    r = gantry("pipelines", "submit", bad)
    assert r.code == 2
    assert r.err.splitlines()[0] == (
        "gantry: error: the pipeline is invalid: spec.steps[3] (deploy).gate.atLeast: Input "
        "should be a valid number — see docs/workflows.md for the pipeline format"
    )


def test_list_get_and_delete(gantry: Gantry, fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    r = gantry("pipelines", "list")
    assert r.code == 0, r.err
    assert "2 pipelines" in r.out
    assert r.cells("churn") == [
        "churn",
        "Pipeline",
        "2",
        "dev",
        "4",
        "",
        "",
        "run-1 succeeded",
    ]
    assert r.cells("nightly")[5:7] == ["0 3 * * * (UTC), queue", "2026-01-01 03:00:00"]

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # the next fire in local time: 9 hours ahead of UTC
    time.tzset()
    try:
        r = gantry("pipelines", "get", "nightly")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert r.code == 0, r.err
    assert "CronPipeline nightly, revision 2" in r.out
    fields = {x.split("  ", 1)[0]: x.split("  ", 1)[1].strip() for x in r.out.splitlines()[1:8]}
    assert fields["schedule"] == "0 3 * * * (Europe/Paris), concurrency skip"
    assert fields["next fire"] == "2026-01-01 12:00:00 JST (2026-01-01 03:00:00 UTC)"
    assert fields["missed fires"].startswith("11 (the service was down")
    assert fields["params"] == "epochs=3, min_accuracy=0.7"
    assert fields["last run"] == "run-1 (succeeded)" and fields["owner"] == "dev"
    assert r.cells("3") == ["3", "evaluate", "evaluate", "train", "", ""]

    r = gantry("pipelines", "get", "nope")
    assert r.code == 2 and r.err.strip() == "gantry: error: pipeline 'nope' not found"
    assert json.loads(gantry("pipelines", "get", "churn", "--json").out)["revision"] == 2

    r = gantry("pipelines", "delete", "churn")
    assert r.code == 0 and "deleted Pipeline churn (revision 2); its runs stay" in r.out
    r = gantry("pipelines", "delete", "nightly")
    assert r.code == 2 and "gantry: error: pipeline nightly has 1 active run(s)" in r.err


# ---------------------------------------------------------------------- run


def test_run_sends_the_parameters_and_refuses_bad_ones(gantry: Gantry, fakes: Fakes) -> None:
    r = gantry("pipelines", "run", "churn", "--param", "epochs=20", "-p", "note=a=b",
               "--request-id", "r-1")  # fmt: skip
    assert r.code == 0, r.err
    sent = fakes.workflows.last(pb.StartRunRequest)
    assert dict(sent.params) == {"epochs": "20", "note": "a=b"} and sent.request_id == "r-1"
    assert "started run run-1 of churn (revision 2): running" in r.out
    assert "follow it with 'gantry pipelines runs get run-1'" in r.out
    r = gantry("pipelines", "run", "churn", "--request-id", "x")
    assert "run run-1 of churn was already started with request id x; it is running" in r.out

    before = len(fakes.workflows.requests)
    r = gantry("pipelines", "run", "churn", "--param", "epochs")
    assert r.code == 2 and "gantry: error: --param 'epochs' is not name=value" in r.err
    assert "gantry: hint: e.g. --param epochs=20" in r.err
    r = gantry("pipelines", "run", "churn", "--param", "=3")
    assert r.code == 2 and "is not name=value" in r.err
    r = gantry("pipelines", "run", "churn", "-p", "epochs=1", "-p", "epochs=2")
    assert r.code == 2 and "--param epochs is given twice" in r.err
    assert len(fakes.workflows.requests) == before
    r = gantry("pipelines", "run", "churn", "--param", "lr=0.1")
    assert r.code == 2 and "unknown parameter 'lr'; the pipeline declares epochs" in r.err


def test_run_wait_follows_the_steps_and_shows_the_run(gantry: Gantry, fakes: Fakes) -> None:
    fakes.workflows.service.script = [*RUNNING, SUCCEEDED]
    r = gantry("pipelines", "run", "churn", "--wait")
    assert r.code == 0, r.err
    assert fakes.workflows.service.polls == 3
    changes = [line.split("  ", 1)[1] for line in r.err.splitlines()]  # after the time stamp
    assert changes[0].split() == ["…", "preprocess", "data", "running", "job", "j-1"]
    assert any(c.split()[:4] == ["✓", "train", "train", "succeeded"] for c in changes)
    assert "run run-1 of churn (revision 2): succeeded" in r.out
    assert "✓ deploy (deploy) ← evaluate" in r.out
    assert r.cells("train")[:6] == ["train", "train", "succeeded", "2", "j-3", "1m 30s"]


def test_run_wait_exits_1_when_the_run_fails_or_takes_too_long(
    gantry: Gantry, fakes: Fakes
) -> None:
    fakes.workflows.service.script = [RUNNING[0], FAILED]
    r = gantry("pipelines", "run", "churn", "--wait")
    assert r.code == 1
    assert "run run-1 of churn (revision 2): failed" in r.out
    assert "step evaluate failed: job j-4 failed: evaluate() raised" in r.out
    assert "      └─ ⊘ deploy (deploy) ← evaluate" in r.out.splitlines()

    fakes.workflows.service.script, fakes.workflows.service.polls = [RUNNING[1]], 0
    r = gantry("pipelines", "run", "churn", "--wait", "--timeout", "0.2", "--json")
    assert r.code == 1
    assert json.loads(r.out)["steps"][1]["state"] == "running"  # stdout: the run as last seen
    assert "run run-1 is still running after 0.2s; it goes on: follow it with" in r.err
    assert fakes.workflows.service.polls >= 3


# ---------------------------------------------------------------------- runs


def test_runs_list_shows_the_cron_history(gantry: Gantry, fakes: Fakes) -> None:
    r = gantry("pipelines", "runs", "list", "--pipeline", "churn", "--state", "skipped",
               "--limit", "5")  # fmt: skip
    assert r.code == 0, r.err
    sent = fakes.workflows.last(pb.ListRunsRequest)
    assert (sent.pipeline, sent.state, sent.limit) == ("churn", "skipped", 5)
    assert "2 runs of churn" in r.out
    assert r.cells("run-9") == [
        "run-9", "churn", "2", "schedule", "2026-01-01 03:00:00", "2026-01-01 02:00:00",
        "6m 40s", "skipped", "skipped: run run-8 is still running (concurrency: skip)",
    ]  # fmt: skip
    assert r.cells("run-8")[6:8] == ["", "running"]
    data = json.loads(gantry("pipelines", "runs", "list", "--json").out)
    assert [x["id"] for x in data] == ["run-9", "run-8"]

    before = len(fakes.workflows.requests)
    r = gantry("pipelines", "runs", "list", "--state", "done")
    assert r.code == 2 and "gantry: error: unknown run state 'done'" in r.err
    assert "one of queued, running, succeeded, failed, cancelled, skipped" in r.err
    assert len(fakes.workflows.requests) == before


def test_runs_get_draws_the_graph_and_shows_outputs_lineage_and_attempts(
    gantry: Gantry,
) -> None:
    r = gantry("pipelines", "runs", "get", "run-1")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "run run-1 of churn (revision 2): succeeded"
    assert lines[1:4] == [
        "  all 4 steps succeeded",
        "  trigger manual, owner dev, started 2026-01-01 02:00:00 UTC, took 6m 40s",
        "  params: epochs=3",
    ]
    graph_at = lines.index("✓ preprocess (data)")
    assert lines[graph_at : graph_at + 4] == [
        "✓ preprocess (data)",
        "└─ ✓ train (train) ← preprocess",
        "   └─ ✓ evaluate (evaluate) ← train",
        "      └─ ✓ deploy (deploy) ← evaluate",
    ]
    assert r.cells("deploy")[:7] == [
        "deploy", "deploy", "succeeded", "1", "", "1m 30s", "churn v4 canary at 20% in churn",
    ]  # fmt: skip
    at = lines.index("train:")
    assert lines[at + 1 : at + 6] == [
        "  outputs: job=j-3, model=churn:4",
        "  metrics: loss=0.3141",
        "  lineage: dataset churn-features@9f3c → model churn@4",
        "  attempt 1 (job j-2): failed: job j-2 failed: OOM",
        "  attempt 2 (job j-3): succeeded",
    ]
    assert "  lineage: dataset churn@0123 → dataset churn-features@9f3c" in lines
    assert "  lineage: model churn@4 → deployment churn@4" in lines

    r = gantry("pipelines", "runs", "get", "run-7")
    assert r.code == 2 and r.err.strip() == "gantry: error: run 'run-7' not found"


def test_runs_get_logs_reads_each_steps_job_from_the_scheduler(
    gantry: Gantry, fakes: Fakes, tmp_path: Path
) -> None:
    r = gantry("pipelines", "runs", "get", "run-1", "--logs", "2")
    assert r.code == 0, r.err
    assert [(x.id, x.tail, x.follow) for x in fakes.scheduler.requests] == [
        ("j-1", 2, False),
        ("j-3", 2, False),
        ("j-4", 2, False),
    ]
    lines = r.out.splitlines()
    at = lines.index("── train (job j-3): the last 2 log lines ──")
    assert lines[at + 1 : at + 3] == ["w0| j-3 line 4", "w0| j-3 line 5"]
    at = lines.index("── evaluate (job j-4): the last 2 log lines ──")
    assert lines[at + 1] == "(no logs: job 'j-4' not found)"

    (tmp_path / "run" / "scheduler.json").unlink()
    r = gantry("pipelines", "runs", "get", "run-1", "--logs", "2")
    assert r.code == 0 and "no logs: don't know where the scheduler service is" in r.out
    r = gantry("pipelines", "runs", "get", "run-1", "--logs", "-1")
    assert r.code == 2 and "--logs" in r.err


def test_cancel_and_retry(gantry: Gantry, fakes: Fakes) -> None:
    r = gantry("pipelines", "runs", "cancel", "run-1", "--reason", "wrong data")
    assert r.code == 0, r.err
    assert fakes.workflows.last(pb.RunRequest).reason == "wrong data"
    assert "run run-1 of churn: cancelled: wrong data" in r.out

    r = gantry("pipelines", "runs", "retry", "run-1", "--from", "evaluate")
    assert r.code == 0, r.err
    assert fakes.workflows.last(pb.RunRequest).from_step == "evaluate"
    assert "run run-1 of churn: running" in r.out and "running again: evaluate, deploy" in r.out
    r = gantry("pipelines", "runs", "retry", "run-1", "--from", "tune")
    assert r.code == 2 and "gantry: error: run run-1 has no step 'tune'" in r.err


def test_the_service_is_found_from_the_setting_or_said_missing(
    gantry: Gantry, fakes: Fakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run" / "workflows.json").unlink()
    r = gantry("pipelines", "list")
    assert r.code == 2 and "don't know where the workflows service is" in r.err
    assert "GANTRY_WORKFLOWS_ADDR" in r.err
    monkeypatch.setenv("GANTRY_WORKFLOWS_ADDR", f"127.0.0.1:{fakes.workflows.port}")
    r = gantry("pipelines", "list")
    assert r.code == 0 and "2 pipelines" in r.out
