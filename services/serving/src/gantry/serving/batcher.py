"""Dynamic batching of inference requests, in the manner of Triton's dynamic batcher.

A :class:`DynamicBatcher` sits in front of one model version. Callers :meth:`~DynamicBatcher.
submit` requests of one or more rows (dim 0 of every input); the batcher queues them, joins
waiting requests whose inputs have the same dtypes and trailing shapes into batches of at most
``max_batch_size`` rows (concatenated along dim 0), runs each batch on one of the version's
*instances* and splits the outputs back to the callers by rows.

When a batch starts
    As soon as an instance is free and either ``max_batch_size`` rows of one kind are waiting,
    or the oldest request of that kind has waited ``max_queue_delay_us``, or the queue is full
    (waiting longer cannot add rows), or the batcher is draining. Among the kinds that may
    start, the one whose oldest request came first goes first; within a kind requests are
    taken in arrival order, never skipped. ``max_batch_size == 1`` disables batching: each
    request runs alone, without delay. (asyncio's selector waits in whole milliseconds, so a
    delay below 1 ms is in effect about 1 ms for a lone request.)

Oversize requests
    A request of more rows than ``max_batch_size`` is *not* refused: it runs alone, as one
    batch of its own size. ``max_batch_size`` is the batching knob (how many rows the batcher
    joins; 1 = no batching), not a model limit: input limits of the model are checked against
    its metadata before a request reaches the batcher.

Instances and threads
    ``run`` (the model's forward pass) is synchronous. Each instance is a dedicated worker
    thread taking batches from a shared hand-off queue; the batcher never lets more than
    ``instances`` batches run at once and keeps at least ``instances`` threads (started when
    first needed, at most ``max_instances``), so every batch it starts has a thread to itself
    at once (torch and numpy release the GIL while they compute). (Not a
    ``ThreadPoolExecutor``: it may queue a work item behind a busy thread instead of starting
    another.) :meth:`~DynamicBatcher.set_instances` changes the limit at run time within
    ``1..max_instances``: raising it starts waiting batches at once, lowering it lets running
    batches finish and starts no new one until fewer than ``instances`` run; threads beyond
    the limit stay idle until :meth:`~DynamicBatcher.close`. The event loop only queues, forms
    batches and resolves futures; joining inputs, running the model and splitting outputs
    happen on the worker thread, which hands the results back with ``loop.call_soon_threadsafe``.

Overload, timeouts, failures
    The queue holds at most ``queue_capacity`` requests; one more is refused at once with
    :class:`~gantry.serving.errors.Overloaded` whose ``retry_after_s`` is the time the
    current instances need to clear the queue: queued requests / drain rate, the drain rate
    being ``instances * requests per batch / batch service time`` (moving averages of recent
    batches; when the queue is full every instance is busy, so this is the recent
    throughput). Before any batch has finished it is 1 s; it is capped at 60 s. The front
    end rounds it up to whole seconds for ``Retry-After``.
    A request whose timeout passes while it waits is dropped and gets
    :class:`~gantry.serving.errors.RequestTimedOut` — it never runs. One whose timeout passes
    while its batch runs gets RequestTimedOut too, at its deadline; the batch still finishes.
    When ``run`` raises, every request of the batch gets
    :class:`~gantry.serving.errors.ModelFailed` and the batcher goes on serving. A caller
    cancelled while its request waits (the client went away) takes the request out of the
    queue.

Load figures
    :attr:`~DynamicBatcher.queued`, :attr:`~DynamicBatcher.running` and
    :meth:`~DynamicBatcher.snapshot` (a :class:`LoadSample` of gauges and running totals) are
    what the autoscaler and the canary analysis read.

Metrics
    With ``labels`` (``deployment`` and ``version``) the batcher records queue and compute
    time per request, rows per batch, the queue length, the instances and the requests it
    refused in :mod:`gantry.serving.metrics`. Without labels it records nothing.

Every method must be called on the event loop the batcher serves (the loop of its first
:meth:`~DynamicBatcher.submit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gantry.core import InvalidInput
from gantry.serving.errors import (
    BadRequest,
    ModelFailed,
    ModelNotReady,
    Overloaded,
    RequestTimedOut,
)
from gantry.serving.metrics import VersionMetrics

#: A model's forward pass: inputs batched along dim 0 in, outputs batched along dim 0 out.
RunFn = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]

_QUEUED, _RUNNING, _DONE = 0, 1, 2
_EWMA = 0.2  #: weight of the newest batch in the moving averages
_RETRY_AFTER_UNKNOWN_S = 1.0
_RETRY_AFTER_MAX_S = 60.0
_TIMER_SLACK_S = 1e-6  #: asyncio may fire a timer up to its clock resolution early


@dataclass(frozen=True)
class BatchingConfig:
    """How a version batches: Triton's ``dynamic_batching`` settings.

    ``max_batch_size``: most rows joined into one batch (1 = no batching).
    ``max_queue_delay_us``: longest a request waits for others to join it (0 = never wait).
    ``queue_capacity``: most requests waiting; one more is refused with Overloaded.
    ``timeout_s``: default per-request timeout, from submission to answer.
    """

    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    queue_capacity: int = 512
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        _check_int("max_batch_size", self.max_batch_size, minimum=1)
        _check_int("max_queue_delay_us", self.max_queue_delay_us, minimum=0)
        _check_int("queue_capacity", self.queue_capacity, minimum=1)
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or not self.timeout_s > 0
        ):
            raise InvalidInput(
                f"batching timeout_s must be a positive number of seconds, got {self.timeout_s!r}",
                hint="e.g. timeout_s=30.0",
            )

    @property
    def max_queue_delay_s(self) -> float:
        """``max_queue_delay_us`` in seconds."""
        return self.max_queue_delay_us / 1e6


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(
            f"batching {name} must be an integer >= {minimum}, got {value!r}",
            hint=f"set {name} to a whole number of at least {minimum}",
        )


@dataclass(frozen=True)
class LoadSample:
    """The batcher's load at one moment: gauges, and running totals since it started.

    Rates come from the difference of two samples' totals over their ``time`` difference.
    """

    time: float  #: the batcher's clock when the sample was taken, seconds
    instances: int  #: batches allowed to run at once
    busy_instances: int  #: batches running now
    queued: int  #: requests waiting
    queued_rows: int
    running: int  #: requests in running batches
    running_rows: int
    arrivals_total: int  #: requests submitted and checked: accepted + refused as overload
    completed_total: int  #: requests whose batch finished (answered, or ModelFailed)
    failed_total: int  #: of those, requests whose batch raised
    rejected_total: int  #: refused because the queue was full
    timed_out_total: int  #: dropped from the queue when their timeout passed
    cancelled_total: int  #: taken out of the queue because their caller went away
    batches_total: int  #: batches finished
    busy_s: float  #: instance-seconds spent running batches, including those running now
    mean_batch_s: float  #: moving average of a batch's service time (0 before the first)
    mean_batch_rows: float  #: moving average of rows per batch
    mean_batch_requests: float  #: moving average of requests per batch
    max_batch_size: int
    max_queue_delay_s: float

    @property
    def utilisation(self) -> float:
        """Share of the instances running a batch right now."""
        return self.busy_instances / self.instances if self.instances else 0.0


class _Request:
    __slots__ = ("due", "enqueued", "future", "inputs", "key", "rows", "state", "timer")

    def __init__(
        self,
        inputs: tuple[np.ndarray, ...],
        rows: int,
        key: Hashable,
        future: asyncio.Future[list[np.ndarray]],
        enqueued: float,
        due: float,
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.key = key
        self.future = future
        self.enqueued = enqueued  #: batcher clock, for queue time
        self.due = due  #: loop clock: when its queue delay is up
        self.state = _QUEUED
        self.timer: asyncio.TimerHandle | None = None


class _Group:
    """Waiting requests whose inputs can be joined: same dtypes and trailing shapes."""

    __slots__ = ("key", "requests", "rows")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.requests: deque[_Request] = deque()
        self.rows = 0


class _Batch:
    __slots__ = ("requests", "rows", "started")

    def __init__(self, requests: list[_Request], rows: int, started: float) -> None:
        self.requests = requests
        self.rows = rows
        self.started = started


class DynamicBatcher:
    """Queues requests for one model version and runs them in batches on its instances."""

    def __init__(
        self,
        run: RunFn,
        config: BatchingConfig,
        *,
        instances: int = 1,
        max_instances: int | None = None,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_instances`` (default: ``instances``) bounds :meth:`set_instances` and the
        worker threads. ``labels`` (``deployment``, ``version``) name the version in
        metrics and messages; ``clock`` measures times for metrics and :meth:`snapshot`."""
        if max_instances is None:
            max_instances = instances
        _check_instances("max_instances", max_instances, 1, None)
        _check_instances("instances", instances, 1, max_instances)
        labels = dict(labels or {})
        unknown = sorted(set(labels) - {"deployment", "version"})
        if unknown:
            raise InvalidInput(
                f"batcher labels are 'deployment' and 'version', not {', '.join(unknown)}"
            )
        self._run = run
        self._config = config
        self._clock = clock
        self._instances = instances
        self._max_instances = max_instances
        self._metrics: VersionMetrics | None = None
        if labels:
            deployment, version = labels.get("deployment", ""), labels.get("version", "")
            self._name = f"model {deployment!r} version {version!r}"
            self._metrics = VersionMetrics(deployment, version)
            self._metrics.set_instances(instances)
            self._metrics.set_queue_length(0)
        else:
            self._name = "the model"
        self._work: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._groups: dict[Hashable, _Group] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = math.inf
        self._running_batches: set[_Batch] = set()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._accepting = True
        self._flushing = False  # draining or closing: start batches without waiting
        self._closed = False
        # gauges
        self._queued = 0
        self._queued_rows = 0
        self._running = 0
        self._running_rows = 0
        # totals
        self._arrivals = 0
        self._completed = 0
        self._failed = 0
        self._rejected = 0
        self._timed_out = 0
        self._cancelled = 0
        self._batches = 0
        self._busy_s = 0.0
        # moving averages of finished batches
        self._mean_batch_s = 0.0
        self._mean_batch_rows = 0.0
        self._mean_batch_requests = 0.0

    # -- figures ------------------------------------------------------------------------------

    @property
    def config(self) -> BatchingConfig:
        """The batching settings."""
        return self._config

    @property
    def instances(self) -> int:
        """How many batches may run at once."""
        return self._instances

    @property
    def max_instances(self) -> int:
        """The most instances :meth:`set_instances` accepts."""
        return self._max_instances

    @property
    def queued(self) -> int:
        """Requests waiting to start."""
        return self._queued

    @property
    def running(self) -> int:
        """Requests in batches that are running (including ones whose callers gave up)."""
        return self._running

    @property
    def accepting(self) -> bool:
        """False once :meth:`drain` or :meth:`close` was called."""
        return self._accepting

    def snapshot(self) -> LoadSample:
        """The load now, for the autoscaler and the canary analysis."""
        now = self._clock()
        busy = self._busy_s + sum(max(0.0, now - b.started) for b in self._running_batches)
        return LoadSample(
            time=now,
            instances=self._instances,
            busy_instances=len(self._running_batches),
            queued=self._queued,
            queued_rows=self._queued_rows,
            running=self._running,
            running_rows=self._running_rows,
            arrivals_total=self._arrivals,
            completed_total=self._completed,
            failed_total=self._failed,
            rejected_total=self._rejected,
            timed_out_total=self._timed_out,
            cancelled_total=self._cancelled,
            batches_total=self._batches,
            busy_s=busy,
            mean_batch_s=self._mean_batch_s,
            mean_batch_rows=self._mean_batch_rows,
            mean_batch_requests=self._mean_batch_requests,
            max_batch_size=self._config.max_batch_size,
            max_queue_delay_s=self._config.max_queue_delay_s,
        )

    # -- control ------------------------------------------------------------------------------

    def set_instances(self, n: int) -> None:
        """Let ``n`` batches (1..max_instances) run at once, from now on; nothing is dropped."""
        _check_instances("instances", n, 1, self._max_instances)
        self._instances = n
        if self._metrics is not None and not self._closed:
            self._metrics.set_instances(n)
        if self._loop is not None and not self._closed:
            self._pump()

    async def drain(self) -> None:
        """Refuse new requests (ModelNotReady) and return once every queued and running
        request is finished. Queued requests start without waiting out the queue delay."""
        self._accepting = False
        self._flushing = True
        if self._loop is None:
            return
        self._pump()
        await self._until_idle()

    async def close(self) -> None:
        """Shut down at once: refuse new requests, answer every queued and running request
        ModelNotReady, and let the worker threads end after their current batch (a thread
        cannot be interrupted: a running batch finishes in the background, its outputs
        dropped). Returns without waiting for the model; call :meth:`drain` first (with a
        timeout) for a graceful stop. Closing twice does nothing."""
        self._accepting = False
        self._flushing = True
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for group in list(self._groups.values()):
            for request in list(group.requests):
                self._unqueue(request)
                if not request.future.done():
                    request.future.set_exception(
                        ModelNotReady(f"{self._name} was shut down before the request ran")
                    )
        for batch in self._running_batches:
            for request in batch.requests:
                if not request.future.done():
                    request.future.set_exception(
                        ModelNotReady(f"{self._name} was shut down while the request ran")
                    )
        for _ in self._threads:
            self._work.put(None)  # each worker thread ends when it takes one
        if self._metrics is not None:
            self._metrics.set_queue_length(0)
            self._metrics.set_instances(0)

    # -- requests -----------------------------------------------------------------------------

    async def submit(
        self, inputs: Sequence[np.ndarray], *, timeout_s: float | None = None
    ) -> list[np.ndarray]:
        """Run one request of ``n >= 1`` rows (dim 0 of every input) and return its outputs
        (``n`` rows each). ``timeout_s`` overrides the configured timeout.

        Raises BadRequest (malformed inputs or timeout), Overloaded (queue full),
        RequestTimedOut, ModelFailed, ModelNotReady (draining or closed)."""
        if not self._accepting:
            raise ModelNotReady(
                f"{self._name} is being removed and takes no new requests",
                hint="retry: the deployment routes new requests to another version",
            )
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        rows, key = _describe(inputs)
        timeout = self._config.timeout_s if timeout_s is None else timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise BadRequest(
                f"a request's timeout must be a positive number of seconds, not {timeout!r}"
            )
        self._arrivals += 1
        if self._queued >= self._config.queue_capacity:
            self._rejected += 1
            if self._metrics is not None:
                self._metrics.count_rejected("overload")
            retry_after = self._retry_after()
            raise Overloaded(
                f"{self._name} is overloaded: {self._queued} requests are already waiting, "
                f"the most its queue holds",
                retry_after_s=retry_after,
                hint=f"retry in {retry_after:.2g} s",
            )
        request = _Request(
            tuple(inputs),
            rows,
            key,
            loop.create_future(),
            self._clock(),
            loop.time() + self._config.max_queue_delay_s,
        )
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
        group.requests.append(request)
        group.rows += rows
        self._queued += 1
        self._queued_rows += rows
        if math.isfinite(timeout):
            request.timer = loop.call_later(timeout, self._expire, request, timeout)
        self._pump()
        if self._metrics is not None:
            self._metrics.set_queue_length(self._queued)
        try:
            return await request.future
        except asyncio.CancelledError:
            if request.state == _QUEUED:
                self._unqueue(request)
                self._cancelled += 1
            raise
        finally:
            if request.timer is not None:
                request.timer.cancel()
                request.timer = None

    # -- the queue (event loop) ---------------------------------------------------------------

    def _pump(self) -> None:
        """Start every batch that may start now; arm the timer for the next one that may."""
        while self._queued and len(self._running_batches) < self._instances:
            group = self._ready_group()
            if group is None:
                self._arm_timer()
                return
            self._dispatch(group)

    def _ready_group(self) -> _Group | None:
        assert self._loop is not None
        flush = self._flushing or self._queued >= self._config.queue_capacity
        now = self._loop.time() + _TIMER_SLACK_S
        full = self._config.max_batch_size
        best: _Group | None = None
        for group in self._groups.values():
            head = group.requests[0]
            if (flush or group.rows >= full or head.due <= now) and (
                best is None or head.due < best.requests[0].due
            ):
                best = group
        return best

    def _arm_timer(self) -> None:
        assert self._loop is not None
        due = min(group.requests[0].due for group in self._groups.values())
        if self._timer is not None:
            if self._timer_due <= due:
                return  # fires first anyway, and re-arms
            self._timer.cancel()
        self._timer = self._loop.call_at(due, self._on_timer)
        self._timer_due = due

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_due = math.inf
        self._pump()

    def _dispatch(self, group: _Group) -> None:
        full = self._config.max_batch_size
        waiting = group.requests
        taken: list[_Request] = []
        rows = 0
        while waiting:
            request = waiting[0]
            if taken and rows + request.rows > full:
                break
            waiting.popleft()
            request.state = _RUNNING
            taken.append(request)
            rows += request.rows
            if rows >= full:
                break
        group.rows -= rows
        if not waiting:
            del self._groups[group.key]
        self._queued -= len(taken)
        self._queued_rows -= rows
        self._running += len(taken)
        self._running_rows += rows
        batch = _Batch(taken, rows, self._clock())
        self._running_batches.add(batch)
        if self._metrics is not None:
            self._metrics.set_queue_length(self._queued)
        if len(self._threads) < len(self._running_batches):
            thread = threading.Thread(
                target=self._worker,
                name=f"gantry-batcher-{len(self._threads)}",
                daemon=True,  # a hung model must not keep the process from exiting
            )
            thread.start()
            self._threads.append(thread)
        self._work.put(batch)

    def _unqueue(self, request: _Request) -> None:
        group = self._groups[request.key]
        group.requests.remove(request)
        group.rows -= request.rows
        if not group.requests:
            del self._groups[request.key]
        request.state = _DONE
        self._queued -= 1
        self._queued_rows -= request.rows
        if self._metrics is not None:
            self._metrics.set_queue_length(self._queued)
        self._wake_if_idle()

    def _expire(self, request: _Request, timeout: float) -> None:
        request.timer = None
        if request.future.done():
            return
        if request.state == _QUEUED:
            self._unqueue(request)
            self._timed_out += 1
            if self._metrics is not None:
                self._metrics.count_rejected("timeout")
            error = RequestTimedOut(
                f"the request waited its whole timeout ({timeout:g} s) in the queue of "
                f"{self._name} without starting",
                hint="the model is overloaded: retry later, or allow a longer timeout",
            )
        else:
            error = RequestTimedOut(
                f"the request was not answered within its timeout ({timeout:g} s): "
                f"{self._name} was still computing it",
                hint="allow a longer timeout, or send smaller requests",
            )
        request.future.set_exception(error)

    def _retry_after(self) -> float:
        """Seconds the current instances need to clear the queue, from recent batches."""
        if self._mean_batch_s <= 0.0:
            return _RETRY_AFTER_UNKNOWN_S
        drain_rate = self._instances * self._mean_batch_requests / self._mean_batch_s
        return min(max(self._queued / drain_rate, 1e-3), _RETRY_AFTER_MAX_S)

    async def _until_idle(self) -> None:
        if not self._queued and not self._running_batches:
            return
        assert self._loop is not None
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._idle_waiters.append(waiter)
        await waiter

    def _wake_if_idle(self) -> None:
        if self._queued or self._running_batches or not self._idle_waiters:
            return
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- a batch (worker thread, then the event loop) -----------------------------------------

    def _worker(self) -> None:
        """A worker thread (an instance): runs batches until it takes None."""
        while (batch := self._work.get()) is not None:
            self._execute(batch)

    def _execute(self, batch: _Batch) -> None:
        """Worker thread: join the inputs, run the model, split the outputs, hand back."""
        start = self._clock()
        results: list[list[np.ndarray]] | None = None
        error: BaseException | None = None
        try:
            results = self._compute(batch)
        except BaseException as exc:  # the model's failure is the answer to its batch
            error = exc
        end = self._clock()
        if self._metrics is not None:
            self._metrics.observe_batch(batch.rows)
            for request in batch.requests:
                self._metrics.observe_queue(max(0.0, start - request.enqueued))
                self._metrics.observe_compute(end - start)
        assert self._loop is not None
        # A closed loop (RuntimeError) has nobody left waiting for the answers.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._finish, batch, results, error, end)

    def _compute(self, batch: _Batch) -> list[list[np.ndarray]]:
        requests = batch.requests
        if len(requests) == 1:
            inputs: Sequence[np.ndarray] = requests[0].inputs
        else:
            inputs = [
                np.concatenate([request.inputs[i] for request in requests], axis=0)
                for i in range(len(requests[0].inputs))
            ]
        returned = self._run(inputs)
        if isinstance(returned, np.ndarray):  # iterating it would take rows for outputs
            raise TypeError("the model returned one array, not a list of output arrays")
        outputs = [np.asarray(output) for output in returned]
        for i, output in enumerate(outputs):
            if output.ndim == 0 or output.shape[0] != batch.rows:
                raise ValueError(
                    f"output {i} has shape {output.shape}, but a batch of {batch.rows} rows "
                    f"needs {batch.rows} rows along dim 0"
                )
        if len(requests) == 1:
            return [outputs]
        results: list[list[np.ndarray]] = []
        offset = 0
        for request in requests:
            end = offset + request.rows
            results.append([output[offset:end] for output in outputs])
            offset = end
        return results

    def _finish(
        self,
        batch: _Batch,
        results: list[list[np.ndarray]] | None,
        error: BaseException | None,
        end: float,
    ) -> None:
        """Event loop: answer the batch's requests and start what may start next."""
        self._running_batches.discard(batch)
        requests = batch.requests
        n = len(requests)
        self._running -= n
        self._running_rows -= batch.rows
        self._completed += n
        self._batches += 1
        service_s = max(0.0, end - batch.started)
        self._busy_s += service_s
        if self._batches == 1:
            self._mean_batch_s = service_s
            self._mean_batch_rows = batch.rows
            self._mean_batch_requests = n
        else:
            self._mean_batch_s += _EWMA * (service_s - self._mean_batch_s)
            self._mean_batch_rows += _EWMA * (batch.rows - self._mean_batch_rows)
            self._mean_batch_requests += _EWMA * (n - self._mean_batch_requests)
        message = ""
        if error is not None:
            self._failed += n
            message = f"the model failed on this request's batch: {type(error).__name__}: {error}"
        for i, request in enumerate(requests):
            request.state = _DONE
            future = request.future
            if future.done():  # timed out or cancelled while running
                continue
            if results is not None:
                future.set_result(results[i])
            else:
                future.set_exception(ModelFailed(message))
        if not self._closed:
            self._pump()
        self._wake_if_idle()


