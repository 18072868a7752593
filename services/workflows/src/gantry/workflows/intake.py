"""Event consumers (handler): job state changes wake the runs they touch; evaluations feed
the experiments' pruners.

- JOBS ``gantry.job.state`` from the scheduler, read only to learn *which* run or experiment to
  look at; what a job became is then read from the scheduler itself (the controllers are
  level-triggered). A job nobody here knows is acknowledged and ignored.
- METRICS ``gantry.metrics.job.evaluation`` from node agents: a trial's objective after an
  epoch, reported to its study's pruner (which may stop the trial there and then).
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
    Publisher,
    require_source,
)
from gantry.events.catalog import JobEvaluation, JobStateChanged
from gantry.workflows.controller import Controller
from gantry.workflows.experimenter import Experimenter

SCHEDULER_SOURCE = "gantry/scheduler"
AGENT_SOURCE = "gantry/training-agent"
TERMINAL = ("succeeded", "failed", "cancelled")


class Intake:
    """The workflows service's consumers."""

    def __init__(
        self,
        bus: Bus,
        controller: Controller,
        experimenter: Experimenter,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 30.0,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.controller = controller
        self.experimenter = experimenter
        self.wake = wake
        self.seen = 0
        self.evaluations = 0

        def runner(durable: str, stream: str, subject: str, handler: object) -> ConsumerRunner:
            return ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable=durable,
                    stream=stream,
                    filter_subject=subject,
                    ack_wait_s=ack_wait_s,
                    batch_size=200,
                    fetch_timeout_s=0.5,
                ),
                handler,  # type: ignore[arg-type]
                publisher=publisher,
                verifier=verifier,
            )

        self.runners = [
            runner("workflows-jobs", "JOBS", "gantry.job.state", self.jobs),
            runner(
                "workflows-evaluations",
                "METRICS",
                "gantry.metrics.job.evaluation",
                self.evaluation,
            ),
        ]

    async def jobs(self, batch: Sequence[Delivery]) -> None:
        """Wake the runs whose jobs ended."""
        woke = False
        for delivery in batch:
            require_source(delivery, (SCHEDULER_SOURCE,), consumer="workflows")
            change = JobStateChanged.model_validate(delivery.event.data)
            if change.state not in TERMINAL:
                continue
            if await asyncio.to_thread(self.controller.job_changed, change.job_id):
                self.seen += 1
                woke = True
            elif await asyncio.to_thread(self.experimenter.knows, change.job_id):
                woke = True
        if woke and self.wake is not None:
            self.wake.set()

    async def evaluation(self, batch: Sequence[Delivery]) -> None:
        """Report each trial's objective to its pruner, in the order they came."""
        for delivery in batch:
            require_source(delivery, (AGENT_SOURCE,), consumer="workflows")
            e = JobEvaluation.model_validate(delivery.event.data)
            if await asyncio.to_thread(self.experimenter.evaluation, e.job_id, e.epoch, e.metrics):
                self.evaluations += 1

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        for r in self.runners:
            r.stop()


__all__ = ["Intake"]
