"""Where shards come from: the protocol, plain files on disk, and the node cache in front.

A shard is one unit of work for a reader: a contiguous block of a dataset version's rows, as
one Arrow IPC payload already in the job's view. Shards are content-addressed by the
governance service, so a shard id never changes meaning and cached bytes never go stale.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.parquet as pq

from gantry.core import IntegrityError, InvalidInput
from gantry.dataload._process import process_lock
from gantry.storage import NodeCache

_ARROW_FILE_MAGIC = b"ARROW1"
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".feather")


@dataclass(frozen=True)
class ShardRef:
    """One shard of a dataset version: its id, row count and size in bytes (as stored)."""

    id: str
    rows: int
    bytes: int


@runtime_checkable
class ShardSource(Protocol):
    """Anything that lists a dataset's shards and returns one shard's Arrow IPC bytes.

    Implementations must be picklable: DataLoader workers receive a copy.
    """

    def list_shards(self) -> list[ShardRef]:
        """Every shard, in a deterministic order (the same on every rank)."""
        ...

    def fetch(self, shard_id: str) -> bytes:
        """The shard's rows in the view, as one Arrow IPC stream (or file)."""
        ...


@runtime_checkable
class ScopedSource(Protocol):
    """A source that can say which data its shard ids refer to, for cache keys."""

    def cache_scope(self) -> str:
        """A string naming the dataset, version and view (and nothing secret)."""
        ...


@runtime_checkable
class DescribedSource(Protocol):
    """A source that knows the view's column names before any shard is read."""

    def column_names(self) -> list[str] | None:
        """The columns of the view, or None when not known yet."""
        ...


class ShardCache(Protocol):
    """What :class:`CachedShardSource` needs of a cache; :class:`gantry.storage.NodeCache` fits."""

    def get(self, key: str) -> bytes | None:
        """The cached bytes, or None."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``."""
        ...

    def get_or_fill(self, key: str, fill: Callable[[], bytes]) -> bytes:
        """The cached bytes, calling ``fill`` once (across processes) on a miss."""
        ...


def decode_shard(data: bytes | pa.Buffer) -> pa.Table:
    """The table in an Arrow IPC stream or file, without copying the column data."""
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    try:
        if buffer.size >= 6 and buffer[:6].to_pybytes() == _ARROW_FILE_MAGIC:
            return pa.ipc.open_file(buffer).read_all()
        return pa.ipc.open_stream(buffer).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise IntegrityError(f"a shard is not a readable Arrow IPC payload: {exc}") from None


