"""Checking event signatures in worker processes.

Ed25519 verification is the most expensive step of consuming an event (tens of microseconds,
and the GIL stays held), so a busy consumer hands each batch's signatures to a process pool
and keeps parsing and storing on its own core meanwhile.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from gantry.events.signing import EventVerifier

_verifier: EventVerifier | None = None


def _init_worker(factory: Callable[[], EventVerifier]) -> None:
    global _verifier
    _verifier = factory()
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()


def _exit_with_parent() -> None:
    """End this worker when the service that spawned it dies (even by SIGKILL)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    os._exit(0)


def _verify_chunk(items: Sequence[tuple[str, bytes, bytes]]) -> list[str | None]:
    assert _verifier is not None
    results: list[str | None] = []
    for kid, data, signature in items:
        try:
            _verifier.verify(kid, data, signature)
            results.append(None)
        except Exception as exc:
            results.append(str(exc))
    return results


class SignaturePool:
    """Verifies (kid, data, signature) triples in ``workers`` spawned processes.

    ``factory`` builds the verifier inside each worker; it must be picklable (a class, or a
    ``functools.partial`` of one, e.g. ``partial(DirectoryTrustStore, trusted_dir)``).
    """

    def __init__(self, factory: Callable[[], EventVerifier], *, workers: int = 1) -> None:
        self._workers = workers
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(factory,),
        )

    async def verify_many(self, items: Sequence[tuple[str, bytes, bytes]]) -> list[str | None]:
        """For each triple: None when the signature is good, else the reason it is not."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        size = -(-len(items) // self._workers)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        parts = await asyncio.gather(
            *(loop.run_in_executor(self._executor, _verify_chunk, chunk) for chunk in chunks)
        )
        return [result for part in parts for result in part]

    def close(self) -> None:
        """Stop the workers."""
        self._executor.shutdown(wait=True, cancel_futures=True)


__all__ = ["SignaturePool"]
