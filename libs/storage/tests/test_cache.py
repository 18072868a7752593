"""NodeCache: LRU bound, encryption at rest, damaged entries, and one fill across processes."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gantry.storage import CacheStats, NodeCache
from gantry.storage.backends import FILE_SUFFIX


def head_files(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / "objects" / "_head").rglob("*" + FILE_SUFFIX)]


def test_get_put_and_counters(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=1_000_000)
    assert cache.get("shard/1") is None
    cache.put("shard/1", b"rows")
    assert cache.get("shard/1") == b"rows"
    assert cache.stats() == CacheStats(entries=1, bytes=4, hits=1, misses=1, evictions=0)
    calls: list[int] = []
    assert cache.get_or_fill("shard/2", lambda: calls.append(1) or b"filled") == b"filled"
    assert cache.get_or_fill("shard/2", lambda: calls.append(1) or b"again") == b"filled"
    assert calls == [1]
    reopened = NodeCache(tmp_path / "cache", max_bytes=1_000_000)  # counters are shared
    assert reopened.get("shard/2") == b"filled"
    assert reopened.stats() == CacheStats(entries=2, bytes=10, hits=3, misses=2, evictions=0)


def test_least_recently_used_entries_are_evicted_to_stay_under_the_bound(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=100_000)
    for i in range(3):
        cache.put(f"k{i}", bytes([i]) * 30_000)
    cache.put("k3", b"3" * 30_000)  # evicts k0, the oldest
    assert cache.get("k0") is None
    assert cache.get("k1") is not None  # k1 is now the most recently used...
    cache.put("k4", b"4" * 30_000)  # ...so k2 goes
    assert cache.get("k2") is None
    assert [cache.get(k) is not None for k in ("k1", "k3", "k4")] == [True, True, True]
    stats = cache.stats()
    assert stats.bytes == 90_000 <= cache.max_bytes
    assert (stats.entries, stats.evictions) == (3, 2)
    assert len(head_files(tmp_path / "cache")) == 3  # evicted objects are gone from disk
    cache.put("k1", b"1" * 60_000)  # replacing an entry counts its new size only
    assert cache.stats().bytes <= cache.max_bytes
    assert cache.get("k1") == b"1" * 60_000


def test_an_entry_larger_than_the_cache_is_not_kept(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=1000)
    cache.put("k", b"small")
    cache.put("k", b"x" * 5000)
    assert cache.get("k") is None  # neither the huge value nor the stale small one
    assert cache.stats().bytes == 0
    assert cache.get_or_fill("k", lambda: b"y" * 5000) == b"y" * 5000


def test_entries_are_encrypted_at_rest(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=10_000_000)
    secret = os.urandom(16) * 20_000  # 320 KB that is easy to spot
    key = "datasets/customer-emails/shard-00042"
    cache.put(key, secret)
    assert cache.get(key) == secret
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(files) >= 4  # index, key ring, header, body
    for path in files:
        content = path.read_bytes()
        assert secret[:16] not in content, path
        assert key.encode() not in content, path
        assert "customer" not in str(path)


def test_a_damaged_entry_is_dropped_and_refilled(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=10_000_000)
    cache.put("k", b"v" * 200_000)
    [body] = (tmp_path / "cache" / "objects" / "_body").rglob("*" + FILE_SUFFIX)
    data = bytearray(body.read_bytes())
    data[5000] ^= 0xFF
    body.write_bytes(bytes(data))
    assert cache.get("k") is None
    assert cache.stats().entries == 0
    assert cache.get_or_fill("k", lambda: b"fresh") == b"fresh"


def test_clear_removes_everything(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", max_bytes=10_000_000)
    for i in range(5):
        cache.put(f"k{i}", b"x" * 1000)
    cache.clear()
    assert cache.stats() == CacheStats(0, 0, 0, 0, 0)
    assert head_files(tmp_path / "cache") == []
    assert list((tmp_path / "cache" / "objects").rglob("*" + FILE_SUFFIX)) == []


def _fill_in_child(cache_dir: str, marker: str, barrier: Any, out: str) -> None:
    cache = NodeCache(Path(cache_dir), max_bytes=10_000_000)

    def fill() -> bytes:
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # long enough for the other process to miss too
        return b"expensive shard" * 1000

    barrier.wait()
    data = cache.get_or_fill("shard-7", fill)
    Path(out).write_bytes(data)


def test_two_processes_missing_the_same_key_fill_it_once(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    NodeCache(cache_dir, max_bytes=10_000_000)  # created (key ring, index) up front
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    marker = tmp_path / "fills"
    procs = [
        ctx.Process(
            target=_fill_in_child,
            args=(str(cache_dir), str(marker), barrier, str(tmp_path / f"out{i}")),
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(marker.read_text().splitlines()) == 1  # fill ran in one process only
    for i in range(2):
        assert (tmp_path / f"out{i}").read_bytes() == b"expensive shard" * 1000
    stats = NodeCache(cache_dir, max_bytes=10_000_000).stats()
    assert (stats.hits, stats.misses) == (1, 1)


def test_bad_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="max_bytes must be >= 1"):
        NodeCache(tmp_path / "c", max_bytes=0)
