"""Event consumers (handler): step windows and heartbeats in; jobs and nodes from their owners.

- METRICS ``gantry.metrics.job.step`` and ``gantry.metrics.node.heartbeat`` from node agents
  (source ``gantry/training-agent``, signed by a service key);
- JOBS ``gantry.job.scheduled`` and ``gantry.job.state`` from the scheduler;
- NODES ``gantry.node.registered`` from agents.

A step window that cannot be taken is dead-lettered with the reason (the consumer's
dead-letter subject keeps it for inspection): malformed or impossible numbers, a rank the job
does not have, the wrong node, a duplicate, an old attempt. Metrics of a job not seen scheduled
yet are retried for a few seconds (the JOBS stream may be behind), then dead-lettered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gantry.events import (
    Bus,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    EventVerifier,
    PermanentError,
    Publisher,
    TemporaryError,
    require_source,
)
from gantry.events.catalog import (
    JobScheduled,
    JobStateChanged,
    JobStepMetrics,
    NodeHeartbeat,
    NodeRegistered,
)
from gantry.profiler.metrics import IntakeCounters
from gantry.profiler.profiles import UnknownJob
from gantry.profiler.recording import Recorder
from gantry.profiler.windows import MetricRejected, Window

AGENT_SOURCE = "gantry/training-agent"
SCHEDULER_SOURCE = "gantry/scheduler"
UNKNOWN_JOB_RETRIES = 4


def _check_source(delivery: Delivery, sources: tuple[str, ...]) -> None:
    require_source(delivery, sources, consumer="profiler")


class Intake:
    """The profiler's consumers."""

    def __init__(
        self,
        bus: Bus,
        recorder: Recorder,
        publisher: Publisher,
        counters: IntakeCounters,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 30.0,
        unknown_job_retry_s: float = 2.0,
    ) -> None:
        self.recorder = recorder
        self.retry_s = unknown_job_retry_s
        self.counters = counters
        self._merged = 0

        def runner(durable: str, stream: str, subject: str, handler: object) -> ConsumerRunner:
            return ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable=durable,
                    stream=stream,
                    filter_subject=subject,
                    ack_wait_s=ack_wait_s,
                    batch_size=500,
                    fetch_timeout_s=0.5,
                ),
                handler,  # type: ignore[arg-type]
                publisher=publisher,
                verifier=verifier,
            )

        self.runners = [
            runner("profiler-steps", "METRICS", "gantry.metrics.job.step", self.steps),
            runner(
                "profiler-heartbeats", "METRICS", "gantry.metrics.node.heartbeat", self.heartbeats
            ),
            runner("profiler-jobs", "JOBS", "gantry.job.>", self.jobs),
            runner("profiler-nodes", "NODES", "gantry.node.registered", self.nodes),
        ]

    async def steps(self, batch: Sequence[Delivery]) -> None:
        """Check every window first (nothing applied if one is bad), then analyse them all."""
        windows = []
        for delivery in batch:
            _check_source(delivery, (AGENT_SOURCE,))
            try:
                w = Window.from_event(JobStepMetrics.model_validate(delivery.event.data))
                await asyncio.to_thread(self.recorder.admit, w)
            except UnknownJob as exc:
                if delivery.num_delivered < UNKNOWN_JOB_RETRIES:
                    raise TemporaryError(str(exc), delay_s=self.retry_s) from None
                self.counters.rejected.labels(exc.reason).inc()  # counted once, when given up
                raise PermanentError(str(exc)) from None
            except MetricRejected as exc:
                self.counters.rejected.labels(exc.reason).inc()
                raise PermanentError(f"metric refused ({exc.reason}): {exc}") from None
            windows.append(w)
        applied = await asyncio.to_thread(self.recorder.windows, windows)
        self.count(applied)

    def count(self, applied: object) -> None:
        from gantry.profiler.recording import Applied

        assert isinstance(applied, Applied)
        self.counters.windows.inc(applied.windows)
        for exc in applied.rejected:
            self.counters.rejected.labels(exc.reason).inc()
        merged = self.recorder.profiles.merged
        if merged > self._merged:
            self.counters.merged.inc(merged - self._merged)
            self._merged = merged
        for _, state, finding in applied.findings:
            self.counters.findings.labels(finding.kind, state).inc()
        for health in applied.health:
            self.counters.health.labels("degraded" if health.degraded else "recovered").inc()

    async def heartbeats(self, batch: Sequence[Delivery]) -> None:
        beats = []
        for delivery in batch:
            _check_source(delivery, (AGENT_SOURCE,))
            hb = NodeHeartbeat.model_validate(delivery.event.data)
            beats.append((hb, int(delivery.event.time.timestamp() * 1000)))
        applied = await asyncio.to_thread(self.recorder.heartbeats, beats)
        self.counters.heartbeats.inc(len(beats))
        self.count(applied)

    async def jobs(self, batch: Sequence[Delivery]) -> None:
        for delivery in batch:
            event = delivery.event
            if event.type == "gantry.job.scheduled":
                _check_source(delivery, (SCHEDULER_SOURCE,))
                await asyncio.to_thread(
                    self.recorder.scheduled, JobScheduled.model_validate(event.data)
                )
            elif event.type == "gantry.job.state":
                _check_source(delivery, (SCHEDULER_SOURCE,))
                s = JobStateChanged.model_validate(event.data)
                applied = await asyncio.to_thread(
                    self.recorder.job_state, s.job_id, s.attempt, s.state
                )
                self.count(applied)

    async def nodes(self, batch: Sequence[Delivery]) -> None:
        for delivery in batch:
            _check_source(delivery, (AGENT_SOURCE,))
            await asyncio.to_thread(
                self.recorder.registered, NodeRegistered.model_validate(delivery.event.data)
            )

    async def run(self) -> None:
        """Consume until stopped."""
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        for r in self.runners:
            r.stop()


__all__ = ["AGENT_SOURCE", "SCHEDULER_SOURCE", "Intake"]
