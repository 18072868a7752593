"""Models registered by a service on behalf of a scheduled job, code versions, and schema 2."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from gantry.events import EventEnvelope
from gantry.governance import store
from gantry.protos.v1 import governance_pb2 as pb

from .conftest import Running, governance_settings, people, publish_event, running, stream_events

TRAINER = ("svc-trainer", "service", "service")  # the training agent's identity
DEV = ("dev", "ml-developer")


def _artifact(data: bytes, **start: object) -> Iterator[pb.RegisterModelRequest]:
    yield pb.RegisterModelRequest(start=pb.ModelStart(**start))  # type: ignore[arg-type]
    yield pb.RegisterModelRequest(data=data, last=True)


async def _schedule(
    gov: Running, nats_url: str, job: str, versions: list[tuple[str, str]],
    owner: tuple[str, str] = DEV,
) -> None:  # fmt: skip
    """Publish the scheduler's gantry.job.scheduled and wait until governance has stored it."""
    event = EventEnvelope(
        type="gantry.job.scheduled",
        source="gantry/scheduler",
        actor=owner[0],
        subject=f"job/{job}",
        data={
            "job_id": job,
            "owner": owner[0],
            "owner_roles": [owner[1]],
            "nodes": ["node-1"],
            "datasets": [{"dataset": d, "version": v} for d, v in versions],
        },
    )
    await publish_event(nats_url, event, gov.keyring.service_key("scheduler"))
    stored = sa.select(store.scheduled_jobs.c.job_id).where(store.scheduled_jobs.c.job_id == job)

    def consumed() -> bool:
        with gov.service.engine.connect() as conn:
            return conn.execute(stored).first() is not None

    async with asyncio.timeout(10):
        while not await asyncio.to_thread(consumed):
            await asyncio.sleep(0.05)


async def _refused(gov: Running, who: tuple[str, ...], **start: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gov.stub.RegisterModel(_artifact(b"w", **start), metadata=gov.md(*who))
    return refused.value


async def _decision(
    nats_url: str, wanted: Callable[[EventEnvelope], bool], *, wait_s: float = 10.0
) -> EventEnvelope:
    """The first gantry.authz.decision matching ``wanted`` (they are published in background)."""
    async with asyncio.timeout(wait_s):
        while True:
            for event in await stream_events(nats_url, "gantry.authz.decision", wait_s=wait_s):
                if wanted(event):
                    return event
            await asyncio.sleep(0.1)


async def test_a_service_registers_for_a_scheduled_job_as_its_owner(
    gov: Running, nats_url: str
) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(10))).upload_id])
    await _schedule(gov, nats_url, "job-5", [("people", v.id[:12])])  # a prefix, as specs give

    m = await gov.stub.RegisterModel(
        _artifact(b"weights", name="churn", framework="pytorch", job_id="job-5",
                  code_version="3f2a9c81d0e4", metrics={"auc": 0.9},
                  trained_on=[pb.GrantedVersion(dataset="people", version=v.id)]),
        metadata=gov.md(*TRAINER),
    )  # fmt: skip
    assert (m.registered_by, m.job_id, m.code_version) == ("dev", "job-5", "3f2a9c81d0e4")
    got = await gov.stub.GetModel(pb.GetModelRequest(name="churn"), metadata=gov.md(*DEV))
    assert got.code_version == "3f2a9c81d0e4" and got.registered_by == "dev"

    lineage = await gov.stub.GetLineage(
        pb.LineageRequest(model="churn", model_version="1"), metadata=gov.md(*DEV)
    )
    assert {(e.from_id, e.to_id) for e in lineage.edges} == {
        ("job-5", "churn:1"),
        (f"people@{v.id}", "job-5"),
    }
    assert [(x.name, x.version, x.code_version, x.registered_by) for x in lineage.models] == [
        ("churn", 1, "3f2a9c81d0e4", "dev")
    ]
    by_data = await gov.stub.GetLineage(
        pb.LineageRequest(dataset="people", version=v.id), metadata=gov.md(*DEV)
    )
    assert [x.code_version for x in by_data.models] == ["3f2a9c81d0e4"]
    # a data steward sees the edges but not model metadata (no `list model`)
    steward = await gov.stub.GetLineage(pb.LineageRequest(job_id="job-5"), metadata=gov.md())
    assert len(steward.edges) == 2 and not steward.models

    registered = await stream_events(nats_url, "gantry.model.registered")
    assert registered[0].actor == "svc-trainer"  # who called; registered_by is the owner
    assert registered[0].data["code_version"] == "3f2a9c81d0e4"
    allowed = await _decision(
        nats_url, lambda e: e.data["action"] == "register" and e.data["decision"] == "allow"
    )
    assert allowed.actor == "svc-trainer" and allowed.data["principal"] == "dev"
    assert "via service svc-trainer" in allowed.data["reason"]


