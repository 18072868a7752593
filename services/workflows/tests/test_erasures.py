"""Pipelines that retrain when a data subject is erased: the ``erasure`` trigger as written and
refused, and the runs an erasure starts — once per erasure and pipeline, however often the
event comes, across a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from gantry.core import InvalidInput, NatsSettings, new_id
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.events.catalog import SubjectErased
from gantry.security.keyring import Keyring
from gantry.testing.events import dead_letter_reasons
from gantry.workflows.app import WorkflowService
from gantry.workflows.erasures import ErasureRuns, request_id
from gantry.workflows.pipelines import parse_pipeline

from .conftest import CHURN, DEV, FakePlatform, Rig, serving, workflow_service

NEW_CHURN = "f" * 64


def retraining(
    name: str = "churn", erasure: dict[str, Any] | None = None, *, params: Any = None
) -> str:
    """CHURN (which reads ``churn`` at ``${params.source}``) with an erasure trigger."""
    doc = yaml.safe_load(CHURN)
    doc["metadata"]["name"] = name
    doc["spec"]["params"]["erasure"] = ""
    trigger: dict[str, Any] = dict(erasure) if erasure is not None else {"datasets": ["churn"]}
    if params is None:
        params = {"source": "${erasure.version.churn}", "erasure": "${erasure.id}", "epochs": 5}
    trigger.setdefault("params", params)
    doc["spec"]["triggers"] = [{"erasure": trigger}]
    return yaml.safe_dump(doc, sort_keys=False)


def erasure(
    erasure_id: str = "er-1", datasets: tuple[str, ...] = ("churn",), models: tuple[str, ...] = ()
) -> SubjectErased:
    return SubjectErased(
        erasure_id=erasure_id,
        subject_ref="hmac:0badc0de",
        requested_by="dpo",
        reason="GDPR art. 17",
        datasets=[
            {"dataset": d, "old_version": "0123", "new_version": NEW_CHURN, "rows_removed": 3}
            for d in datasets
        ],
        models_to_retrain=list(models),
    )


def _refused(source: str) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_pipeline(source)
    return str(info.value)


# -- the spec ---------------------------------------------------------------------------------


def test_an_erasure_trigger_is_accepted_and_matches_datasets_or_model_names() -> None:
    p = parse_pipeline(retraining(erasure={"datasets": ["churn"], "models": ["churn-classifier"]}))
    (trigger,) = p.triggers
    assert trigger.kind == "erasure" and trigger.erasure is not None
    e = trigger.erasure
    assert e.matches(erasure()) == ("dataset churn",)
    assert e.matches(erasure(datasets=("other",), models=("churn-classifier:3",))) == (
        "model churn-classifier:3",
    )
    assert e.matches(erasure(datasets=("other",), models=("other-model:1",))) == ()
    assert e.run_params(erasure()) == {"source": NEW_CHURN, "erasure": "er-1", "epochs": "5"}
    # a dataset this erasure did not touch did not hold the person: the default stays
    assert "source" not in e.run_params(erasure(datasets=("other",)))
    assert parse_pipeline(CHURN).triggers == ()


def test_bad_triggers_are_refused_with_their_place() -> None:
    assert "spec.triggers[0].erasure.dataset: is not a known field" in _refused(
        retraining(erasure={"dataset": ["churn"]})
    )
    assert "spec.triggers[0]: 'retrain' is not a trigger kind; the kinds are: erasure" in (
        _refused(retraining().replace("- erasure:", "- retrain:"))
    )
    assert "spec.triggers[0].erasure: name the datasets and/or the models" in _refused(
        retraining(erasure={"datasets": [], "models": []})
    )
    message = _refused(
        retraining(
            erasure={"datasets": ["Churn"], "models": ["../x"]},
            params={
                "lr": "${erasure.id}",
                "epochs": "${erasure.id}",
                "source": "${erasure.rows}",
                "min_accuracy": "high",
            },
        )
    )
    for expected in (
        "spec.triggers[0].erasure.datasets[0]: 'Churn' is not a dataset name",
        "spec.triggers[0].erasure.models[0]: '../x' is not a model name",
        "spec.triggers[0].erasure.params.lr: spec.params does not declare 'lr'",
        "spec.triggers[0].erasure.params.epochs: ${erasure.id} is text but the parameter "
        "epochs is a whole number",
        "spec.triggers[0].erasure.params.source: '${erasure.rows}' is not a value of the "
        "erasure; write ${erasure.id} or ${erasure.version.<dataset>}",
        "spec.triggers[0].erasure.params.min_accuracy: 'high' is text but the parameter "
        "min_accuracy is a number",
    ):
        assert expected in message
    no_kind = yaml.safe_load(CHURN)
    no_kind["spec"]["triggers"] = [{}]
    assert "spec.triggers[0]: give a trigger kind (erasure)" in _refused(yaml.safe_dump(no_kind))
    in_a_step = CHURN.replace('version: "${params.source}"', 'version: "${erasure.id}"')
    assert "${erasure.id} is only known in an erasure trigger's params" in _refused(in_a_step)


# -- the runs ---------------------------------------------------------------------------------


def test_an_erasure_starts_one_run_of_each_matching_pipeline_exactly_once(rig: Rig) -> None:
    owner = DEV
    rig.registry.submit(retraining(), owner=owner.subject, roles=owner.roles)
    rig.registry.submit(
        retraining("other", {"datasets": ["other"]}, params={}),
        owner=owner.subject,
        roles=owner.roles,
    )
    runs = ErasureRuns(rig.controller.engine, rig.registry, rig.controller)

    started = runs.erased("ev-1", erasure())
    assert [(r.pipeline, repeat) for r, repeat in started] == [("churn", False)]
    run = started[0][0]
    assert run.trigger == "erasure" and run.owner == "dev" and run.roles == owner.roles
    assert run.params["source"] == NEW_CHURN and run.params["epochs"] == 5
    assert run.params["erasure"] == "er-1" and run.params["erasure.id"] == "er-1"
    assert run.reason == "started by erasure er-1 (dataset churn)"
    # the first step reads the version committed without the person, as the owner
    job = rig.platform.jobs[rig.platform.job_of("preprocess")]
    assert job["doc"]["spec"]["data"][0] == {"dataset": "churn", "version": NEW_CHURN}
    assert job["owner"].subject == "dev"

    assert runs.erased("ev-1", erasure()) == []  # the same event delivered again
    again = runs.erased("ev-2", erasure())  # the same erasure published again
    assert [(r.id, repeat) for r, repeat in again] == [(run.id, True)]
    restarted = rig.restart()  # a restarted service
    later = ErasureRuns(restarted.controller.engine, restarted.registry, restarted.controller)
    assert later.erased("ev-1", erasure()) == []
    assert [r.id for r, _ in later.erased("ev-3", erasure())] == [run.id]

    assert [r.id for r in restarted.controller.list()] == [run.id]  # "other" never started
    assert len(rig.platform.submissions) == 1
    # another erasure of the same dataset is another retraining
    (second, repeat), *_ = later.erased("ev-4", erasure("er-2"))
    assert not repeat and second.id != run.id
    assert len(restarted.controller.list(pipeline="churn")) == 2


def test_a_model_named_for_retraining_starts_its_pipelines(rig: Rig) -> None:
    rig.registry.submit(
        retraining(erasure={"models": ["churn-classifier"]}),
        owner=DEV.subject,
        roles=DEV.roles,
    )
    runs = ErasureRuns(rig.controller.engine, rig.registry, rig.controller)
    assert runs.erased("ev-1", erasure(datasets=("other",), models=("other-model:2",))) == []
    ((run, _),) = runs.erased("ev-2", erasure(datasets=(), models=("churn-classifier:7",)))
    assert run.reason == "started by erasure er-1 (model churn-classifier:7)"
    assert run.params["source"] == "0123"  # churn was not touched: its default stays


def test_the_request_id_fits_its_column() -> None:
    assert request_id("er-1", "churn") == "erasure:er-1:churn"
    long = request_id("x" * 200, "p" * 63)
    assert len(long) <= 128 and long.endswith(":" + "p" * 63)
    assert long == request_id("x" * 200, "p" * 63)


# -- the service, on a real nats-server --------------------------------------------------------


async def test_the_service_starts_one_run_per_erasure_however_often_it_comes(
    tmp_path: Path, nats_url: str
) -> None:
    data = tmp_path / "data"
    keyring = Keyring(data / "keys")
    governance_key = keyring.service_key("governance")
    scheduler_key = keyring.service_key("scheduler")
    platform = FakePlatform()
    service = workflow_service(data, nats_url, platform)
    task = asyncio.create_task(service.run())
    bus = await Bus.connect(NatsSettings(url=nats_url), name="test-governance")
    governance = Publisher(bus, signer=governance_key)
    impostor = Publisher(bus, signer=scheduler_key)
    event = EventEnvelope(
        type="gantry.data.subject.erased",
        source="gantry/governance",
        actor="dpo",
        subject="er-1",
        data=erasure().model_dump(mode="json"),
    )

    async def deliver(publisher: Publisher, e: EventEnvelope, copy: str = "") -> None:
        payload, headers = publisher.encode(e)
        if copy:  # the same event stored again: JetStream delivers it twice
            headers["Nats-Msg-Id"] = f"{e.id}-{copy}"
        await publisher.publish_raw(e.type, payload, headers)

    async def handled(s: WorkflowService, count: int) -> None:
        async with asyncio.timeout(10):
            while s.intake is None or s.intake.runners[2].handled < count:
                await asyncio.sleep(0.02)

    try:
        await serving(service)
        service.registry.submit(retraining(), owner=DEV.subject, roles=DEV.roles)
        service.registry.submit(
            retraining("other", {"datasets": ["other"]}, params={}),
            owner=DEV.subject,
            roles=DEV.roles,
        )
        await deliver(governance, event)
        await deliver(governance, event, "again")
        await deliver(governance, event.model_copy(update={"id": new_id()}))  # republished
        await handled(service, 3)
        # only governance may say someone was erased
        await deliver(impostor, event.model_copy(update={"id": new_id(), "source": "gantry/x"}))
        (reason,) = await dead_letter_reasons(nats_url, "gantry.deadletter.workflows-erasures", 1)
        assert "only from gantry/governance" in reason

        (run,) = service.controller.list()
        assert (run.pipeline, run.trigger, run.params["erasure.id"]) == ("churn", "erasure", "er-1")
        assert service.intake is not None and service.intake.erasure_runs == 1
        job = platform.jobs[platform.job_of("preprocess")]
        assert job["doc"]["spec"]["data"][0]["version"] == NEW_CHURN
    finally:
        service.stop()
        await asyncio.wait_for(task, 20)

    again = workflow_service(data, nats_url, platform)  # a restart: the inbox remembers
    task = asyncio.create_task(again.run())
    try:
        await serving(again)
        await deliver(governance, event, "after-restart")
        await handled(again, 1)
        assert [r.id for r in again.controller.list()] == [run.id]
        assert len(platform.submissions) == 1
    finally:
        again.stop()
        await asyncio.wait_for(task, 20)
        await bus.close()
