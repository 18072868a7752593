"""Shared fixtures: small datasets on disk whose rows are easy to tell apart."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gantry.dataload import LocalShardSource, ShardRef, encode_shard

#: Rows per shard: uneven on purpose, so ranks and workers get different amounts.
SHARD_ROWS = [37, 50, 23, 61, 44, 50, 18, 29, 55, 40, 33, 47]


def shard_table(index: int, rows: int) -> pa.Table:
    """Shard ``index``: ids ``index*1000 + k``, a float feature, a label and a name."""
    ids = np.arange(index * 1000, index * 1000 + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x": (ids * 0.5).astype(np.float32),
            "y": (ids % 3).astype(np.int64),
            "name": [f"user-{i}" for i in ids],
        }
    )


@pytest.fixture
def expected_ids() -> list[int]:
    """Every id of the dataset the fixtures write."""
    return [i * 1000 + k for i, n in enumerate(SHARD_ROWS) for k in range(n)]


@pytest.fixture
def make_shard() -> Callable[[int, int], pa.Table]:
    """``shard_table``, for tests that build their own shards."""
    return shard_table


@pytest.fixture
def arrow_files(tmp_path: Path) -> list[Path]:
    """The dataset as one Arrow IPC stream file per shard."""
    paths = []
    for i, rows in enumerate(SHARD_ROWS):
        path = tmp_path / f"shard-{i:02d}.arrows"
        path.write_bytes(encode_shard(shard_table(i, rows)))
        paths.append(path)
    return paths


@pytest.fixture
def parquet_files(tmp_path: Path) -> list[Path]:
    """The dataset as one Parquet file per shard, in row groups of 16 rows."""
    paths = []
    for i, rows in enumerate(SHARD_ROWS):
        path = tmp_path / f"shard-{i:02d}.parquet"
        pq.write_table(shard_table(i, rows), path, row_group_size=16)
        paths.append(path)
    return paths


class CountingSource:
    """A source that counts fetches per shard (thread-safe: the loader fetches in threads)."""

    def __init__(self, inner: LocalShardSource) -> None:
        self.inner = inner
        self.fetches: Counter[str] = Counter()
        self._lock = threading.Lock()

    def list_shards(self) -> list[ShardRef]:
        return self.inner.list_shards()

    def fetch(self, shard_id: str) -> bytes:
        with self._lock:
            self.fetches[shard_id] += 1
        return self.inner.fetch(shard_id)

    def cache_scope(self) -> str:
        return self.inner.cache_scope()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class MemoryCache:
    """An in-memory stand-in for NodeCache with the same methods."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self.entries.get(key)

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.entries[key] = data

    def get_or_fill(self, key: str, fill: Callable[[], bytes]) -> bytes:
        with self._lock:
            if key in self.entries:
                self.hits += 1
                return self.entries[key]
            self.misses += 1
        data = fill()
        self.put(key, data)
        return data


@pytest.fixture
def counting(arrow_files: list[Path]) -> CountingSource:
    """The Arrow dataset behind a fetch counter."""
    return CountingSource(LocalShardSource(arrow_files))


@pytest.fixture
def memory_cache() -> MemoryCache:
    """An empty in-memory cache."""
    return MemoryCache()