def _describe(inputs: Sequence[np.ndarray]) -> tuple[int, Hashable]:
    """A request's rows, and the key of the requests it may share a batch with."""
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
        raise BadRequest("a request's inputs are a sequence of arrays, one per model input")
    if not inputs:
        raise BadRequest("the request has no inputs; send at least one tensor")
    rows = -1
    key: list[tuple[np.dtype[np.generic], tuple[int, ...]]] = []
    for i, array in enumerate(inputs):
        if not isinstance(array, np.ndarray):
            raise BadRequest(f"input {i} is a {type(array).__name__}, not a numpy array")
        if array.ndim == 0:
            raise BadRequest(
                f"input {i} is a scalar; inputs are batched along dim 0, so each needs a "
                "leading batch dimension (shape [1, ...] for one row)"
            )
        n = array.shape[0]
        if rows < 0:
            rows = n
        elif n != rows:
            raise BadRequest(
                f"input {i} has {n} rows along dim 0 but input 0 has {rows}; every input of "
                "a request needs the same number of rows"
            )
        key.append((array.dtype, array.shape[1:]))
    if rows == 0:
        raise BadRequest("the request has 0 rows along dim 0; send at least one row")
    return rows, tuple(key)


def _check_instances(name: str, value: object, low: int, high: int | None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidInput(f"{name} must be an integer in {bounds}, got {value!r}")


__all__ = ["BatchingConfig", "DynamicBatcher", "LoadSample", "RunFn"]
