"""Event consumers (handler): what the scheduler learns from node agents, governance, profiler.

- NODES ``gantry.node.registered`` (agents), ``gantry.node.degraded`` / ``recovered``
  (profiler): inventory and health;
- METRICS ``gantry.metrics.node.heartbeat``: liveness;
- METRICS ``gantry.metrics.job.progress``: how far each job's training is (the latest kept);
- JOBS ``gantry.job.workers``: workers started, checkpointed, restarted, finished, stopped;
- DATA ``gantry.data.dataset.created``: datasets' classifications (for trusted pools);
- LOGS ``gantry.log.job``: worker log lines for ``gantry jobs logs``.

Each producer is pinned: an event is accepted only from its expected source AND signed by a
platform service key (``svc-*``); anything else is refused to the dead-letter stream with
the reason. Handlers are idempotent (reports of older attempts are ignored; log batches are
deduplicated through the inbox), so redeliveries change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gantry.core import get_logger
from gantry.events import (
    Bus,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    EventVerifier,
    Publisher,
    require_source,
)
from gantry.events.catalog import (
    DatasetCreated,
    JobLogLines,
    JobProgress,
    JobWorkersReported,
    NodeHealth,
    NodeHeartbeat,
    NodeRegistered,
)
from gantry.scheduler.api import ControlThread

AGENT_SOURCE = "gantry/training-agent"
GOVERNANCE_SOURCE = "gantry/governance"
PROFILER_SOURCE = "gantry/profiler"
_log = get_logger("gantry.scheduler.consumers")


@dataclass(frozen=True)
class _Route:
    durable: str
    stream: str
    subject: str
    sources: tuple[str, ...]
    ack_wait_s: float = 30.0


ROUTES = (
    _Route("scheduler-nodes", "NODES", "gantry.node.>", (AGENT_SOURCE, PROFILER_SOURCE)),
    _Route("scheduler-heartbeats", "METRICS", "gantry.metrics.node.heartbeat", (AGENT_SOURCE,)),
    _Route("scheduler-progress", "METRICS", "gantry.metrics.job.progress", (AGENT_SOURCE,)),
    _Route("scheduler-workers", "JOBS", "gantry.job.workers", (AGENT_SOURCE,)),
    _Route("scheduler-datasets", "DATA", "gantry.data.dataset.created", (GOVERNANCE_SOURCE,)),
    _Route("scheduler-logs", "LOGS", "gantry.log.job", (AGENT_SOURCE,)),
)


def _check_source(delivery: Delivery, sources: tuple[str, ...]) -> None:
    require_source(delivery, sources, consumer="scheduler")


class SchedulerEvents:
    """All the scheduler's consumers; ``kick`` asks for a scheduling pass after changes."""

    def __init__(
        self,
        bus: Bus,
        control: ControlThread,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        kick: Callable[[], None],
    ) -> None:
        self.control = control
        self.kick = kick
        self.runners = [
            ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable=route.durable,
                    stream=route.stream,
                    filter_subject=route.subject,
                    ack_wait_s=route.ack_wait_s,
                    batch_size=200,
                    fetch_timeout_s=0.5,
                ),
                self._handler(route),
                publisher=publisher,
                verifier=verifier,
            )
            for route in ROUTES
        ]

    def _handler(self, route: _Route) -> Callable[[Sequence[Delivery]], Awaitable[None]]:
        async def handle(batch: Sequence[Delivery]) -> None:
            for delivery in batch:
                if delivery.event.source == "gantry/scheduler":
                    continue  # our own node.lost events share the NODES stream
                _check_source(delivery, route.sources)
            changed = await self.control.call(self._apply, batch)
            if changed:
                self.kick()

        return handle

    def _apply(self, batch: Sequence[Delivery]) -> bool:
        """Apply a batch on the control thread; True when a pass may now decide more."""
        control = self.control.control
        changed = False
        progress: dict[str, JobProgress] = {}  # the batch's latest per job: one update each
        for delivery in batch:
            event = delivery.event
            data = event.data
            if event.source == "gantry/scheduler":
                continue
            if event.type == "gantry.metrics.node.heartbeat":
                control.heartbeat(NodeHeartbeat.model_validate(data).node)
            elif event.type == "gantry.metrics.job.progress":
                p = JobProgress.model_validate(data)
                kept = progress.get(p.job_id)
                if kept is None or (p.attempt, p.at_ms) >= (kept.attempt, kept.at_ms):
                    progress[p.job_id] = p
            elif event.type == "gantry.node.registered":
                control.node_registered(NodeRegistered.model_validate(data))
                changed = True
            elif event.type in ("gantry.node.degraded", "gantry.node.recovered"):
                health = NodeHealth.model_validate(data)
                degraded = event.type == "gantry.node.degraded"
                control.node_health(health.node, degraded, health.reason)
                changed = True
            elif event.type == "gantry.job.workers":
                r = JobWorkersReported.model_validate(data)
                control.worker_report(
                    r.job_id,
                    r.attempt,
                    r.node,
                    r.workers,
                    r.status,
                    exit_code=r.exit_code,
                    message=r.message,
                    step=r.step,
                    restarts=r.restarts,
                    model=r.model,
                    metrics=r.metrics,
                    dataset_version=r.dataset_version,
                )
                changed = True
            elif event.type == "gantry.data.dataset.created":
                d = DatasetCreated.model_validate(data)
                control.dataset_classified(d.dataset, d.sensitivity)
            elif event.type == "gantry.log.job":
                lines = JobLogLines.model_validate(data)
                control.add_logs(
                    lines.job_id,
                    lines.node,
                    lines.worker,
                    lines.stream,
                    lines.lines,
                    event_id=event.id,
                )
        for p in progress.values():
            control.job_progress(p)
        return changed

    async def run(self) -> None:
        """Consume until stopped."""
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        """Stop after the batches in hand."""
        for runner in self.runners:
            runner.stop()


__all__ = ["AGENT_SOURCE", "GOVERNANCE_SOURCE", "PROFILER_SOURCE", "ROUTES", "SchedulerEvents"]
