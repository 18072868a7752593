"""Token revocation: a token revoked before it expires is refused by every service at once.

The audit service keeps the list: ``RevokeToken`` (platform admins) writes the token's ``jti``
into the JetStream key-value bucket ``gantry-revocations`` and records a
``gantry.authz.token.revoked`` event. Every service with an API runs a
:class:`RevocationWatcher` on the bucket, which feeds its :class:`RevocationList`; the
:class:`~gantry.security.tokens.TokenVerifier` consults that list on every call, cached
signatures included. Entries carry the token's expiry: once it has passed, the token is refused
anyway and the entry is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

import orjson
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from gantry.core import Clock, ConfigError, SystemClock, Unavailable, get_logger
from gantry.events import Bus
from gantry.events.streams import REVOCATIONS_BUCKET

_log = get_logger("gantry.security.revocations")


@dataclass(frozen=True)
class Revocation:
    """One revoked token."""

    jti: str
    expires_ms: int
    reason: str = ""
    subject: str = ""
    revoked_by: str = ""
    revoked_ms: int = 0

    def to_bytes(self) -> bytes:
        """The bucket value."""
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_bytes(cls, jti: str, value: bytes) -> Revocation:
        """Parse a bucket value (an unreadable one still revokes the token, for ever)."""
        try:
            data = orjson.loads(value)
            return cls(
                jti=jti,
                expires_ms=int(data.get("expires_ms", 0)),
                reason=str(data.get("reason", "")),
                subject=str(data.get("subject", "")),
                revoked_by=str(data.get("revoked_by", "")),
                revoked_ms=int(data.get("revoked_ms", 0)),
            )
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return cls(jti=jti, expires_ms=2**62, reason="(unreadable revocation entry)")


class RevocationList:
    """The revoked tokens this process knows of; thread-safe (gRPC threads read it)."""

    def __init__(self, clock: Clock = SystemClock()) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, Revocation] = {}
        #: Set once the watcher has read the whole bucket (services are ready only then).
        self.loaded = threading.Event()

    def add(self, revocation: Revocation) -> None:
        """Remember ``revocation`` (unless its token has expired already)."""
        with self._lock:
            self._entries[revocation.jti] = revocation
            self._prune()

    def revoked(self, jti: str) -> Revocation | None:
        """The revocation of token ``jti``, or None."""
        with self._lock:
            return self._entries.get(jti)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _prune(self) -> None:
        now_ms = int(self._clock.now().timestamp() * 1000)
        expired = [j for j, r in self._entries.items() if r.expires_ms and r.expires_ms < now_ms]
        for jti in expired:
            del self._entries[jti]


async def revocation_bucket(bus: Bus) -> KeyValue:
    """The revocation bucket (ConfigError if the deployment has not created it)."""
    try:
        return await bus.js.key_value(REVOCATIONS_BUCKET)
    except BucketNotFoundError:
        raise ConfigError(
            f"the key-value bucket {REVOCATIONS_BUCKET} does not exist",
            hint="run 'gantry admin streams' with the NATS admin credentials",
        ) from None


class RevocationWatcher:
    """Keeps a :class:`RevocationList` up to date from the bucket until stopped."""

    def __init__(self, bus: Bus, revocations: RevocationList) -> None:
        self._bus = bus
        self.revocations = revocations
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self, timeout_s: float = 10.0) -> None:
        """Read the whole list, then keep watching in the background."""
        self._task = asyncio.create_task(self._run(), name="revocation-watcher")
        loaded = asyncio.get_running_loop().run_in_executor(None, self.revocations.loaded.wait)
        try:
            await asyncio.wait_for(asyncio.shield(loaded), timeout=timeout_s)
        except TimeoutError:
            raise Unavailable(
                f"could not read the token revocation list within {timeout_s}s",
                hint="check that NATS is up and the bucket exists ('gantry admin streams')",
            ) from None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                kv = await revocation_bucket(self._bus)
                watcher = await kv.watchall()
                try:
                    async for entry in watcher:
                        if entry is None:  # the initial values are all read
                            self.revocations.loaded.set()
                            continue
                        if entry.value:
                            self.revocations.add(Revocation.from_bytes(entry.key, entry.value))
                        if self._stopping.is_set():
                            break
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning("revocation watch failed; retrying", error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=1.0)

    async def stop(self) -> None:
        """Stop watching."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def revoke(bus: Bus, revocation: Revocation) -> None:
    """Put ``revocation`` into the bucket (the audit service's user may)."""
    kv = await revocation_bucket(bus)
    await kv.put(revocation.jti, revocation.to_bytes())


async def list_revocations(bus: Bus) -> list[Revocation]:
    """Every revocation in the bucket, oldest first."""
    kv = await revocation_bucket(bus)
    out: list[Revocation] = []
    watcher = await kv.watchall()
    try:
        async for entry in watcher:
            if entry is None:
                break
            if entry.value:
                out.append(Revocation.from_bytes(entry.key, entry.value))
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return sorted(out, key=lambda r: (r.revoked_ms, r.jti))


__all__ = [
    "Revocation",
    "RevocationList",
    "RevocationWatcher",
    "list_revocations",
    "revocation_bucket",
    "revoke",
]
