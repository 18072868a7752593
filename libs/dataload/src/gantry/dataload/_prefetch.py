"""Reading ahead: shards fetched and decoded in background threads, handed out in order.

Fetching (network or cache read, decryption) and Arrow decoding release the GIL, so a few
threads keep the next shards ready while the training loop consumes the current one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Prefetcher(Generic[K, V]):
    """``fn(key)`` for each key, computed up to ``depth`` keys ahead on ``threads`` threads.

    Results come back in key order. An exception from ``fn`` is raised where its result would
    have been returned. :meth:`close` (also on ``with`` exit) cancels what has not started;
    the keys iterator is read lazily, so it may be endless.
    """

    def __init__(
        self, fn: Callable[[K], V], keys: Iterator[K], *, depth: int, threads: int
    ) -> None:
        self._fn = fn
        self._keys = keys
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="gantry-dataload")
        self._pending: deque[Future[V]] = deque()
        self._exhausted = False
        self._fill()

    def _fill(self) -> None:
        while not self._exhausted and len(self._pending) < self._depth:
            try:
                key = next(self._keys)
            except StopIteration:
                self._exhausted = True
                return
            self._pending.append(self._pool.submit(self._fn, key))

    def __iter__(self) -> Iterator[V]:
        return self

    def __next__(self) -> V:
        if not self._pending:
            raise StopIteration
        future = self._pending.popleft()
        self._fill()
        return future.result()

    def close(self) -> None:
        """Stop reading ahead; work already running finishes in the background."""
        self._exhausted = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Prefetcher[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Prefetcher"]
