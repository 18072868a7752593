"""The serving service's Prometheus metrics, and typed helpers to record them.

Every metric is a module-level object in prometheus_client's default ``REGISTRY`` (so the
service's ``/metrics`` endpoint exposes them), named ``gantry_serving_*``. Code elsewhere in
the service records through the helper functions below (or a :class:`VersionMetrics` bound to
one deployment version, which caches the labelled children for the hot path) and never touches
the raw objects, so label names and values stay consistent.

Labels: ``deployment`` (the deployment's name), ``version`` (the model version serving it),
``protocol`` (``rest`` or ``grpc``), ``code`` (the HTTP status the request was answered with,
e.g. ``"200"``, ``"503"``; the gRPC front end maps its codes to the same statuses),
``reason`` (why a request was refused without running: ``overload`` = the queue was full,
``timeout`` = its timeout passed while it was still queued).

Latency buckets run from 0.5 ms to 10 s on a 1-1.5-2-3-4-5-7.5 grid per decade, fine enough
to aggregate p99 across replicas with ``histogram_quantile(0.99, sum by (le) (rate(...)))``
to within one bucket step (≤ 50 % relative, usually 25 to 33 %).
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

from gantry.core import InvalidInput

#: Request latency buckets, seconds: 0.5 ms .. 10 s.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    5.0,
    7.5,
    10.0,
)
#: Queue and compute time buckets: the latency buckets, finer below 0.5 ms (a no-op batch).
STAGE_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, *LATENCY_BUCKETS)
#: Batch size buckets, rows: 1, 2, 4, ..., 256.
BATCH_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(9))

Protocol = Literal["rest", "grpc"]
RejectReason = Literal["overload", "timeout"]

REQUESTS = Counter(
    "gantry_serving_requests_total",
    "Inference requests answered, by deployment, version, protocol and HTTP status code.",
    ["deployment", "version", "protocol", "code"],
)
REQUEST_SECONDS = Histogram(
    "gantry_serving_request_seconds",
    "Time from a request's arrival at the front end to its answer, seconds.",
    ["deployment", "version", "protocol"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_SECONDS = Histogram(
    "gantry_serving_queue_seconds",
    "Time a request waited in its version's batching queue before its batch started, seconds.",
    ["deployment", "version"],
    buckets=STAGE_BUCKETS,
)
COMPUTE_SECONDS = Histogram(
    "gantry_serving_compute_seconds",
    "Time the model took to compute a request's batch, seconds (observed once per request).",
    ["deployment", "version"],
    buckets=STAGE_BUCKETS,
)
BATCH_SIZE = Histogram(
    "gantry_serving_batch_size",
    "Rows per batch the model ran.",
    ["deployment", "version"],
    buckets=BATCH_SIZE_BUCKETS,
)
QUEUE_LENGTH = Gauge(
    "gantry_serving_queue_length",
    "Requests waiting in the version's batching queue.",
    ["deployment", "version"],
)
INSTANCES = Gauge(
    "gantry_serving_instances",
    "Model instances (concurrent batches) the version runs with.",
    ["deployment", "version"],
)
CANARY_WEIGHT = Gauge(
    "gantry_serving_canary_weight",
    "Share of the deployment's traffic routed to the version, 0..1.",
    ["deployment", "version"],
)
REJECTED = Counter(
    "gantry_serving_rejected_total",
    "Requests refused without running: overload = queue full, timeout = expired while queued.",
    ["deployment", "version", "reason"],
)

_VERSION_METRICS = (QUEUE_SECONDS, COMPUTE_SECONDS, BATCH_SIZE, QUEUE_LENGTH, INSTANCES)


def observe_request(
    deployment: str, version: str, protocol: Protocol, code: int | str, seconds: float
) -> None:
    """Count one answered request and record its end-to-end latency."""
    REQUESTS.labels(deployment, version, protocol, str(code)).inc()
    REQUEST_SECONDS.labels(deployment, version, protocol).observe(seconds)


def observe_queue(deployment: str, version: str, seconds: float) -> None:
    """Record how long one request waited in the batching queue."""
    QUEUE_SECONDS.labels(deployment, version).observe(seconds)


def observe_compute(deployment: str, version: str, seconds: float) -> None:
    """Record how long the model took on one request's batch."""
    COMPUTE_SECONDS.labels(deployment, version).observe(seconds)


