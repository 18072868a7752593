"""Views (domain): versioned de-identification policies, per-dataset secrets, view-applied reads.

The ``raw`` view returns rows as stored; the ``deidentified`` view applies the dataset's
current policy (:mod:`gantry.governance.deid`). A policy is data: each change is a new
numbered version, kept forever and announced as ``gantry.data.policy.changed``. The keys for
keyed hashing and tokenising are generated per dataset and kept encrypted in the object store
(so key rotation re-wraps them with everything else). Recently served view-applied shards are
kept in a bounded in-memory cache, keyed by content digest, view and policy version, so a
policy change or a new version can never serve stale rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import sqlalchemy as sa

from gantry.core import Conflict, InvalidInput
from gantry.events.catalog import ViewPolicyChanged
from gantry.governance import store as db
from gantry.governance.catalog import Catalog, DatasetRecord, columns_from_json, now_ms
from gantry.governance.changes import record
from gantry.governance.dataset_keys import DatasetKeys
from gantry.governance.deid import (
    DEFAULT_POLICY,
    ColumnRule,
    DeidKeys,
    ViewPolicy,
    apply_view,
    policy_from_json,
    policy_to_json,
    view_columns,
)
from gantry.governance.manifest import Manifest, ShardEntry
from gantry.governance.schema import Column, ColumnClass, DatasetSchema
from gantry.governance.tables import shard_to_table, table_to_ipc
from gantry.storage import ObjectStore

#: Classes of files that the de-identified view may show (opaque files cannot be transformed).
_SHAREABLE_FILES = (ColumnClass.PUBLIC, ColumnClass.INTERNAL)


@dataclass(frozen=True)
class PolicyRecord:
    """One version of a dataset's view policy (version 0: the built-in default)."""

    dataset: str
    version: int
    policy: ViewPolicy
    author: str
    created_ms: int


class _Lru:
    """A byte-bounded LRU of served shards (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, ...], tuple[bytes, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, ...]) -> tuple[bytes, int] | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: tuple[str, ...], value: tuple[bytes, int]) -> None:
        size = len(value[0])
        if size > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (old, _rows) = self._items.popitem(last=False)
                self._bytes -= len(old)


class Views:
    """Policies, dataset secrets and view-applied reads."""

    def __init__(
        self,
        catalog: Catalog,
        objects: ObjectStore,
        *,
        cache_bytes: int,
        keys: DatasetKeys | None = None,
    ) -> None:
        self.catalog = catalog
        self.engine = catalog.engine
        self.objects = objects
        self._cache = _Lru(cache_bytes)
        self._keys = keys or DatasetKeys(objects)

    # ------------------------------------------------------------------ secrets

    def keys(self, dataset: str) -> DeidKeys:
        """The dataset's de-identification keys, created on first use."""
        return self._keys.get(dataset)

    # ------------------------------------------------------------------ policies

    def policy(self, dataset: str, version: int | None = None) -> PolicyRecord:
        """The current policy (or a given version) of ``dataset``."""
        ds = self.catalog.get_dataset(dataset)
        wanted = ds.policy_version if version is None else version
        if wanted == 0:
            return PolicyRecord(dataset, 0, DEFAULT_POLICY, "gantry", ds.created_ms)
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(db.policies).where(
                    db.policies.c.dataset == dataset, db.policies.c.version == wanted
                )
            ).first()
        if row is None:
            raise InvalidInput(f"dataset {dataset!r} has no view policy version {wanted}")
        return PolicyRecord(
            dataset, row.version, policy_from_json(row.rules_json), row.author, row.created_ms
        )

    def set_policy(
        self,
        dataset: str,
        rules: list[ColumnRule],
        *,
        author: str,
        correlation_id: str | None = None,
    ) -> PolicyRecord:
        """Store ``rules`` as the dataset's next policy version (checked against its schema)."""
        ds = self.catalog.get_dataset(dataset)
        if ds.format != "table":
            raise InvalidInput(
                f"dataset {dataset!r} holds files, which a view policy cannot transform",
                hint="its de-identified view depends on the files' classification only",
            )
        policy = ViewPolicy(rules)
        policy.check(ds.schema)
        text = policy_to_json(policy)
        created = now_ms()
        with self.engine.begin() as conn:
            version = ds.policy_version + 1
            moved = conn.execute(
                db.datasets.update()
                .where(
                    db.datasets.c.name == dataset,
                    db.datasets.c.policy_version == ds.policy_version,
                )
                .values(policy_version=version)
            )
            if moved.rowcount != 1:
                raise Conflict(
                    f"the policy of {dataset!r} changed meanwhile", hint="look at it and retry"
                )
            conn.execute(
                db.policies.insert().values(
                    dataset=dataset,
                    version=version,
                    rules_json=text,
                    author=author,
                    created_ms=created,
                )
            )
            record(
                conn,
                "gantry.data.policy.changed",
                ViewPolicyChanged(
                    dataset=dataset, policy_version=version, rules=orjson.loads(text)["rules"]
                ),
                actor=author,
                subject=f"dataset/{dataset}",
                correlation_id=correlation_id,
            )
        return PolicyRecord(dataset, version, policy, author, created)

    # ------------------------------------------------------------------ reads

    def columns(self, ds: DatasetRecord, manifest: Manifest, view: str) -> list[Column]:
        """The columns a reader of ``manifest`` sees in ``view``."""
        cols = columns_from_json(manifest.columns)
        if view == "raw" or manifest.format != "table":
            return cols
        return view_columns(DatasetSchema(cols), self.policy(ds.name).policy)

    def check_files_view(self, ds: DatasetRecord, view: str) -> None:
        """Files cannot be de-identified: only files classed public/internal are shown."""
        if (
            ds.format == "files"
            and view != "raw"
            and ds.files_classification not in _SHAREABLE_FILES
        ):
            raise InvalidInput(
                f"dataset {ds.name!r} holds {ds.files_classification} files, which cannot be "
                "de-identified, so it has no de-identified view",
                hint="read it raw with a role allowed raw access (annotator, data-steward)",
            )

    def table_shard(
        self, ds: DatasetRecord, manifest: Manifest, shard: ShardEntry, view: str
    ) -> tuple[bytes, int, int]:
        """One table shard in ``view`` as an Arrow IPC stream: (bytes, rows, policy version)."""
        policy = self.policy(ds.name) if view != "raw" else None
        policy_version = policy.version if policy else 0
        key = (ds.name, shard.id, shard.object, view, str(policy_version))
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0], hit[1], policy_version
        table = shard_to_table(self.objects.get(shard.object))
        if policy is not None:
            schema = DatasetSchema(columns_from_json(manifest.columns))
            table = apply_view(
                table,
                schema,
                policy.policy,
                self.keys(ds.name),
                view=view,
                noise_seed=shard.id.encode(),
            )
        data = table_to_ipc(table)
        self._cache.put(key, (data, table.num_rows))
        return data, table.num_rows, policy_version

    def file_chunks(self, shard: ShardEntry) -> Iterator[bytes]:
        """A file's verified plaintext, chunk by chunk."""
        with self.objects.open(shard.object) as reader:
            yield from reader


__all__ = ["PolicyRecord", "Views"]
