"""Erasure runs (application): the pipelines a data subject's erasure starts.

Governance publishes ``gantry.data.subject.erased`` once it has committed new versions of the
datasets without the person's rows; it names those versions and the model versions trained on
data that held them. Every pipeline with an ``erasure`` trigger that matches
(:class:`~gantry.workflows.triggers.ErasureTrigger`) gets one run, trigger ``erasure``, owned
by the pipeline's owner with the roles they submitted it with (as a cron pipeline's scheduled
runs are), its parameters set from the trigger's ``params``. The run keeps the erasure's id in
its parameters (``erasure.id``) and says which datasets and models matched in its reason.

Exactly once per (erasure, pipeline), however often the event comes:

- each run is started with the request id ``erasure:<erasure id>:<pipeline>``, so starting it
  again (a redelivery, the same erasure published twice, a restart half-way through an event)
  finds the run already started instead of starting another;
- once every run is started, the event's id is claimed in the inbox; a later delivery of the
  same event does nothing, not even start a pipeline submitted since.

The inbox is claimed *after* the runs start, never before: a crash in between repeats the
event, which the request ids make harmless, while the other order could lose a retraining.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

from gantry.core import GantryError, get_logger
from gantry.events import Inbox
from gantry.events.catalog import SubjectErased
from gantry.workflows import store
from gantry.workflows.controller import Caller, Controller
from gantry.workflows.registry import Registry
from gantry.workflows.runs import Run

CONSUMER = "workflows-erasures"
TRIGGER = "erasure"
CAUSE_PARAM = "erasure.id"
"""The run parameter that records which erasure started it."""
_REQUEST_ID_MAX = 128  # wf_runs.request_id

_log = get_logger("gantry.workflows.erasures")


def request_id(erasure_id: str, pipeline: str) -> str:
    """The request id of the run ``erasure_id`` starts for ``pipeline`` (the column holds 128
    characters: a longer erasure id is replaced by its digest)."""
    rid = f"erasure:{erasure_id}:{pipeline}"
    if len(rid) <= _REQUEST_ID_MAX:
        return rid
    digest = hashlib.sha256(erasure_id.encode()).hexdigest()[:32]
    return f"erasure:{digest}:{pipeline}"


class ErasureRuns:
    """Starts the runs of the pipelines an erasure concerns; safe to call from any thread."""

    def __init__(self, engine: sa.Engine, registry: Registry, controller: Controller) -> None:
        self.engine = engine
        self.registry = registry
        self.controller = controller
        self._inbox = Inbox(store.inbox, CONSUMER)

    def handled(self, event_id: str) -> bool:
        """Whether the event ``event_id`` was already handled."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.inbox.c.event_id).where(
                    store.inbox.c.consumer == CONSUMER, store.inbox.c.event_id == event_id
                )
            ).first()
        return row is not None

    def erased(self, event_id: str, erasure: SubjectErased) -> list[tuple[Run, bool]]:
        """Start a run of every pipeline ``erasure`` concerns; each run and whether it had
        been started before (a repeat). Nothing when event ``event_id`` was handled already.

        A pipeline that cannot be started (deleted meanwhile, a parameter its latest revision
        no longer takes) is logged and passed over; any other failure is raised, and the
        event is delivered again.
        """
        if self.handled(event_id):
            return []
        started: list[tuple[Run, bool]] = []
        for record in self.registry.list():
            pipeline = record.pipeline
            for trigger in pipeline.triggers:
                if trigger.erasure is None:
                    continue
                why = trigger.erasure.matches(erasure)
                if not why:
                    continue
                try:
                    run, repeat = self.controller.start(
                        pipeline.name,
                        trigger.erasure.run_params(erasure),
                        caller=Caller(record.owner, record.roles),
                        request_id=request_id(erasure.erasure_id, pipeline.name),
                        trigger=TRIGGER,
                        reason=f"started by erasure {erasure.erasure_id} ({', '.join(why)})",
                        cause={CAUSE_PARAM: erasure.erasure_id},
                    )
                except GantryError as exc:
                    _log.warning(
                        "erasure run not started",
                        erasure=erasure.erasure_id,
                        pipeline=pipeline.name,
                        error=exc.message,
                    )
                    break
                started.append((run, repeat))
                if not repeat:
                    _log.info(
                        "erasure started a run",
                        erasure=erasure.erasure_id,
                        pipeline=pipeline.name,
                        run=run.id,
                        matched=", ".join(why),
                    )
                break  # one run per pipeline, however many of its triggers match
        with self.engine.begin() as conn:
            self._inbox.claim(conn, event_id)
        return started


__all__ = ["CAUSE_PARAM", "CONSUMER", "TRIGGER", "ErasureRuns", "request_id"]