def encode_shard(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream (the form the governance service sends)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


class LocalShardSource:
    """Shards from Arrow IPC or Parquet files on disk: one file is one shard.

    ``paths`` are files or directories (a directory contributes its ``*.parquet``, ``*.arrow``,
    ``*.arrows``, ``*.ipc`` and ``*.feather`` files, sorted by name). A shard's id is its path.
    No governance applies: use it for tests and for data that needs none.
    """

    def __init__(self, paths: Sequence[str | Path]) -> None:
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                files.extend(
                    sorted(
                        p for p in path.iterdir() if p.suffix in _PARQUET_SUFFIXES + _ARROW_SUFFIXES
                    )
                )
            elif path.is_file():
                files.append(path)
            else:
                raise InvalidInput(f"no such shard file or directory: {path}")
        if not files:
            raise InvalidInput(
                "no shard files given",
                hint="pass Parquet or Arrow IPC files, or directories of them",
            )
        self._files = {str(p): p for p in files}
        if len(self._files) != len(files):
            raise InvalidInput("the same shard file is listed twice")

    def list_shards(self) -> list[ShardRef]:
        """One shard per file, rows read from the file's metadata."""
        return [
            ShardRef(key, _row_count(path), path.stat().st_size)
            for key, path in self._files.items()
        ]

    def fetch(self, shard_id: str) -> bytes:
        """The file's bytes (Arrow) or its rows re-encoded as an Arrow IPC stream (Parquet)."""
        path = self._files.get(shard_id)
        if path is None:
            raise InvalidInput(f"unknown shard {shard_id!r}")
        if path.suffix in _PARQUET_SUFFIXES:
            return encode_shard(pq.read_table(path))
        return path.read_bytes()

    def column_names(self) -> list[str] | None:
        """The first file's columns."""
        first = next(iter(self._files.values()))
        if first.suffix in _PARQUET_SUFFIXES:
            return list(pq.read_schema(first).names)
        return list(decode_shard(pa.memory_map(str(first)).read_buffer()).schema.names)

    def cache_scope(self) -> str:
        """``local/`` and a digest of the file paths."""
        digest = hashlib.sha256("\n".join(self._files).encode()).hexdigest()[:16]
        return f"local/{digest}"

    def __repr__(self) -> str:
        return f"LocalShardSource({len(self._files)} files)"


def _row_count(path: Path) -> int:
    if path.suffix in _PARQUET_SUFFIXES:
        return int(pq.ParquetFile(path).metadata.num_rows)
    with pa.memory_map(str(path)) as source:
        return int(decode_shard(source.read_buffer()).num_rows)


class _NodeCacheAddress(NamedTuple):
    """How to reopen a NodeCache in another process (its instances hold file locks that must
    not cross a fork, and do not pickle)."""

    path: Path
    max_bytes: int


class CachedShardSource:
    """``inner`` with a node cache in front: each shard is fetched once per node.

    The cache key is ``dataload/<namespace>/<scope>/<shard id>`` where the scope (from the
    inner source) names the dataset, the resolved version and the view, so a shard cached for
    one view is never served for another; an inner source without a scope gets ``unscoped``,
    and then ``namespace`` alone must tell datasets apart. Shard ids are content hashes, so
    entries never go stale; eviction is the cache's business. The shard list always comes from
    ``inner``, so the governance service still checks the job's grant before a cached shard
    is used. A :class:`~gantry.storage.NodeCache` is reopened at the same path in each process
    (DataLoader workers); other caches are used as they are.
    """

    def __init__(self, inner: ShardSource, cache: ShardCache, namespace: str = "gantry") -> None:
        if not namespace or "/" in namespace:
            raise InvalidInput(
                f"invalid cache namespace {namespace!r}", hint="use a non-empty name without '/'"
            )
        self.inner = inner
        self.namespace = namespace
        self._cache: ShardCache | _NodeCacheAddress = cache
        self._pid = os.getpid()

    @property
    def cache(self) -> ShardCache:
        """The cache, opened in this process."""
        with process_lock():
            cache = self._cache
            if isinstance(cache, _NodeCacheAddress) or (
                isinstance(cache, NodeCache) and self._pid != os.getpid()
            ):
                cache = self._cache = NodeCache(cache.path, cache.max_bytes)
                self._pid = os.getpid()
            return cache

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if isinstance(self._cache, NodeCache):
            state["_cache"] = _NodeCacheAddress(self._cache.path, self._cache.max_bytes)
        return state

    def list_shards(self) -> list[ShardRef]:
        """The inner source's shards (never cached: listing is where the grant is checked)."""
        return self.inner.list_shards()

    def fetch(self, shard_id: str) -> bytes:
        """The cached bytes, or the inner source's, stored for next time."""
        return self.cache.get_or_fill(self.key(shard_id), lambda: self.inner.fetch(shard_id))

    def key(self, shard_id: str) -> str:
        """The cache key of ``shard_id``."""
        return f"dataload/{self.namespace}/{self.cache_scope()}/{shard_id}"

    def cache_scope(self) -> str:
        """The inner source's scope, or ``unscoped`` when it has none."""
        if isinstance(self.inner, ScopedSource):
            return self.inner.cache_scope()
        return "unscoped"

    def column_names(self) -> list[str] | None:
        """The inner source's columns, when it knows them."""
        if isinstance(self.inner, DescribedSource):
            return self.inner.column_names()
        return None

    def __repr__(self) -> str:
        return f"CachedShardSource({self.inner!r}, namespace={self.namespace!r})"


__all__ = [
    "CachedShardSource",
    "DescribedSource",
    "LocalShardSource",
    "ScopedSource",
    "ShardCache",
    "ShardRef",
    "ShardSource",
    "decode_shard",
    "encode_shard",
]
