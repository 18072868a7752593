"""The key ring: versioned key-encryption keys (KEKs), and where a ring is kept (KeySource).

A ring is a small immutable value, :class:`KeyRingState`. Exactly one version is ``active``
(it wraps new data keys); older ones are ``decrypt-only`` (they still unwrap) or ``retired``
(their key material is gone, so anything still wrapped by them is unreadable). Each version
also carries ``wraps``: an upper bound of how many data keys it has wrapped.

A :class:`KeySource` loads and saves the ring. Saves are optimistic: ``state.revision`` is the
token the source returned when the state was loaded, and ``save`` refuses with
:class:`~gantry.storage.errors.KeyRingChanged` when the stored ring has moved on since. An
external KMS fits the same protocol: such a source keeps the ring document encrypted under a
KMS master key, calling the KMS to decrypt in ``load`` and to encrypt in ``save``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from gantry.core import ConfigError

KeyState = Literal["active", "decrypt-only", "retired"]
KEK_LEN = 32
DOCUMENT_FORMAT = "gantry-storage-keyring/1"


@dataclass(frozen=True)
class KeyVersionInfo:
    """What :meth:`KeyManager.versions` reports about one KEK version (never the key)."""

    version: int
    state: KeyState
    created_ms: int
    wraps: int


@dataclass(frozen=True)
class KeyRecord:
    """One KEK version. ``key`` is ``None`` exactly when the version is retired."""

    version: int
    state: KeyState
    created_ms: int
    wraps: int = 0
    key: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class KeyRingState:
    """An immutable key ring; every change returns a new state. Invalid rings cannot exist."""

    records: tuple[KeyRecord, ...]
    revision: str | None = None

    def __post_init__(self) -> None:
        versions = [r.version for r in self.records]
        if not versions or versions != sorted(set(versions)) or versions[0] < 1:
            raise ValueError("versions must be unique, ascending and start at 1 or above")
        if sum(r.state == "active" for r in self.records) != 1:
            raise ValueError("exactly one version must be active")
        for r in self.records:
            if r.state not in ("active", "decrypt-only", "retired"):
                raise ValueError(f"version {r.version} has unknown state {r.state!r}")
            if (r.state == "retired") != (r.key is None):
                raise ValueError(f"version {r.version}: only retired versions lack key material")
            if r.key is not None and len(r.key) != KEK_LEN:
                raise ValueError(f"version {r.version}: a KEK is {KEK_LEN} bytes")
            if r.wraps < 0:
                raise ValueError(f"version {r.version}: negative wrap count")

    @property
    def active(self) -> KeyRecord:
        """The version that wraps new data keys."""
        return next(r for r in self.records if r.state == "active")

    def get(self, version: int) -> KeyRecord | None:
        """The record of ``version``, or ``None`` if the ring never had it."""
        return next((r for r in self.records if r.version == version), None)

    @classmethod
    def new(cls, key: bytes, created_ms: int) -> KeyRingState:
        """A fresh ring holding one active version, 1."""
        return cls((KeyRecord(1, "active", created_ms, 0, key),))

    def rotated(self, key: bytes, created_ms: int) -> KeyRingState:
        """This ring with a new active version; the old active one becomes decrypt-only."""
        demoted = tuple(
            replace(r, state="decrypt-only") if r.state == "active" else r for r in self.records
        )
        version = self.records[-1].version + 1
        return replace(self, records=(*demoted, KeyRecord(version, "active", created_ms, 0, key)))

    def retired(self, version: int) -> KeyRingState:
        """This ring with ``version`` retired and its key material dropped."""
        return self._with(version, state="retired", key=None)

    def with_wraps(self, version: int, wraps: int) -> KeyRingState:
        """This ring with ``version``'s wrap count set to ``wraps``."""
        return self._with(version, wraps=wraps)

    def _with(self, version: int, **changes: Any) -> KeyRingState:
        records = tuple(replace(r, **changes) if r.version == version else r for r in self.records)
        return replace(self, records=records)

    def to_document(self, *, include_keys: bool = True) -> dict[str, Any]:
        """The ring as a JSON-able document (keys base64), as key files and Secrets hold it."""
        keys = []
        for r in self.records:
            entry: dict[str, Any] = {
                "version": r.version,
                "state": r.state,
                "created_ms": r.created_ms,
                "wraps": r.wraps,
            }
            if include_keys and r.key is not None:
                entry["key"] = base64.b64encode(r.key).decode()
            keys.append(entry)
        return {"format": DOCUMENT_FORMAT, "keys": keys}

    @classmethod
    def from_document(
        cls,
        doc: Any,
        *,
        where: str,
        keys: Mapping[int, bytes] | None = None,
        revision: str | None = None,
    ) -> KeyRingState:
        """Parse :meth:`to_document` output; ``keys`` supplies key material kept elsewhere.

        Raises :class:`~gantry.core.ConfigError` naming ``where`` when the document is bad.
        """
        try:
            if not isinstance(doc, dict) or doc.get("format") != DOCUMENT_FORMAT:
                raise ValueError(f"format is not {DOCUMENT_FORMAT!r}")
            records = []
            for entry in doc["keys"]:
                version = int(entry["version"])
                raw = entry.get("key")
                key = base64.b64decode(raw, validate=True) if raw else None
                if keys is not None and key is None:
                    key = keys.get(version)
                state = entry["state"]
                if state == "retired":
                    key = None
                elif key is None:
                    raise ValueError(f"version {version} is {state} but its key is missing")
                records.append(
                    KeyRecord(version, state, int(entry["created_ms"]), int(entry["wraps"]), key)
                )
            return cls(tuple(records), revision)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"the key ring in {where} is malformed: {exc}",
                hint="restore it from a backup; never edit a key ring by hand",
            ) from None


class KeySource(Protocol):
    """Where a key ring is kept. Implementations: LocalKeyFile, KubernetesSecretKeys, ...

    ``load`` returns ``None`` when no ring exists yet. ``save`` stores ``state`` only if the
    stored ring still has ``state.revision`` (``None`` = must not exist yet), else raises
    :class:`~gantry.storage.errors.KeyRingChanged`; it returns the state with its new revision.
    A ``read_only`` source (a mounted Secret) never has ``save`` called.
    """

    read_only: bool

    def describe(self) -> str:
        """Where the ring lives, for messages (e.g. ``key file /x/keys.json``)."""
        ...

    def load(self) -> KeyRingState | None:
        """The stored ring with its revision, or ``None`` if there is none yet."""
        ...

    def save(self, state: KeyRingState) -> KeyRingState:
        """Store ``state`` if nobody changed the ring since it was loaded; return it stored."""
        ...


__all__ = [
    "DOCUMENT_FORMAT",
    "KEK_LEN",
    "KeyRecord",
    "KeyRingState",
    "KeySource",
    "KeyState",
    "KeyVersionInfo",
]
