"""Jobs' training progress (domain): the latest ``gantry.metrics.job.progress`` of each job.

Progress is frequent and only its latest value matters, so the scheduler keeps it on the job
in memory (what the API shows) and writes it to the database at most once per
:data:`SAVE_INTERVAL_MS` per job — enough for a restarted scheduler to show recent progress.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.events.catalog import JobProgress

#: The shortest time between two database writes of one job's progress.
SAVE_INTERVAL_MS = 5_000


def progress_record(event: JobProgress, now_ms: int) -> dict[str, Any]:
    """What the scheduler keeps of a progress event (the job's ``progress`` column, as JSON).

    ``updated_ms`` is when the training measured it, or ``now_ms`` when it did not say.
    """
    return {
        "attempt": event.attempt,
        "step": event.step,
        "total_steps": event.total_steps,
        "epoch": event.epoch,
        "loss": event.loss,
        "samples_per_s": event.samples_per_s,
        "eta_s": event.eta_s,
        "updated_ms": event.at_ms or now_ms,
    }


def supersedes(record: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``record`` replaces the progress kept: it was measured no earlier (an event
    measured before the one kept, delivered late, is not; a restarted gang's lower step,
    measured later, is). Of two measured in the same millisecond, the later delivered wins."""
    if not current:
        return True
    if int(record["attempt"]) != int(current.get("attempt", 0)):
        return int(record["attempt"]) > int(current.get("attempt", 0))
    return int(record["updated_ms"]) >= int(current.get("updated_ms", 0))


class SaveThrottle:
    """Which jobs' progress to write now, and which are due later (at most one write per
    job per interval; the latest value always reaches the database within about one)."""

    def __init__(self, interval_ms: int = SAVE_INTERVAL_MS) -> None:
        self.interval_ms = interval_ms
        self._saved_ms: dict[str, int] = {}
        self._dirty: set[str] = set()

    def changed(self, job_id: str, now_ms: int) -> bool:
        """A job's progress changed: True when it is to be written now, else it waits."""
        if now_ms - self._saved_ms.get(job_id, -self.interval_ms) >= self.interval_ms:
            return True
        self._dirty.add(job_id)
        return False

    def written(self, job_id: str, now_ms: int) -> None:
        """The job's row (with its progress) was written at ``now_ms``."""
        self._saved_ms[job_id] = now_ms
        self._dirty.discard(job_id)

    def due(self, now_ms: int) -> list[str]:
        """Jobs whose unwritten progress may be written now."""
        return sorted(
            j for j in self._dirty if now_ms - self._saved_ms.get(j, 0) >= self.interval_ms
        )

    def forget(self, job_id: str) -> None:
        """The job ended: nothing more to track."""
        self._saved_ms.pop(job_id, None)
        self._dirty.discard(job_id)


__all__ = ["SAVE_INTERVAL_MS", "SaveThrottle", "progress_record", "supersedes"]
