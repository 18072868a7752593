"""The autoscaling policy of a model version: how many instances its load needs.

Pure and clock-injected: the service feeds :meth:`Autoscaler.observe` the batcher's
:class:`~gantry.serving.batcher.LoadSample` every second or so, asks :meth:`Autoscaler.decide`
with the current instance count, applies a :class:`ScaleDecision` with
``DynamicBatcher.set_instances`` and emits an event with the decision's reason. No I/O here.

How many instances the load needs (the larger of two figures, within min..max):

*Rate, ahead of the trend.* The arrival rate of each interval between samples in the last
``window_s`` is fitted with a least-squares line; its value now plus its slope times ``lead_s``
(a rising slope only) is the forecast rate. Each request costs the instance-seconds the version
spent per request over the window (``Δbusy_s / Δcompleted``, which reflects the current batch
sizes), so the forecast needs ``ceil(forecast_rate * service_s_per_request /
target_utilisation)`` instances — more instances *before* the queue grows.

*Queue.* The queue should hold no more than the current instances clear within the max queue
delay: one batch of ``max_batch_size`` rows per instance, or more when batches are faster than
the delay. A longer queue needs ``ceil(queued_rows / rows_one_instance_clears)`` instances.

Scaling up goes straight to the needed count. Scaling down happens only after the load has
needed fewer instances than there are for ``scale_down_after_s`` without a break, and then by
one instance; the next step down waits another ``scale_down_after_s`` (hysteresis, so a dip
does not shed capacity a returning peak needs).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gantry.core import InvalidInput
from gantry.serving.batcher import LoadSample


@dataclass(frozen=True)
class ScalingPolicy:
    """Bounds and targets of a version's autoscaling."""

    min_instances: int = 1
    max_instances: int = 4
    target_utilisation: float = 0.7  #: share of an instance's time the load should fill
    window_s: float = 30.0  #: how far back the arrival-rate trend is fitted
    lead_s: float = 10.0  #: how far ahead the trend is forecast (instances take time to warm)
    scale_down_after_s: float = 30.0  #: how long load must stay low before each step down

    def __post_init__(self) -> None:
        for name in ("min_instances", "max_instances"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"scaling {name} must be an integer >= 1, got {value!r}")
        if self.max_instances < self.min_instances:
            raise InvalidInput(
                f"scaling max_instances ({self.max_instances}) is below min_instances "
                f"({self.min_instances})"
            )
        if not 0.0 < self.target_utilisation <= 1.0:
            raise InvalidInput(
                "scaling target_utilisation is a share of an instance's time in (0, 1], "
                f"got {self.target_utilisation!r}"
            )
        if not self.window_s > 0.0:
            raise InvalidInput(f"scaling window_s must be > 0 seconds, got {self.window_s!r}")
        for name in ("lead_s", "scale_down_after_s"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise InvalidInput(f"scaling {name} must be >= 0 seconds, got {value!r}")


@dataclass(frozen=True)
class ScaleDecision:
    """Run ``instances`` instances, because ``reason`` (words and numbers, for the event)."""

    instances: int
    reason: str


@dataclass(frozen=True)
class Assessment:
    """What the recent samples say the load needs (the figures behind a decision)."""

    rate: float  #: fitted arrival rate now, requests/s
    slope: float  #: its trend, requests/s²
    forecast: float  #: the rate ``lead_s`` ahead (the rate now when the trend is not rising)
    service_s: float | None  #: instance-seconds per request; None until a request completed
    queued_rows: int
    clear_rows: float  #: rows one instance clears within the max queue delay
    needed_for_rate: int
    needed_for_queue: int
    needed: int  #: the larger, within the policy's bounds
    reason: str


class Autoscaler:
    """Decides a version's instance count from its load samples (see the module doc)."""

    def __init__(self, policy: ScalingPolicy, *, clock: Callable[[], float] = time.monotonic):
        self._policy = policy
        self._clock = clock
        self._samples: deque[LoadSample] = deque()
        self._low_since: float | None = None

    @property
    def policy(self) -> ScalingPolicy:
        """The bounds and targets."""
        return self._policy

    def observe(self, sample: LoadSample) -> None:
        """Add a sample (samples not newer than the last one are ignored)."""
        samples = self._samples
        if samples and sample.time <= samples[-1].time:
            return
        samples.append(sample)
        # Keep the window, plus the newest sample just before it (the first interval's start).
        horizon = sample.time - self._policy.window_s
        while len(samples) > 2 and samples[1].time <= horizon:
            samples.popleft()

    def assess(self, current: int) -> Assessment | None:
        """The load's needs per the samples, or None without two samples or when the newest
        is older than the window (the figures are stale)."""
        policy = self._policy
        samples = list(self._samples)
        if len(samples) < 2 or samples[-1].time < self._clock() - policy.window_s:
            return None
        last = samples[-1]

        rate, slope = _fit_rate(samples, at=last.time)
        rising = slope > 0.0
        forecast = max(0.0, rate + slope * policy.lead_s) if rising else max(0.0, rate)
        service_s = _service_s(samples)
        if service_s is None or forecast <= 0.0:
            needed_for_rate = 0
        else:
            needed_for_rate = math.ceil(forecast * service_s / policy.target_utilisation - 1e-9)

        clear_rows = float(last.max_batch_size)
        if last.mean_batch_s > 0.0:
            clear_rows *= max(1.0, last.max_queue_delay_s / last.mean_batch_s)
        threshold = current * clear_rows
        needed_for_queue = (
            math.ceil(last.queued_rows / clear_rows) if last.queued_rows > threshold else 0
        )

        wanted = max(needed_for_rate, needed_for_queue, policy.min_instances)
        needed = min(wanted, policy.max_instances)

        if needed_for_queue >= needed_for_rate and needed_for_queue > current:
            reason = (
                f"queue {last.queued_rows} rows exceeds the {_n(threshold)} that {current} "
                f"instance{_s(current)} clear{'s' if current == 1 else ''} within "
                f"{_n(last.max_queue_delay_s * 1e3)} ms "
                f"→ needs {needed_for_queue} instance{_s(needed_for_queue)}"
            )
        else:
            per_request = (
                f"{_n(service_s * 1e3)} ms per request"
                if service_s is not None
                else "no request completed yet"
            )
            if rising and policy.lead_s > 0.0:
                trend = (
                    f"rate {_n(rate)}/s rising {_n(slope)}/s² → {_n(forecast)}/s in "
                    f"{_n(policy.lead_s)} s"
                )
            elif slope < 0.0:
                trend = f"rate {_n(rate)}/s falling {_n(-slope)}/s²"
            else:
                trend = f"rate {_n(rate)}/s"
            reason = (
                f"{trend} needs {needed_for_rate} instance{_s(needed_for_rate)} at "
                f"{_n(policy.target_utilisation * 100)}% utilisation ({per_request})"
            )
        if wanted > policy.max_instances:
            reason += f", capped at max_instances {policy.max_instances}"
        elif wanted == policy.min_instances > max(needed_for_rate, needed_for_queue):
            reason += f", kept at min_instances {policy.min_instances}"
        return Assessment(
            rate=rate,
            slope=slope,
            forecast=forecast,
            service_s=service_s,
            queued_rows=last.queued_rows,
            clear_rows=clear_rows,
            needed_for_rate=needed_for_rate,
            needed_for_queue=needed_for_queue,
            needed=needed,
            reason=reason,
        )

    def decide(self, current: int) -> ScaleDecision | None:
        """The instance count to change to from ``current``, or None to stay."""
        policy = self._policy
        now = self._clock()
        if current < policy.min_instances or current > policy.max_instances:
            self._low_since = None
            target = min(max(current, policy.min_instances), policy.max_instances)
            return ScaleDecision(
                target,
                f"{current} instance{_s(current)} is outside the policy's "
                f"{policy.min_instances}..{policy.max_instances}",
            )
        assessment = self.assess(current)
        if assessment is None:
            return None
        if assessment.needed > current:
            self._low_since = None
            return ScaleDecision(assessment.needed, assessment.reason)
        if assessment.needed == current:
            self._low_since = None
            return None
        if self._low_since is None:
            self._low_since = now
        low_for = now - self._low_since
        if low_for < policy.scale_down_after_s:
            return None
        self._low_since = now  # the next step down waits again
        return ScaleDecision(
            current - 1,
            f"load low for {_n(low_for)} s: {assessment.reason} → one step down from {current} "
            f"to {current - 1}",
        )


def _fit_rate(samples: list[LoadSample], *, at: float) -> tuple[float, float]:
    """Least-squares line through the interval arrival rates: (value at ``at``, slope)."""
    xs: list[float] = []
    ys: list[float] = []
    for before, after in itertools.pairwise(samples):
        dt = after.time - before.time
        xs.append((before.time + after.time) / 2.0)
        ys.append((after.arrivals_total - before.arrivals_total) / dt)
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0.0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y + slope * (at - mean_x), slope


def _service_s(samples: list[LoadSample]) -> float | None:
    """Instance-seconds per request over the samples (the latest batches' as a fallback)."""
    first, last = samples[0], samples[-1]
    completed = last.completed_total - first.completed_total
    if completed > 0:
        return max(0.0, last.busy_s - first.busy_s) / completed
    if last.mean_batch_s > 0.0 and last.mean_batch_requests > 0.0:
        return last.mean_batch_s / last.mean_batch_requests
    return None


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _n(x: float) -> str:
    """A figure for people: three significant digits, no exponent, no trailing zeros."""
    if x == 0.0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


__all__ = ["Assessment", "Autoscaler", "ScaleDecision", "ScalingPolicy"]
