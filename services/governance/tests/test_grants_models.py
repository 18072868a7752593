"""Grants for scheduled jobs, lineage, the model registry, key rotation and tampering."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from gantry.events import EventEnvelope
from gantry.protos.v1 import governance_pb2 as pb

from .conftest import Running, dead_letter_reasons, people, publish_event, stream_events


async def _scheduled(gov: Running, nats_url: str, job: str, datasets: list[dict[str, str]]) -> None:
    event = EventEnvelope(
        type="gantry.job.scheduled",
        source="gantry/scheduler",
        actor="dev",
        subject=f"job/{job}",
        data={
            "job_id": job,
            "owner": "dev",
            "owner_roles": ["ml-developer"],
            "nodes": ["node-1"],
            "datasets": datasets,
        },
    )
    await publish_event(nats_url, event, gov.keyring.service_key("scheduler"))


async def _grant_for(gov: Running, job: str) -> pb.Grant:
    agent = gov.md("svc-agent", "service", kind="service")
    async with asyncio.timeout(10):
        while True:
            try:
                return await gov.stub.IssueGrant(pb.IssueGrantRequest(job_id=job), metadata=agent)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # not consumed yet
                    raise
                await asyncio.sleep(0.1)


async def test_a_scheduled_job_gets_exactly_its_grant(gov: Running, nats_url: str) -> None:
    await gov.create_people()
    await gov.create_people("other")
    v = await gov.commit("people", [(await gov.upload("people", people(60))).upload_id])
    o = await gov.commit("other", [(await gov.upload("other", people(5))).upload_id])
    await _scheduled(
        gov, nats_url, "job-1",
        [{"dataset": "people", "version": v.id, "view": "deidentified"}],
    )  # fmt: skip
    grant = await _grant_for(gov, "job-1")
    assert grant.token.startswith("ggr_") and grant.view == "deidentified"
    assert [(g.dataset, g.version) for g in grant.versions] == [("people", v.id)]

    worker = {"user": "svc-agent", "role": "service", "kind": "service"}
    shards = await gov.stub.ListShards(
        pb.ListShardsRequest(dataset="people", version=v.id, grant=grant.token),
        metadata=gov.md("svc-agent", "service", "service"),
    )
    assert shards.view == "deidentified" and "income" not in [c.name for c in shards.columns]
    rows = await gov.read("people", "deidentified", version=v.id, grant=grant.token, **worker)
    assert rows.num_rows == 60 and "income" not in rows.column_names

    # the grant opens nothing else: another dataset, the raw view, no grant at all
    for kwargs in (
        {"dataset": "other", "view": "deidentified", "version": o.id},
        {"dataset": "people", "view": "raw", "version": v.id},
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gov.read(kwargs["dataset"], kwargs["view"], version=kwargs["version"],
                           grant=grant.token, **worker)  # fmt: skip
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as no_grant:
        await gov.read("people", "deidentified", **worker)
    assert no_grant.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # the lineage now links the version to the job
    lineage = await gov.stub.GetLineage(
        pb.LineageRequest(dataset="people", version=v.id[:8]), metadata=gov.md()
    )
    assert [(e.from_id, e.to_id) for e in lineage.edges] == [(f"people@{v.id}", "job-1")]
    issued = await stream_events(nats_url, "gantry.data.grant.issued")
    assert issued[0].data["job_id"] == "job-1" and "token" not in issued[0].data


async def test_expired_and_forged_grants_are_refused(gov: Running, nats_url: str) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(10))).upload_id])
    grant = await gov.stub.IssueGrant(
        pb.IssueGrantRequest(
            job_id="job-2", versions=[pb.GrantedVersion(dataset="people", version=v.id)],
            view="raw", ttl_s=1,
        ),
        metadata=gov.md(),
    )  # fmt: skip
    worker = {"user": "svc-agent", "role": "service", "kind": "service"}
    assert (await gov.read("people", "raw", grant=grant.token, **worker)).num_rows == 10
    await asyncio.sleep(1.1)
    with pytest.raises(grpc.aio.AioRpcError) as expired:
        await gov.read("people", "raw", grant=grant.token, **worker)
    assert "expired" in (expired.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as forged:
        await gov.read("people", "raw", grant="ggr_" + "A" * 43, **worker)
    assert "not known" in (forged.value.details() or "")
    denials = await stream_events(nats_url, "gantry.data.accessed", at_least=3)
    assert sum(e.data["decision"] == "deny" for e in denials) == 2

    # a job whose owner may only see de-identified data cannot get a raw grant
    await _scheduled(gov, nats_url, "job-raw",
                     [{"dataset": "people", "version": v.id, "view": "raw"}])  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await _grant_for(gov, "job-raw")
    assert raw.value.code() == grpc.StatusCode.PERMISSION_DENIED


def _artifact(data: bytes, **start: object) -> Iterator[pb.RegisterModelRequest]:
    yield pb.RegisterModelRequest(start=pb.ModelStart(**start))  # type: ignore[arg-type]
    for i in range(0, len(data), 100_000):
        yield pb.RegisterModelRequest(data=data[i : i + 100_000])
    yield pb.RegisterModelRequest(last=True)


async def test_model_registry_round_trip_lineage_and_tamper(gov: Running, nats_url: str) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(10))).upload_id])
    weights = bytes(range(256)) * 3000
    dev = gov.md("dev", "ml-developer")
    m1 = await gov.stub.RegisterModel(
        _artifact(weights, name="churn", framework="pytorch", job_id="job-9",
                  metrics={"auc": 0.91}, signature_json='{"inputs": []}',
                  trained_on=[pb.GrantedVersion(dataset="people", version=v.id)]),
        metadata=dev,
    )  # fmt: skip
    m2 = await gov.stub.RegisterModel(_artifact(b"v2", name="churn"), metadata=dev)
    assert (m1.version, m2.version) == (1, 2) and m1.bytes == len(weights)
    listed = await gov.stub.ListModels(pb.ListModelsRequest(name="churn"), metadata=dev)
    assert [m.version for m in listed.versions] == [2, 1]
    gc = await gov.stub.CollectGarbage(pb.CollectGarbageRequest(), metadata=gov.md())
    assert gc.removed_objects == 0 and gc.kept_objects >= 3  # models and the version's shard
    got = b""
    async for part in gov.stub.DownloadModel(
        pb.GetModelRequest(name="churn", version=1), metadata=dev
    ):
        if part.HasField("info"):
            assert part.info.metrics["auc"] == pytest.approx(0.91)
        got += part.data
    assert got == weights

    lineage = await gov.stub.GetLineage(
        pb.LineageRequest(model="churn", model_version="1"), metadata=dev
    )
    assert {(e.from_id, e.to_id) for e in lineage.edges} == {
        ("job-9", "churn:1"),
        (f"people@{v.id}", "job-9"),
    }
    registered = await stream_events(nats_url, "gantry.model.registered", at_least=2)
    assert registered[0].data["name"] == "churn"

    with pytest.raises(grpc.aio.AioRpcError) as bad_sig:
        await gov.stub.RegisterModel(_artifact(b"x", name="m", signature_json="{no"), metadata=dev)
    assert bad_sig.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # flip one byte of the stored artifact: the download refuses
    root = gov.settings.data_dir / "objects"
    bodies = [p for p in root.rglob("*") if p.is_file() and "churn" in str(p) and "_body" in str(p)]
    assert bodies
    target = max(bodies, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    with pytest.raises(grpc.aio.AioRpcError) as tampered:
        async for _ in gov.stub.DownloadModel(
            pb.GetModelRequest(name="churn", version=1), metadata=dev
        ):
            pass
    assert tampered.value.code() == grpc.StatusCode.DATA_LOSS


async def test_key_rotation_rewraps_and_old_data_stays_readable(gov: Running) -> None:
    await gov.create_people()
    await gov.commit("people", [(await gov.upload("people", people(30))).upload_id])
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await gov.stub.RotateKeys(pb.RotateKeysRequest(), metadata=gov.md("dev", "ml-developer"))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    rotated = await gov.stub.RotateKeys(
        pb.RotateKeysRequest(retire_previous=True), metadata=gov.md()
    )
    assert rotated.active_version == 2 and rotated.rewrapped >= 2 and list(rotated.retired) == [1]
    assert (await gov.read("people", "raw")).num_rows == 30
    deid = await gov.read("people", "deidentified", user="dev", role="ml-developer")
    assert deid.num_rows == 30


async def test_a_retired_key_without_rewrap_gives_a_clear_error(gov: Running) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(20))).upload_id])
    keys = gov.service.objects.keys
    keys.rotate()
    keys.retire(1)  # an operator mistake: retired before re-wrapping
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gov.read("people", "raw", version=v.id, user="sam", role="data-steward")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    assert "KEK version 1, which was retired" in details and "restore the key ring" in details


async def test_grants_can_be_listed_and_revoked(gov: Running, nats_url: str) -> None:
    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(10))).upload_id])
    grant = await gov.stub.IssueGrant(
        pb.IssueGrantRequest(
            job_id="job-r", versions=[pb.GrantedVersion(dataset="people", version=v.id)],
            view="deidentified",
        ),
        metadata=gov.md(),
    )  # fmt: skip
    worker = {"user": "svc-agent", "role": "service", "kind": "service"}
    assert (await gov.read("people", "deidentified", grant=grant.token, **worker)).num_rows == 10
    listed = await gov.stub.ListGrants(pb.ListGrantsRequest(job_id="job-r"), metadata=gov.md())
    assert [g.id for g in listed.grants] == [grant.id] and listed.grants[0].token == ""
    revoked = await gov.stub.RevokeGrant(
        pb.RevokeGrantRequest(grant_id=grant.id, reason="job cancelled"), metadata=gov.md()
    )
    assert revoked.revoked
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gov.read("people", "deidentified", grant=grant.token, **worker)
    assert "revoked" in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await gov.stub.RevokeGrant(
            pb.RevokeGrantRequest(grant_id=grant.id), metadata=gov.md("dev", "ml-developer")
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    events = await stream_events(nats_url, "gantry.data.grant.revoked")
    assert events[0].data["reason"] == "job cancelled"


async def test_only_the_scheduler_places_jobs(gov: Running, nats_url: str) -> None:
    """A job.scheduled from an outside account's key is dead-lettered, never a grant."""
    from gantry.security.keyring import Keyring

    await gov.create_people()
    v = await gov.commit("people", [(await gov.upload("people", people(5))).upload_id])
    outsider = Keyring(gov.settings.keys_dir).account_key("intruder")
    event = EventEnvelope(
        type="gantry.job.scheduled",
        source="intruder",
        actor="mallory",
        data={"job_id": "job-x", "owner": "mallory", "owner_roles": ["data-steward"],
              "datasets": [{"dataset": "people", "version": v.id, "view": "raw"}]},
    )  # fmt: skip
    await publish_event(nats_url, event, outsider)
    reasons = await dead_letter_reasons(nats_url, "gantry.deadletter.governance-jobs")
    assert "only the scheduler" in reasons[0]
    with pytest.raises(grpc.aio.AioRpcError) as none:
        await gov.stub.IssueGrant(
            pb.IssueGrantRequest(job_id="job-x"),
            metadata=gov.md("svc-agent", "service", "service"),
        )
    assert none.value.code() == grpc.StatusCode.NOT_FOUND


async def test_an_upload_left_uncommitted_too_long_expires(gov: Running) -> None:
    from gantry.governance.store import uploads

    await gov.create_people()
    up = await gov.upload("people", people(3000))
    with gov.service.engine.begin() as conn:
        conn.execute(uploads.update().values(active_ms=1))  # finished long ago
    with pytest.raises(grpc.aio.AioRpcError) as expired:
        await gov.commit("people", [up.upload_id])
    assert expired.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expired" in (expired.value.details() or "")
    gc = await gov.stub.CollectGarbage(pb.CollectGarbageRequest(), metadata=gov.md())
    assert gc.removed_objects == up.shards
