"""Ingest (handler): durable consumers on every audited stream feeding the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client import Counter

from gantry.audit.anomalies import AnomalyWatch
from gantry.audit.ledger import SOURCE, Ledger
from gantry.core import get_logger
from gantry.events import (
    AUDITED_STREAMS,
    Bus,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    EventVerifier,
    Publisher,
    SignaturePool,
)

_log = get_logger("gantry.audit.ingest")

APPENDED = Counter("gantry_audit_events_appended_total", "Events appended to the audit log")
DUPLICATES = Counter("gantry_audit_duplicates_total", "Redelivered events already in the log")

DURABLE = "audit"


class Ingestor:
    """One durable consumer per audited stream; all append through one ledger."""

    def __init__(
        self,
        bus: Bus,
        ledger: Ledger,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        signature_pool: SignaturePool | None = None,
        batch_size: int,
        ack_wait_s: float = 30.0,
        max_event_bytes: int,
        streams: Sequence[str] = AUDITED_STREAMS,
        own_kid: str = "svc-audit",
        watch: AnomalyWatch | None = None,
    ) -> None:
        self._ledger = ledger
        self._watch = watch
        self._own_kid = own_kid
        self.runners = [
            ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable=DURABLE, stream=stream, batch_size=batch_size, ack_wait_s=ack_wait_s
                ),
                self.handle,
                publisher=publisher,
                verifier=verifier,
                signature_pool=signature_pool,
                max_event_bytes=max_event_bytes,
            )
            for stream in streams
        ]
        self.new_events = asyncio.Event()

    async def handle(self, batch: Sequence[Delivery]) -> None:
        """Append a batch durably (the runner acks it after this returns)."""
        items = [
            (d.event, d.canonical)
            for d in batch
            # our own signed tree heads are stored as checkpoints already
            if not (
                d.event.type == "gantry.audit.checkpoint"
                and d.event.source == SOURCE
                and d.signer in (None, self._own_kid)
            )
        ]
        if not items:
            return
        new = await asyncio.to_thread(self._ledger.append_new, items)
        added = len(new)
        APPENDED.inc(added)
        DUPLICATES.inc(len(items) - added)
        if added:
            self.new_events.set()
        if new and self._watch is not None:
            try:
                await asyncio.to_thread(self._watch.observe, new)
            except Exception:  # judging must never stop the log from taking events
                _log.exception("anomaly detection failed on a batch")

    async def run(self) -> None:
        """Run every consumer until :meth:`stop`."""
        await asyncio.gather(*(r.run() for r in self.runners))

    def stop(self) -> None:
        """Finish the batches in hand, then return from :meth:`run`."""
        for runner in self.runners:
            runner.stop()

    @property
    def dead_lettered(self) -> int:
        """Events refused so far (all streams)."""
        return sum(r.dead_lettered for r in self.runners)


__all__ = ["DURABLE", "Ingestor"]
