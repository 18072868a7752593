"""Fixtures: one store per backend (local directory, moto S3, MinIO, memory), and raw blob access.

Every test that takes ``store`` or ``backend`` runs once per backend; MinIO is skipped with
the reason when no Docker engine is reachable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gantry.storage import (
    Backend,
    KeyManager,
    LocalBackend,
    LocalKeyFile,
    MemoryBackend,
    ObjectStore,
    S3Backend,
)
from gantry.storage.format import MIN_CHUNK_SIZE
from gantry.storage.naming import body_name, head_name
from gantry.testing.s3 import S3Endpoint

CHUNK = MIN_CHUNK_SIZE  # 64 KiB: multi-chunk objects stay small and fast
S3_PART = 5 * 1024 * 1024  # the S3 minimum, so multipart is exercised by small objects


def s3_backend(endpoint: S3Endpoint, **options: object) -> S3Backend:
    """A backend on a fresh bucket of ``endpoint``."""
    return S3Backend(
        endpoint.endpoint,
        bucket=f"t-{uuid.uuid4().hex[:16]}",
        access_key=endpoint.access_key,
        secret_key=endpoint.secret_key,
        secure=endpoint.secure,
        region=endpoint.region,
        part_size=S3_PART,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["local", "s3-moto", "minio", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, empty backend of each kind."""
    if request.param == "local":
        return LocalBackend(tmp_path / "blobs")
    if request.param == "memory":
        return MemoryBackend()
    fixture = "s3_server" if request.param == "s3-moto" else "minio_container"
    endpoint: S3Endpoint = request.getfixturevalue(fixture)
    return s3_backend(endpoint)


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    """Where the test's key ring file lives."""
    return tmp_path / "keys" / "ring.json"


@pytest.fixture
def keys(key_path: Path) -> Iterator[KeyManager]:
    """A key manager over a fresh local key file."""
    with KeyManager(LocalKeyFile(key_path)) as manager:
        yield manager


@pytest.fixture
def store(backend: Backend, keys: KeyManager) -> ObjectStore:
    """An object store with 64 KiB chunks over each backend."""
    return ObjectStore(backend, keys, chunk_size=CHUNK)


class Blobs:
    """Raw access to the blobs behind a store, for tests that inspect or damage them."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.backend = store.backend

    def head(self, name: str) -> str:
        return head_name(name)

    def body(self, name: str) -> str:
        return body_name(name, bytes.fromhex(self.store.stat(name).object_id))

    def read(self, blob: str) -> bytes:
        return b"".join(self.backend.get_stream(blob))

    def write(self, blob: str, data: bytes) -> None:
        self.backend.put_stream(blob, [data])

    def flip(self, blob: str, offset: int) -> None:
        data = bytearray(self.read(blob))
        data[offset] ^= 0x01
        self.write(blob, bytes(data))

    def all(self) -> list[str]:
        return list(self.backend.list(""))


@pytest.fixture
def blobs(store: ObjectStore) -> Blobs:
    """Raw blob access for ``store``."""
    return Blobs(store)


def pattern(size: int, seed: int = 0) -> bytes:
    """``size`` bytes in which every 8-byte word differs from its neighbours (cheap to make)."""
    words = -(-size // 8)
    return b"".join((seed * 1_000_003 + i).to_bytes(8, "big") for i in range(words))[:size]


@pytest.fixture
def make_data() -> Callable[..., bytes]:
    """``pattern(size, seed=0)``: distinctive test data."""
    return pattern
