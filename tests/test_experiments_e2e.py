"""A hyperparameter search on the whole embedded platform (NATS, every service, two node
agents; the ``platform`` and ``version`` fixtures of ``tests/conftest.py``): an Experiment whose
trials are real scheduler jobs training the churn classifier on CPU, each reporting its
held-out accuracy after every epoch, and whose ASHA pruner cancels the poor ones early."""

from __future__ import annotations

import datetime as dt
import statistics
import textwrap

import pytest

from gantry.client.admin import create_token
from gantry.client.scheduler import SchedulerClient
from gantry.client.workflows import WorkflowsClient
from gantry.supervisor.platform import Platform

# whole-platform tests: generous bounds (the suite runs two files side by side)
pytestmark = pytest.mark.timeout(300)

OWNER = "hugo-hpo"
EPOCHS = 6
TRIALS = 8
# Random search with a fixed seed draws the same learning rates every run: 3e-2, 5e-5, 1e-2,
# 2e-6, 3e-6, 9e-4, 4e-4, 1e-4. The tiny ones barely move AdamW's weights in an epoch (~27 %
# held-out accuracy against ~85 % for the others), so they are far behind at the first rung.
# ASHA (reduction factor 3) judges at epochs 1 and 3, both well before the last, and always
# lets the first trial to reach a rung through, so at least one trial runs every epoch. Small
# micro-batches make an epoch long enough (~0.5 s) that a pruned job is still training when it
# is cancelled.
EXPERIMENT = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Experiment
    metadata: {{name: churn-asha}}
    spec:
      objective: {{metric: accuracy, goal: maximize}}
      method: random
      seed: 6
      pruner: {{kind: asha, minEpochs: 1, reductionFactor: 3}}
      budget: {{trials: {trials}}}
      parallelism: {parallelism}
      space:
        lr: {{logUniform: [0.000001, 0.1]}}
      trial:
        resources: {{cpus: 0.5, memory: 1Gi}}
        entrypoint:
          task: gantry.training.examples.tabular:task
          args: ["lr=${{trial.lr}}", "epochs={epochs}", "micro_batch_size=16"]
        data: [{{dataset: churn, version: "{version}"}}]
    """
)


def _token(platform: Platform, who: str, roles: list[str]) -> str:
    return create_token(platform.data_dir, who, roles, dt.timedelta(hours=1))


def test_asha_prunes_the_poor_trials_of_a_real_search(platform: Platform, version: str) -> None:
    token = _token(platform, OWNER, ["ml-developer"])
    # four trials at a time fill both agents' CPUs (two half-CPU trials each)
    doc = EXPERIMENT.format(trials=TRIALS, parallelism=4, epochs=EPOCHS, version=version)
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        wf.submit_experiment(doc)
        exp = wf.wait_experiment("churn-asha", timeout_s=300, poll_s=0.3)
    table = [(t.number, t.state, t.values["lr"], t.curve, t.device_s) for t in exp.trials]
    assert exp.state == "succeeded", (exp.reason, table)
    assert len(exp.trials) == TRIALS
    # every trial was a scheduler job of the submitting user, not of the workflows service
    with SchedulerClient(platform.address("scheduler"), token) as sched:
        jobs = {t.number: sched.get(t.job_id) for t in exp.trials}
    assert len({j.id for j in jobs.values()}) == TRIALS
    assert {j.owner for j in jobs.values()} == {OWNER}
    assert {j.labels["gantry.io/experiment"] for j in jobs.values()} == {"churn-asha"}
    pruned, finished = exp.pruned, exp.trials_in("succeeded")
    assert pruned and finished, table
    assert len(pruned) + len(finished) == TRIALS, table
    # a pruned trial stopped at a rung before the last epoch, and its job was cancelled there
    # (not left to train on), its cost recorded once it had ended
    for t in pruned:
        assert t.epochs < EPOCHS, (t, table)
        assert t.reason.startswith(f"pruned at epoch {t.epochs}: accuracy"), t
        job = jobs[t.number]
        assert job.state == "cancelled" and "pruned at epoch" in job.reason, (t, job)
        assert t.device_s > 0, (t, table)
    # a finished trial reported its objective after every epoch, then its final metrics
    for t in finished:
        assert [e for e, _ in t.curve] == list(range(1, EPOCHS + 1)), t
        assert jobs[t.number].state == "succeeded" and t.value == t.metrics["accuracy"], t
    best = exp.best
    assert best is not None and best.value is not None, table
    assert best.value == max(t.value or 0.0 for t in finished) > 0.8
    assert best.model.startswith("churn-classifier:") and best.model == jobs[best.number].model
    # stopping early saved device time
    assert statistics.mean(t.device_s for t in pruned) < statistics.mean(
        t.device_s for t in finished
    ), table
    assert exp.device_s == pytest.approx(sum(t.device_s for t in exp.trials))
