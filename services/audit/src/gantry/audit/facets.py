"""What the audit indexes about each event: actor, resource, action and decision."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.events import EventEnvelope


@dataclass(frozen=True, slots=True)
class Facets:
    """The queryable facets of one event."""

    actor: str
    resource: str
    action: str
    decision: str


def facets_of(event: EventEnvelope) -> Facets:
    """Index facets for ``event``.

    An ``authz.decision`` is about its principal doing an action on a resource; a
    ``data.accessed`` is a read of ``dataset/<name>``; any other event is its actor acting on
    its subject, the action being the last part of the type (``gantry.job.cancelled`` →
    ``cancelled``), the decision ``allow`` (it happened).
    """
    data = event.data
    if event.type == "gantry.authz.decision":
        kind = str(data.get("resource_kind", ""))
        name = str(data.get("resource_name", "*"))
        return Facets(
            actor=str(data.get("principal", event.actor)),
            resource=f"{kind}/{name}" if name and name != "*" else kind,
            action=str(data.get("action", "")),
            decision=str(data.get("decision", "")),
        )
    if event.type == "gantry.data.accessed":
        return Facets(
            actor=event.actor,
            resource=f"dataset/{data.get('dataset', '')}",
            action="read",
            decision=str(data.get("decision", "allow")),
        )
    return Facets(
        actor=event.actor,
        resource=event.subject or "",
        action=event.type.rsplit(".", 1)[-1],
        decision="allow",
    )


__all__ = ["Facets", "facets_of"]
