"""Pipelines on the whole embedded platform (NATS, every service, two node agents; the
``platform`` and ``version`` fixtures of ``tests/conftest.py``): a real preprocess → train →
evaluate → gated canary deploy, once passing its gate and once failing it while the workflows
service is killed mid-run and restarted; and a cron pipeline on the real clock."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import yaml

from gantry.client.admin import create_token
from gantry.client.scheduler import SchedulerClient
from gantry.client.serving import ServingClient
from gantry.client.workflows import RunInfo, WorkflowsClient
from gantry.supervisor.platform import Platform
from gantry.testing.specs import churn_pipeline

# whole-platform tests: generous bounds (the suite runs two files side by side)
pytestmark = pytest.mark.timeout(300)

OWNER = "mia-mlops"


def _token(platform: Platform, who: str, roles: list[str]) -> str:
    return create_token(platform.data_dir, who, roles, dt.timedelta(hours=1))


def _owner(platform: Platform) -> str:
    # a data step commits a dataset version: the owner must be allowed to (a steward)
    return _token(platform, OWNER, ["ml-developer", "data-steward"])


def _wait(client: WorkflowsClient, run_id: str) -> RunInfo:
    return client.wait(run_id, timeout_s=300, poll_s=0.3)


def test_a_pipeline_passes_its_gate_and_deploys_a_canary(platform: Platform, version: str) -> None:
    token = _owner(platform)
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        wf.submit(churn_pipeline("churn-e2e", version))
        run = _wait(wf, wf.start("churn-e2e").run.id)
    assert run.state == "succeeded", run.reason
    pre, train, evaluate, deploy = (
        run.step(n) for n in ("preprocess", "train", "evaluate", "deploy")
    )
    produced = pre.outputs["version"]
    # lineage: the data step made a version, training used it and made a model, which the
    # evaluation read and the deploy step rolled out
    assert [a.text for a in pre.produced] == [f"dataset churn-features@{produced}"]
    assert f"dataset churn@{version}" in [a.text for a in pre.inputs]
    assert f"dataset churn-features@{produced}" in [a.text for a in train.inputs]
    model = train.outputs["model"]
    name, _, number = model.partition(":")
    assert evaluate.outputs["model"] == model
    assert f"model {name}@{number}" in [a.text for a in evaluate.inputs]
    assert evaluate.metrics["accuracy"] > 0.5
    assert deploy.state == "succeeded" and deploy.outputs["version"] == number
    with ServingClient(platform.address("serving"), token) as serving:
        info = serving.get("churn-e2e")
    assert {v.version for v in info.versions} == {int(number)}
    # every job ran as the pipeline's owner, not as the workflows service
    with SchedulerClient(platform.address("scheduler"), token) as sched:
        jobs = [sched.get(s.job_id) for s in run.steps if s.job_id]
    assert {j.owner for j in jobs} == {OWNER}


def test_a_failed_gate_does_not_deploy_and_a_killed_service_resumes(
    platform: Platform, version: str
) -> None:
    token = _owner(platform)
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        wf.submit(churn_pipeline("churn-e2e", version))
        run = wf.start("churn-e2e", {"min_accuracy": "1.01"}).run
        deadline = time.monotonic() + 120
        while wf.run(run.id).step("train").state != "running":
            assert time.monotonic() < deadline, wf.run(run.id)
            time.sleep(0.2)
    platform.kill_service("workflows")  # SIGKILL, mid-run
    platform.restart_service("workflows")
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        done = _wait(wf, run.id)
    assert done.state == "succeeded", done.reason
    deploy = done.step("deploy")
    assert deploy.state == "skipped"
    assert deploy.reason.startswith("gate closed: evaluate.accuracy")
    assert "< 1.01 (atLeast)" in deploy.reason
    # each step ran exactly once despite the kill
    assert all(len(s.attempts) == 1 for s in done.steps if s.name != "deploy")
    with SchedulerClient(platform.address("scheduler"), token) as sched:
        trains = [
            j for j in sched.list(owner=OWNER, limit=0) if j.labels.get("gantry.io/run") == run.id
        ]
    assert len(trains) == 3  # preprocess, train, evaluate: nothing submitted twice
    with ServingClient(platform.address("serving"), token) as serving:
        info = serving.get("churn-e2e")
    assert len(info.versions) == 1  # the first test's version only: nothing deployed


def test_a_cron_pipeline_fires_on_the_real_clock(platform: Platform) -> None:
    token = _token(platform, "dev-engineer", ["ml-developer"])
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "CronPipeline",
        "metadata": {"name": "every-few-seconds"},
        "spec": {
            "schedule": {"cron": "*/3 * * * * *", "concurrency": "skip"},
            "steps": [
                {
                    "name": "hello",
                    "train": {
                        "resources": {"cpus": 0.25, "memory": "128Mi"},
                        "entrypoint": {"command": ["python", "-c", "print('hello')"]},
                    },
                }
            ],
        },
    }
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        wf.submit(yaml.safe_dump(doc))
        deadline = time.monotonic() + 60
        while len([r for r in wf.runs(pipeline="every-few-seconds") if r.state == "succeeded"]) < 2:
            assert time.monotonic() < deadline, wf.runs(pipeline="every-few-seconds")
            time.sleep(0.5)
        doc["spec"]["schedule"]["suspend"] = True  # type: ignore[index]
        wf.submit(yaml.safe_dump(doc))
        runs = wf.runs(pipeline="every-few-seconds")
        assert all(r.trigger == "schedule" and r.scheduled_ms for r in runs)
        assert all(r.scheduled_ms % 3000 == 0 for r in runs)  # on the schedule's seconds
        assert wf.get("every-few-seconds").schedule.suspended
