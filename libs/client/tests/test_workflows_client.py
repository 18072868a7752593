"""The workflows SDK against a fake WorkflowService on a free local port.

The fake answers in the protocol's shapes with canned pipelines and runs (the churn pipeline of
docs/workflows.md: preprocess → train → evaluate → gated deploy) and records every request, so
tests can check what went over the wire; a run can be scripted to change from poll to poll, or
to be unreachable for a while, to exercise :meth:`WorkflowsClient.wait`.
"""

from __future__ import annotations

import dataclasses
import socket
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gantry.client.errors import RemoteNotFound
from gantry.client.workflows import (
    ArtifactInfo,
    PipelineInfo,
    RunInfo,
    RunWaitTimeout,
    ScheduleInfo,
    WorkflowsClient,
)
from gantry.core import Conflict, InvalidInput, Unauthenticated, Unavailable
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
CHURN = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Pipeline
    metadata:
      name: churn
      description: preprocess, train, evaluate, deploy when good enough
    spec:
      params: {epochs: 3, min_accuracy: 0.7, source: "0123"}
      steps:
        - name: preprocess
          data:
            commit: churn-features
            entrypoint: {transform: "gantry.training.examples.tabular:features"}
            data: [{dataset: churn, version: "${params.source}"}]
        - name: train
          retries: 1
          train:
            entrypoint: {task: "gantry.training.examples.tabular:task"}
            data: [{dataset: churn-features, version: "${steps.preprocess.outputs.version}"}]
        - name: evaluate
          evaluate:
            model: ${steps.train.outputs.model}
            entrypoint:
              task: gantry.training.examples.tabular:task
              args: ["note=$${steps.deploy.outputs.model} is a literal, no dependency"]
            data: [{dataset: churn-features, version: "${steps.preprocess.outputs.version}"}]
        - name: deploy
          dependsOn: [preprocess]
          gate:
            metric: ${steps.evaluate.outputs.metrics.accuracy}
            atLeast: ${params.min_accuracy}
          deploy: {deployment: churn, model: "${steps.evaluate.outputs.model}"}
    """
)
ORDER = ("preprocess", "train", "evaluate", "deploy")
VERSION = "9f3c" * 16


def pipeline_pb(spec: str = CHURN, **changes: Any) -> pb.Pipeline:
    p = pb.Pipeline(
        name="churn", kind="Pipeline", owner="dev", revision=2, spec_yaml=spec,
        description="preprocess, train, evaluate, deploy when good enough", steps=ORDER,
        params={"epochs": "3", "min_accuracy": "0.7", "source": "0123"},
        created_ms=1_767_225_600_000, updated_ms=1_767_229_200_000, last_run_id="run-1",
        last_run_state="succeeded",
    )  # fmt: skip
    for key, value in changes.items():
        if isinstance(value, pb.Schedule):
            p.schedule.CopyFrom(value)
        else:
            setattr(p, key, value)
    return p


def _artifact(kind: str, name: str, version: str) -> pb.Artifact:
    return pb.Artifact(kind=kind, name=name, version=version)


def run_pb(state: str = "succeeded", *, upto: int = 4, run_id: str = "run-1") -> pb.Run:
    """The churn run: the first ``upto`` steps succeeded (train on its second attempt), the
    rest pending; ``state`` is the run's."""
    t0 = 1_767_232_800_000
    steps = [
        pb.StepRun(
            name="preprocess", kind="data", state="succeeded", attempt=1, job_id="j-1",
            reason="job j-1 succeeded",
            outputs={"job": "j-1", "dataset": "churn-features", "version": VERSION},
            inputs=[_artifact("dataset", "churn", "0123")],
            produced=[_artifact("dataset", "churn-features", VERSION)],
            attempts=[pb.StepAttempt(number=1, job_id="j-1", state="succeeded",
                                     started_ms=t0, finished_ms=t0 + 65_000)],
            started_ms=t0, finished_ms=t0 + 65_000,
        ),
        pb.StepRun(
            name="train", kind="train", state="succeeded", attempt=2, job_id="j-3",
            depends_on=["preprocess"], reason="job j-3 succeeded (loss=0.31)",
            outputs={"job": "j-3", "model": "churn:4"}, metrics={"loss": 0.31},
            inputs=[_artifact("dataset", "churn-features", VERSION)],
            produced=[_artifact("model", "churn", "4")],
            attempts=[
                pb.StepAttempt(number=1, job_id="j-2", state="failed",
                               reason="job j-2 failed: worker 1 lost", started_ms=t0 + 65_000,
                               finished_ms=t0 + 95_000),
                pb.StepAttempt(number=2, job_id="j-3", state="succeeded",
                               started_ms=t0 + 95_000, finished_ms=t0 + 605_000),
            ],
            started_ms=t0 + 95_000, finished_ms=t0 + 605_000,
        ),
        pb.StepRun(
            name="evaluate", kind="evaluate", state="succeeded", attempt=1, job_id="j-4",
            depends_on=["train", "preprocess"], reason="job j-4 succeeded (accuracy=0.91)",
            outputs={"job": "j-4", "model": "churn:4"}, metrics={"accuracy": 0.91},
            inputs=[_artifact("dataset", "churn-features", VERSION),
                    _artifact("model", "churn", "4")],
            attempts=[pb.StepAttempt(number=1, job_id="j-4", state="succeeded")],
            started_ms=t0 + 605_000, finished_ms=t0 + 650_000,
        ),
        pb.StepRun(
            name="deploy", kind="deploy", state="succeeded", attempt=1,
            depends_on=["preprocess", "evaluate"], reason="churn v4 canary at 20% in churn",
            outputs={"deployment": "churn", "model": "churn:4", "version": "4"},
            inputs=[_artifact("model", "churn", "4")],
            produced=[_artifact("deployment", "churn", "4")],
            started_ms=t0 + 650_000, finished_ms=t0 + 652_000,
        ),
    ]  # fmt: skip
    for s in steps[upto:]:  # not reached yet
        name, kind, depends_on = s.name, s.kind, list(s.depends_on)
        s.Clear()
        s.name, s.kind, s.state, s.depends_on[:] = name, kind, "pending", depends_on
    return pb.Run(
        id=run_id, pipeline="churn", revision=2, owner="dev", state=state,
        reason="all 4 steps succeeded" if state == "succeeded" else "",
        trigger="manual", params={"epochs": "3", "min_accuracy": "0.7", "source": "0123"},
        steps=steps, created_ms=t0, started_ms=t0,
        finished_ms=t0 + 652_000 if state == "succeeded" else 0,
    )  # fmt: skip


