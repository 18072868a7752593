"""Experiments: the documents, and the search over an in-process platform whose trials learn
at a speed set by their parameters, so pruning has something real to judge."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from gantry.core import InvalidInput
from gantry.workflows.experimenter import Experimenter
from gantry.workflows.experiments import parse_experiment, trial_document
from gantry.workflows.platform import Owner

from .conftest import FakePlatform, Rig

HPO = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Experiment
    metadata: {name: churn-hpo}
    spec:
      objective: {metric: accuracy, goal: maximize}
      method: tpe
      seed: 7
      pruner: {kind: asha, minEpochs: 1, reductionFactor: 3}
      budget: {trials: 12}
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
OWNER = Owner("dev", ("ml-developer",))


def _refused(source: str) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_experiment(source)
    return str(info.value)


def test_an_experiment_document_is_accepted_and_makes_trial_jobs() -> None:
    exp = parse_experiment(HPO)
    doc = trial_document(
        exp.name, exp.spec, number=3, values={"lr": 0.01, "hidden": 32, "act": "relu"}, run_id=""
    )
    assert doc["metadata"]["name"] == "churn-hpo-t3"
    assert doc["metadata"]["labels"] == {
        "gantry.io/experiment": "churn-hpo",
        "gantry.io/trial": "3",
    }
    assert doc["spec"]["entrypoint"]["args"] == [
        "lr=0.01",
        "hidden=32",
        "act=relu",
        "epochs=9",
        "eval_every=1",  # the pruner needs a value per epoch
    ]


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("{uniform: [0.5, 0.1]}", "uniform [0.5, 0.1] has no values: the low end is above"),
        ("{logUniform: [0, 1]}", "logUniform [0.0, 1.0] has no values on a log scale"),
        ("{int: [10, 2]}", "int [10, 2] has no values"),
        ("{choice: []}", "choice [] has no values to choose from"),
        ("{int: [0, 10], step: 3}", "step 3 does not divide [0, 10]"),
        ("{uniform: [0, 1], choice: [1]}", "give exactly one of uniform"),
    ],
)
def test_a_space_with_no_valid_values_is_refused(space: str, message: str) -> None:
    source = HPO.replace("lr: {logUniform: [0.0001, 1.0]}", f"lr: {space}")
    got = _refused(source)
    assert "spec.space.lr" in got and message in got


def test_trial_references_must_match_the_space() -> None:
    unused = _refused(HPO.replace('"act=${trial.act}", ', ""))
    assert "spec.space.act: the trial never uses it" in unused
    unknown = _refused(HPO.replace("${trial.hidden}", "${trial.width}"))
    assert "${trial.width} is not a parameter of the space" in unknown
    assert "kind 'Pipeline' is not an experiment" in _refused(
        HPO.replace("kind: Experiment", "kind: Pipeline")
    )


def _quality(lr: float, hidden: int, act: str) -> float:
    """Final accuracy of a synthetic trial: best near lr=0.01, a little better when wide."""
    return (
        0.95
        - 0.12 * (math.log10(lr) + 2) ** 2
        + 0.01 * hidden / 128
        - (0.02 if act == "tanh" else 0)
    )


def _drive(experimenter: Experimenter, platform: FakePlatform, epochs: int = 9) -> None:
    """Train every running trial one epoch at a time until the experiment ends."""
    for _ in range(500):
        exp = experimenter.get("churn-hpo")
        if exp.done:
            return
        for t in exp.trials:
            job = platform.jobs.get(t.job_id)
            if t.state != "running" or job is None or job["state"] != "running":
                continue
            epoch = job.setdefault("epoch", 0) + 1
            job["epoch"] = epoch
            final = _quality(t.values["lr"], t.values["hidden"], t.values["act"])
            accuracy = final * (1 - 0.5**epoch)  # learning curves rise to their final value
            experimenter.evaluation(t.job_id, epoch, {"accuracy": accuracy})
            if epoch >= epochs and platform.jobs[t.job_id]["state"] == "running":
                platform.finish(
                    t.job_id,
                    metrics={"accuracy": accuracy},
                    model=f"churn-hpo:{t.number + 1}",
                    device_seconds=float(epoch),
                )
            elif platform.jobs[t.job_id]["state"] == "cancelled":
                platform.jobs[t.job_id]["device_seconds"] = float(epoch)
        experimenter.tick()
    raise AssertionError("the experiment never ended")


def test_pruning_stops_poor_trials_early_and_the_best_is_found(rig: Rig, tmp_path: Path) -> None:
    experimenter = Experimenter(
        rig.controller.engine, rig.platform, f"sqlite:///{tmp_path / 'studies.db'}", rig.clock
    )
    exp = experimenter.submit(HPO, owner=OWNER)
    assert len([t for t in exp.trials if t.state == "running"]) == 3  # parallelism
    _drive(experimenter, rig.platform)
    done = experimenter.get("churn-hpo")
    assert done.state == "succeeded", done.reason
    assert len(done.trials) == 12
    pruned = [t for t in done.trials if t.state == "pruned"]
    finished = [t for t in done.trials if t.state == "succeeded"]
    assert len(pruned) >= 3, [(t.state, t.epochs) for t in done.trials]
    # the pruned trials stopped early, and their jobs were cancelled (their GPUs freed)
    early = [t for t in pruned if t.epochs < 9]
    assert len(early) >= 3, [(t.state, t.epochs, t.value) for t in done.trials]
    assert {t.job_id for t in pruned} <= set(rig.platform.cancelled)
    assert all("pruned at epoch" in t.reason for t in pruned)
    # ...and they were the poor ones: each is below the best finished trial at its last epoch
    best = done.best
    assert best is not None and best.state == "succeeded"
    assert best.value == max(t.value or 0 for t in finished)
    assert best.model == f"churn-hpo:{best.number + 1}"
    assert "best trial" in done.reason and "pruned" in done.reason
    # cost: pruned trials used fewer device-seconds than 9 epochs each
    assert sum(t.device_s for t in pruned) < 9 * len(pruned)
    # every trial's job ran as the owner
    assert {o.subject for _, _, o in rig.platform.submissions} == {"dev"}


def test_a_restarted_service_continues_the_same_study(rig: Rig, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    first = Experimenter(rig.controller.engine, rig.platform, url, rig.clock)
    first.submit(HPO, owner=OWNER)
    jobs = len(rig.platform.submissions)
    again = Experimenter(rig.restart().controller.engine, rig.platform, url, rig.clock)
    again.tick()
    assert len(rig.platform.submissions) == jobs  # nothing started twice
    _drive(again, rig.platform)
    assert again.get("churn-hpo").state == "succeeded"
    assert len(again.get("churn-hpo").trials) == 12


PIPELINE = textwrap.dedent(
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
            pruner: {kind: none}
            budget: {trials: 3}
            parallelism: 3
            space:
              lr: {logUniform: [0.001, 0.1]}
            trial:
              entrypoint:
                task: gantry.training.examples.tabular:task
                args: ["lr=${trial.lr}"]
              data: [{dataset: churn, version: "${params.source}"}]
        - name: deploy
          gate: {metric: "${steps.search.outputs.metrics.accuracy}", atLeast: 0.5}
          deploy:
            deployment: tuned
            model: ${steps.search.outputs.model}
    """
)