async def test_a_service_may_register_only_for_a_scheduled_job(gov: Running, nats_url: str) -> None:
    no_job = await _refused(gov, TRAINER, name="churn", framework="pytorch")
    assert no_job.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "on behalf of a job" in (no_job.details() or "")
    unknown = await _refused(gov, TRAINER, name="churn", framework="pytorch", job_id="job-x")
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    assert "jobs the scheduler placed" in (unknown.details() or "")
    listed = await gov.stub.ListModels(pb.ListModelsRequest(), metadata=gov.md(*DEV))
    assert not listed.versions
    denied = await _decision(
        nats_url, lambda e: e.data["action"] == "register" and e.data["decision"] == "deny"
    )
    assert denied.data["principal"] == "svc-trainer"


async def test_a_service_is_refused_when_the_jobs_owner_may_not_register(
    gov: Running, nats_url: str
) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(5))).upload_id])
    await _schedule(gov, nats_url, "job-ann", [("people", v.id)], owner=("ann", "annotator"))
    refused = await _refused(
        gov, TRAINER, name="churn", framework="pytorch", job_id="job-ann",
        trained_on=[pb.GrantedVersion(dataset="people", version=v.id)],
    )  # fmt: skip
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    details = refused.details() or ""
    assert "job job-ann, whose owner is refused" in details and "'ann'" in details


async def test_a_service_may_name_only_the_jobs_dataset_versions(
    gov: Running, nats_url: str
) -> None:
    await gov.create_people()
    await gov.create_people("other")
    v1 = await gov.commit("people", [(await gov.upload("people", people(5))).upload_id])
    v2 = await gov.commit("people", [(await gov.upload("people", people(5, 5))).upload_id])
    o = await gov.commit("other", [(await gov.upload("other", people(3))).upload_id])
    await _schedule(gov, nats_url, "job-6", [("people", v1.id)])
    for dataset, version in (("people", v2.id), ("other", o.id)):
        refused = await _refused(
            gov, TRAINER, name="churn", framework="pytorch", job_id="job-6",
            trained_on=[pb.GrantedVersion(dataset=dataset, version=version)],
        )  # fmt: skip
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.details() or ""
        assert f"cannot be trained on {dataset}@{version[:12]}" in details
        assert f"scheduled with people@{v1.id[:12]} only" in details
    listed = await gov.stub.ListModels(pb.ListModelsRequest(), metadata=gov.md(*DEV))
    assert not listed.versions


async def test_users_register_as_before(gov: Running) -> None:
    """A user needs `register model` and names any job; a `service` role on a user token
    gets past the method check (`list model`) but not the handler's."""
    m = await gov.stub.RegisterModel(
        _artifact(b"w", name="churn", framework="pytorch", job_id="never-scheduled"),
        metadata=gov.md(*DEV),
    )
    assert (m.registered_by, m.code_version) == ("dev", "")
    refused = await _refused(gov, ("mallory", "service", "user"), name="churn")
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not register model churn" in (refused.details() or "")
    too_long = await _refused(gov, DEV, name="churn", code_version="x" * 300)
    assert too_long.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "300 characters long" in (too_long.details() or "")


def _schema_1(url: str) -> None:
    """A database as schema 1 left it (no gov_models.code_version), with one model in it."""
    engine = store.connect(url)
    old = sa.MetaData()
    models_v1 = sa.Table(
        store.models.name, old,
        *(sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable,
                    autoincrement=False)
          for c in store.models.columns if c.name != "code_version"),
    )  # fmt: skip
    with engine.begin() as conn:
        store.metadata.create_all(
            conn, tables=[t for t in store.metadata.sorted_tables if t is not store.models]
        )
        old.create_all(conn)
        conn.execute(store.schema_version.insert().values(version=1))
        conn.execute(
            models_v1.insert().values(
                name="legacy", version=1, digest="0" * 64, bytes=1, object_name="models/legacy/x",
                framework="sklearn", job_id="", metrics_json="{}", signature_json="",
                trained_on_json="[]", description="", registered_by="dev", created_ms=1,
            )
        )  # fmt: skip
    engine.dispose()


async def test_a_schema_1_database_is_migrated(
    tmp_path: Path, nats_url: str, database_url: str | None
) -> None:
    settings = governance_settings(tmp_path / "data", nats_url, database_url)
    settings.data_dir.mkdir(parents=True)
    await asyncio.to_thread(_schema_1, settings.database_url)
    async with running(settings) as gov:
        old = await gov.stub.GetModel(pb.GetModelRequest(name="legacy"), metadata=gov.md(*DEV))
        assert (old.registered_by, old.code_version) == ("dev", "")
        new = await gov.stub.RegisterModel(
            _artifact(b"w", name="legacy", framework="sklearn", code_version="v2.0"),
            metadata=gov.md(*DEV),
        )
        assert (new.version, new.code_version) == (2, "v2.0")
    engine = store.connect(settings.database_url)
    try:
        assert store.migrate(engine) == store.SCHEMA_VERSION == 4  # nothing left to do
    finally:
        engine.dispose()
