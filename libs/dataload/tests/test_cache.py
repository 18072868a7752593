"""CachedShardSource: each shard fetched once per node, keyed by scope, encrypted on disk."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from gantry.core import InvalidInput
from gantry.dataload import CachedShardSource, GovernedDataset, LocalShardSource


def epoch_ids(ds: GovernedDataset, epoch: int) -> list[int]:
    ds.set_epoch(epoch)
    return sorted(int(i) for b in ds for i in b["id"].tolist())


def test_second_epoch_is_served_from_the_cache(counting: Any, memory_cache: Any) -> None:
    ds = GovernedDataset(
        CachedShardSource(counting, memory_cache, "test"), 16, world_size=1, rank=0
    )
    first = epoch_ids(ds, 0)
    assert set(counting.fetches.values()) == {1}
    assert epoch_ids(ds, 1) == first
    assert set(counting.fetches.values()) == {1}
    assert memory_cache.hits == len(counting.fetches)


def test_keys_name_namespace_scope_and_shard(counting: Any, memory_cache: Any) -> None:
    cached = CachedShardSource(counting, memory_cache, "team-a")
    shard = counting.list_shards()[0].id
    cached.fetch(shard)
    assert list(memory_cache.entries) == [f"dataload/team-a/{counting.cache_scope()}/{shard}"]


def test_namespace_must_be_a_single_segment(counting: Any, memory_cache: Any) -> None:
    with pytest.raises(InvalidInput, match="namespace"):
        CachedShardSource(counting, memory_cache, "a/b")


def _node_cache_class() -> Any:
    storage = pytest.importorskip("gantry.storage")
    node_cache = getattr(storage, "NodeCache", None)
    if node_cache is None:
        pytest.skip("gantry.storage.NodeCache is not available in this checkout")
    return node_cache


@pytest.mark.parametrize("num_workers", [0, 2])
def test_node_cache_serves_epochs_and_holds_no_plaintext(
    tmp_path: Path, arrow_files: list[Path], counting: Any, num_workers: int
) -> None:
    node_cache = _node_cache_class()(tmp_path / "cache", 64 << 20)
    source = CachedShardSource(counting, node_cache, "test")
    ds = GovernedDataset(source, 16, world_size=1, rank=0)
    if num_workers:
        from gantry.dataload import loader

        dl = loader(ds, num_workers=num_workers)
        first = sorted(int(i) for b in dl for i in b["id"].tolist())
        ds.set_epoch(1)
        assert sorted(int(i) for b in dl for i in b["id"].tolist()) == first
    else:
        first = epoch_ids(ds, 0)
        assert epoch_ids(ds, 1) == first
        assert set(counting.fetches.values()) == {1}
    stats = node_cache.stats()
    assert stats.entries == len(arrow_files)
    stored = [p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert stored
    assert not any(b"user-1" in data for data in stored)
    plain = LocalShardSource(arrow_files).fetch(str(arrow_files[0]))
    assert not any(plain[-4096:] in data for data in stored)


def test_a_pickled_node_cache_source_reopens_the_cache(tmp_path: Path, counting: Any) -> None:
    node_cache = _node_cache_class()(tmp_path / "cache", 64 << 20)
    source = CachedShardSource(counting, node_cache, "test")
    shard = counting.list_shards()[0].id
    first = source.fetch(shard)
    copy = pickle.loads(pickle.dumps(source))
    assert copy.fetch(shard) == first
    assert copy.cache is not node_cache
    assert copy.inner.fetches[shard] == 1  # served from the reopened cache, not fetched again
