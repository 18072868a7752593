"""Storage settings, and open_store(): the one place a service turns settings into a store.

A service's settings hold :class:`StorageSettings` as their ``storage`` group, so the
environment names are ``GANTRY_STORAGE__<FIELD>``, e.g. ``GANTRY_STORAGE__BACKEND=s3`` and
``GANTRY_STORAGE__S3__ENDPOINT=minio:9000`` (each process has its own environment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from gantry.storage.backends import Backend, LocalBackend
from gantry.storage.format import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from gantry.storage.key_file import LocalKeyFile
from gantry.storage.key_manager import DEFAULT_WRAP_LIMIT, KeyManager
from gantry.storage.keyring import KeySource
from gantry.storage.kubernetes_keys import KubernetesSecretKeys, MountedSecretKeys
from gantry.storage.s3 import DEFAULT_PART_SIZE, MIN_PART_SIZE, S3Backend
from gantry.storage.store import ObjectStore

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class S3Settings(BaseModel):
    """How to reach an S3-compatible bucket (MinIO, AWS S3, Ceph RGW)."""

    endpoint: str = Field(
        default="127.0.0.1:9000",
        description="host:port of the S3 API; an http:// or https:// prefix sets `secure`. "
        "Default: a MinIO on this machine (its default port).",
    )
    bucket: str = Field(
        default="gantry", description="Bucket holding every object (default gantry)."
    )
    access_key: str = Field(default="", description="Access key id; empty = anonymous.")
    secret_key: SecretStr = Field(
        default=SecretStr(""), description="Secret key for `access_key`; never logged."
    )
    secure: bool = Field(
        default=True,
        description="Use TLS (default true: credentials must not cross the network in clear).",
    )
    region: str | None = Field(
        default=None, description="Region; none = ask the server (MinIO needs none)."
    )
    create_bucket: bool = Field(
        default=True,
        description="Create the bucket when missing (default true; turn off when the "
        "credentials may not create buckets).",
    )
    part_size: int = Field(
        default=DEFAULT_PART_SIZE,
        ge=MIN_PART_SIZE,
        le=5 * 1024**3,
        description="Bytes per multipart part, 5 MiB to 5 GiB (default 16 MiB). The largest "
        "object is 10,000 parts; each upload holds about parallel_uploads + 1 parts in memory.",
    )
    parallel_uploads: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Parts uploaded at once per object (default 2: overlaps network and "
        "encryption while keeping memory low).",
    )


class KeySettings(BaseModel):
    """Where the key ring (the versioned KEKs) is kept."""

    source: Literal["file", "kubernetes", "mounted"] = Field(
        default="file",
        description="`file` (a 0600 JSON file; single machines), `kubernetes` (a Secret via "
        "the API; clusters) or `mounted` (a Secret volume, read-only). Default file.",
    )
    file: Path | None = Field(
        default=None, description="Key file; default <data_dir>/keys/storage-kek.json."
    )
    namespace: str | None = Field(
        default=None,
        description="Namespace of the Secret; default the pod's own namespace (else default).",
    )
    secret_name: str = Field(
        default="gantry-storage-kek", description="Name of the key-ring Secret."
    )
    mounted_dir: Path = Field(
        default=Path("/etc/gantry/storage-kek"),
        description="Where the key-ring Secret is mounted when source is `mounted`.",
    )
    wrap_limit: int = Field(
        default=DEFAULT_WRAP_LIMIT,
        ge=1,
        le=2**32,
        description="Data keys one KEK version may wrap before writes fail asking for a "
        "rotation, count (default 2**31: half the 2**32 random-nonce bound of AES-GCM).",
    )


class StorageSettings(BaseModel):
    """The object store of one service: backend, chunking and keys."""

    backend: Literal["local", "s3"] = Field(
        default="local",
        description="`local` (a directory; single machines) or `s3` (S3/MinIO; clusters). "
        "Default local.",
    )
    path: Path | None = Field(
        default=None, description="Root directory of the local backend; default <data_dir>/objects."
    )
    s3: S3Settings = Field(default_factory=S3Settings, description="The S3 backend.")
    chunk_size: int = Field(
        default=MAX_CHUNK_SIZE,
        description="Plaintext bytes per encrypted chunk, 64 KiB to 1 MiB (default 1 MiB: "
        "fastest; smaller chunks make small ranged reads cheaper).",
    )
    keys: KeySettings = Field(default_factory=KeySettings, description="The key ring.")

    @field_validator("chunk_size")
    @classmethod
    def _chunk_size_in_range(cls, value: int) -> int:
        if not MIN_CHUNK_SIZE <= value <= MAX_CHUNK_SIZE:
            raise ValueError(
                f"chunk_size must be between {MIN_CHUNK_SIZE} (64 KiB) and {MAX_CHUNK_SIZE} "
                f"(1 MiB) bytes, got {value}"
            )
        return value


def open_key_source(settings: KeySettings, *, data_dir: Path) -> KeySource:
    """The KeySource the settings describe."""
    if settings.source == "kubernetes":
        namespace = settings.namespace
        if namespace is None:
            namespace = (
                SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
                if SERVICE_ACCOUNT_NAMESPACE.is_file()
                else "default"
            )
        return KubernetesSecretKeys(namespace, settings.secret_name)
    if settings.source == "mounted":
        return MountedSecretKeys(settings.mounted_dir)
    return LocalKeyFile(settings.file or Path(data_dir) / "keys" / "storage-kek.json")


def open_backend(settings: StorageSettings, *, data_dir: Path) -> Backend:
    """The Backend the settings describe (S3: connects, and creates the bucket if allowed)."""
    if settings.backend == "s3":
        s3 = settings.s3
        return S3Backend(
            s3.endpoint,
            bucket=s3.bucket,
            access_key=s3.access_key or None,
            secret_key=s3.secret_key.get_secret_value() or None,
            secure=s3.secure,
            region=s3.region,
            create_bucket=s3.create_bucket,
            part_size=s3.part_size,
            parallel_uploads=s3.parallel_uploads,
        )
    return LocalBackend(settings.path or Path(data_dir) / "objects")


def open_store(settings: StorageSettings, *, data_dir: Path) -> ObjectStore:
    """An ObjectStore built from ``settings``; relative defaults live under ``data_dir``."""
    keys = KeyManager(
        open_key_source(settings.keys, data_dir=data_dir), wrap_limit=settings.keys.wrap_limit
    )
    return ObjectStore(
        open_backend(settings, data_dir=data_dir), keys, chunk_size=settings.chunk_size
    )


__all__ = [
    "KeySettings",
    "S3Settings",
    "StorageSettings",
    "open_backend",
    "open_key_source",
    "open_store",
]
