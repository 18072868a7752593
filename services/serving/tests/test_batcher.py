"""The dynamic batcher, with a numpy "model" (rows * 2) that records the batches it saw.

Timing assertions are bounds with wide margins (the machine is shared); orderings are made
deterministic by holding the model on a gate while requests queue up behind it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from gantry.core import InvalidInput
from gantry.serving.batcher import BatchingConfig, DynamicBatcher
from gantry.serving.errors import (
    BadRequest,
    ModelFailed,
    ModelNotReady,
    Overloaded,
    RequestTimedOut,
)


class Model:
    """rows * 2 for every input; records each batch; optionally slow, gated or failing."""

    def __init__(
        self,
        *,
        sleep_s: float = 0.0,
        gated: bool = False,
        wait_for_peers: int = 0,
        peer_timeout_s: float = 0.0,
    ) -> None:
        self.sleep_s = sleep_s
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.wait_for_peers = wait_for_peers
        self.peer_timeout_s = peer_timeout_s
        self.batches: list[list[np.ndarray]] = []
        self.active = 0
        self.max_active = 0
        self.cond = threading.Condition()

    @property
    def sizes(self) -> list[int]:
        return [batch[0].shape[0] for batch in self.batches]

    def seen(self) -> set[float]:
        """Every first-column value the model computed on."""
        return {
            float(v) for batch in self.batches for v in batch[0].reshape(len(batch[0]), -1)[:, 0]
        }

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        with self.cond:
            self.batches.append([x.copy() for x in inputs])
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.cond.notify_all()
            if self.wait_for_peers:
                # max_active, not active: a peer may be done before this thread wakes.
                self.cond.wait_for(
                    lambda: self.max_active >= self.wait_for_peers, timeout=self.peer_timeout_s
                )
        try:
            self.gate.wait(10)
            if self.sleep_s:
                time.sleep(self.sleep_s)
            if any((x < 0).any() for x in inputs):
                raise RuntimeError("negative input")
            return [x * 2 for x in inputs]
        finally:
            with self.cond:
                self.active -= 1


Make = Callable[..., DynamicBatcher]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    made: list[tuple[DynamicBatcher, Model]] = []

    def factory(model: Model, config: BatchingConfig | None = None, **kw: Any) -> DynamicBatcher:
        batcher = DynamicBatcher(model, config or BatchingConfig(), **kw)
        made.append((batcher, model))
        return batcher

    yield factory
    for batcher, model in made:
        model.gate.set()
        await asyncio.wait_for(batcher.close(), 10)


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


def row(value: float, width: int = 3, dtype: Any = np.float32) -> list[np.ndarray]:
    return [np.full((1, width), value, dtype=dtype)]


async def test_concurrent_requests_share_batches_and_get_their_own_rows(make: Make) -> None:
    model = Model(sleep_s=0.005)
    batcher = make(model, BatchingConfig(max_batch_size=8, max_queue_delay_us=5000))

    outputs = await asyncio.gather(*(batcher.submit(row(i)) for i in range(32)))

    for i, out in enumerate(outputs):
        assert len(out) == 1
        np.testing.assert_array_equal(out[0], np.full((1, 3), 2 * i, dtype=np.float32))
    assert sum(model.sizes) == 32
    assert max(model.sizes) > 1
    assert max(model.sizes) <= 8


async def test_multi_row_requests_are_split_back_by_rows(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=8, max_queue_delay_us=0))
    first = asyncio.ensure_future(batcher.submit(row(100)))
    await until(lambda: batcher.running == 1)
    requests = [np.arange(n * 2, dtype=np.int64).reshape(n, 2) + 10 * n for n in (1, 2, 3)]
    tasks = [asyncio.ensure_future(batcher.submit([r, r.astype(np.float64)])) for r in requests]
    await until(lambda: batcher.queued == 3)
    model.gate.set()

    await first
    for r, task in zip(requests, tasks, strict=True):
        ints, floats = await task
        np.testing.assert_array_equal(ints, r * 2)
        np.testing.assert_array_equal(floats, r.astype(np.float64) * 2)
        assert ints.dtype == np.int64
    assert model.sizes == [1, 6]


async def test_a_lone_request_waits_about_the_queue_delay(make: Make) -> None:
    batcher = make(Model(), BatchingConfig(max_batch_size=8, max_queue_delay_us=100_000))
    start = time.monotonic()
    await batcher.submit(row(1))
    elapsed = time.monotonic() - start
    assert 0.09 <= elapsed < 3.0


async def test_a_full_batch_does_not_wait_for_the_delay(make: Make) -> None:
    model = Model()
    batcher = make(model, BatchingConfig(max_batch_size=4, max_queue_delay_us=30_000_000))
    start = time.monotonic()
    await asyncio.gather(*(batcher.submit(row(i)) for i in range(4)))
    assert time.monotonic() - start < 10.0
    assert model.sizes == [4]


async def test_max_batch_size_one_runs_each_request_alone_without_delay(make: Make) -> None:
    model = Model()
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=30_000_000))
    start = time.monotonic()
    await asyncio.gather(*(batcher.submit(row(i)) for i in range(5)))
    assert time.monotonic() - start < 10.0
    assert model.sizes == [1] * 5


async def test_an_oversize_request_runs_alone(make: Make) -> None:
    model = Model()
    batcher = make(model, BatchingConfig(max_batch_size=4, max_queue_delay_us=0))
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    (out,) = await batcher.submit([x])
    np.testing.assert_array_equal(out, x * 2)
    assert model.sizes == [10]


async def test_a_full_queue_refuses_at_once_with_a_retry_estimate(make: Make) -> None:
    model = Model(gated=True)
    config = BatchingConfig(max_batch_size=1, max_queue_delay_us=0, queue_capacity=4)
    batcher = make(model, config)
    tasks = [asyncio.ensure_future(batcher.submit(row(i))) for i in range(5)]
    await until(lambda: batcher.running == 1 and batcher.queued == 4)

    for _ in range(3):
        with pytest.raises(Overloaded) as refused:
            await batcher.submit(row(99))
        assert refused.value.retry_after_s > 0
        assert batcher.queued == 4

    model.gate.set()
    await asyncio.gather(*tasks)
    assert 99.0 not in model.seen()
    sample = batcher.snapshot()
    assert sample.rejected_total == 3
    assert sample.arrivals_total == 8
    assert sample.completed_total == 5


async def test_the_retry_estimate_follows_the_drain_rate(make: Make) -> None:
    model = Model(sleep_s=0.02)
    config = BatchingConfig(max_batch_size=1, max_queue_delay_us=0, queue_capacity=20)
    batcher = make(model, config)
    await asyncio.gather(*(batcher.submit(row(i)) for i in range(3)))  # learn the batch time
    model.gate.clear()
    tasks = [asyncio.ensure_future(batcher.submit(row(i))) for i in range(21)]
    await until(lambda: batcher.queued == 20)
    with pytest.raises(Overloaded) as refused:
        await batcher.submit(row(99))
    # 20 queued, one instance, one request per batch of >= 20 ms: at least 0.4 s.
    assert 0.3 < refused.value.retry_after_s <= 60
    model.gate.set()
    await asyncio.gather(*tasks)


async def test_a_request_that_times_out_in_the_queue_never_runs(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    first = asyncio.ensure_future(batcher.submit(row(1)))
    await until(lambda: batcher.running == 1)

    with pytest.raises(RequestTimedOut, match="in the queue"):
        await batcher.submit(row(2), timeout_s=0.05)
    assert batcher.queued == 0

    model.gate.set()
    await first
    assert model.seen() == {1.0}
    assert batcher.snapshot().timed_out_total == 1


async def test_a_running_request_times_out_for_its_caller_but_the_batch_finishes(
    make: Make,
) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    with pytest.raises(RequestTimedOut, match="still computing"):
        await batcher.submit(row(1), timeout_s=0.05)
    assert batcher.running == 1
    model.gate.set()
    await until(lambda: batcher.running == 0)
    assert batcher.snapshot().completed_total == 1
    (out,) = await batcher.submit(row(2))
    assert out[0, 0] == 4


async def test_a_failing_batch_fails_only_its_own_requests(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=2, max_queue_delay_us=0))
    first = asyncio.ensure_future(batcher.submit(row(1)))
    await until(lambda: batcher.running == 1)
    tasks = [asyncio.ensure_future(batcher.submit(row(v))) for v in (-1, 2, 3, 4)]
    await until(lambda: batcher.queued == 4)
    model.gate.set()

    results = await asyncio.gather(first, *tasks, return_exceptions=True)

    assert model.sizes == [1, 2, 2]
    assert not isinstance(results[0], BaseException)
    for failed in results[1:3]:
        assert isinstance(failed, ModelFailed)
        assert str(failed).startswith(
            "the model failed on this request's batch: RuntimeError: negative input"
        )
    for ok, value in zip(results[3:], (3, 4), strict=True):
        assert not isinstance(ok, BaseException)
        assert ok[0][0, 0] == 2 * value
    (out,) = await batcher.submit(row(5))
    assert out[0, 0] == 10
    assert batcher.snapshot().failed_total == 2


async def test_a_model_returning_the_wrong_rows_fails_the_batch() -> None:
    def bad(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [inputs[0][:1]]

    def bare(inputs: Sequence[np.ndarray]) -> np.ndarray:
        return inputs[0]

    batcher = DynamicBatcher(bad, BatchingConfig(max_batch_size=4, max_queue_delay_us=0))
    unlisted = DynamicBatcher(bare, BatchingConfig())  # type: ignore[arg-type]
    try:
        with pytest.raises(ModelFailed, match="ValueError: output 0 has shape"):
            await batcher.submit([np.zeros((3, 2), np.float32)])
        with pytest.raises(ModelFailed, match="TypeError: the model returned one array"):
            await unlisted.submit([np.zeros((3, 2), np.float32)])
    finally:
        await batcher.close()
        await unlisted.close()


async def test_different_dtypes_or_trailing_shapes_never_share_a_batch(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=16, max_queue_delay_us=0))
    first = asyncio.ensure_future(batcher.submit(row(0)))
    await until(lambda: batcher.running == 1)
    kinds = [(3, np.float32), (4, np.float32), (3, np.float64)]
    tasks = [asyncio.ensure_future(batcher.submit(row(i, *kinds[i % 3]))) for i in range(1, 10)]
    await until(lambda: batcher.queued == 9)
    model.gate.set()
    await first
    for i, task in enumerate(tasks, start=1):
        (out,) = await task
        width, dtype = kinds[i % 3]
        assert out.shape == (1, width)
        assert out.dtype == dtype
        assert out[0, 0] == 2 * i
    later = [(b[0].shape[0], b[0].shape[1:], b[0].dtype.name) for b in model.batches[1:]]
    assert sorted(later) == [(3, (3,), "float32"), (3, (3,), "float64"), (3, (4,), "float32")]


async def test_drain_waits_for_queued_and_running_requests_and_refuses_new(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    tasks = [asyncio.ensure_future(batcher.submit(row(i))) for i in (1, 2)]
    await until(lambda: batcher.running == 1 and batcher.queued == 1)

    draining = asyncio.ensure_future(batcher.drain())
    await asyncio.sleep(0.05)
    assert not draining.done()
    with pytest.raises(ModelNotReady, match="being removed"):
        await batcher.submit(row(3))

    model.gate.set()
    await asyncio.wait_for(draining, 10)
    assert [out[0][0, 0] for out in await asyncio.gather(*tasks)] == [2, 4]
    assert batcher.queued == 0
    assert batcher.running == 0


async def test_drain_starts_queued_requests_without_waiting_out_the_delay(make: Make) -> None:
    batcher = make(Model(), BatchingConfig(max_batch_size=8, max_queue_delay_us=30_000_000))
    task = asyncio.ensure_future(batcher.submit(row(1)))
    await until(lambda: batcher.queued == 1)
    await asyncio.wait_for(batcher.drain(), 10)
    assert (await task)[0][0, 0] == 2


async def test_close_answers_every_request_at_once_and_does_not_wait_for_the_model(
    make: Make,
) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    running = asyncio.ensure_future(batcher.submit(row(1)))
    queued = asyncio.ensure_future(batcher.submit(row(2)))
    await until(lambda: batcher.queued == 1)

    await asyncio.wait_for(batcher.close(), 10)  # the model is still blocked

    with pytest.raises(ModelNotReady, match="shut down before the request ran"):
        await queued
    with pytest.raises(ModelNotReady, match="shut down while the request ran"):
        await running
    with pytest.raises(ModelNotReady):
        await batcher.submit(row(3))
    model.gate.set()
    await until(lambda: batcher.running == 0)  # the batch finished in the background
    await batcher.close()
    assert model.seen() == {1.0}


async def test_more_instances_run_batches_concurrently(make: Make) -> None:
    model = Model(wait_for_peers=2, peer_timeout_s=0.1)
    config = BatchingConfig(max_batch_size=1, max_queue_delay_us=0)
    batcher = make(model, config, instances=1, max_instances=2)

    await asyncio.gather(batcher.submit(row(1)), batcher.submit(row(2)))
    assert model.max_active == 1

    model.peer_timeout_s = 10.0  # each of the next two waits until the other runs too
    batcher.set_instances(2)
    assert batcher.instances == 2
    await asyncio.wait_for(asyncio.gather(batcher.submit(row(3)), batcher.submit(row(4))), 20)
    assert model.max_active == 2


async def test_raising_instances_starts_waiting_batches_at_once(make: Make) -> None:
    model = Model(gated=True)
    config = BatchingConfig(max_batch_size=1, max_queue_delay_us=0)
    batcher = make(model, config, instances=1, max_instances=3)
    tasks = [asyncio.ensure_future(batcher.submit(row(i))) for i in range(3)]
    await until(lambda: batcher.running == 1 and batcher.queued == 2)
    batcher.set_instances(3)
    assert batcher.running == 3
    assert batcher.queued == 0
    batcher.set_instances(1)  # lowering drops nothing
    model.gate.set()
    assert len(await asyncio.gather(*tasks)) == 3
    assert batcher.snapshot().busy_instances == 0


def test_instances_are_bounded() -> None:
    batcher = DynamicBatcher(Model(), BatchingConfig(), instances=1, max_instances=2)
    for wrong in (0, 3, True):
        with pytest.raises(InvalidInput, match=r"instances must be an integer in 1\.\.2"):
            batcher.set_instances(wrong)
    with pytest.raises(InvalidInput):
        DynamicBatcher(Model(), BatchingConfig(), instances=3, max_instances=2)
    with pytest.raises(InvalidInput, match="labels"):
        DynamicBatcher(Model(), BatchingConfig(), labels={"model": "x"})


async def test_a_cancelled_caller_leaves_the_queue(make: Make) -> None:
    model = Model(gated=True)
    batcher = make(model, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    first = asyncio.ensure_future(batcher.submit(row(1)))
    second = asyncio.ensure_future(batcher.submit(row(2)))
    await until(lambda: batcher.queued == 1)

    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert batcher.queued == 0

    model.gate.set()
    await first
    assert model.seen() == {1.0}
    assert batcher.snapshot().cancelled_total == 1


async def test_malformed_requests_are_bad_requests(make: Make) -> None:
    batcher = make(Model())
    cases: list[tuple[Any, str]] = [
        ([], "no inputs"),
        ([np.float32(1.0)], "not a numpy array"),
        ([np.array(1.0)], "scalar"),
        ([np.zeros((2, 3)), np.zeros((3, 3))], "same number of rows"),
        ([np.zeros((0, 3))], "0 rows"),
        (np.zeros((2, 3)), "sequence of arrays"),
    ]
    for inputs, message in cases:
        with pytest.raises(BadRequest, match=message):
            await batcher.submit(inputs)
    with pytest.raises(BadRequest, match="timeout"):
        await batcher.submit(row(1), timeout_s=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch_size", 0),
        ("max_queue_delay_us", -1),
        ("queue_capacity", 0),
        ("timeout_s", 0.0),
        ("max_batch_size", 2.5),
    ],
)
def test_config_is_validated(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=field):
        BatchingConfig(**{field: value})


async def test_snapshot_counts_the_load(make: Make) -> None:
    ticks = itertools.count()  # a clock that advances one second per reading
    model = Model(gated=True)
    batcher = make(
        model,
        BatchingConfig(max_batch_size=2, max_queue_delay_us=0),
        clock=lambda: float(next(ticks)),
    )
    tasks = [asyncio.ensure_future(batcher.submit(row(i))) for i in range(3)]
    await until(lambda: batcher.running == 1 and batcher.queued == 2)
    during = batcher.snapshot()
    assert (during.queued, during.queued_rows, during.running, during.running_rows) == (2, 2, 1, 1)
    assert during.busy_instances == 1
    assert during.utilisation == 1.0
    assert during.arrivals_total == 3
    model.gate.set()
    await asyncio.gather(*tasks)
    after = batcher.snapshot()
    assert after.completed_total == 3
    assert after.batches_total == 2
    assert after.busy_s > 0
    assert after.mean_batch_s > 0
    assert after.time > during.time
    assert after.max_batch_size == 2


async def test_a_no_op_model_adds_little_per_request(make: Make) -> None:
    batcher = make(Model(), BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
    x = row(1)
    await batcher.submit(x)  # start the worker thread
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        await batcher.submit(x)
    per_request = (time.perf_counter() - start) / n
    assert per_request < 0.01  # typically ~0.15 ms; a wide margin for a busy machine
