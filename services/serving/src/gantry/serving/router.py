"""Routing (domain): which version of a deployment answers a request, and which requests are
mirrored to its shadow.

Weights are laid out in slot order over 100 buckets (the stable version first, a canary last).
A request without a routing key lands in a random bucket; one with a key (the deployment's
sticky header) lands in the bucket its hash names, so the same key keeps the same version on
every replica for as long as the weights stay put. When a canary's weight steps up, the buckets
that move go from the stable version to the canary, never back: a sticky caller that reached
the canary stays on it until it is promoted or rolled back.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gantry.serving.deployments import Slot

BUCKETS = 100


def bucket(key: str, salt: str = "") -> int:
    """The stable bucket (0..99) of a routing key."""
    digest = hashlib.blake2b(f"{salt}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


@dataclass(frozen=True)
class Route:
    """Where a request goes: ``version`` answers it, ``shadow`` (if set) gets a copy."""

    version: int
    shadow: int | None = None


class Router:
    """Picks versions by weight; immutable — build a new one when the weights change."""

    def __init__(
        self,
        slots: Sequence[Slot],
        *,
        shadow_percent: int = 0,
        salt: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self._table: list[int] = []
        for slot in slots:
            if slot.role != "shadow" and slot.weight > 0:
                self._table.extend([slot.version] * slot.weight)
        shadow = next((s.version for s in slots if s.role == "shadow"), None)
        self._shadow = shadow if shadow_percent > 0 else None
        self._shadow_percent = shadow_percent
        self._salt = salt
        self._rng = rng or random.Random()

    @property
    def empty(self) -> bool:
        """No version takes routed traffic."""
        return not self._table

    def route(self, key: str | None = None) -> Route:
        """The version for a request with routing ``key`` (None = not sticky)."""
        if not self._table:
            raise LookupError("no version takes traffic")
        if key is None:
            version = self._table[self._rng.randrange(len(self._table))]
        else:
            version = self._table[bucket(key, self._salt) * len(self._table) // BUCKETS]
        shadow = None
        if self._shadow is not None and self._rng.randrange(BUCKETS) < self._shadow_percent:
            shadow = self._shadow
        return Route(version, shadow)


__all__ = ["BUCKETS", "Route", "Router", "bucket"]
