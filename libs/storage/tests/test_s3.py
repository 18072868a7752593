"""S3Backend specifics: aborted multipart uploads leave nothing, failures are typed."""

from __future__ import annotations

import socket
import uuid

import pytest

from gantry.core import ConfigError
from gantry.storage import BackendUnavailable, KeyManager, ObjectStore, S3Backend
from gantry.testing.s3 import S3Endpoint


@pytest.fixture(params=["s3-moto", "minio"])
def endpoint(request: pytest.FixtureRequest) -> S3Endpoint:
    fixture = "s3_server" if request.param == "s3-moto" else "minio_container"
    result: S3Endpoint = request.getfixturevalue(fixture)
    return result


def backend_for(endpoint: S3Endpoint, **options: object) -> S3Backend:
    return S3Backend(
        endpoint.url,
        bucket=options.pop("bucket", f"t-{uuid.uuid4().hex[:16]}"),  # type: ignore[arg-type]
        access_key=endpoint.access_key,
        secret_key=endpoint.secret_key,
        region=endpoint.region,
        part_size=5 * 1024 * 1024,
        **options,  # type: ignore[arg-type]
    )


def test_an_aborted_multipart_upload_leaves_no_parts(
    endpoint: S3Endpoint, keys: KeyManager
) -> None:
    import boto3

    backend = backend_for(endpoint)
    store = ObjectStore(backend, keys)
    writer = store.writer("big")
    for _ in range(12):  # 12 MiB: two 5 MiB parts are uploaded before the abort
        writer.write(b"\x07" * (1024 * 1024))
    writer.abort()
    assert list(backend.list("")) == []
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        region_name=endpoint.region,
    )
    try:
        uploads = s3.list_multipart_uploads(Bucket=backend.bucket).get("Uploads", [])
    finally:
        s3.close()
    assert uploads == []


def test_a_missing_bucket_that_may_not_be_created_is_a_configuration_error(
    endpoint: S3Endpoint, keys: KeyManager
) -> None:
    backend = backend_for(endpoint, bucket="never-created", create_bucket=False)
    with pytest.raises(ConfigError, match="does not exist"):
        ObjectStore(backend, keys).put("x", b"y")


def test_an_unreachable_endpoint_is_unavailable(keys: KeyManager) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(BackendUnavailable) as err:
        S3Backend(f"http://127.0.0.1:{port}", access_key="a", secret_key="b", retries=0,
                  connect_timeout_s=1)  # fmt: skip
    assert err.value.temporary and err.value.grpc_code == "UNAVAILABLE"
    assert f"127.0.0.1:{port}" in str(err.value)


def test_a_part_size_below_the_s3_minimum_is_refused() -> None:
    with pytest.raises(ConfigError, match="5 MiB"):
        S3Backend("127.0.0.1:1", part_size=1024, create_bucket=False)