def test_a_pipeline_step_runs_an_experiment_and_deploys_its_best_model(
    rig: Rig, tmp_path: Path
) -> None:
    from .conftest import DEV

    experimenter = Experimenter(
        rig.controller.engine, rig.platform, f"sqlite:///{tmp_path / 's.db'}", rig.clock
    )
    rig.controller.experimenter = experimenter
    rig.registry.submit(PIPELINE, owner=DEV.subject, roles=DEV.roles)
    run, _ = rig.controller.start("tuned", {"source": "v7"}, caller=DEV)
    step = run.steps["search"]
    assert step.state == "running" and step.outputs["experiment"].startswith("tuned-search-")
    exp = experimenter.get(step.outputs["experiment"])
    assert len(exp.trials) == 3 and exp.run_id.startswith(run.id)
    for t in exp.trials:
        doc = rig.platform.jobs[t.job_id]["doc"]
        assert doc["spec"]["data"][0]["version"] == "v7"  # the pipeline's references resolved
        assert doc["spec"]["entrypoint"]["args"] == [f"lr={t.values['lr']}"]
        rig.platform.finish(
            t.job_id, metrics={"accuracy": 0.6 + t.number / 10}, model=f"tuned:{t.number + 1}"
        )
    experimenter.tick()
    rig.controller.tick()
    done = rig.controller.get(run.id)
    assert done.state == "succeeded", done.reason
    assert done.steps["search"].outputs["trial"] == "2"
    assert done.steps["search"].outputs["model"] == "tuned:3"
    assert rig.platform.deploys[0][1:3] == ("tuned", 3)


def test_trial_references_belong_to_experiments() -> None:
    from gantry.workflows.pipelines import parse_pipeline

    source = PIPELINE.replace("model: ${steps.search.outputs.model}", "model: ${trial.lr}")
    with pytest.raises(InvalidInput, match=r"only means something in an experiment's trial"):
        parse_pipeline(source)
    bad = PIPELINE.replace("{logUniform: [0.001, 0.1]}", "{logUniform: [-1, 0.1]}")
    with pytest.raises(InvalidInput, match=r"spec.steps\[0\] \(search\).experiment.space.lr"):
        parse_pipeline(bad)


def test_a_cancelled_experiment_keeps_what_its_running_trials_cost(
    rig: Rig, tmp_path: Path
) -> None:
    experimenter = Experimenter(
        rig.controller.engine, rig.platform, f"sqlite:///{tmp_path / 'studies.db'}", rig.clock
    )
    exp = experimenter.submit(HPO, owner=OWNER)
    running = [t for t in exp.trials if t.state == "running"]
    for i, t in enumerate(running):
        rig.platform.jobs[t.job_id]["device_seconds"] = 10.0 * (i + 1)
    done = experimenter.cancel("churn-hpo", "enough")
    assert done.state == "cancelled"
    assert {t.job_id for t in running} <= set(rig.platform.cancelled)
    assert [t.device_s for t in done.trials if t.state == "cancelled"] == [10.0, 20.0, 30.0]
    assert done.device_s == 60.0
