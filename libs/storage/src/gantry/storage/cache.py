"""NodeCache: a node-local, encrypted, size-bounded LRU cache shared by the processes of a node.

Layout under ``path``::

    objects/        an ObjectStore (LocalBackend, no fsync: a cache may lose entries)
    key.json        its key ring (LocalKeyFile, mode 0600)
    index.sqlite3   entries (name, size, last use) and shared counters, in WAL mode
    locks/          fill locks, 4096 stripes chosen by the entry name

Cache keys are arbitrary strings; an entry's object name is the SHA-256 of its key, so keys
never reach the file system. Sizes are plaintext bytes. The index row of an entry is written
before its object, so an object without a row can only be a leftover of a crash during
eviction; those are removed when a cache is opened.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from gantry.core import IntegrityError, InvalidInput, get_logger
from gantry.storage.backends import LocalBackend
from gantry.storage.errors import KeyUnavailable, ObjectNotFound
from gantry.storage.key_file import LocalKeyFile
from gantry.storage.key_manager import KeyManager
from gantry.storage.store import ObjectStore

log = get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (name TEXT PRIMARY KEY, size INTEGER NOT NULL,
                                    used INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS entries_by_use ON entries (used);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
_COUNTERS = ("bytes", "hits", "misses", "evictions")
LOCK_STRIPE_CHARS = 3  # 16**3 = 4096 lock files at most
RECONCILE_EVERY_S = 3600


@dataclass(frozen=True)
class CacheStats:
    """Counts shared by every process using the cache (hits, misses, evictions since clear)."""

    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int


class NodeCache:
    """A node-local cache of hot blobs (shards, weights), encrypted at rest, bounded in size
    (LRU), safe for several processes.

    Promises: the plaintext bytes of all entries stay at or below ``max_bytes`` (an entry
    larger than that is not cached); :meth:`get_or_fill` runs ``fill`` once per key across
    processes that miss it together; a damaged entry is dropped and reported as a miss.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        if max_bytes < 1:
            raise InvalidInput(f"max_bytes must be >= 1, got {max_bytes}", hint="size the cache")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.path / "locks").mkdir(exist_ok=True, mode=0o700)
        keys = KeyManager(LocalKeyFile(self.path / "key.json"))
        self._store = ObjectStore(LocalBackend(self.path / "objects", durable=False), keys)
        self._db_path = self.path / "index.sqlite3"
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        self._maybe_reconcile()

    # -- public ------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The cached bytes for ``key``, or ``None``; a hit makes it the most recently used."""
        name = self._name(key)
        data = self._lookup(name)
        self._count(name, hit=data is not None)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Cache ``data`` under ``key``, evicting least-recently-used entries to make room."""
        name = self._name(key)
        size = len(data)
        if size > self.max_bytes:
            self._forget(name)  # never leave an older value of this key behind
            return
        victims: list[str] = []
        with self._transaction() as db:
            old = db.execute("SELECT size FROM entries WHERE name = ?", (name,)).fetchone()
            total = self._counter(db, "bytes") - (old[0] if old else 0)
            db.execute("DELETE FROM entries WHERE name = ?", (name,))
            while total + size > self.max_bytes:
                rows = db.execute("SELECT name, size FROM entries ORDER BY used LIMIT 64")
                batch = rows.fetchall()
                if not batch:
                    break
                for victim, victim_size in batch:
                    if total + size <= self.max_bytes:
                        break
                    db.execute("DELETE FROM entries WHERE name = ?", (victim,))
                    total -= victim_size
                    victims.append(victim)
            db.execute(
                "INSERT INTO entries VALUES (?, ?, (SELECT COALESCE(MAX(used), 0) + 1 "
                "FROM entries))",
                (name, size),
            )
            self._add(db, "bytes", total + size - self._counter(db, "bytes"))
            self._add(db, "evictions", len(victims))
        for victim in victims:
            self._store.delete(victim)
        try:
            self._store.put(name, data)
        except BaseException:
            self._forget(name)
            raise

    def get_or_fill(self, key: str, fill: Callable[[], bytes]) -> bytes:
        """The cached bytes for ``key``; on a miss, ``fill()`` once (across processes) and cache.

        Processes that miss the same key together wait on a file lock; the first runs
        ``fill`` and the others read what it cached.
        """
        name = self._name(key)
        data = self._lookup(name)
        if data is None:
            with FileLock(self.path / "locks" / f"{name[:LOCK_STRIPE_CHARS]}.lock"):
                data = self._lookup(name)
                if data is None:
                    data = bytes(fill())
                    self.put(key, data)
                    self._count(name, hit=False)
                    return data
        self._count(name, hit=True)
        return data

    def stats(self) -> CacheStats:
        """Current entry count and bytes, and the shared hit/miss/eviction counters."""
        with closing(self._connect()) as db:
            (entries,) = db.execute("SELECT COUNT(*) FROM entries").fetchone()
            values = [self._counter(db, c) for c in _COUNTERS]
        return CacheStats(entries, *values)

    def clear(self) -> None:
        """Remove every entry and reset the counters."""
        with self._transaction() as db:
            db.execute("DELETE FROM entries")
            db.execute("DELETE FROM counters WHERE name != 'reconciled_at'")
        for name in list(self._store.names()):
            self._store.delete(name)
        self._store.sweep_incomplete(older_than_s=0)

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _name(key: str) -> str:
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _counter(db: sqlite3.Connection, name: str) -> int:
        row = db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def _add(db: sqlite3.Connection, name: str, delta: int) -> None:
        db.execute(
            "INSERT INTO counters VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            (name, delta),
        )

    def _lookup(self, name: str) -> bytes | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT 1 FROM entries WHERE name = ?", (name,)).fetchone()
        if row is None:
            return None
        try:
            with self._store.open(name) as reader:
                return b"".join(reader)
        except ObjectNotFound:  # being written by another process, or evicted meanwhile
            return None
        except (IntegrityError, KeyUnavailable) as exc:
            log.warning("cache entry dropped", path=str(self.path), entry=name, error=str(exc))
            self._forget(name)
            return None

    def _count(self, name: str, *, hit: bool) -> None:
        with self._transaction() as db:
            self._add(db, "hits" if hit else "misses", 1)
            if hit:
                db.execute(
                    "UPDATE entries SET used = (SELECT MAX(used) FROM entries) + 1 WHERE name = ?",
                    (name,),
                )

    def _forget(self, name: str) -> None:
        with self._transaction() as db:
            row = db.execute("SELECT size FROM entries WHERE name = ?", (name,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM entries WHERE name = ?", (name,))
                self._add(db, "bytes", -row[0])
        self._store.delete(name)

    def _maybe_reconcile(self) -> None:
        """Delete objects left without an index row, and bodies of aborted writes.

        Runs when a cache is opened, at most once per RECONCILE_EVERY_S across processes, so
        worker processes that reopen the cache do not each walk it.
        """
        now = int(time.time())
        with self._transaction() as db:
            if now - self._counter(db, "reconciled_at") < RECONCILE_EVERY_S:
                return
            db.execute("INSERT OR REPLACE INTO counters VALUES ('reconciled_at', ?)", (now,))
        names = list(self._store.names())  # before the rows: a row is written before its object
        with closing(self._connect()) as db:
            known = {row[0] for row in db.execute("SELECT name FROM entries")}
        for name in names:
            if name not in known:
                self._store.delete(name)
        self._store.sweep_incomplete()


__all__ = ["CacheStats", "NodeCache"]
