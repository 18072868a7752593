"""Event consumers (handler): job state changes wake the runs they touch; evaluations feed
the experiments' pruners; erasures start the pipelines that retrain without the person.

- JOBS ``gantry.job.state`` from the scheduler, read only to learn *which* run or experiment to
  look at; what a job became is then read from the scheduler itself (the controllers are
  level-triggered). A job nobody here knows is acknowledged and ignored.
- METRICS ``gantry.metrics.job.evaluation`` from node agents: a trial's objective after an
  epoch, reported to its study's pruner (which may stop the trial there and then).
- DATA ``gantry.data.subject.erased`` from governance: the runs of the pipelines with a
  matching ``erasure`` trigger, once per erasure and pipeline (:mod:`gantry.workflows.erasures`).
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
from gantry.events.catalog import JobEvaluation, JobStateChanged, SubjectErased
from gantry.workflows.controller import Controller
from gantry.workflows.erasures import CONSUMER as ERASURES_DURABLE
from gantry.workflows.erasures import ErasureRuns
from gantry.workflows.experimenter import Experimenter

SCHEDULER_SOURCE = "gantry/scheduler"
AGENT_SOURCE = "gantry/training-agent"
GOVERNANCE_SOURCE = "gantry/governance"
TERMINAL = ("succeeded", "failed", "cancelled")


class Intake:
    """The workflows service's consumers."""

    def __init__(
        self,
        bus: Bus,
        controller: Controller,
        experimenter: Experimenter,
        erasures: ErasureRuns,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 30.0,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.controller = controller
        self.experimenter = experimenter
        self.erasures = erasures
        self.wake = wake
        self.seen = 0
        self.evaluations = 0
        self.erasure_runs = 0

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
            runner(ERASURES_DURABLE, "DATA", "gantry.data.subject.erased", self.erasure),
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

    async def erasure(self, batch: Sequence[Delivery]) -> None:
        """Start the runs each erasure asks for (once per erasure and pipeline)."""
        for delivery in batch:
            require_source(delivery, (GOVERNANCE_SOURCE,), consumer="workflows")
            erasure = SubjectErased.model_validate(delivery.event.data)
            started = await asyncio.to_thread(self.erasures.erased, delivery.event.id, erasure)
            self.erasure_runs += sum(1 for _, repeat in started if not repeat)

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        for r in self.runners:
            r.stop()


__all__ = ["Intake"]
