"""The governance service on S3 storage: moto's S3 server, and MinIO where Docker runs."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import minio
import pytest

from gantry.protos.v1 import governance_pb2 as pb
from gantry.storage import S3Settings, StorageSettings
from gantry.testing.s3 import S3Endpoint

from .conftest import governance_settings, people, running


@pytest.fixture(params=["moto", "minio"])
def s3(request: pytest.FixtureRequest) -> S3Endpoint:
    name = "s3_server" if request.param == "moto" else "minio_container"
    endpoint: S3Endpoint = request.getfixturevalue(name)
    return endpoint


async def test_datasets_on_s3_round_trip_and_refuse_tampering(
    tmp_path: Path, nats_url: str, s3: S3Endpoint
) -> None:
    bucket = f"gov-{uuid.uuid4().hex[:12]}"
    storage = StorageSettings(
        backend="s3",
        chunk_size=64 << 10,
        s3=S3Settings(
            endpoint=s3.endpoint,
            bucket=bucket,
            access_key=s3.access_key,
            secret_key=s3.secret_key,  # type: ignore[arg-type]
            secure=s3.secure,
            region=s3.region,
        ),
    )
    settings = governance_settings(tmp_path / "data", nats_url, storage=storage)
    async with running(settings) as gov:
        await gov.create_people()
        up = await gov.upload("people", people(3000))
        version = await gov.commit("people", [up.upload_id])
        assert (await gov.read("people", "raw")).num_rows == 3000
        deid = await gov.read("people", "deidentified", user="dev", role="ml-developer")
        assert "income" not in deid.column_names

        client = minio.Minio(
            s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key, secure=s3.secure
        )
        names = [o.object_name for o in client.list_objects(bucket, recursive=True)]
        bodies = [n for n in names if n.startswith("_body/datasets/people/uploads/")]
        assert len(bodies) == up.shards
        response = client.get_object(bucket, bodies[0])
        try:
            blob = bytearray(response.read())
        finally:
            response.close()
            response.release_conn()
        assert b"user1@example.com" not in blob  # encrypted at rest
        blob[len(blob) // 3] ^= 0x40
        import io

        client.put_object(bucket, bodies[0], io.BytesIO(bytes(blob)), len(blob))
    async with running(settings) as gov:  # a fresh process: nothing cached in memory
        with pytest.raises(grpc.aio.AioRpcError) as tampered:
            await gov.read("people", "raw", version=version.id, role="data-steward", user="sam")
        assert tampered.value.code() == grpc.StatusCode.DATA_LOSS
        assert "people" in (tampered.value.details() or "")
        listed = await gov.stub.ListDatasets(pb.ListDatasetsRequest(), metadata=gov.md())
        assert [d.name for d in listed.datasets] == ["people"]
