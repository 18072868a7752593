"""Run-time prediction from the history of similar jobs, for duration-aware ordering.

Helios' QSSF orders queued jobs by predicted service (GPUs times duration) without an oracle: it
learns from the jobs users ran before. :class:`DurationPredictor` does the same with a ladder
of ever broader notions of "similar" — same user, queue, name pattern and size; then same user
and name pattern; same user, queue and resource shape (GPU demand and CPU size); same user and
queue; same queue and shape; same queue; everyone — and answers with the median of
the most specific level that has enough history, so one odd run does not swing it. The name
pattern is the job name with its digits and hex-looking parts replaced (``bert-ft-0042`` and
``bert-ft-0043`` are the same pattern). A job never predicted longer than its own
``maxRuntime``.
"""

from __future__ import annotations

import functools
import re
import statistics
from collections import defaultdict, deque
from collections.abc import Hashable
from dataclasses import dataclass

_VARYING = re.compile(r"[0-9a-f]{6,}|\d+")

#: History kept per key (the newest runs win: habits change).
WINDOW = 50


def name_pattern(name: str) -> str:
    """The job name with its varying parts (numbers, hashes) replaced by ``#``."""
    return _VARYING.sub("#", name.lower())


def size_bucket(gpu_milli_total: int) -> int:
    """Powers of two of whole GPUs (0: CPU-only or a GPU share)."""
    gpus = gpu_milli_total // 1000
    return 0 if gpus < 1 else gpus.bit_length()


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What the predictor knows of a job before it runs."""

    user: str
    queue: str
    name: str
    gpu_milli_total: int
    max_runtime_s: float = float("inf")
    cpu_milli: int = 0
    memory_mib: int = 0

    def similarity_keys(self) -> tuple[tuple[Hashable, ...], ...]:
        """From most to least specific."""
        return _keys(
            self.user, self.queue, self.name, self.gpu_milli_total, self.cpu_milli, self.memory_mib
        )


@functools.lru_cache(maxsize=65536)
def _keys(
    user: str, queue: str, name: str, gpu_milli_total: int, cpu_milli: int, memory_mib: int
) -> tuple[tuple[Hashable, ...], ...]:
    pattern = name_pattern(name)
    size = size_bucket(gpu_milli_total)
    shape = (gpu_milli_total, cpu_milli.bit_length())
    # the exact resource request: jobs submitted from one template (the same script, config
    # or notebook) ask for the same numbers, and tend to run alike
    template = (gpu_milli_total, cpu_milli, memory_mib)
    return (
        ("u-q-n-t", user, queue, pattern, *template),
        ("u-q-n-s", user, queue, pattern, size),
        ("u-n", user, pattern),
        ("u-q-template", user, queue, *template),
        ("u-q-shape", user, queue, *shape),
        ("u-q", user, queue),
        ("q-shape", queue, *shape),
        ("q", queue),
        ("all",),
    )


class DurationPredictor:
    """Learns run times online; predicts a job's run time from the most similar history.

    ``min_samples`` is how many past runs a level needs before it is trusted; ``prior_s`` is
    the answer with no history at all (1 hour: long enough not to jump ahead of everything).
    """

    def __init__(self, *, min_samples: int = 3, prior_s: float = 3600.0) -> None:
        self.min_samples = min_samples
        self.prior_s = prior_s
        self._history: dict[tuple[Hashable, ...], deque[float]] = defaultdict(
            lambda: deque(maxlen=WINDOW)
        )
        self._medians: dict[tuple[Hashable, ...], float] = {}  # cached until the key learns

    def observe(self, job: JobFeatures, duration_s: float) -> None:
        """Learn that ``job`` ran for ``duration_s`` seconds."""
        if duration_s < 0:
            return
        for key in job.similarity_keys():
            self._history[key].append(duration_s)
            self._medians.pop(key, None)

    def predict(self, job: JobFeatures) -> float:
        """The predicted run time in seconds (never above the job's max runtime)."""
        for key in job.similarity_keys():
            runs = self._history.get(key)
            if runs is not None and len(runs) >= (1 if key == ("all",) else self.min_samples):
                median = self._medians.get(key)
                if median is None:
                    median = self._medians[key] = statistics.median(runs)
                return min(median, job.max_runtime_s)
        return min(self.prior_s, job.max_runtime_s)

    def predicted_service(self, job: JobFeatures) -> float:
        """GPU-seconds the job is expected to take (QSSF's sort key); CPU jobs count a tenth
        of a GPU so they are ordered among themselves by duration."""
        gpus = max(job.gpu_milli_total / 1000, 0.1)
        return gpus * self.predict(job)


__all__ = ["WINDOW", "DurationPredictor", "JobFeatures", "name_pattern", "size_bucket"]
