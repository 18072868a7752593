"""The public surface of gantry.storage is pinned: other packages code against exactly this."""

from __future__ import annotations

import gantry.storage

PUBLIC = [
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


def test_the_public_names_are_exactly_these() -> None:
    assert sorted(gantry.storage.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(gantry.storage, name) is not None


def test_every_error_is_a_storage_error_and_a_core_error() -> None:
    from gantry.core import GantryError, IntegrityError, InvalidInput, NotFound

    errors = [getattr(gantry.storage, n) for n in PUBLIC if n.endswith(("Error", "Unavailable"))]
    errors += [gantry.storage.TamperedObject, gantry.storage.ObjectNotFound]
    for cls in errors:
        assert issubclass(cls, gantry.storage.StorageError) and issubclass(cls, GantryError)
    assert issubclass(gantry.storage.TamperedObject, IntegrityError)
    assert issubclass(gantry.storage.ObjectNotFound, NotFound)
    assert issubclass(gantry.storage.InvalidObjectName, InvalidInput)


def test_every_public_item_says_what_it_promises() -> None:
    for name in PUBLIC:
        assert (getattr(gantry.storage, name).__doc__ or "").strip(), name
