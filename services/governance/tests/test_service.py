"""The governance service over real gRPC and a real nats-server: datasets, versions, views."""

from __future__ import annotations

import hashlib

import grpc
import pyarrow as pa
import pytest

from gantry.protos.v1 import governance_pb2 as pb
from gantry.testing.probes import readyz

from .conftest import PEOPLE_COLUMNS, Running, governance_settings, people, running, stream_events


async def test_steward_creates_annotator_reads_raw_developer_reads_deidentified(
    gov: Running, nats_url: str
) -> None:
    ds = await gov.create_people()
    assert ds.name == "people" and [c.name for c in ds.columns] == [c.name for c in PEOPLE_COLUMNS]
    up = await gov.upload("people", people(3000))
    assert up.rows == 3000 and up.shards >= 2  # 64 KiB shards in the test settings
    version = await gov.commit("people", [up.upload_id])
    assert len(version.id) == 64 and version.rows == 3000 and version.author == "sam"

    raw = await gov.read("people", "raw")
    assert raw.sort_by("id").to_pylist() == people(3000).to_pylist()

    deid = await gov.read("people", "deidentified", user="dev", role="ml-developer")
    assert deid.column_names == ["id", "email", "dob", "city"]  # income (sensitive) dropped
    emails = deid.sort_by("id").column("email").to_pylist()
    assert all(len(e) == 32 and "@" not in e for e in emails)
    assert len(set(emails)) == 3000  # keyed hash keeps distinct values distinct (joins work)

    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await gov.read("people", "raw", user="dev", role="ml-developer")
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "view" in (denied.value.details() or "")

    created = await stream_events(nats_url, "gantry.data.dataset.created")
    assert created[0].data["sensitivity"] == "sensitive"  # its most sensitive column
    reads = await stream_events(nats_url, "gantry.data.accessed", at_least=3)
    by = {(e.actor, e.data["view"], e.data["decision"]) for e in reads}
    assert ("ann", "raw", "allow") in by
    assert ("dev", "deidentified", "allow") in by
    assert ("dev", "raw", "deny") in by
    allowed = next(e for e in reads if e.actor == "ann")
    assert allowed.data["rows"] == 3000 and allowed.data["version"] == version.id
    assert len(allowed.data["shards"]) == up.shards


async def test_versions_are_content_addressed_and_rollback_makes_a_new_version(
    gov: Running,
) -> None:
    await gov.create_people()
    v1 = await gov.commit("people", [(await gov.upload("people", people(50))).upload_id])
    v2 = await gov.commit(
        "people",
        [(await gov.upload("people", people(20, start=50))).upload_id],
        append=True,
        parent=v1.id,
    )
    assert v2.parents == [v1.id] and v2.rows == 70
    diff = await gov.stub.Diff(
        pb.DiffRequest(dataset="people", from_version=v1.id, to_version=v2.id), metadata=gov.md()
    )
    assert diff.rows_added == 20 and diff.rows_removed == 0

    # a stale parent is a conflict, not a silent overwrite
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await gov.commit(
            "people", [(await gov.upload("people", people(5))).upload_id], parent=v1.id
        )
    assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    back = await gov.stub.Rollback(
        pb.RollbackRequest(dataset="people", to_version=v1.id[:10]), metadata=gov.md()
    )
    assert back.id not in (v1.id, v2.id) and back.rollback_of == v1.id
    assert back.parents == [v2.id] and back.rows == 50
    log = await gov.stub.Log(pb.LogRequest(dataset="people"), metadata=gov.md())
    assert [v.id for v in log.versions] == [back.id, v2.id, v1.id]  # history kept
    assert (await gov.read("people", "raw")).num_rows == 50
    old = await gov.read("people", "raw", version=v2.id)
    assert old.num_rows == 70

    # the id is the SHA-256 of the manifest the service stores
    from gantry.governance.store import versions

    with gov.service.engine.connect() as conn:
        manifest = conn.execute(versions.select().where(versions.c.id == back.id)).one().manifest
    assert hashlib.sha256(manifest).hexdigest() == back.id