def observe_batch(deployment: str, version: str, rows: int) -> None:
    """Record the size (rows) of one batch the model ran."""
    BATCH_SIZE.labels(deployment, version).observe(rows)


def set_queue_length(deployment: str, version: str, requests: int) -> None:
    """Set how many requests wait in the version's queue."""
    QUEUE_LENGTH.labels(deployment, version).set(requests)


def set_instances(deployment: str, version: str, instances: int) -> None:
    """Set how many model instances the version runs with."""
    INSTANCES.labels(deployment, version).set(instances)


def set_canary_weight(deployment: str, version: str, weight: float) -> None:
    """Set the share (0..1) of the deployment's traffic the version receives."""
    if not 0.0 <= weight <= 1.0:
        raise InvalidInput(f"a traffic weight is a share in 0..1, got {weight}")
    CANARY_WEIGHT.labels(deployment, version).set(weight)


def count_rejected(deployment: str, version: str, reason: RejectReason, n: int = 1) -> None:
    """Count requests refused without running (``overload`` or ``timeout``)."""
    REJECTED.labels(deployment, version, reason).inc(n)


def forget_version(deployment: str, version: str) -> None:
    """Drop every series of a removed version (so its gauges stop reporting stale values)."""
    for metric in (*_VERSION_METRICS, CANARY_WEIGHT):
        metric.remove(deployment, version)  # a no-op for a series never recorded
    for labelled in (REQUESTS, REQUEST_SECONDS, REJECTED):
        # prometheus_client keeps the children in ``_metrics``; there is no public listing.
        for labels in list(labelled._metrics):
            if tuple(labels[:2]) == (deployment, version):
                labelled.remove(*labels)


class VersionMetrics:
    """The per-version metrics of one deployment version, children looked up once.

    The batcher records through one of these on its hot path (a labelled child lookup takes
    a lock and a dict lookup per call; a cached child skips both).
    """

    __slots__ = (
        "_batch",
        "_compute",
        "_instances",
        "_queue",
        "_queue_length",
        "_rejected",
        "deployment",
        "version",
    )

    def __init__(self, deployment: str, version: str) -> None:
        self.deployment = deployment
        self.version = version
        self._queue = QUEUE_SECONDS.labels(deployment, version)
        self._compute = COMPUTE_SECONDS.labels(deployment, version)
        self._batch = BATCH_SIZE.labels(deployment, version)
        self._queue_length = QUEUE_LENGTH.labels(deployment, version)
        self._instances = INSTANCES.labels(deployment, version)
        self._rejected: dict[str, Counter] = {}

    def observe_queue(self, seconds: float) -> None:
        """Record one request's wait in the queue."""
        self._queue.observe(seconds)

    def observe_compute(self, seconds: float) -> None:
        """Record the compute time of one request's batch."""
        self._compute.observe(seconds)

    def observe_batch(self, rows: int) -> None:
        """Record one batch's size in rows."""
        self._batch.observe(rows)

    def set_queue_length(self, requests: int) -> None:
        """Set the queue length gauge."""
        self._queue_length.set(requests)

    def set_instances(self, instances: int) -> None:
        """Set the instances gauge."""
        self._instances.set(instances)

    def count_rejected(self, reason: RejectReason, n: int = 1) -> None:
        """Count requests refused without running."""
        child = self._rejected.get(reason)
        if child is None:
            child = self._rejected[reason] = REJECTED.labels(self.deployment, self.version, reason)
        child.inc(n)


__all__ = [
    "BATCH_SIZE",
    "BATCH_SIZE_BUCKETS",
    "CANARY_WEIGHT",
    "COMPUTE_SECONDS",
    "INSTANCES",
    "LATENCY_BUCKETS",
    "QUEUE_LENGTH",
    "QUEUE_SECONDS",
    "REJECTED",
    "REQUESTS",
    "REQUEST_SECONDS",
    "STAGE_BUCKETS",
    "Protocol",
    "RejectReason",
    "VersionMetrics",
    "count_rejected",
    "forget_version",
    "observe_batch",
    "observe_compute",
    "observe_queue",
    "observe_request",
    "set_canary_weight",
    "set_instances",
    "set_queue_length",
]
