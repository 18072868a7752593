"""The autoscaling policy, on synthetic load samples and a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gantry.core import InvalidInput
from gantry.serving.autoscale import Autoscaler, ScaleDecision, ScalingPolicy
from gantry.serving.batcher import LoadSample

SERVICE_S = 0.01  # instance-seconds per request in these samples


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample(
    t: float,
    arrivals: float,
    *,
    queued_rows: int = 0,
    instances: int = 1,
    max_batch_size: int = 8,
    mean_batch_s: float = SERVICE_S,
    max_queue_delay_s: float = 0.002,
) -> LoadSample:
    """A batcher keeping up: every arrival completed, SERVICE_S instance-seconds each."""
    n = round(arrivals)
    return LoadSample(
        time=t,
        instances=instances,
        busy_instances=0,
        queued=queued_rows,
        queued_rows=queued_rows,
        running=0,
        running_rows=0,
        arrivals_total=n,
        completed_total=n,
        failed_total=0,
        rejected_total=0,
        timed_out_total=0,
        cancelled_total=0,
        batches_total=n,
        busy_s=n * SERVICE_S,
        mean_batch_s=mean_batch_s,
        mean_batch_rows=1.0,
        mean_batch_requests=1.0,
        max_batch_size=max_batch_size,
        max_queue_delay_s=max_queue_delay_s,
    )


def feed(
    scaler: Autoscaler, clock: Clock, arrivals: Callable[[float], float], times: range, **kw: int
) -> None:
    for t in times:
        clock.now = float(t)
        scaler.observe(sample(float(t), arrivals(t), **kw))


def test_a_rising_trend_scales_up_before_the_queue_grows() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(max_instances=8), clock=clock)
    # rate(t) = 10 + 8 t per second: 90/s at t = 10, 170/s ten seconds later.
    feed(scaler, clock, lambda t: 10 * t + 4 * t * t, range(11))

    decision = scaler.decide(1)

    assert decision is not None
    # 90/s alone needs ceil(90 * 0.01 / 0.7) = 2; the forecast 170/s needs 3.
    assert decision.instances == 3
    for figure in ("rate 90/s", "rising 8/s²", "170/s in 10 s", "needs 3 instances", "10 ms"):
        assert figure in decision.reason
    assessment = scaler.assess(1)
    assert assessment is not None
    assert assessment.queued_rows == 0
    assert assessment.rate == pytest.approx(90)
    assert assessment.slope == pytest.approx(8)


def test_a_steady_load_that_fits_changes_nothing() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(), clock=clock)
    feed(scaler, clock, lambda t: 100 * t, range(20))  # 100/s needs ceil(1 / 0.7) = 2
    assert scaler.decide(2) is None
    decision = scaler.decide(1)
    assert decision is not None
    assert decision.instances == 2
    assert "rate 100/s needs 2 instances at 70% utilisation" in decision.reason


def test_steady_low_load_scales_down_one_step_after_the_delay() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(scale_down_after_s=30.0), clock=clock)
    decisions: dict[int, ScaleDecision] = {}
    current = 3
    for t in range(100):
        feed(scaler, clock, lambda t: 10 * t, range(t, t + 1))  # 10/s needs 1 instance
        decision = scaler.decide(current)
        if decision is not None:
            decisions[t] = decision
            current = decision.instances

    # Low from the first decision (t = 1, two samples); one step each 30 s, no faster.
    assert sorted(decisions) == [31, 61]
    assert [d.instances for d in decisions.values()] == [2, 1]
    assert "load low for 30 s" in decisions[31].reason
    assert "from 3 to 2" in decisions[31].reason
    assert "rate 10/s needs 1 instance" in decisions[31].reason


def test_a_returning_peak_resets_the_scale_down_delay() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(window_s=5.0, lead_s=0.0), clock=clock)
    total = 0.0
    decisions: dict[int, ScaleDecision] = {}
    for t in range(70):
        total += 100.0 if 20 <= t < 26 else 10.0  # a 6 s peak that needs 2 instances
        clock.now = float(t)
        scaler.observe(sample(float(t), total))
        decision = scaler.decide(2)
        if decision is not None:
            decisions[t] = decision
    # Low from t = 1, but the peak (t = 20..25) needs both instances: the step down comes
    # 30 s after the load fell again, not at t = 31.
    assert decisions
    assert 50 <= min(decisions) <= 60
    assert all(d.instances == 1 for d in decisions.values())


def test_scaling_stays_within_bounds() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(min_instances=2, max_instances=4), clock=clock)
    feed(scaler, clock, lambda t: 1000 * t, range(10))  # 1000/s needs 15
    decision = scaler.decide(2)
    assert decision is not None
    assert decision.instances == 4
    assert "capped at max_instances 4" in decision.reason
    assert scaler.decide(4) is None

    idle = Autoscaler(
        ScalingPolicy(min_instances=2, max_instances=4, scale_down_after_s=0), clock=clock
    )
    feed(idle, clock, lambda t: 0.0, range(10))
    assessment = idle.assess(2)
    assert assessment is not None
    assert assessment.needed == 2  # no load: min_instances, never below
    assert "kept at min_instances 2" in assessment.reason
    assert idle.decide(2) is None

    outside = scaler.decide(7)
    assert outside == ScaleDecision(4, "7 instances is outside the policy's 2..4")
    below = scaler.decide(1)
    assert below is not None
    assert below.instances == 2


def test_a_queue_longer_than_the_instances_clear_within_the_delay_scales_up() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(max_instances=8), clock=clock)
    # A low rate, but 40 rows waiting; each instance clears one batch of 8 within 2 ms.
    feed(scaler, clock, lambda t: 10 * t, range(5), queued_rows=40)
    decision = scaler.decide(1)
    assert decision is not None
    assert decision.instances == 5
    assert decision.reason == (
        "queue 40 rows exceeds the 8 that 1 instance clears within 2 ms → needs 5 instances"
    )
    assert scaler.decide(5) is None


def test_no_decision_without_recent_samples() -> None:
    clock = Clock()
    scaler = Autoscaler(ScalingPolicy(window_s=30.0), clock=clock)
    assert scaler.decide(1) is None
    scaler.observe(sample(0.0, 0))
    assert scaler.decide(1) is None
    feed(scaler, clock, lambda t: 1000 * t, range(1, 5))
    assert scaler.decide(1) is not None
    clock.now = 100.0  # the newest sample is 96 s old
    assert scaler.decide(1) is None
    scaler.observe(sample(3.0, 0))  # older than the newest: ignored
    assert scaler.assess(1) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_instances": 0},
        {"min_instances": 3, "max_instances": 2},
        {"target_utilisation": 0.0},
        {"target_utilisation": 1.5},
        {"window_s": 0.0},
        {"lead_s": -1.0},
        {"scale_down_after_s": -1.0},
    ],
)
def test_policy_is_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidInput):
        ScalingPolicy(**kwargs)  # type: ignore[arg-type]
