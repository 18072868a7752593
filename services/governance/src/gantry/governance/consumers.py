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
    PermanentError,
    Publisher,
)
from gantry.events.catalog import JobScheduled
from gantry.governance.grants import Grants
from gantry.governance.store import inbox

DURABLE = "governance-jobs"
#: Only the scheduler places jobs: its events come from this source, which the consumer only
#: accepts when signed by a platform service key (``svc-*``), never an outside account's.
SCHEDULER_SOURCE = "gantry/scheduler"
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
        for delivery in batch:
            event = delivery.event
            if event.source != SCHEDULER_SOURCE or not (delivery.signer or "").startswith("svc-"):
                raise PermanentError(
                    f"gantry.job.scheduled from {event.source!r} signed by {delivery.signer!r} "
                    f"is refused: only the scheduler ({SCHEDULER_SOURCE}, a service key) "
                    "places jobs"
                )
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


__all__ = ["DURABLE", "SCHEDULER_SOURCE", "JobEvents"]
