"""The controller over an in-process platform: runs, gates, failures, retries, restarts."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import yaml

from gantry.core import Conflict
from gantry.workflows import store

from .conftest import CHURN, DEV, Rig


def _edited(change: object) -> str:
    doc = yaml.safe_load(CHURN)
    change(doc)  # type: ignore[operator]
    return yaml.safe_dump(doc, sort_keys=False)


def _submit(rig: Rig, source: str = CHURN) -> None:
    rig.registry.submit(source, owner=DEV.subject, roles=DEV.roles)


def _through_training(rig: Rig, run_id: str, *, accuracy: float) -> None:
    p, c = rig.platform, rig.controller
    p.finish(p.job_of("preprocess"), dataset_version="v-features")
    c.job_changed(p.job_of("preprocess"))
    c.tick()
    p.finish(p.job_of("train"), model="churn:4", metrics={"final_loss": 0.3})
    c.tick()
    p.finish(p.job_of("evaluate"), metrics={"accuracy": accuracy})
    c.tick()


def test_a_run_passes_its_outputs_along_and_deploys_when_the_gate_opens(rig: Rig) -> None:
    _submit(rig)
    run, duplicate = rig.controller.start("churn", {"epochs": "5"}, caller=DEV, request_id="r-1")
    assert not duplicate and run.state == "running"
    assert run.steps["preprocess"].state == "running"  # submitted at once
    assert run.steps["train"].state == "pending"
    again, duplicate = rig.controller.start("churn", {}, caller=DEV, request_id="r-1")
    assert duplicate and again.id == run.id

    _through_training(rig, run.id, accuracy=0.91)
    train_doc = rig.platform.jobs[rig.platform.job_of("train")]["doc"]
    assert train_doc["spec"]["data"][0]["version"] == "v-features"
    assert train_doc["spec"]["entrypoint"]["args"] == ["epochs=5"]
    eval_doc = rig.platform.jobs[rig.platform.job_of("evaluate")]["doc"]
    assert eval_doc["spec"]["model"] == {"name": "churn", "version": 4}
    # every job was submitted as the run's owner
    assert {o.subject for _, _, o in rig.platform.submissions} == {"dev"}

    done = rig.controller.get(run.id)
    assert done.state == "succeeded", done.reason
    assert rig.platform.deploys == [("churn", "churn", 4, rig.platform.deploys[0][3])]
    deploy = done.steps["deploy"]
    assert deploy.outputs == {"deployment": "churn", "model": "churn:4", "version": "4"}
    # lineage: what each step used and made
    assert [a.text() for a in done.steps["preprocess"].produced] == [
        "dataset churn-features@v-features"
    ]
    assert "dataset churn-features@v-features" in [a.text() for a in done.steps["train"].inputs]
    assert [a.text() for a in done.steps["train"].produced] == ["model churn@4"]
    assert [a.text() for a in done.steps["evaluate"].inputs][-1] == "model churn@4"
    assert done.steps["evaluate"].metrics == {"accuracy": 0.91}
    # the changes left through the outbox, in one transaction each
    with rig.controller.engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(store.outbox)).scalar()
    assert count and count >= 10


def test_a_closed_gate_skips_the_deploy_and_says_why(rig: Rig) -> None:
    _submit(rig)
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    _through_training(rig, run.id, accuracy=0.55)
    done = rig.controller.get(run.id)
    assert rig.platform.deploys == []
    assert done.steps["deploy"].state == "skipped"
    assert done.steps["deploy"].reason == "gate closed: evaluate.accuracy 0.55 < 0.7 (atLeast)"
    assert done.state == "succeeded"
    assert "deploy skipped (gate closed" in done.reason


def test_a_failed_step_fails_the_run_and_a_retry_resumes_from_it(rig: Rig) -> None:
    _submit(rig)
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    p, c = rig.platform, rig.controller
    p.finish(p.job_of("preprocess"), dataset_version="v-features")
    c.tick()
    first_train = p.job_of("train")
    p.finish(first_train, "failed", reason="worker 1 exited 137 (out of memory)")
    c.tick()
    failed = c.get(run.id)
    assert failed.state == "failed"
    assert failed.reason == (
        f"step train failed: job {first_train} failed: worker 1 exited 137 (out of memory)"
    )
    assert failed.steps["evaluate"].state == "skipped"
    assert failed.steps["evaluate"].reason == "not run: step train failed"
    preprocess_jobs = len(
        [
            j
            for j in p.jobs
            if p.jobs[j]["doc"]["metadata"]["labels"]["gantry.io/step"] == "preprocess"
        ]
    )

    retried = c.retry(run.id, caller=DEV)
    assert retried.state == "running"
    second_train = p.job_of("train")
    assert second_train != first_train
    assert retried.steps["train"].attempt == 2
    assert [a.state for a in retried.steps["train"].attempts] == ["failed", "running"]
    assert retried.steps["preprocess"].state == "succeeded"  # kept, not run again
    p.finish(second_train, model="churn:5")
    c.tick()
    p.finish(p.job_of("evaluate"), metrics={"accuracy": 0.8})
    c.tick()
    assert c.get(run.id).state == "succeeded"
    assert (
        len(
            [
                j
                for j in p.jobs
                if p.jobs[j]["doc"]["metadata"]["labels"]["gantry.io/step"] == "preprocess"
            ]
        )
        == preprocess_jobs
    )
    with pytest.raises(Conflict, match="nothing to retry"):
        c.retry(run.id, caller=DEV)
    from_train = c.retry(run.id, caller=DEV, from_step="train")
    assert from_train.steps["preprocess"].state == "succeeded"
    assert from_train.steps["train"].attempt == 3


def test_automatic_retries(rig: Rig) -> None:
    _submit(rig, _edited(lambda d: d["spec"]["steps"][1].update(retries=1)))
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    p, c = rig.platform, rig.controller
    p.finish(p.job_of("preprocess"), dataset_version="v1")
    c.tick()
    first = p.job_of("train")
    p.finish(first, "failed", reason="node lost")
    c.tick()
    now = c.get(run.id)
    assert now.state == "running" and now.steps["train"].attempt == 2
    p.finish(p.job_of("train"), "failed", reason="node lost again")
    c.tick()
    assert c.get(run.id).state == "failed"


def test_a_restart_mid_run_carries_on_and_never_submits_twice(rig: Rig) -> None:
    _submit(rig)
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    job = rig.platform.job_of("preprocess")
    # the crash window: the job was submitted but its id never reached the database
    with rig.controller.engine.begin() as conn:
        stored = store.get_run(conn, run.id)
        assert stored is not None
        sr = stored.steps["preprocess"]
        sr.state, sr.job_id, sr.attempts = "starting", "", []
        store.save_run(conn, stored)
    restarted = rig.restart()
    restarted.controller.tick()
    again = restarted.controller.get(run.id)
    assert again.steps["preprocess"].job_id == job  # the scheduler answered the same request
    assert len(rig.platform.submissions) == 1
    rig.platform.finish(job, dataset_version="v2")
    restarted.controller.tick()  # no event: the resync finds it
    assert restarted.controller.get(run.id).steps["train"].state == "running"


def test_a_scheduler_outage_delays_a_step_without_failing_it(rig: Rig) -> None:
    _submit(rig)
    rig.platform.down = True
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    assert run.steps["preprocess"].state == "starting"
    rig.controller.tick()
    assert rig.controller.get(run.id).steps["preprocess"].state == "starting"
    rig.platform.down = False
    rig.controller.tick()
    assert rig.controller.get(run.id).steps["preprocess"].state == "running"


def test_cancel_stops_the_running_job_and_the_rest(rig: Rig) -> None:
    _submit(rig)
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    job = rig.platform.job_of("preprocess")
    done = rig.controller.cancel(run.id, "", caller=DEV)
    assert rig.platform.cancelled == [job]
    assert done.state == "cancelled"
    assert {s.state for s in done.steps.values()} == {"cancelled"}
    with pytest.raises(Conflict):
        rig.controller.cancel(run.id, "", caller=DEV)


def test_waiting_for_promotion(rig: Rig) -> None:
    _submit(rig, _edited(lambda d: d["spec"]["steps"][3]["deploy"].update(waitFor="promoted")))
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    from gantry.workflows.platform import Rollout

    rig.platform.rollouts[("churn", 1)] = Rollout("churn", 1, 100, "stable", "ready")
    _through_training(rig, run.id, accuracy=0.95)
    now = rig.controller.get(run.id)
    assert now.steps["deploy"].state == "running"
    assert now.steps["deploy"].reason == "canary at 20%"
    rig.controller.tick()
    assert rig.controller.get(run.id).steps["deploy"].state == "running"
    rig.platform.promote("churn", 4)
    rig.controller.tick()
    assert rig.controller.get(run.id).state == "succeeded"


def test_an_unresolvable_reference_fails_the_step_with_the_reason(rig: Rig) -> None:
    _submit(rig)
    run, _ = rig.controller.start("churn", {}, caller=DEV)
    p, c = rig.platform, rig.controller
    p.finish(p.job_of("preprocess"), dataset_version="v1")
    c.tick()
    p.finish(p.job_of("train"))  # registered no model
    c.tick()
    done = c.get(run.id)
    assert done.steps["evaluate"].state == "failed"
    assert (
        done.steps["evaluate"].reason
        == "step train produced no model (its job registered no model)"
    )
