"""Cron schedules (through :mod:`cronsim`): checking an expression, finding the fires that are due.

Expressions have the five standard fields (minute hour day-of-month month day-of-week), or six
with seconds first; ``@hourly``, ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` work too.
Times are computed in the schedule's time zone (so ``0 3 * * *`` in Europe/Paris is 03:00 local
time on both sides of a daylight-saving change) and returned in UTC.

Like a Kubernetes CronJob, a schedule that fell behind (the service was down) starts only the
most recent fire still within its starting deadline; the fires before it are reported missed.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MAX_SCAN = 100_000


class CronError(ValueError):
    """A schedule that cannot be used, with the reason."""


def _expression(expr: str) -> str:
    text = " ".join(expr.split())
    text = MACROS.get(text.lower(), text)
    if len(text.split()) not in (5, 6):
        raise CronError(
            f"cron {expr!r} has {len(text.split())} fields; write five (minute hour "
            "day-of-month month day-of-week, e.g. '0 3 * * *' for 03:00 daily), six with "
            "seconds first, or @hourly/@daily/@weekly/@monthly"
        )
    return text


def _zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CronError(
            f"unknown time zone {name!r}: use an IANA name such as UTC or Europe/Paris"
        ) from None


def check_cron(expr: str, timezone: str = "UTC") -> None:
    """Raise :class:`CronError` saying what is wrong with ``expr`` or ``timezone``."""
    next_fire(expr, timezone, datetime(2026, 1, 1, tzinfo=UTC))


def next_fire(expr: str, timezone: str, after: datetime) -> datetime:
    """The first fire strictly after ``after``, in UTC."""
    zone = _zone(timezone)
    text = _expression(expr)
    try:
        it = CronSim(text, after.astimezone(zone))
        return next(it).astimezone(UTC)
    except CronSimError as exc:
        raise CronError(f"cron {expr!r}: {exc}") from None
    except StopIteration:
        raise CronError(f"cron {expr!r} never fires (e.g. 30 February)") from None


@dataclass(frozen=True)
class Due:
    """What a schedule should do now: ``fire`` (or None), how many fires were ``missed``
    (past their deadline) and the first of them, and the ``next`` fire to wait for."""

    fire: datetime | None
    missed: int
    first_missed: datetime | None
    next: datetime


def due(
    expr: str,
    timezone: str,
    next_at: datetime,
    now: datetime,
    *,
    deadline: timedelta,
) -> Due:
    """The fires from ``next_at`` up to ``now``: the latest within ``deadline`` is fired, the
    others are missed."""
    fires: list[datetime] = []
    at = next_at
    while at <= now and len(fires) < MAX_SCAN:
        fires.append(at)
        at = next_fire(expr, timezone, at)
    if len(fires) >= MAX_SCAN:  # a very old next_at: skip ahead
        at = next_fire(expr, timezone, now)
    fire = fires[-1] if fires and now - fires[-1] <= deadline else None
    missed = fires[:-1] if fire is not None else fires
    return Due(fire, len(missed), missed[0] if missed else None, at)


__all__ = ["MACROS", "CronError", "Due", "check_cron", "due", "next_fire"]
