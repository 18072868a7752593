"""The errors the object store raises, each a kind of :mod:`gantry.core` error.

Every class below also derives from :class:`StorageError` (itself a ``GantryError``), so
``except StorageError`` catches all of them, while ``except gantry.core.NotFound`` (and so on)
keeps working across libraries::

    GantryError
    ├── InvalidInput
    │   └── InvalidObjectName     a name is not a relative, '/'-separated safe path
    ├── NotFound
    │   └── ObjectNotFound        no committed object (or backend blob) of that name
    ├── Conflict                  FAILED_PRECONDITION
    │   ├── KeyUnavailable        the KEK version an object needs is unknown or retired
    │   ├── KeyUsageExceeded      the active KEK reached its wrap limit: rotate
    │   ├── KeyRingChanged        a KeySource refused a save: the ring changed since load
    │   └── ReadOnlyKeySource     rotate/retire on a key ring this process cannot write
    ├── Unavailable
    │   └── BackendUnavailable    S3/MinIO or the Kubernetes API could not be reached
    └── IntegrityError            DATA_LOSS
        └── TamperedObject        a header or chunk failed authentication, or is missing
"""

from __future__ import annotations

from gantry.core import (
    Conflict,
    GantryError,
    IntegrityError,
    InvalidInput,
    NotFound,
    Unavailable,
)


class StorageError(GantryError):
    """Base of every error raised by :mod:`gantry.storage` (mixed into each class below)."""


class InvalidObjectName(InvalidInput, StorageError):
    """An object name breaks the naming rules; the store never touches the backend for it."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"invalid object name {name!r}: {reason}",
            hint="use a relative path of '/'-separated segments made of A-Z a-z 0-9 . _ = - "
            "(no '..', no empty segment, no leading '_' in the first segment, at most 1024 chars)",
        )


class ObjectNotFound(NotFound, StorageError):
    """No committed object (or, from a backend, no blob) with this name exists."""

    def __init__(self, name: str, *, hint: str | None = None) -> None:
        super().__init__("object", name, hint=hint or "check the name with ObjectStore.list()")


class TamperedObject(IntegrityError, StorageError):
    """Stored bytes failed verification. No plaintext from the damaged chunk onward is returned.

    ``chunk`` is the index of the first chunk that failed, or ``None`` when the header did.
    """

    def __init__(self, name: str, chunk: int | None, reason: str) -> None:
        self.name = name
        self.chunk = chunk
        self.reason = reason
        where = "its header" if chunk is None else f"chunk {chunk}"
        super().__init__(
            f"object {name!r} failed verification at {where}: {reason}",
            hint="the stored data was altered or damaged; nothing past the last good chunk was "
            "returned — restore the object from its source or a backup, or delete it",
        )


class KeyUnavailable(Conflict, StorageError):
    """The key-encryption key (KEK) version an object is wrapped by cannot be used.

    ``reason`` is ``"retired"`` (the key was destroyed on purpose) or ``"unknown"`` (the ring
    has no such version: it is older than the object, or the header names a bogus version).
    """

    def __init__(
        self, version: int, reason: str, *, name: str | None = None, source: str = "the key ring"
    ) -> None:
        self.version = version
        self.reason = reason
        self.name = name
        self.source = source
        subject = f"object {name!r} is" if name is not None else "the data key is"
        if reason == "retired":
            message = f"{subject} wrapped by KEK version {version}, which was retired"
            hint = (
                f"restore the key ring ({source}) from backup, or re-wrap (ObjectStore.rewrap) "
                "before retiring a version"
            )
        else:
            message = f"{subject} wrapped by KEK version {version}, which {source} does not have"
            hint = (
                "restore the key ring from a backup at least as new as the object; if the ring "
                "was never restored, the object's header is damaged"
            )
        super().__init__(message, hint=hint)


class KeyUsageExceeded(Conflict, StorageError):
    """The active KEK has wrapped ``limit`` data keys; using it again would weaken it."""

    def __init__(self, version: int, limit: int) -> None:
        self.version = version
        self.limit = limit
        super().__init__(
            f"KEK version {version} reached its wrap limit of {limit} data keys",
            hint="rotate the key ring (KeyManager.rotate) to get a fresh active KEK",
        )


class KeyRingChanged(Conflict, StorageError):
    """A :class:`KeySource` refused a save because the stored ring changed since it was loaded.

    :class:`KeyManager` catches it, reloads and re-applies its change; other callers should do
    the same.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(
            f"{source} changed since it was loaded",
            hint="reload the key ring and apply the change again",
        )


class ReadOnlyKeySource(Conflict, StorageError):
    """The key ring can be read here but not written (e.g. a mounted Kubernetes Secret)."""

    def __init__(self, source: str, action: str) -> None:
        self.source = source
        self.action = action
        super().__init__(
            f"cannot {action}: {source} is read-only",
            hint="run the change where the ring is writable (a KubernetesSecretKeys or "
            "LocalKeyFile source); readers pick it up when the mounted Secret updates",
        )


class BackendUnavailable(Unavailable, StorageError):
    """The blob backend (or the Kubernetes API holding the key ring) could not be reached."""

    def __init__(self, what: str, cause: str) -> None:
        self.what = what
        self.cause = cause
        super().__init__(
            f"{what} is unavailable: {cause}",
            hint="check that the endpoint is up and reachable from here, then retry",
        )


__all__ = [
    "BackendUnavailable",
    "InvalidObjectName",
    "KeyRingChanged",
    "KeyUnavailable",
    "KeyUsageExceeded",
    "ObjectNotFound",
    "ReadOnlyKeySource",
    "StorageError",
    "TamperedObject",
]
