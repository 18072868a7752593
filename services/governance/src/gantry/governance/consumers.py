"""Event consumers (handler): what governance learns from the other services.

``gantry.job.scheduled`` tells governance which dataset versions, in which view, a placed job
may read; the job's grant is later issued from exactly that. Each event is handled once (inbox).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gantry.core import get_logger
from gantry.events import (
    Bus,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    EventVerifier,
    Inbox,
    Publisher,
)
from gantry.events.catalog import JobScheduled
from gantry.governance.grants import Grants
from gantry.governance.store import inbox

DURABLE = "governance-jobs"
_log = get_logger("gantry.governance.consumers")


class JobEvents:
    """Consumes the JOBS stream for scheduling decisions."""

    def __init__(
        self,
        bus: Bus,
        grants: Grants,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 30.0,
    ) -> None:
        self.grants = grants
        self._inbox = Inbox(inbox, DURABLE)
        self.runner = ConsumerRunner(
            bus,
            ConsumerSpec(
                durable=DURABLE,
                stream="JOBS",
                filter_subject="gantry.job.scheduled",
                ack_wait_s=ack_wait_s,
                batch_size=100,
            ),
            self.handle,
            publisher=publisher,
            verifier=verifier,
        )

    async def handle(self, batch: Sequence[Delivery]) -> None:
        """Remember each scheduled job's data needs (once per event)."""
        await asyncio.to_thread(self._store, batch)

    def _store(self, batch: Sequence[Delivery]) -> None:
        with self.grants.engine.begin() as conn:
            for delivery in batch:
                if not self._inbox.claim(conn, delivery.event.id):
                    continue
                job = JobScheduled.model_validate(delivery.event.data)
                self.grants.remember_job(conn, job)
                _log.info("job scheduled", job=job.job_id, datasets=len(job.datasets))

    async def run(self) -> None:
        """Consume until stopped."""
        await self.runner.run()

    def stop(self) -> None:
        """Stop after the batch in hand."""
        self.runner.stop()


__all__ = ["DURABLE", "JobEvents"]
