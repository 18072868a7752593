"""Recording authorisation decisions as ``gantry.authz.decision`` events."""

from __future__ import annotations

from gantry.events import AuthzDecision, BackgroundPublisher, EventEnvelope


class EventDecisionSink:
    """A :class:`~gantry.security.interceptor.DecisionSink` that publishes every decision.

    Publishing happens in the background so a decision never waits on NATS; the audit service
    stores each one in its log.
    """

    def __init__(self, background: BackgroundPublisher, *, source: str) -> None:
        self._background = background
        self._source = source

    def record(self, decision: AuthzDecision, *, actor: str) -> None:
        """Queue the decision as an event on behalf of ``actor``."""
        name = decision.resource_name
        subject = (
            decision.resource_kind if name in ("", "*") else f"{decision.resource_kind}/{name}"
        )
        self._background.submit(
            EventEnvelope(
                type="gantry.authz.decision",
                source=self._source,
                actor=actor,
                subject=subject,
                data=decision.model_dump(),
            )
        )


__all__ = ["EventDecisionSink"]
