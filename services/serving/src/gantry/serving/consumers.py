"""Event consumers (handler): new model versions roll out on their own where asked.

A deployment deployed with ``auto_canary_percent`` (``gantry serve deploy ... --follow 10%``)
follows its model: when governance registers a new version of it (``gantry.model.registered``,
e.g. from the nightly retraining job), the service starts a canary of that version at that
weight, and the deployment's canary analysis promotes it or rolls it back like any other. Each
event is handled once (inbox); only governance's own, service-signed events are believed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import sqlalchemy as sa

from gantry.core import GantryError, get_logger
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
from gantry.events.catalog import ModelRegistered
from gantry.serving.rollout import Rollouts
from gantry.serving.store import inbox

DURABLE = "serving-models"
GOVERNANCE_SOURCE = "gantry/governance"
ACTOR = "gantry/serving"
_log = get_logger("gantry.serving.consumers")


class ModelEvents:
    """Consumes ``gantry.model.registered`` and starts the canaries deployments follow."""

    def __init__(
        self,
        bus: Bus,
        rollouts: Rollouts,
        engine: sa.Engine,
        publisher: Publisher,
        *,
        verifier: EventVerifier | None,
        ack_wait_s: float = 300.0,
    ) -> None:
        self.rollouts = rollouts
        self.engine = engine
        self._inbox = Inbox(inbox, DURABLE)
        self.runner = ConsumerRunner(
            bus,
            ConsumerSpec(
                durable=DURABLE,
                stream="MODELS",
                filter_subject="gantry.model.registered",
                ack_wait_s=ack_wait_s,
                batch_size=20,
            ),
            self.handle,
            publisher=publisher,
            verifier=verifier,
        )

    async def handle(self, batch: Sequence[Delivery]) -> None:
        """Start a canary for every deployment that follows a newly registered model."""
        for delivery in batch:
            event = delivery.event
            if event.source != GOVERNANCE_SOURCE or not (delivery.signer or "").startswith("svc-"):
                raise PermanentError(
                    f"gantry.model.registered from {event.source!r} signed by "
                    f"{delivery.signer!r} is refused: only governance ({GOVERNANCE_SOURCE}, a "
                    "service key) registers models"
                )
        for delivery in batch:
            if not await asyncio.to_thread(self._claim, delivery.event.id):
                continue
            model = ModelRegistered.model_validate(delivery.event.data)
            await self.follow(model)

    async def follow(self, model: ModelRegistered) -> list[str]:
        """Start the canaries for ``model``; the deployments that started one."""
        started = []
        for name, running in sorted(self.rollouts.deployments.items()):
            d = running.deployment
            percent = d.spec.auto_canary_percent
            if d.model != model.name or percent <= 0 or model.version in d.versions():
                continue
            try:
                await self.rollouts.deploy(
                    model=model.name,
                    version=model.version,
                    name=name,
                    canary_percent=percent,
                    actor=ACTOR,
                )
            except GantryError as exc:  # e.g. a canary already in progress: say so, go on
                _log.warning(
                    "new model version not rolled out",
                    deployment=name,
                    model=model.name,
                    version=model.version,
                    error=str(exc),
                )
                continue
            started.append(name)
            _log.info(
                "new model version rolled out as a canary",
                deployment=name,
                model=model.name,
                version=model.version,
                percent=percent,
            )
        return started

    def _claim(self, event_id: str) -> bool:
        with self.engine.begin() as conn:
            return self._inbox.claim(conn, event_id)

    async def run(self) -> None:
        """Consume until stopped."""
        await self.runner.run()

    def stop(self) -> None:
        """Stop after the batch in hand."""
        self.runner.stop()


__all__ = ["DURABLE", "GOVERNANCE_SOURCE", "ModelEvents"]
