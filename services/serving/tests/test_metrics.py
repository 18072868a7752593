"""The service's Prometheus metrics show up in prometheus_client's default registry."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from prometheus_client import REGISTRY, generate_latest

from gantry.core import InvalidInput
from gantry.serving import metrics
from gantry.serving.batcher import BatchingConfig, DynamicBatcher
from gantry.serving.errors import Overloaded, RequestTimedOut

_names = itertools.count()


def deployment() -> str:
    """A deployment name no other test uses (the registry is process-wide)."""
    return f"metrics-test-{next(_names)}"


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_requests_are_counted_and_timed_per_protocol_and_code() -> None:
    d = deployment()
    metrics.observe_request(d, "v1", "rest", 200, 0.0012)
    metrics.observe_request(d, "v1", "rest", 200, 0.3)
    metrics.observe_request(d, "v1", "grpc", "503", 0.0001)

    ok = {"deployment": d, "version": "v1", "protocol": "rest"}
    assert value("gantry_serving_requests_total", **ok, code="200") == 2
    assert value("gantry_serving_request_seconds_count", **ok) == 2
    assert value("gantry_serving_request_seconds_sum", **ok) == pytest.approx(0.3012)
    assert value("gantry_serving_request_seconds_bucket", **ok, le="0.0015") == 1
    assert value("gantry_serving_request_seconds_bucket", **ok, le="0.0005") == 0
    text = generate_latest(REGISTRY).decode()
    assert (
        f'gantry_serving_requests_total{{code="503",deployment="{d}",protocol="grpc",'
        f'version="v1"}} 1.0' in text
    )


def test_latency_buckets_span_half_a_millisecond_to_ten_seconds() -> None:
    assert metrics.LATENCY_BUCKETS[0] == 0.0005
    assert metrics.LATENCY_BUCKETS[-1] == 10.0
    steps = [b / a for a, b in itertools.pairwise(metrics.LATENCY_BUCKETS)]
    assert max(steps) <= 1.5 + 1e-9  # fine enough to aggregate a p99 across replicas
    assert metrics.BATCH_SIZE_BUCKETS == (1, 2, 4, 8, 16, 32, 64, 128, 256)


def test_gauges_and_rejections() -> None:
    d = deployment()
    labels = {"deployment": d, "version": "v2"}
    metrics.set_queue_length(d, "v2", 7)
    metrics.set_instances(d, "v2", 3)
    metrics.set_canary_weight(d, "v2", 0.25)
    metrics.count_rejected(d, "v2", "overload", 2)
    metrics.count_rejected(d, "v2", "timeout")
    metrics.observe_queue(d, "v2", 0.002)
    metrics.observe_compute(d, "v2", 0.004)
    metrics.observe_batch(d, "v2", 5)

    assert value("gantry_serving_queue_length", **labels) == 7
    assert value("gantry_serving_instances", **labels) == 3
    assert value("gantry_serving_canary_weight", **labels) == 0.25
    assert value("gantry_serving_rejected_total", **labels, reason="overload") == 2
    assert value("gantry_serving_rejected_total", **labels, reason="timeout") == 1
    assert value("gantry_serving_queue_seconds_count", **labels) == 1
    assert value("gantry_serving_compute_seconds_sum", **labels) == pytest.approx(0.004)
    assert value("gantry_serving_batch_size_bucket", **labels, le="4.0") == 0
    assert value("gantry_serving_batch_size_bucket", **labels, le="8.0") == 1
    with pytest.raises(InvalidInput, match=r"share in 0\.\.1"):
        metrics.set_canary_weight(d, "v2", 1.5)


def test_forgetting_a_version_drops_its_series_only() -> None:
    d = deployment()
    for version in ("old", "new"):
        metrics.observe_request(d, version, "rest", 200, 0.01)
        metrics.set_queue_length(d, version, 1)
        metrics.set_canary_weight(d, version, 0.5)
        metrics.count_rejected(d, version, "overload")
    metrics.forget_version(d, "old")

    text = generate_latest(REGISTRY).decode()
    assert f'deployment="{d}",protocol="rest",version="old"' not in text
    assert f'deployment="{d}",version="old"' not in text
    new = {"deployment": d, "version": "new"}
    assert value("gantry_serving_requests_total", **new, protocol="rest", code="200") == 1
    assert value("gantry_serving_canary_weight", deployment=d, version="new") == 0.5
    metrics.forget_version(d, "never-recorded")  # a no-op


async def test_the_batcher_records_through_its_labels() -> None:
    d = deployment()
    labels = {"deployment": d, "version": "v1"}
    gate = threading.Event()

    def model(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        gate.wait(10)
        return [inputs[0] * 2]

    config = BatchingConfig(max_batch_size=1, max_queue_delay_us=0, queue_capacity=2)
    batcher = DynamicBatcher(model, config, instances=1, max_instances=2, labels=labels)
    x = [np.ones((1, 2), np.float32)]
    try:
        assert value("gantry_serving_instances", **labels) == 1
        batcher.set_instances(2)
        assert value("gantry_serving_instances", **labels) == 2
        batcher.set_instances(1)

        running = asyncio.ensure_future(batcher.submit(x))
        waiting = asyncio.ensure_future(batcher.submit(x))
        expiring = asyncio.ensure_future(batcher.submit(x, timeout_s=0.05))
        for _ in range(3):
            await asyncio.sleep(0)
        assert value("gantry_serving_queue_length", **labels) == 2
        with pytest.raises(Overloaded):
            await batcher.submit(x)
        with pytest.raises(RequestTimedOut):
            await expiring
        assert value("gantry_serving_queue_length", **labels) == 1
        assert value("gantry_serving_rejected_total", **labels, reason="overload") == 1
        assert value("gantry_serving_rejected_total", **labels, reason="timeout") == 1

        gate.set()
        await asyncio.gather(running, waiting)
        assert value("gantry_serving_queue_length", **labels) == 0
        assert value("gantry_serving_queue_seconds_count", **labels) == 2
        assert value("gantry_serving_compute_seconds_count", **labels) == 2
        assert value("gantry_serving_batch_size_count", **labels) == 2
        assert value("gantry_serving_batch_size_sum", **labels) == 2
    finally:
        gate.set()
        await batcher.close()
    assert value("gantry_serving_instances", **labels) == 0
