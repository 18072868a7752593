"""One lock per process for opening per-process resources (gRPC channels, cache handles).

Sources are shared by a reader's prefetch threads and copied into DataLoader workers by fork
or pickle. Their channels and cache handles are opened lazily in each process, under this
lock; a lock held by another thread at the moment of a fork would stay locked forever in the
child, so the child gets a fresh one.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def process_lock() -> threading.Lock:
    """This process's lock for opening per-process resources."""
    return _lock


__all__ = ["process_lock"]