@dataclass
class FakeWorkflows(pb_grpc.WorkflowServiceServicer):
    """Canned answers (the requests are kept by ``serve_fake``). ``GetRun`` answers from ``script``
    (one run per poll, the last one repeated); polls listed in ``down`` answer UNAVAILABLE."""

    script: list[pb.Run] = field(default_factory=lambda: [run_pb()])
    down: set[int] = field(default_factory=set)
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitPipeline(self, request: Any, context: Any) -> pb.SubmitPipelineResponse:
        if "kind: Pipe\n" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kind 'Pipe' is not a pipeline — use kind: Pipeline, or kind: CronPipeline for "
                "one with a schedule",
            )
        revision = 0 if request.dry_run else 2
        return pb.SubmitPipelineResponse(
            pipeline=pipeline_pb(request.spec_yaml, revision=revision, last_run_id=""),
            replaced=not request.dry_run,
        )

    def GetPipeline(self, request: Any, context: Any) -> pb.Pipeline:
        if request.name == "nightly":
            schedule = pb.Schedule(cron="0 3 * * *", timezone="Europe/Paris", concurrency="queue",
                                   next_fire_ms=1_767_236_400_000, missed=2)  # fmt: skip
            return pipeline_pb(name="nightly", kind="CronPipeline", schedule=schedule)
        if request.name != "churn":
            context.abort(grpc.StatusCode.NOT_FOUND, f"pipeline {request.name!r} not found")
        return pipeline_pb()

    def ListPipelines(self, request: Any, context: Any) -> pb.ListPipelinesResponse:
        return pb.ListPipelinesResponse(pipelines=[pipeline_pb()])

    def DeletePipeline(self, request: Any, context: Any) -> pb.Pipeline:
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, f"pipeline {request.name} has 1 active run(s)"
        )
        raise AssertionError("abort raises")

    def StartRun(self, request: Any, context: Any) -> pb.StartRunResponse:
        return pb.StartRunResponse(
            run=run_pb("running", upto=0), duplicate=request.request_id == "again"
        )

    def GetRun(self, request: Any, context: Any) -> pb.Run:
        if request.id != "run-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.id!r} not found")
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        if poll in self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return self.script[min(poll, len(self.script) - 1)]

    def ListRuns(self, request: Any, context: Any) -> pb.ListRunsResponse:
        return pb.ListRunsResponse(runs=[run_pb()])

    def CancelRun(self, request: Any, context: Any) -> pb.Run:
        return run_pb("cancelled", upto=1)

    def RetryRun(self, request: Any, context: Any) -> pb.Run:
        return run_pb("running", upto=2)


