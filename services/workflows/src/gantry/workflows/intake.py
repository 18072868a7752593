"""Event consumers (handler): job state changes from the scheduler wake the runs they touch.

Only ``gantry.job.state`` events from the scheduler are read, and only to learn *which* run to
look at; what a job became is then read from the scheduler itself (the controller is
level-triggered). A job no run knows is acknowledged and ignored.
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
from gantry.events.catalog import JobStateChanged
from gantry.workflows.controller import Controller

SCHEDULER_SOURCE = "gantry/scheduler"
TERMINAL = ("succeeded", "failed", "cancelled")


class Intake:
    """The workflows service's consumers."""

    def __init__(
        self,
        bus: Bus,
        controller: Controller,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 30.0,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.controller = controller
        self.wake = wake
        self.seen = 0
        self.runners = [
            ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable="workflows-jobs",
                    stream="JOBS",
                    filter_subject="gantry.job.state",
                    ack_wait_s=ack_wait_s,
                    batch_size=200,
                    fetch_timeout_s=0.5,
                ),
                self.jobs,
                publisher=publisher,
                verifier=verifier,
            )
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
        if woke and self.wake is not None:
            self.wake.set()

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        for r in self.runners:
            r.stop()


__all__ = ["Intake"]
