"""Canary analysis (domain): the figures of one version over an analysis window, and the
verdict of one check against the deployment's :class:`~gantry.serving.deployments.
CanaryPolicy`.

A check *passes* when the canary answered at least ``min_requests`` requests in the window with
a success rate of at least ``min_success_rate`` and a p99 latency of at most ``max_p99_ms``; it
*fails* when either threshold is crossed (with any number of requests: ten failures out of ten
need no more evidence); otherwise it is *skipped* (too little traffic to judge). Server-side
failures count against the success rate (the model raised, timed out, was overloaded); a
caller's bad request does not.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gantry.serving.deployments import CanaryPolicy

#: Latencies kept per window (reservoir sampling beyond it keeps the p99 honest and bounded).
RESERVOIR = 8192


@dataclass(frozen=True)
class WindowStats:
    """One version's figures over a window."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    seconds: float

    @property
    def success_rate(self) -> float:
        """Answered without a server-side failure, as a fraction (1.0 with no requests)."""
        return 1.0 if self.requests == 0 else 1.0 - self.errors / self.requests

    def evidence(self) -> dict[str, Any]:
        """The figures as plain data for events and the audit."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "success_rate": round(self.success_rate, 5),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "window_s": round(self.seconds, 3),
        }


class VersionWindow:
    """Counts one version's outcomes since the last :meth:`take`; thread-safe."""

    def __init__(self, started: float, *, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._started = started
        self._requests = 0
        self._errors = 0
        self._latencies: list[float] = []
        self._rng = random.Random(seed)

    def record(self, latency_s: float, *, failed: bool) -> None:
        """One finished request."""
        with self._lock:
            self._requests += 1
            if failed:
                self._errors += 1
            ms = latency_s * 1000.0
            if len(self._latencies) < RESERVOIR:
                self._latencies.append(ms)
            else:
                slot = self._rng.randrange(self._requests)
                if slot < RESERVOIR:
                    self._latencies[slot] = ms

    def take(self, now: float) -> WindowStats:
        """The figures since the last call, and start a new window."""
        with self._lock:
            latencies, requests, errors = self._latencies, self._requests, self._errors
            seconds = max(0.0, now - self._started)
            self._latencies, self._requests, self._errors = [], 0, 0
            self._started = now
        if latencies:
            p50, p99 = (float(x) for x in np.percentile(latencies, [50, 99]))
        else:
            p50 = p99 = 0.0
        return WindowStats(requests, errors, p50, p99, seconds)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check, with what it saw."""

    outcome: Literal["passed", "failed", "skipped"]
    summary: str
    evidence: dict[str, Any]


def judge(stats: WindowStats, policy: CanaryPolicy) -> Verdict:
    """Check a canary's window against the policy (see the module doc)."""
    evidence = {
        **stats.evidence(),
        "min_success_rate": policy.min_success_rate,
        "max_p99_ms": policy.max_p99_ms,
        "min_requests": policy.min_requests,
    }
    figures = (
        f"{stats.requests} requests, success {stats.success_rate:.2%}, p99 {stats.p99_ms:.1f} ms"
    )
    problems = []
    if stats.requests and stats.success_rate < policy.min_success_rate:
        problems.append(f"success rate {stats.success_rate:.2%} < {policy.min_success_rate:.2%}")
    if stats.requests and stats.p99_ms > policy.max_p99_ms:
        problems.append(f"p99 {stats.p99_ms:.1f} ms > {policy.max_p99_ms:g} ms")
    if problems:
        return Verdict("failed", f"{figures}: {'; '.join(problems)}", evidence)
    if stats.requests < max(1, policy.min_requests):
        return Verdict(
            "skipped", f"{figures}: too few requests to judge (< {policy.min_requests})", evidence
        )
    return Verdict("passed", figures, evidence)


__all__ = ["RESERVOIR", "Verdict", "VersionWindow", "WindowStats", "judge"]
