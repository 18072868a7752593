"""A node agent (a service) acting for a scheduled job: it downloads the model version the
job's spec.model names, and uploads and commits the job's spec.output dataset, each only when
the job's owner may; the commit names the job and lineage links its inputs to the version."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pyarrow as pa
import pytest
import sqlalchemy as sa

from gantry.client.tables import encode_arrow_stream
from gantry.events import EventEnvelope
from gantry.governance import store
from gantry.protos.v1 import governance_pb2 as pb

from .conftest import Running, people, publish_event, stream_events

AGENT = ("svc-training-agent", "service", "service")
DEV = ("dev", "ml-developer")
STEWARD = ("sam", "data-steward")


async def schedule(
    gov: Running,
    nats_url: str,
    job: str,
    *,
    owner: tuple[str, str],
    datasets: list[tuple[str, str]] = (),  # type: ignore[assignment]
    spec: dict[str, Any] | None = None,
) -> None:
    """Publish the scheduler's gantry.job.scheduled and wait until governance stored it."""
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
            "datasets": [{"dataset": d, "version": v} for d, v in datasets],
            "spec": spec or {},
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


async def download(gov: Running, who: tuple[str, ...], **request: Any) -> bytes:
    call = gov.stub.DownloadModel(pb.GetModelRequest(**request), metadata=gov.md(*who))
    return b"".join([m.data async for m in call])


