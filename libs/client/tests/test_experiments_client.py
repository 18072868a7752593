"""Experiments in the workflows SDK, and their pictures, against a fake WorkflowService.

The fake answers in the protocol's shapes with one canned search, ``churn-hpo`` (the HPO
document of the service's tests: ``lr`` log-uniform, ``hidden`` a stepped int, ``act`` a
choice), whose trials learn at a speed set by their parameters; some were pruned after an epoch
or two, one failed, one is still running. Every request is recorded, so tests can check what
went over the wire and that bad arguments were refused before anything was sent.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.client.errors import RemoteNotFound
from gantry.client.experiment_plots import (
    experiment_figure,
    html_experiment,
    log_axis,
    write_experiment_plot,
)
from gantry.client.workflows import (
    STEP_KINDS,
    ExperimentInfo,
    ExperimentWaitTimeout,
    ParameterInfo,
    PipelineInfo,
    TrialInfo,
    WorkflowsClient,
)
from gantry.core import AlreadyExists, Conflict, InvalidInput, Unavailable
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
HPO = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Experiment
    metadata: {name: churn-hpo}
    spec:
      objective: {metric: accuracy, goal: maximize}
      method: tpe
      pruner: {kind: asha, minEpochs: 1, reductionFactor: 3}
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
)
T0 = 1_767_232_800_000
#: (lr, hidden, act, state, epochs): what each trial tried and how far it got.
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


def _quality(lr: float, hidden: int, act: str) -> float:
    """Final accuracy: best near lr=0.01, a little better when wide, worse with tanh."""
    return 0.95 - 0.12 * (math.log10(lr) + 2) ** 2 + 0.01 * hidden / 128 - 0.02 * (act == "tanh")


def trial_pb(number: int) -> pb.Trial:
    lr, hidden, act, state, epochs = TRIALS[number]
    final = _quality(lr, hidden, act)
    curve = [pb.CurvePoint(epoch=e, value=final * (1 - 0.5**e)) for e in range(1, epochs + 1)]
    t = pb.Trial(
        number=number, state=state, job_id=f"j-{number}", curve=list(reversed(curve)),
        values={"lr": repr(lr), "hidden": str(hidden), "act": act},
        device_s=float(epochs * 100), started_ms=T0 + number * 1000,
    )  # fmt: skip
    if state in ("succeeded", "pruned"):
        t.value, t.has_value = curve[-1].value, True
        t.finished_ms = T0 + 600_000
    if state == "succeeded":
        t.model = f"churn-hpo:{number + 1}"
        t.metrics["accuracy"] = curve[-1].value
        t.reason = f"accuracy {curve[-1].value:.4g}"
    elif state == "pruned":
        t.reason = f"pruned at epoch {epochs}: accuracy {curve[-1].value:.4g} was behind (asha)"
    elif state == "failed":
        t.reason = "job j-5 failed: CUDA out of memory"
    else:
        t.reason = "job j-7"
    return t


def experiment_pb(state: str = "running", upto: int = len(TRIALS), **changes: Any) -> pb.Experiment:
    """churn-hpo with its first ``upto`` trials (the trials come in shuffled, as maps do)."""
    trials = [trial_pb(n) for n in range(upto)]
    done = [t for t in trials if t.state == "succeeded"]
    best = max(done, key=lambda t: t.value).number if done else -1
    e = pb.Experiment(
        name="churn-hpo", owner="dev", state=state, spec_yaml=HPO, metric="accuracy",
        goal="maximize", method="tpe", pruner="asha", budget_trials=12, budget_gpu_hours=2.0,
        parallelism=3, best_trial=best, trials=trials[1::2] + trials[::2],
        device_s=sum(t.device_s for t in trials), created_ms=T0,
        parameters=["lr", "hidden", "act"],
        reason="searching 12 trials with tpe" if state == "running" else f"it {state}",
    )  # fmt: skip
    for key, value in changes.items():
        setattr(e, key, value)
    return e


@dataclass
class FakeWorkflows(pb_grpc.WorkflowServiceServicer):
    """Canned experiments; ``GetExperiment`` of churn-hpo answers from ``script`` (one per
    poll, the last one repeated); polls in ``down`` answer UNAVAILABLE."""

    script: list[pb.Experiment] = field(default_factory=lambda: [experiment_pb()])
    down: set[int] = field(default_factory=set)
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitExperiment(self, request: Any, context: Any) -> pb.Experiment:
        if "logUniform: [0, 1]" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "experiment 'churn-hpo' is invalid: spec.space.lr: logUniform [0.0, 1.0] has no "
                "values on a log scale: the low end must be > 0",
            )
        if "name: taken" in request.spec_yaml:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "experiment taken already exists")
        if request.dry_run:
            return experiment_pb("checked", upto=0, created_ms=0, device_s=0, reason="")
        return experiment_pb(upto=3)

    def GetExperiment(self, request: Any, context: Any) -> pb.Experiment:
        if request.name != "churn-hpo":
            context.abort(grpc.StatusCode.NOT_FOUND, f"experiment {request.name!r} not found")
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        if poll in self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return self.script[min(poll, len(self.script) - 1)]

    def ListExperiments(self, request: Any, context: Any) -> pb.ListExperimentsResponse:
        return pb.ListExperimentsResponse(experiments=[experiment_pb()])

    def CancelExperiment(self, request: Any, context: Any) -> pb.Experiment:
        if request.name == "done-hpo":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "experiment done-hpo already failed")
        e = experiment_pb("cancelled", reason=request.reason)
        for t in e.trials:
            if t.state == "running":
                t.state, t.reason = "cancelled", request.reason
        return e


@pytest.fixture
def workflows(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeWorkflows(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def client(workflows: Any) -> Iterator[WorkflowsClient]:
    with WorkflowsClient(workflows.address, TOKEN, timeout_s=10) as c:
        yield c


# ---------------------------------------------------------------------- records


def test_an_experiment_arrives_as_plain_records() -> None:
    e = ExperimentInfo.from_pb(experiment_pb())
    assert (e.name, e.owner, e.state, e.metric, e.goal, e.method, e.pruner) == (
        "churn-hpo", "dev", "running", "accuracy", "maximize", "tpe", "asha",
    )  # fmt: skip
    assert (e.budget_trials, e.budget_gpu_hours, e.parallelism) == (12, 2.0, 3)
    assert [t.number for t in e.trials] == list(range(8))  # by number, however they came
    assert e.parameters == ("lr", "hidden", "act") and not e.done and not e.succeeded
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.state = "succeeded"  # type: ignore[misc]

    first = e.trials[0]
    assert isinstance(first, TrialInfo)
    assert first.values == {"lr": "0.01", "hidden": "64", "act": "relu"}
    assert first.curve[0][0] == 1 and first.epochs == 9  # the curve sorted by epoch
    assert first.value == pytest.approx(first.curve[-1][1]) and first.done
    assert (first.model, first.job_id, first.device_s) == ("churn-hpo:1", "j-0", 900.0)
    assert e.trials[5].value is None and e.trials[5].epochs == 0  # failed: has_value unset
    assert e.trials[7].value is None and e.trials[7].epochs == 4 and not e.trials[7].done

    assert [t.number for t in e.pruned] == [1, 3]
    assert [t.epochs for t in e.pruned] == [1, 2]  # stopped early
    assert [t.number for t in e.active] == [7]
    best = e.best
    assert best is not None and best.number == 4 == e.best_trial
    assert best.value == max(t.value or 0 for t in e.trials_in("succeeded"))
    assert e.device_s == 4300.0 and e.device_hours == pytest.approx(4300 / 3600)
    assert best.values_text(e.parameters) == "lr=0.008, hidden=96, act=relu"
    assert e.trials[1].values_text(e.parameters) == "lr=0.0002, hidden=32, act=tanh"
    assert e.trials[1].values_text() == "act=tanh, hidden=32, lr=0.0002"  # no order: by name

    # no gpuHours budget, no trial yet
    empty = ExperimentInfo.from_pb(experiment_pb(upto=0, budget_gpu_hours=0))
    assert empty.budget_gpu_hours is None and empty.best is None and empty.best_trial == -1


def test_the_best_so_far_follows_the_goal() -> None:
    e = ExperimentInfo.from_pb(experiment_pb())
    trend = e.best_so_far()
    assert [n for n, _ in trend] == [0, 2, 4, 6]  # succeeded trials only
    values = [v for _, v in trend]
    assert values == sorted(values) and values[-1] == e.best.value  # type: ignore[union-attr]
    low = ExperimentInfo.from_pb(experiment_pb(goal="minimize", metric="loss"))
    assert low.better(0.1, 0.2) and not e.better(0.1, 0.2)
    lowest = [v for _, v in low.best_so_far()]
    assert lowest == sorted(lowest, reverse=True)


def test_the_space_is_read_from_the_document() -> None:
    space = ExperimentInfo.from_pb(experiment_pb()).space()
    assert space == (
        ParameterInfo("lr", "logUniform", 0.0001, 1.0, (), None, True),
        ParameterInfo("hidden", "int", 16.0, 128.0, (), 16.0, False),
        ParameterInfo("act", "choice", None, None, ("relu", "tanh"), None, False),
    )
    assert [p.text for p in space] == [
        "logUniform [0.0001, 1]",
        "int [16, 128] step 16",
        "choice [relu, tanh]",
    ]
    source = HPO.replace("{int: [16, 128], step: 16}", "{int: [1, 1024], log: true}").replace(
        "{choice: [relu, tanh]}", "{uniform: [0.0, 0.5], step: 0.1}"
    )
    _, hidden, act = ExperimentInfo.from_pb(experiment_pb(spec_yaml=source)).space()
    assert (hidden.log, hidden.text) == (True, "int [1, 1024] log")
    assert (act.kind, act.text) == ("uniform", "uniform [0, 0.5] step 0.1")
    unreadable = ExperimentInfo.from_pb(experiment_pb(spec_yaml="spec: ["))
    assert [(p.name, p.kind, p.text) for p in unreadable.space()] == [
        ("lr", "", "?"),
        ("hidden", "", "?"),
        ("act", "", "?"),
    ]


def test_an_experiment_step_is_a_step_kind_of_the_graph() -> None:
    tuned = textwrap.dedent(
        """
        apiVersion: gantry/v1
        kind: Pipeline
        metadata: {name: tuned}
        spec:
          params: {source: "v0"}
          steps:
            - name: search
              experiment:
                objective: {metric: accuracy}
                budget: {trials: 3}
                space: {lr: {logUniform: [0.001, 0.1]}}
                trial:
                  entrypoint: {task: "m:task", args: ["lr=${trial.lr}"]}
                  data: [{dataset: churn, version: "${params.source}"}]
            - name: deploy
              gate: {metric: "${steps.search.outputs.metrics.accuracy}", atLeast: 0.5}
              deploy: {deployment: tuned, model: "${steps.search.outputs.model}"}
        """
    )
    p = PipelineInfo.from_pb(pb.Pipeline(name="tuned", spec_yaml=tuned, steps=["search", "deploy"]))
    search, deploy = p.step_graph()
    assert "experiment" in STEP_KINDS
    assert (search.kind, search.depends_on, search.gate) == ("experiment", (), "")
    assert (deploy.kind, deploy.depends_on) == ("deploy", ("search",))
    assert deploy.gate == "search.accuracy >= 0.5"


# ---------------------------------------------------------------------- calls


def test_submit_get_list_and_cancel_send_their_arguments(
    workflows: Any, client: WorkflowsClient
) -> None:
    started = client.submit_experiment(HPO)
    sent = workflows.last(pb.SubmitExperimentRequest)
    assert (sent.spec_yaml, sent.dry_run) == (HPO, False)
    assert isinstance(started, ExperimentInfo) and len(started.trials) == 3
    checked = client.submit_experiment(HPO, dry_run=True)
    assert workflows.last(pb.SubmitExperimentRequest).dry_run
    assert (checked.state, checked.trials, checked.done) == ("checked", (), False)

    assert client.experiment("churn-hpo").best_trial == 4
    assert workflows.last(pb.NameRequest).name == "churn-hpo"
    assert [e.name for e in client.experiments(state="running")] == ["churn-hpo"]
    assert workflows.last(pb.ListExperimentsRequest).state == "running"

    cancelled = client.cancel_experiment("churn-hpo", "wrong data")
    sent = workflows.last(pb.NameRequest)
    assert (sent.name, sent.reason) == ("churn-hpo", "wrong data")
    assert cancelled.state == "cancelled" and cancelled.done
    assert [t.number for t in cancelled.trials_in("cancelled")] == [7]


def test_bad_arguments_are_refused_before_any_call(workflows: Any, client: WorkflowsClient) -> None:
    with pytest.raises(InvalidInput, match="the experiment document is empty"):
        client.submit_experiment(" \n")
    with pytest.raises(InvalidInput, match="unknown experiment state 'done'") as info:
        client.experiments(state="done")
    assert info.value.hint == "one of running, succeeded, failed, cancelled"
    with pytest.raises(InvalidInput, match="an experiment name is needed"):
        client.experiment("")
    with pytest.raises(InvalidInput, match="an experiment name is needed"):
        client.cancel_experiment(" ")
    with pytest.raises(InvalidInput, match="timeout_s must be more than 0"):
        client.wait_experiment("churn-hpo", timeout_s=0)
    with pytest.raises(InvalidInput, match="poll_s must be more than 0"):
        client.wait_experiment("churn-hpo", timeout_s=1, poll_s=0)
    assert workflows.requests == []


def test_server_errors_become_typed_errors_with_the_message(client: WorkflowsClient) -> None:
    with pytest.raises(InvalidInput, match=r"spec.space.lr: logUniform \[0.0, 1.0\] has no"):
        client.submit_experiment(HPO.replace("[0.0001, 1.0]", "[0, 1]"))
    with pytest.raises(AlreadyExists, match="experiment taken already exists"):
        client.submit_experiment(HPO.replace("name: churn-hpo", "name: taken"))
    with pytest.raises(RemoteNotFound, match="experiment 'nope' not found"):
        client.experiment("nope")
    with pytest.raises(Conflict, match="already failed"):
        client.cancel_experiment("done-hpo")


def test_wait_polls_until_the_search_ends_and_reports_each_change(
    workflows: Any, client: WorkflowsClient
) -> None:
    three = experiment_pb(upto=3)
    workflows.service.script = [
        three, three, experiment_pb(upto=5), experiment_pb("succeeded", upto=7),
    ]  # fmt: skip
    workflows.service.down = {1}  # the service restarts between two polls: the wait goes on
    seen: list[ExperimentInfo] = []
    done = client.wait_experiment("churn-hpo", timeout_s=10, poll_s=0.01, on_update=seen.append)
    assert done.state == "succeeded" and done.succeeded and workflows.service.polls == 4
    assert [len(e.trials) for e in seen] == [3, 5, 7]


def test_wait_gives_up_after_the_timeout_with_the_experiment_as_last_seen(
    workflows: Any, client: WorkflowsClient
) -> None:
    with pytest.raises(ExperimentWaitTimeout) as info:
        client.wait_experiment("churn-hpo", timeout_s=0.2, poll_s=0.05)
    assert isinstance(info.value, Unavailable)
    assert info.value.message == (
        "experiment churn-hpo is still running after 0.2s (8 of 12 trials started)"
    )
    assert "gantry experiments get churn-hpo" in (info.value.hint or "")
    assert len(info.value.last.trials) == 8 and workflows.service.polls >= 3
    with pytest.raises(RemoteNotFound, match="experiment 'other' not found"):
        client.wait_experiment("other", timeout_s=1)


# ---------------------------------------------------------------------- pictures


def test_the_figure_has_the_trials_the_curves_and_a_panel_per_parameter() -> None:
    e = ExperimentInfo.from_pb(experiment_pb())
    fig = experiment_figure(e)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "accuracy of each trial, and the best so far",
        "learning curves: accuracy after each epoch",
        "lr",
        "hidden",
        "act",
    ]
    trials, curves, lr, hidden, act = fig.axes
    # (a): succeeded dots, pruned crosses (the failed and the running trial have no point)
    points = sum(len(c.get_offsets()) for c in trials.collections)
    assert points == 4 + 2 + 1  # succeeded, pruned, the best's star
    assert [t.get_text() for t in trials.get_legend().get_texts()] == [
        "succeeded", "pruned (where it stopped)", "best so far", "best: trial 4",
    ]  # fmt: skip
    # (b): one curve per trial that reported an epoch; the pruned ones are short and faded
    assert len(curves.get_lines()) == 7
    short = [line for line in curves.get_lines() if len(line.get_xdata()) <= 2]
    assert len(short) == 2 and all((line.get_alpha() or 1) < 0.5 for line in short)
    # (c): lr spans four decades (log axis), hidden does not, act is a choice
    assert (lr.get_xscale(), hidden.get_xscale()) == ("log", "linear")
    assert [t.get_text() for t in act.get_xticklabels()] == ["relu", "tanh"]
    assert "log axis" in lr.get_xlabel() and hidden.get_xlabel() == "int [16, 128] step 16"


def test_the_log_axis_needs_more_than_two_decades() -> None:
    wide = ParameterInfo("lr", "logUniform", 1e-4, 1e-1, (), None, True)
    narrow = ParameterInfo("lr", "logUniform", 1e-3, 1e-1, (), None, True)
    unknown = ParameterInfo("x", "", None, None, (), None, False)
    assert log_axis(wide, []) and not log_axis(narrow, [])
    assert log_axis(unknown, [0.5, 500.0]) and not log_axis(unknown, [0.0, 500.0])


def test_the_plot_is_a_png_and_the_page_is_self_contained(tmp_path: Path) -> None:
    e = ExperimentInfo.from_pb(experiment_pb("succeeded", upto=7))
    path = write_experiment_plot(e, tmp_path / "hpo.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000

    hostile = experiment_pb("succeeded", upto=7, reason="<script>alert(1)</script>")
    hostile.trials[0].values["act"] = "</svg><script>x</script>"
    page = html_experiment(ExperimentInfo.from_pb(hostile))
    assert page.startswith("<!doctype html>") and page.count("<svg") == 1
    assert "<script" not in page and "&lt;script&gt;alert(1)" in page
    assert "src=" not in page and "href=" not in page.replace('xlink:href="#', "")
    assert page.count('<tr class="') == 7 and '<tr class="best">' in page

    # an experiment with no trial yet still draws every panel
    empty = ExperimentInfo.from_pb(experiment_pb(upto=0))
    assert len(experiment_figure(empty).axes) == 5
    assert write_experiment_plot(empty, tmp_path / "empty.png").stat().st_size > 0
