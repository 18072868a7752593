"""Clocks: the system clock for services, a manual one for tests of time-based behaviour."""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Clock(Protocol):
    """Something that tells the current UTC time."""

    def now(self) -> dt.datetime:
        """Current time, timezone-aware UTC."""
        ...


class SystemClock:
    """The machine's wall clock, in UTC."""

    def now(self) -> dt.datetime:
        """Current wall-clock time, timezone-aware UTC."""
        return dt.datetime.now(dt.UTC)


class ManualClock:
    """A clock that only moves when told to (for tests of expiry and intervals)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        """The time last set."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self._now += dt.timedelta(seconds=seconds)


def utc(value: dt.datetime) -> dt.datetime:
    """Return ``value`` as timezone-aware UTC (naive values are taken to be UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


__all__ = ["Clock", "ManualClock", "SystemClock", "utc"]
