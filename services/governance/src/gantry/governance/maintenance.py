"""Maintenance (domain): garbage collection and key rotation.

Garbage collection removes stored content nothing can reach: shards of uploads that were
aborted, never finished, or never committed within ``upload_ttl_s``. It never removes content
that any version (every version is kept forever), a registered model, or a live upload still
references; it lists objects before reading what is live, and uploads record a shard before
writing it, so a shard being written is never mistaken for garbage. The subject index forgets
the shards that nothing holds any more.

Key rotation makes a new key-encryption key active and re-wraps every object's data key under
it (headers only; no data is re-encrypted); optionally the older key versions are retired.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import sqlalchemy as sa

from gantry.core import get_logger
from gantry.events.catalog import GarbageCollected, KeysRotated
from gantry.governance import store as db
from gantry.governance.catalog import now_ms
from gantry.governance.changes import record
from gantry.governance.manifest import Manifest
from gantry.governance.registry import Registry
from gantry.governance.subjects import prune_index
from gantry.storage import ObjectInfo, ObjectNotFound, ObjectStore, StorageError

_log = get_logger("gantry.governance.maintenance")

#: Unreferenced objects younger than this are kept: a model artifact is written just before
#: its registry row, and an object from an unknown writer deserves the benefit of the doubt.
GRACE_MS = 15 * 60 * 1000


@dataclass(frozen=True)
class GcReport:
    """What a garbage collection removed (or would remove, on a dry run)."""

    removed_objects: int
    removed_bytes: int
    kept_objects: int


@dataclass(frozen=True)
class RotationReport:
    """The outcome of a key rotation."""

    active_version: int
    rewrapped: int
    retired: tuple[int, ...]


class Maintenance:
    """Garbage collection and key rotation over the catalog and the object store."""

    def __init__(
        self,
        engine: sa.Engine,
        objects: ObjectStore,
        registry: Registry,
        *,
        upload_ttl_s: int,
        lock: threading.RLock,
    ) -> None:
        self.engine = engine
        self.objects = objects
        self.registry = registry
        self.upload_ttl_s = upload_ttl_s
        self.lock = lock

    def live_objects(self) -> set[str]:
        """Every object name something still references."""
        live: set[str] = set(self.registry.referenced_objects())
        cutoff = now_ms() - self.upload_ttl_s * 1000
        with self.engine.connect() as conn:
            for (manifest,) in conn.execute(sa.select(db.versions.c.manifest)).all():
                live.update(s.object for s in Manifest.parse(manifest).shards)
            rows = conn.execute(
                sa.select(db.upload_shards.c.object_name)
                .join(db.uploads, db.uploads.c.id == db.upload_shards.c.upload_id)
                .where(
                    db.uploads.c.state.in_(["open", "complete"]),
                    db.uploads.c.active_ms >= cutoff,
                )
            ).all()
            live.update(str(r.object_name) for r in rows)
            for (name,) in conn.execute(sa.select(db.datasets.c.name)).all():
                live.add(f"datasets/{name}/secrets")
        return live

    def _listing(self) -> tuple[list[ObjectInfo], int]:
        """Every dataset and model object; ones whose header cannot be read are kept aside.

        An object wrapped by a retired key, or with a damaged header, is never collected
        automatically (it is counted as kept and logged) and does not stop the collection.
        """
        found: list[ObjectInfo] = []
        unreadable = 0
        for prefix in ("datasets/", "models/"):
            for name in self.objects.names(prefix):
                try:
                    found.append(self.objects.stat(name))
                except ObjectNotFound:
                    continue
                except StorageError as exc:
                    unreadable += 1
                    _log.warning(
                        "object kept: its header cannot be read", object=name, error=str(exc)
                    )
        return found, unreadable

    def dead_upload_objects(self) -> set[str]:
        """Objects of uploads that were aborted or expired unfinished (removable at once)."""
        cutoff = now_ms() - self.upload_ttl_s * 1000
        u = db.uploads.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(db.upload_shards.c.object_name)
                .join(db.uploads, u.id == db.upload_shards.c.upload_id)
                .where(
                    sa.or_(
                        u.state == "aborted",
                        sa.and_(u.state.in_(["open", "complete"]), u.active_ms < cutoff),
                    )
                )
            ).all()
        return {str(r.object_name) for r in rows}

    def collect_garbage(self, *, actor: str, dry_run: bool = False) -> GcReport:
        """Remove unreachable dataset and model content; report what went."""
        with self.lock:
            # List first, then read what is live: an upload records its shard in the database
            # before writing the object, so anything listed here is either in the live set
            # read afterwards or truly unreferenced.
            listed, unreadable = self._listing()
            live = self.live_objects()
            dead = self.dead_upload_objects()
            young = now_ms() - GRACE_MS
            removed = removed_bytes = 0
            kept = unreadable
            for info in listed:
                if info.name in live or (info.name not in dead and info.created_ms > young):
                    kept += 1
                    continue
                removed += 1
                removed_bytes += info.size
                if not dry_run:
                    self.objects.delete(info.name)
            if not dry_run:
                self.objects.sweep_incomplete(older_than_s=float(self.upload_ttl_s))
                cutoff = now_ms() - self.upload_ttl_s * 1000
                with self.engine.begin() as conn:
                    conn.execute(
                        db.uploads.update()
                        .where(
                            db.uploads.c.state.in_(["open", "complete"]),
                            db.uploads.c.active_ms < cutoff,
                        )
                        .values(state="aborted")
                    )
                    prune_index(conn, live_since_ms=cutoff)
                    record(
                        conn,
                        "gantry.data.gc.completed",
                        GarbageCollected(
                            removed_objects=removed, removed_bytes=removed_bytes, kept_objects=kept
                        ),
                        actor=actor,
                        subject="store/objects",
                    )
        return GcReport(removed, removed_bytes, kept)

    def rotate_keys(self, *, actor: str, retire_previous: bool = False) -> RotationReport:
        """Activate a new key-encryption key, re-wrap every data key, optionally retire old keys."""
        with self.lock:
            keys = self.objects.keys
            active = keys.rotate()
            rewrapped = self.objects.rewrap()
            retired: list[int] = []
            if retire_previous:
                for info in keys.versions():
                    if info.version != active and info.state != "retired":
                        keys.retire(info.version)
                        retired.append(info.version)
            with self.engine.begin() as conn:
                record(
                    conn,
                    "gantry.data.keys.rotated",
                    KeysRotated(active_version=active, rewrapped=rewrapped, retired=retired),
                    actor=actor,
                    subject="key/storage-kek",
                )
        return RotationReport(active, rewrapped, tuple(retired))


__all__ = ["GcReport", "Maintenance", "RotationReport"]
