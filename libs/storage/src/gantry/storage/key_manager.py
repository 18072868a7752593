"""KeyManager: wraps and unwraps data keys with the versioned KEKs of a key ring.

Wrap counting: AES-GCM with random 96-bit nonces must not be used for more than about 2**32
messages per key, so every active version has a ``wrap_limit`` (default 2**31). Writing the
ring on every wrap would be slow, so a manager *reserves* wraps in blocks: it persists
``wraps += block`` first and then counts in memory. A crash loses at most one unused block
(the stored count over-counts, never under-counts); :meth:`KeyManager.close` hands the unused
part back. Read-only sources (a mounted Secret) cannot persist counts: they count per process.

At the limit :meth:`KeyManager.wrap` raises :class:`KeyUsageExceeded`; rotation is an explicit
operator action, never automatic, so every process agrees on which version is active.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from types import TracebackType

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gantry.core import Conflict, IntegrityError, InvalidInput
from gantry.storage.errors import (
    KeyRingChanged,
    KeyUnavailable,
    KeyUsageExceeded,
    ReadOnlyKeySource,
)
from gantry.storage.keyring import KEK_LEN, KeyRingState, KeySource, KeyVersionInfo

DEFAULT_WRAP_LIMIT = 2**31
DEFAULT_RESERVE_BLOCK = 1024
_SAVE_ATTEMPTS = 50


def _now_ms() -> int:
    return int(time.time() * 1000)


class KeyManager:
    """Versioned key-encryption keys (KEKs) from a KeySource.

    Promises: new data keys are wrapped only by the active version; a retired version never
    unwraps; the persisted wrap count of a version is never below the wraps really made.
    Thread-safe. Other processes' rotations are seen when this one reserves its next block of
    wraps, meets an unknown version, or calls :meth:`refresh`.
    """

    def __init__(
        self,
        source: KeySource,
        *,
        wrap_limit: int = DEFAULT_WRAP_LIMIT,
        reserve_block: int = DEFAULT_RESERVE_BLOCK,
    ) -> None:
        if wrap_limit < 1 or reserve_block < 1:
            raise InvalidInput(
                f"wrap_limit ({wrap_limit}) and reserve_block ({reserve_block}) must be >= 1",
                hint=f"use the defaults ({DEFAULT_WRAP_LIMIT}, {DEFAULT_RESERVE_BLOCK})",
            )
        self._source = source
        self.wrap_limit = wrap_limit
        self.reserve_block = reserve_block
        self._lock = threading.RLock()
        self._ciphers: dict[int, AESGCM] = {}
        self._block = (0, 0, 0)  # (version, next wrap number, end of the reserved block)
        loaded = source.load()
        if loaded is None:
            if source.read_only:
                raise ReadOnlyKeySource(source.describe(), "create a key ring")
            loaded = self._update(lambda s: s or KeyRingState.new(os.urandom(KEK_LEN), _now_ms()))
        self._ring = loaded

    @property
    def source(self) -> KeySource:
        """Where the ring is kept."""
        return self._source

    @property
    def active_version(self) -> int:
        """The KEK version that wraps new data keys."""
        return self._ring.active.version

    def versions(self) -> list[KeyVersionInfo]:
        """Every version the ring knows, oldest first; ``wraps`` is the persisted upper bound."""
        return [
            KeyVersionInfo(r.version, r.state, r.created_ms, r.wraps) for r in self._ring.records
        ]

    def refresh(self) -> None:
        """Re-read the ring from its source now."""
        loaded = self._source.load()
        if loaded is not None:
            with self._lock:
                self._ring = loaded

    def rotate(self) -> int:
        """Make a fresh KEK the active version; the previous one becomes decrypt-only.

        Returns the new version. Existing objects stay readable; :meth:`ObjectStore.rewrap`
        moves them to the new version.
        """
        self._writable("rotate the key ring")
        with self._lock:
            ring = self._update(lambda s: self._require(s).rotated(os.urandom(KEK_LEN), _now_ms()))
            self._block = (0, 0, 0)
            return ring.active.version

    def retire(self, version: int) -> None:
        """Destroy ``version``'s key material; objects still wrapped by it become unreadable.

        Refuses the active version (rotate first). Retiring twice is a no-op.
        """
        self._writable(f"retire KEK version {version}")

        def change(state: KeyRingState | None) -> KeyRingState:
            ring = self._require(state)
            record = ring.get(version)
            if record is None:
                raise InvalidInput(
                    f"the key ring has no KEK version {version}",
                    hint="see KeyManager.versions() for the versions it has",
                )
            if record.state == "active":
                raise Conflict(
                    f"KEK version {version} is the active version and cannot be retired",
                    hint="rotate first, re-wrap every object (ObjectStore.rewrap), then retire",
                )
            return ring if record.state == "retired" else ring.retired(version)

        with self._lock:
            self._update(change)
            self._ciphers.pop(version, None)

    def wrap(self, dek: bytes, aad: bytes) -> tuple[int, bytes]:
        """Wrap ``dek`` with the active KEK, bound to ``aad``: ``(version, nonce || sealed)``.

        Raises :class:`KeyUsageExceeded` once the active version has wrapped ``wrap_limit``
        keys.
        """
        with self._lock:
            version, number, end = self._block
            if version != self._ring.active.version or number >= end:
                version, number, end = self._reserve()
            self._block = (version, number + 1, end)
            cipher = self._cipher(version)
        nonce = os.urandom(12)
        return version, nonce + cipher.encrypt(nonce, dek, aad)

    def unwrap(self, version: int, wrapped: bytes, aad: bytes) -> bytes:
        """The data key ``wrapped`` by KEK ``version`` under ``aad``.

        Raises :class:`KeyUnavailable` for a retired or unknown version and
        :class:`gantry.core.IntegrityError` when the wrapped key or ``aad`` was altered.
        """
        record = self._ring.get(version)
        if record is None:
            self.refresh()
            record = self._ring.get(version)
        if record is None or record.key is None:
            reason = "unknown" if record is None else "retired"
            raise KeyUnavailable(version, reason, source=self._source.describe())
        try:
            return self._cipher(version).decrypt(wrapped[:12], wrapped[12:], aad)
        except (InvalidTag, ValueError):
            raise IntegrityError(
                f"a data key wrapped by KEK version {version} does not authenticate",
                hint="the wrapped key or the data bound to it was altered",
            ) from None

    def close(self) -> None:
        """Hand back the unused part of this process's reserved block of wraps (best effort)."""
        with self._lock:
            version, number, end = self._block
            self._block = (0, 0, 0)
            if number >= end or self._source.read_only:
                return

            def change(state: KeyRingState | None) -> KeyRingState:
                ring = self._require(state)
                record = ring.get(version)
                if record is None or record.wraps != end:  # someone reserved after us
                    return ring
                return ring.with_wraps(version, number)

            self._update(change)

    def __enter__(self) -> KeyManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _cipher(self, version: int) -> AESGCM:
        cipher = self._ciphers.get(version)
        if cipher is None:
            record = self._ring.get(version)
            if record is None or record.key is None:
                raise KeyUnavailable(version, "retired", source=self._source.describe())
            cipher = self._ciphers[version] = AESGCM(record.key)
        return cipher

    def _reserve(self) -> tuple[int, int, int]:
        """Persist a new block of wraps for the active version; return ``(v, first, end)``."""
        if self._source.read_only:  # count in memory only, from the ring's stored figure
            active = self._ring.active
            if self._block[0] == active.version or active.wraps >= self.wrap_limit:
                raise KeyUsageExceeded(active.version, self.wrap_limit)
            return active.version, active.wraps, self.wrap_limit
        block: list[int] = []

        def change(state: KeyRingState | None) -> KeyRingState:
            ring = self._require(state)
            active = ring.active
            if active.wraps >= self.wrap_limit:
                raise KeyUsageExceeded(active.version, self.wrap_limit)
            size = min(self.reserve_block, self.wrap_limit - active.wraps)
            block[:] = [active.version, active.wraps, active.wraps + size]
            return ring.with_wraps(active.version, active.wraps + size)

        self._update(change)
        return block[0], block[1], block[2]

    def _update(self, change: Callable[[KeyRingState | None], KeyRingState]) -> KeyRingState:
        """Load, change and save the ring, retrying while other writers get there first."""
        with self._lock:
            for attempt in range(_SAVE_ATTEMPTS):
                current = self._source.load()
                wanted = change(current)
                if wanted is current:
                    self._ring = wanted
                    return wanted
                try:
                    self._ring = self._source.save(wanted)
                    return self._ring
                except KeyRingChanged:
                    time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
            raise KeyRingChanged(self._source.describe())

    def _require(self, state: KeyRingState | None) -> KeyRingState:
        if state is None:
            raise Conflict(
                f"{self._source.describe()} disappeared",
                hint="restore the key ring from backup; without it no object can be read",
            )
        return state

    def _writable(self, action: str) -> None:
        if self._source.read_only:
            raise ReadOnlyKeySource(self._source.describe(), action)


__all__ = ["DEFAULT_RESERVE_BLOCK", "DEFAULT_WRAP_LIMIT", "KeyManager"]
