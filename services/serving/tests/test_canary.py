"""Canary analysis: a version's window counts requests, errors and latencies (a bounded
reservoir that keeps the percentiles honest) and starts afresh on every take(); judge() passes,
fails or skips a window by the policy's rules, with a summary and the evidence."""

from __future__ import annotations

import threading

import pytest

from gantry.serving.canary import RESERVOIR, VersionWindow, WindowStats, judge
from gantry.serving.deployments import CanaryPolicy

POLICY = CanaryPolicy(min_success_rate=0.95, max_p99_ms=200.0, min_requests=10)


def stats(requests: int, errors: int = 0, p99_ms: float = 50.0) -> WindowStats:
    return WindowStats(requests, errors, p50_ms=p99_ms / 2, p99_ms=p99_ms, seconds=60.0)


# -- the window ---------------------------------------------------------------------------------


def test_an_empty_window() -> None:
    window = VersionWindow(100.0)
    s = window.take(160.0)
    assert s == WindowStats(0, 0, 0.0, 0.0, 60.0)
    assert s.success_rate == 1.0


def test_a_window_counts_and_measures_then_starts_again() -> None:
    window = VersionWindow(10.0)
    for i in range(100):
        window.record((i + 1) / 1000.0, failed=i % 10 == 0)  # 1..100 ms, 10 failures
    s = window.take(12.5)
    assert (s.requests, s.errors, s.seconds) == (100, 10, 2.5)
    assert s.success_rate == pytest.approx(0.9)
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p99_ms == pytest.approx(99.01)
    assert s.evidence() == {
        "requests": 100,
        "errors": 10,
        "success_rate": 0.9,
        "p50_ms": 50.5,
        "p99_ms": 99.01,
        "window_s": 2.5,
    }
    # the next window starts where the last one ended, empty
    window.record(0.002, failed=False)
    s = window.take(14.0)
    assert (s.requests, s.errors, s.seconds) == (1, 0, 1.5)
    assert s.p99_ms == pytest.approx(2.0)


def test_a_clock_going_backwards_gives_no_negative_window() -> None:
    assert VersionWindow(10.0).take(9.0).seconds == 0.0


def test_the_reservoir_is_bounded_and_samples_the_whole_window() -> None:
    window = VersionWindow(0.0, seed=7)
    n = 5 * RESERVOIR
    # latencies grow over the window: keeping only the first RESERVOIR would show a p50
    # near RESERVOIR / 2 ms instead of n / 2 ms
    for i in range(n):
        window.record(i / 1000.0, failed=False)
    assert len(window._latencies) == RESERVOIR
    s = window.take(1.0)
    assert s.requests == n
    assert s.p50_ms == pytest.approx(n / 2, rel=0.05)
    assert s.p99_ms == pytest.approx(0.99 * n, rel=0.02)


def test_the_window_is_thread_safe() -> None:
    window = VersionWindow(0.0)

    def work() -> None:
        for i in range(2000):
            window.record(0.001, failed=i % 4 == 0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = window.take(1.0)
    assert (s.requests, s.errors) == (8000, 2000)


# -- the verdict --------------------------------------------------------------------------------


def test_a_healthy_window_with_enough_requests_passes() -> None:
    verdict = judge(stats(100, errors=2, p99_ms=120.0), POLICY)
    assert verdict.outcome == "passed"
    assert verdict.summary == "100 requests, success 98.00%, p99 120.0 ms"
    assert verdict.evidence == {
        "requests": 100,
        "errors": 2,
        "success_rate": 0.98,
        "p50_ms": 60.0,
        "p99_ms": 120.0,
        "window_s": 60.0,
        "min_success_rate": 0.95,
        "max_p99_ms": 200.0,
        "min_requests": 10,
    }


def test_the_thresholds_themselves_pass() -> None:
    assert judge(stats(100, errors=5, p99_ms=200.0), POLICY).outcome == "passed"
    assert judge(stats(10), POLICY).outcome == "passed"  # exactly min_requests


def test_a_low_success_rate_fails() -> None:
    verdict = judge(stats(100, errors=6), POLICY)
    assert verdict.outcome == "failed"
    assert verdict.summary == (
        "100 requests, success 94.00%, p99 50.0 ms: success rate 94.00% < 95.00%"
    )


def test_a_slow_p99_fails() -> None:
    verdict = judge(stats(100, p99_ms=250.5), POLICY)
    assert verdict.outcome == "failed"
    assert verdict.summary.endswith(": p99 250.5 ms > 200 ms")


def test_both_problems_are_named() -> None:
    verdict = judge(stats(50, errors=50, p99_ms=900.0), POLICY)
    assert verdict.outcome == "failed"
    assert "success rate 0.00% < 95.00%; p99 900.0 ms > 200 ms" in verdict.summary


def test_failures_need_no_minimum_number_of_requests() -> None:
    # ten failures out of ten need no more evidence; nor do two out of two
    verdict = judge(stats(2, errors=2), POLICY)
    assert verdict.outcome == "failed"
    assert judge(stats(3, p99_ms=5000.0), POLICY).outcome == "failed"


def test_too_little_traffic_is_skipped() -> None:
    verdict = judge(stats(9), POLICY)
    assert verdict.outcome == "skipped"
    assert verdict.summary == (
        "9 requests, success 100.00%, p99 50.0 ms: too few requests to judge (< 10)"
    )
    assert verdict.evidence["requests"] == 9


def test_no_traffic_is_skipped_even_without_a_minimum() -> None:
    policy = CanaryPolicy(min_requests=0)
    empty = WindowStats(0, 0, 0.0, 0.0, 60.0)
    assert judge(empty, policy).outcome == "skipped"
    assert judge(stats(1), policy).outcome == "passed"


def test_a_window_feeds_the_verdict() -> None:
    window = VersionWindow(0.0)
    for _ in range(20):
        window.record(0.010, failed=False)
    window.record(0.010, failed=True)
    verdict = judge(window.take(60.0), CanaryPolicy(min_success_rate=0.99, min_requests=10))
    assert verdict.outcome == "failed"
    assert "success rate 95.24% < 99.00%" in verdict.summary
