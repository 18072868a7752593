"""Version manifests: what a dataset version holds, and the digest that names it.

A manifest lists a version's shards (table shards or files) with their content digests, row
counts, sizes and the encrypted objects that hold them, plus the schema, parents, author, time
and message. Its canonical JSON (sorted keys, no spaces) is hashed with SHA-256 to give the
version id, so a version id names exactly one content and history, like a Git commit.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gantry.core import IntegrityError

MANIFEST_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard of a version: ``id`` is the SHA-256 of its plaintext bytes."""

    id: str
    rows: int
    size: int
    object: str
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        out: dict[str, Any] = {
            "id": self.id,
            "rows": self.rows,
            "bytes": self.size,
            "object": self.object,
        }
        if self.path:
            out["path"] = self.path
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardEntry:
        """From :meth:`to_json`'s output."""
        return cls(
            str(d["id"]), int(d["rows"]), int(d["bytes"]), str(d["object"]), d.get("path", "")
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything a version is; immutable once committed."""

    dataset: str
    format: str
    columns: list[dict[str, Any]]
    shards: tuple[ShardEntry, ...]
    parents: tuple[str, ...]
    message: str
    author: str
    created_ms: int
    rollback_of: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """Total rows (tables) or files (file datasets)."""
        return sum(s.rows for s in self.shards)

    @property
    def size(self) -> int:
        """Total plaintext bytes of the shards."""
        return sum(s.size for s in self.shards)

    def canonical(self) -> bytes:
        """The bytes the version id is the digest of."""
        doc = {
            "manifest_format": MANIFEST_FORMAT,
            "dataset": self.dataset,
            "format": self.format,
            "columns": self.columns,
            "shards": [s.to_json() for s in self.shards],
            "parents": list(self.parents),
            "message": self.message,
            "author": self.author,
            "created_ms": self.created_ms,
            "rollback_of": self.rollback_of,
            **({"extra": self.extra} if self.extra else {}),
        }
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)

    @property
    def version_id(self) -> str:
        """SHA-256 (hex) of :meth:`canonical`."""
        return hashlib.sha256(self.canonical()).hexdigest()

    @classmethod
    def parse(cls, data: bytes, *, expected_id: str | None = None) -> Manifest:
        """Read a stored manifest; check it still hashes to ``expected_id`` when given."""
        if expected_id is not None and hashlib.sha256(data).hexdigest() != expected_id:
            raise IntegrityError(
                f"the manifest of version {expected_id[:12]} does not match its id",
                hint="the catalog database was altered; restore it from backup",
            )
        d = orjson.loads(data)
        return cls(
            dataset=d["dataset"],
            format=d["format"],
            columns=list(d["columns"]),
            shards=tuple(ShardEntry.from_json(s) for s in d["shards"]),
            parents=tuple(d["parents"]),
            message=d["message"],
            author=d["author"],
            created_ms=int(d["created_ms"]),
            rollback_of=d.get("rollback_of", ""),
            extra=dict(d.get("extra", {})),
        )


@dataclass(frozen=True)
class ManifestDiff:
    """What changed between two versions."""

    added: tuple[ShardEntry, ...]
    removed: tuple[ShardEntry, ...]
    schema_changes: tuple[str, ...]

    @property
    def rows_added(self) -> int:
        """Rows in added shards."""
        return sum(s.rows for s in self.added)

    @property
    def rows_removed(self) -> int:
        """Rows in removed shards."""
        return sum(s.rows for s in self.removed)


def diff_manifests(old: Manifest, new: Manifest, schema_changes: Sequence[str]) -> ManifestDiff:
    """Shards (by content digest and path, counted) in ``new`` but not ``old``, and the reverse."""

    def key(s: ShardEntry) -> tuple[str, str]:
        return (s.id, s.path)

    # multisets: the same content appended twice is two shards, and a diff must say so
    old_left = Counter(key(s) for s in old.shards)
    new_left = Counter(key(s) for s in new.shards)
    added: list[ShardEntry] = []
    for s in new.shards:
        if old_left[key(s)] > 0:
            old_left[key(s)] -= 1
        else:
            added.append(s)
    removed: list[ShardEntry] = []
    for s in old.shards:
        if new_left[key(s)] > 0:
            new_left[key(s)] -= 1
        else:
            removed.append(s)
    return ManifestDiff(tuple(added), tuple(removed), tuple(schema_changes))


__all__ = ["MANIFEST_FORMAT", "Manifest", "ManifestDiff", "ShardEntry", "diff_manifests"]
