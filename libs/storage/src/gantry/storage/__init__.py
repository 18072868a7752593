"""gantry.storage: the encrypted object store every Gantry service keeps its blobs in.

Objects are chunked and sealed with AES-256-GCM under a fresh data key each; data keys are
wrapped by versioned key-encryption keys from a key ring (a local file or a Kubernetes
Secret); blobs live in a local directory or an S3/MinIO bucket. ``docs/storage-format.md``
describes the format, the keys and the settings.

Typical service wiring::

    store = open_store(settings.storage, data_dir=settings.data_dir)
    store.put("runs/42/metrics.json", payload, metadata={"content-type": "application/json"})
    with store.writer("models/llama/shard-00001") as w:
        for block in source:
            w.write(block)
    data = store.read_range("models/llama/shard-00001", offset=4096, length=65536)
"""

from gantry.storage.backends import Backend, LocalBackend, MemoryBackend
from gantry.storage.cache import CacheStats, NodeCache
from gantry.storage.errors import (
    BackendUnavailable,
    InvalidObjectName,
    KeyRingChanged,
    KeyUnavailable,
    KeyUsageExceeded,
    ObjectNotFound,
    ReadOnlyKeySource,
    StorageError,
    TamperedObject,
)
from gantry.storage.key_file import LocalKeyFile
from gantry.storage.key_manager import KeyManager
from gantry.storage.keyring import KeyRecord, KeyRingState, KeySource, KeyVersionInfo
from gantry.storage.kubernetes_keys import KubernetesSecretKeys, MountedSecretKeys
from gantry.storage.s3 import S3Backend
from gantry.storage.settings import KeySettings, S3Settings, StorageSettings, open_store
from gantry.storage.store import ObjectStore
from gantry.storage.streams import ObjectInfo, ObjectReader, ObjectWriter

__all__ = [
    "Backend",
    "BackendUnavailable",
    "CacheStats",
    "InvalidObjectName",
    "KeyManager",
    "KeyRecord",
    "KeyRingChanged",
    "KeyRingState",
    "KeySettings",
    "KeySource",
    "KeyUnavailable",
    "KeyUsageExceeded",
    "KeyVersionInfo",
    "KubernetesSecretKeys",
    "LocalBackend",
    "LocalKeyFile",
    "MemoryBackend",
    "MountedSecretKeys",
    "NodeCache",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectReader",
    "ObjectStore",
    "ObjectWriter",
    "ReadOnlyKeySource",
    "S3Backend",
    "S3Settings",
    "StorageError",
    "StorageSettings",
    "TamperedObject",
    "open_store",
]