async def test_bad_input_is_refused_with_a_clear_message(gov: Running) -> None:
    await gov.create_people()
    for name in ("../etc", "a/b", "UPPER", ""):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await gov.stub.CreateDataset(
                pb.CreateDatasetRequest(name=name, columns=PEOPLE_COLUMNS), metadata=gov.md()
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await gov.upload("nope", people(3))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "gantry data list" in (unknown.value.details() or "")

    wrong = people(10).set_column(3, "income", pa.array(["x"] * 10))
    with pytest.raises(grpc.aio.AioRpcError) as mismatch:
        await gov.upload("people", wrong)
    assert mismatch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "income" in (mismatch.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as dup:
        await gov.create_people()
    assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS

    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await gov.stub.CreateDataset(
            pb.CreateDatasetRequest(name="x", columns=PEOPLE_COLUMNS),
            metadata=gov.md("dev", "ml-developer"),
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_interrupted_upload_never_becomes_visible(gov: Running) -> None:
    await gov.create_people()
    with pytest.raises(grpc.aio.AioRpcError) as cut:
        await gov.upload("people", people(5000), last=False)
    assert cut.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "without its last message" in (cut.value.details() or "")
    from gantry.governance.store import uploads

    with gov.service.engine.connect() as conn:
        states = [r.state for r in conn.execute(uploads.select()).all()]
    assert states == ["aborted"]
    ds = await gov.stub.GetDataset(pb.GetDatasetRequest(name="people"), metadata=gov.md())
    assert ds.head == "" and ds.versions == 0

    # its objects are garbage; a committed version's are not
    good = await gov.commit("people", [(await gov.upload("people", people(30))).upload_id])
    gc = await gov.stub.CollectGarbage(pb.CollectGarbageRequest(), metadata=gov.md())
    assert gc.removed_objects >= 1
    assert (await gov.read("people", "raw", version=good.id)).num_rows == 30
    again = await gov.stub.CollectGarbage(pb.CollectGarbageRequest(), metadata=gov.md())
    assert again.removed_objects == 0


async def test_view_policy_is_versioned_and_applied(gov: Running, nats_url: str) -> None:
    await gov.create_people()
    await gov.commit("people", [(await gov.upload("people", people(40))).upload_id])
    policy = await gov.stub.SetViewPolicy(
        pb.SetViewPolicyRequest(
            dataset="people",
            rules=[
                pb.ColumnRule(classification="pii", transform="tokenize"),
                pb.ColumnRule(column="dob", transform="generalize", params={"date": "year"}),
                pb.ColumnRule(classification="internal", transform="keep"),
                pb.ColumnRule(classification="public", transform="keep"),
                pb.ColumnRule(column="income", transform="noise", params={"scale": "5"}),
            ],
        ),
        metadata=gov.md(),
    )
    assert policy.version == 1
    deid = (await gov.read("people", "deidentified", user="dev", role="ml-developer")).sort_by("id")
    assert all(e.startswith("tok_") for e in deid.column("email").to_pylist())
    assert deid.column("dob").to_pylist() == [1970 + i % 40 for i in range(40)]
    assert deid.column("income").to_pylist() != people(40).column("income").to_pylist()
    again = (await gov.read("people", "deidentified", user="dev", role="ml-developer")).sort_by(
        "id"
    )
    assert again.equals(deid)  # the same noise on every read: no averaging attack

    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await gov.stub.SetViewPolicy(
            pb.SetViewPolicyRequest(
                dataset="people", rules=[pb.ColumnRule(column="city", transform="noise")]
            ),
            metadata=gov.md(),
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await gov.stub.SetViewPolicy(
            pb.SetViewPolicyRequest(dataset="people", rules=[]),
            metadata=gov.md("dev", "ml-developer"),
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    changed = await stream_events(nats_url, "gantry.data.policy.changed")
    assert changed[0].data["policy_version"] == 1 and changed[0].actor == "sam"


async def test_files_dataset_round_trip_and_bad_paths(gov: Running) -> None:
    await gov.stub.CreateDataset(
        pb.CreateDatasetRequest(
            name="images",
            format="files",
            columns=[pb.Column(name="content", type="binary", classification="sensitive")],
        ),
        metadata=gov.md(),
    )
    blobs = {"a/1.bin": b"\x00" * 200_000, "b.txt": b"hello"}

    def files(items: dict[str, bytes], last: bool = True):  # type: ignore[no-untyped-def]
        yield pb.UploadRequest(start=pb.UploadStart(dataset="images", source_format="files"))
        for path, data in items.items():
            for i in range(0, len(data), 65536):
                yield pb.UploadRequest(file_chunk=pb.FileChunk(path=path, data=data[i : i + 65536]))
        if last:
            yield pb.UploadRequest(last=True)

    up = await gov.stub.Upload(files(blobs), metadata=gov.md())
    assert up.files == 2
    v = await gov.commit("images", [up.upload_id])
    got: dict[str, bytes] = {}
    async for m in gov.stub.Read(
        pb.ReadRequest(dataset="images", view="raw"), metadata=gov.md("ann", "annotator")
    ):
        got[m.file_chunk.path] = got.get(m.file_chunk.path, b"") + m.file_chunk.data
    assert got == blobs and v.rows == 2
    with pytest.raises(grpc.aio.AioRpcError) as no_view:
        async for _ in gov.stub.Read(
            pb.ReadRequest(dataset="images", view="deidentified"),
            metadata=gov.md("dev", "ml-developer"),
        ):
            pass
    assert "cannot be de-identified" in (no_view.value.details() or "")
    for bad in ("../x", "/abs", "a//b", "a\\b"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gov.stub.Upload(files({bad: b"x"}), metadata=gov.md())
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad


async def test_catalog_on_both_databases(tmp_path, nats_url: str, database_url: str | None) -> None:  # type: ignore[no-untyped-def]
    settings = governance_settings(tmp_path / "data", nats_url, database_url)
    async with running(settings) as gov:
        await gov.create_people()
        v = await gov.commit("people", [(await gov.upload("people", people(25))).upload_id])
        assert (await gov.read("people", "raw")).num_rows == 25
    async with running(settings) as again:  # restart: everything is still there
        ds = await again.stub.GetDataset(pb.GetDatasetRequest(name="people"), metadata=again.md())
        assert ds.head == v.id
        assert (await again.read("people", "raw")).num_rows == 25


async def test_readyz_answers_once_the_service_is_up(gov: Running) -> None:
    assert await readyz(gov.service.metrics_port) == "200 ready\n"