@pytest.fixture
def workflows(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeWorkflows(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def client(workflows: Any) -> Iterator[WorkflowsClient]:
    with WorkflowsClient(workflows.address, TOKEN, timeout_s=10) as c:
        yield c


# ---------------------------------------------------------------------- pipelines


def test_a_submitted_pipeline_arrives_as_plain_records(
    workflows: Any, client: WorkflowsClient
) -> None:
    result = client.submit(CHURN)
    sent = workflows.last(pb.SubmitPipelineRequest)
    assert (sent.spec_yaml, sent.dry_run) == (CHURN, False)
    p = result.pipeline
    assert isinstance(p, PipelineInfo) and result.replaced
    assert (p.name, p.kind, p.owner, p.revision, p.steps) == ("churn", "Pipeline", "dev", 2, ORDER)
    assert p.params == {"epochs": "3", "min_accuracy": "0.7", "source": "0123"}
    assert p.schedule is None and p.last_run_id == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.revision = 3  # type: ignore[misc]

    dry = client.submit(CHURN, dry_run=True)
    assert workflows.last(pb.SubmitPipelineRequest).dry_run
    assert (dry.pipeline.revision, dry.replaced) == (0, False)


def test_the_step_graph_follows_references_dependson_and_gates() -> None:
    graph = {s.name: s for s in PipelineInfo.from_pb(pipeline_pb()).step_graph()}
    assert [(s.kind, s.depends_on) for s in graph.values()] == [
        ("data", ()),
        ("train", ("preprocess",)),
        ("evaluate", ("train", "preprocess")),  # the literal $${...} is no reference
        ("deploy", ("preprocess", "evaluate")),  # dependsOn first, then the gate's metric
    ]
    assert graph["deploy"].gate == "evaluate.accuracy >= params.min_accuracy"
    assert (graph["train"].retries, graph["evaluate"].gate) == (1, "")
    # a document the client cannot read still lists the steps, without details
    broken = PipelineInfo.from_pb(pipeline_pb(spec="spec: ["))
    first = broken.step_graph()[0]
    assert (first.name, first.kind, first.depends_on) == ("preprocess", "", ())


def test_get_list_and_a_cron_schedule(workflows: Any, client: WorkflowsClient) -> None:
    p = client.get("churn")
    assert (p.last_run_id, p.last_run_state) == ("run-1", "succeeded")
    nightly = client.get("nightly")
    assert nightly.kind == "CronPipeline"
    assert nightly.schedule == ScheduleInfo(
        cron="0 3 * * *",
        timezone="Europe/Paris",
        concurrency="queue",
        next_fire_ms=1_767_236_400_000,
        suspended=False,
        missed=2,
    )
    assert [x.name for x in client.list()] == ["churn"]


# ---------------------------------------------------------------------- runs


def test_a_run_arrives_step_by_step_with_lineage(client: WorkflowsClient) -> None:
    run = client.run("run-1")
    assert isinstance(run, RunInfo)
    assert (run.state, run.done, run.succeeded, run.duration_ms) == (
        "succeeded",
        True,
        True,
        652_000,
    )
    assert [s.name for s in run.steps] == list(ORDER)
    train = run.step("train")
    assert (train.attempt, train.job_id, train.depends_on) == (2, "j-3", ("preprocess",))
    assert train.outputs == {"job": "j-3", "model": "churn:4"} and train.metrics == {"loss": 0.31}
    assert train.produced == (ArtifactInfo("model", "churn", "4"),)
    assert train.produced[0].text == "model churn@4"
    assert [(a.number, a.job_id, a.state) for a in train.attempts] == [
        (1, "j-2", "failed"),
        (2, "j-3", "succeeded"),
    ]
    assert train.attempts[0].reason == "job j-2 failed: worker 1 lost"
    assert train.done and train.duration_ms == 510_000
    assert run.step("evaluate").metrics == {"accuracy": pytest.approx(0.91)}
    assert run.step("deploy").job_id == "" and run.step("deploy").produced[0].kind == "deployment"
    with pytest.raises(InvalidInput, match="run run-1 has no step 'tune'") as info:
        run.step("tune")
    assert info.value.hint == "its steps: preprocess, train, evaluate, deploy"


def test_start_runs_cancel_and_retry_send_their_arguments(
    workflows: Any, client: WorkflowsClient
) -> None:
    params: Any = {"epochs": "7", "warm": True}  # a bool is sent as the service writes it
    started = client.start("churn", params, request_id="r-1")
    sent = workflows.last(pb.StartRunRequest)
    assert (sent.pipeline, dict(sent.params), sent.request_id) == (
        "churn",
        {"epochs": "7", "warm": "true"},
        "r-1",
    )
    assert not started.duplicate and started.run.state == "running" and not started.run.done
    assert {s.state for s in started.run.steps} == {"pending"}
    assert client.start("churn", request_id="again").duplicate

    assert [r.id for r in client.runs(pipeline="churn", state="failed", limit=5)] == ["run-1"]
    sent = workflows.last(pb.ListRunsRequest)
    assert (sent.pipeline, sent.state, sent.limit) == ("churn", "failed", 5)

    assert client.cancel("run-1", "wrong data").state == "cancelled"
    sent = workflows.last(pb.RunRequest)
    assert (sent.id, sent.reason) == ("run-1", "wrong data")
    assert client.retry("run-1", from_step="evaluate").state == "running"
    sent = workflows.last(pb.RunRequest)
    assert (sent.id, sent.from_step) == ("run-1", "evaluate")


def test_bad_arguments_are_refused_before_any_call(workflows: Any, client: WorkflowsClient) -> None:
    with pytest.raises(InvalidInput, match="the pipeline document is empty"):
        client.submit("  \n")
    with pytest.raises(InvalidInput, match="unknown run state 'done'"):
        client.runs(state="done")
    with pytest.raises(InvalidInput, match="limit must be 0 or more"):
        client.runs(limit=-1)
    with pytest.raises(InvalidInput, match="a pipeline name is needed"):
        client.get(" ")
    with pytest.raises(InvalidInput, match="a run id is needed"):
        client.cancel("")
    with pytest.raises(InvalidInput, match="a parameter needs a name"):
        client.start("churn", {"": "1"})
    with pytest.raises(InvalidInput, match="timeout_s must be more than 0"):
        client.wait("run-1", timeout_s=0)
    assert workflows.requests == []


def test_server_errors_become_typed_errors_with_the_message(
    workflows: Any, client: WorkflowsClient
) -> None:
    with pytest.raises(InvalidInput, match="kind 'Pipe' is not a pipeline"):
        client.submit(CHURN.replace("kind: Pipeline\n", "kind: Pipe\n"))
    with pytest.raises(RemoteNotFound, match="pipeline 'nope' not found"):
        client.get("nope")
    with pytest.raises(Conflict, match="has 1 active run"):
        client.delete("churn")
    with WorkflowsClient(workflows.address, "stolen") as stranger:
        with pytest.raises(Unauthenticated, match="unknown token"):
            stranger.list()


# ---------------------------------------------------------------------- wait


def test_wait_polls_until_the_run_ends_and_reports_each_change(
    workflows: Any, client: WorkflowsClient
) -> None:
    running = run_pb("running", upto=1)
    workflows.service.script = [running, running, run_pb("running", upto=3), run_pb()]
    workflows.service.down = {1}  # the service restarts between two polls: the wait goes on
    seen: list[RunInfo] = []
    run = client.wait("run-1", timeout_s=10, poll_s=0.01, on_update=seen.append)
    assert run.state == "succeeded" and workflows.service.polls == 4
    assert [sum(s.state == "succeeded" for s in r.steps) for r in seen] == [1, 3, 4]


def test_wait_gives_up_after_the_timeout_with_the_run_as_last_seen(
    workflows: Any, client: WorkflowsClient
) -> None:
    workflows.service.script = [run_pb("running", upto=2)]
    with pytest.raises(RunWaitTimeout) as info:
        client.wait("run-1", timeout_s=0.2, poll_s=0.05)
    assert isinstance(info.value, Unavailable)
    assert str(info.value.message) == "run run-1 of churn is still running after 0.2s"
    assert "gantry pipelines runs get run-1" in (info.value.hint or "")
    assert info.value.last.step("train").state == "succeeded"
    assert workflows.service.polls >= 3
    with pytest.raises(RemoteNotFound, match="run 'run-9' not found"):
        client.wait("run-9", timeout_s=1)


def test_wait_on_an_unreachable_service_fails_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with WorkflowsClient(f"127.0.0.1:{port}", TOKEN, timeout_s=5) as nowhere:
        with pytest.raises(Unavailable, match=r"the workflows service at .* is unreachable"):
            nowhere.wait("run-1", timeout_s=60)