async def refused(call: Callable[[], Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call()
    return error.value


async def register(gov: Running, name: str, data: bytes) -> pb.ModelVersion:
    def parts() -> Iterator[pb.RegisterModelRequest]:
        yield pb.RegisterModelRequest(start=pb.ModelStart(name=name, framework="pytorch"))
        yield pb.RegisterModelRequest(data=data, last=True)

    return await gov.stub.RegisterModel(parts(), metadata=gov.md(*DEV))


async def upload(
    gov: Running, who: tuple[str, ...], dataset: str, table: pa.Table, job: str
) -> Any:
    def parts() -> Iterator[pb.UploadRequest]:
        start = pb.UploadStart(dataset=dataset, source_format="arrow", job_id=job)
        yield pb.UploadRequest(start=start)
        for fragment in encode_arrow_stream(table.schema, table.to_batches(), 4096):
            yield pb.UploadRequest(arrow_ipc=fragment)
        yield pb.UploadRequest(last=True)

    return await gov.stub.Upload(parts(), metadata=gov.md(*who))


async def decision(
    nats_url: str, wanted: Callable[[EventEnvelope], bool], *, wait_s: float = 10.0
) -> EventEnvelope:
    async with asyncio.timeout(wait_s):
        while True:
            for event in await stream_events(nats_url, "gantry.authz.decision", wait_s=wait_s):
                if wanted(event):
                    return event
            await asyncio.sleep(0.1)


# -- input models --------------------------------------------------------------------------------


async def test_an_agent_downloads_only_the_model_its_job_names_for_an_owner_who_may_read(
    gov: Running, nats_url: str
) -> None:
    await register(gov, "churn", b"weights v1")
    await register(gov, "churn", b"weights v2")
    evaluate = {"entrypoint": {"task": "t:t", "mode": "evaluate"}}
    await schedule(gov, nats_url, "j-eval", owner=DEV,
                   spec={**evaluate, "model": {"name": "churn", "version": 1}})  # fmt: skip
    await schedule(gov, nats_url, "j-steward", owner=STEWARD,
                   spec={**evaluate, "model": {"name": "churn", "version": 1}})  # fmt: skip
    await schedule(gov, nats_url, "j-plain", owner=DEV, spec={"entrypoint": {"module": "m"}})

    got = await download(gov, AGENT, name="churn", version=1, job_id="j-eval")
    assert got == b"weights v1"
    allowed = await decision(
        nats_url,
        lambda e: e.data["action"] == "read" and e.data["resource_name"] == "churn:1"
        and e.data["decision"] == "allow",
    )  # fmt: skip
    assert allowed.actor == "svc-training-agent" and allowed.data["principal"] == "dev"
    assert "for job j-eval via service svc-training-agent" in allowed.data["reason"]

    other = await refused(lambda: download(gov, AGENT, name="churn", version=2, job_id="j-eval"))
    assert other.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "scheduled with churn:1 as spec.model, not churn:2" in (other.details() or "")
    latest = await refused(lambda: download(gov, AGENT, name="churn", job_id="j-eval"))
    assert "not churn:2" in (latest.details() or "")  # 0 = latest = 2: not what the job names
    none = await refused(lambda: download(gov, AGENT, name="churn", version=1, job_id="j-plain"))
    assert "scheduled with no model as spec.model" in (none.details() or "")
    steward = await refused(
        lambda: download(gov, AGENT, name="churn", version=1, job_id="j-steward")
    )
    assert steward.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "job j-steward, whose owner is refused" in (steward.details() or "")
    unknown = await refused(lambda: download(gov, AGENT, name="churn", version=1, job_id="j-x"))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    # without a job, a service reads models as before (serving loads what it deploys)
    assert await download(gov, AGENT, name="churn", version=2) == b"weights v2"


# -- output datasets -----------------------------------------------------------------------------


async def test_an_agent_commits_its_jobs_output_as_the_owner_with_lineage(
    gov: Running, nats_url: str
) -> None:
    await gov.create_people()
    await gov.create_people("people-clean")
    source = await gov.commit("people", [(await gov.upload("people", people(20))).upload_id])
    spec = {"entrypoint": {"transform": "prep:clean"}, "output": {"dataset": "people-clean"}}
    await schedule(gov, nats_url, "j-prep", owner=STEWARD, datasets=[("people", source.id[:12])],
                   spec=spec)  # fmt: skip
    grant = await gov.stub.IssueGrant(
        pb.IssueGrantRequest(job_id="j-prep"), metadata=gov.md(*AGENT)
    )
    assert grant.token

    up = await upload(gov, AGENT, "people-clean", people(8), "j-prep")
    version = await gov.stub.Commit(
        pb.CommitRequest(dataset="people-clean", upload_ids=[up.upload_id], message="cleaned",
                         job_id="j-prep"),
        metadata=gov.md(*AGENT),
    )  # fmt: skip
    assert version.rows == 8
    assert version.author == "sam"  # the job's owner, not the agent
    assert version.message == "cleaned (job j-prep)"  # the message names the job

    lineage = await gov.stub.GetLineage(
        pb.LineageRequest(dataset="people-clean", version=version.id), metadata=gov.md()
    )
    assert {(e.from_id, e.to_id) for e in lineage.edges} == {
        (f"people@{source.id}", "j-prep"),
        ("j-prep", f"people-clean@{version.id}"),
    }
    allowed = await decision(
        nats_url,
        lambda e: e.data["action"] == "update" and e.data["resource_name"] == "people-clean"
        and e.data["method"].endswith("/Commit"),
    )  # fmt: skip
    assert allowed.actor == "svc-training-agent" and allowed.data["principal"] == "sam"


async def test_an_agent_may_not_write_for_an_owner_who_may_not_or_another_dataset(
    gov: Running, nats_url: str
) -> None:
    await gov.create_people()
    await gov.create_people("people-clean")
    spec = {"entrypoint": {"transform": "prep:clean"}, "output": {"dataset": "people-clean"}}
    await schedule(gov, nats_url, "j-dev", owner=DEV, spec=spec)
    await schedule(gov, nats_url, "j-sam", owner=STEWARD, spec=spec)

    dev = await refused(lambda: upload(gov, AGENT, "people-clean", people(3), "j-dev"))
    assert dev.code() == grpc.StatusCode.PERMISSION_DENIED
    details = dev.details() or ""
    assert "job j-dev, whose owner is refused" in details and "'dev'" in details
    elsewhere = await refused(lambda: upload(gov, AGENT, "people", people(3), "j-sam"))
    assert elsewhere.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spec.output dataset people-clean, not people" in (elsewhere.details() or "")
    no_job = await refused(lambda: upload(gov, AGENT, "people-clean", people(3), ""))
    assert "only on behalf of a job the scheduler placed" in (no_job.details() or "")

    up = await upload(gov, AGENT, "people-clean", people(3), "j-sam")
    cross = await refused(
        lambda: gov.stub.Commit(
            pb.CommitRequest(
                dataset="people-clean", upload_ids=[up.upload_id], message="m", job_id="j-dev"
            ),
            metadata=gov.md(*AGENT),
        )
    )
    assert cross.code() == grpc.StatusCode.PERMISSION_DENIED
    # a schema the dataset does not have is refused as for anyone
    wrong = people(3).drop_columns(["city"]).append_column("town", pa.array(["a", "b", "c"]))
    mismatch = await refused(lambda: upload(gov, AGENT, "people-clean", wrong, "j-sam"))
    assert mismatch.code() == grpc.StatusCode.INVALID_ARGUMENT
    log = await gov.stub.Log(pb.LogRequest(dataset="people-clean"), metadata=gov.md())
    assert not log.versions


async def test_users_still_need_update_dataset_to_upload_and_commit(gov: Running) -> None:
    await gov.create_people()
    up = await gov.upload("people", people(3))
    for who in (DEV, ("mallory", "service", "user")):  # a service role on a user token too
        denied = await refused(lambda who=who: upload(gov, who, "people", people(3), ""))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "may not update dataset people" in (denied.details() or "")
        commit = await refused(
            lambda who=who: gov.stub.Commit(
                pb.CommitRequest(dataset="people", upload_ids=[up.upload_id], message="m"),
                metadata=gov.md(*who),
            )
        )
        assert commit.code() == grpc.StatusCode.PERMISSION_DENIED
    version = await gov.commit("people", [up.upload_id])
    assert version.author == "sam" and version.message == "m"  # a user's message as given
