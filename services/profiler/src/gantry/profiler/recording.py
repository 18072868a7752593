"""Applies inputs to the live state and the database together (the service's domain layer).

:class:`Recorder` owns the :class:`~gantry.profiler.profiles.Profiles` and the database: each
batch of events is applied under one lock, its windows and node samples are stored, and every
finding raised or cleared and every node health change is written with its event in the same
transaction (outbox): ``gantry.job.profile.finding``, ``gantry.node.degraded`` and
``gantry.node.recovered``. After a restart :meth:`Recorder.restore` brings back the running
attempts, their standing findings and the nodes' health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import get_logger
from gantry.events.catalog import (
    JOB_PROFILE_FINDING,
    NODE_DEGRADED,
    NODE_RECOVERED,
    JobProfileFinding,
    JobScheduled,
    NodeHealth,
    NodeHeartbeat,
    NodeRegistered,
    WorkerPlacement,
)
from gantry.profiler import store
from gantry.profiler.nodes import HealthChange
from gantry.profiler.profiles import JobRecord, Outcome, Profiles
from gantry.profiler.stragglers import Finding, GangAnalyzer
from gantry.profiler.windows import MetricRejected, Window

ACTOR = "gantry/profiler"
_log = get_logger("gantry.profiler")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Applied:
    """What a batch changed (for metrics and logs)."""

    windows: int = 0
    findings: list[tuple[str, str, Finding]] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)
    rejected: list[MetricRejected] = field(default_factory=list)


class Recorder:
    """The live state and the database, changed together under one lock."""

    def __init__(
        self,
        engine: sa.Engine,
        profiles: Profiles,
        *,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.engine = engine
        self.profiles = profiles
        self.lock = threading.Lock()
        self.on_change = on_change or (lambda: None)
        self.clock = clock

    # -- restart ---------------------------------------------------------------------------------

    def restore(self) -> int:
        """Bring back running attempts, standing findings and node health; attempts restored."""
        with self.lock, self.engine.connect() as conn:
            for row in conn.execute(sa.select(store.nodes)).all():
                self.profiles.tracker.restore(
                    row.node,
                    degraded=row.degraded,
                    reason=row.reason,
                    evidence=orjson.loads(row.evidence_json),
                    since_ms=row.since_ms,
                    degraded_for=row.degraded_for,
                )
            rows = conn.execute(
                sa.select(store.jobs)
                .where(store.jobs.c.state == "running")
                .order_by(store.jobs.c.started_ms)
            ).all()
            for row in rows:
                placements = [
                    WorkerPlacement.model_validate(p) for p in orjson.loads(row.placements_json)
                ]
                gang = GangAnalyzer(
                    row.job_id,
                    row.attempt,
                    {p.worker: p.node for p in placements},
                    self.profiles.detection,
                )
                for f in conn.execute(
                    sa.select(store.findings).where(
                        store.findings.c.job_id == row.job_id,
                        store.findings.c.attempt == row.attempt,
                        store.findings.c.cleared_ms == 0,
                    )
                ).all():
                    finding = _row_finding(f)
                    gang.active[finding.key] = finding
                self.profiles.adopt(
                    JobRecord(
                        job_id=row.job_id,
                        attempt=row.attempt,
                        name=row.name,
                        owner=row.owner,
                        placements=placements,
                        gang=gang,
                        started_ms=row.started_ms,
                        updated_ms=row.started_ms,
                        last_step=row.last_step,
                    )
                )
            return len(rows)

    # -- inputs ------------------------------------------------------------------------------------

    def scheduled(self, s: JobScheduled) -> None:
        """A job attempt was placed: follow it."""
        now = self.clock()
        with self.lock, self.engine.begin() as conn:
            record = self.profiles.scheduled(s, now)
            if record is None:
                return
            conn.execute(
                store.jobs.update()
                .where(store.jobs.c.job_id == s.job_id, store.jobs.c.state == "running")
                .values(state="ended", ended_ms=now)
            )
            conn.execute(
                store.jobs.insert().values(
                    job_id=s.job_id,
                    attempt=s.attempt,
                    name=s.name,
                    owner=s.owner,
                    placements_json=store.dumps([p.model_dump() for p in record.placements]),
                    state="running",
                    started_ms=now,
                    ended_ms=0,
                    last_step=0,
                )
            )

    def job_state(self, job_id: str, attempt: int, state: str) -> Applied:
        """A job changed state: an ended attempt's standing findings are cleared (with their
        events: the audit sees each finding end)."""
        now = self.clock()
        applied = Applied()
        with self.lock, self.engine.begin() as conn:
            record = self.profiles.job_state(job_id, attempt, state, now)
            if record is None:
                return applied
            conn.execute(
                store.jobs.update()
                .where(store.jobs.c.job_id == job_id, store.jobs.c.attempt == record.attempt)
                .values(state="ended", ended_ms=now, last_step=record.last_step)
            )
            standing = list(record.gang.active.values())
            record.gang.active.clear()
            for finding in standing:
                finding.step = record.last_step
                finding.summary = f"the job ended ({state}): {finding.summary}"
                self._finding(conn, record, "cleared", finding, now)
                applied.findings.append((job_id, "cleared", finding))
        if standing:
            self.on_change()
        return applied

    def windows(self, batch: Sequence[Window]) -> Applied:
        """Analyse and store windows (checked against the job beforehand: :meth:`admit`).

        A window refused even so (a duplicate within the batch) is counted in
        :attr:`Applied.rejected` and skipped; the others are applied.
        """
        now = self.clock()
        out = Outcome()
        rejected: list[MetricRejected] = []
        with self.lock:
            for w in batch:
                try:
                    out.extend(self.profiles.window(w, now))
                except MetricRejected as exc:
                    rejected.append(exc)
            applied = self._commit(out, now)
        applied.rejected = rejected
        return applied

    def admit(self, w: Window) -> None:
        """Raise if ``w`` cannot be taken (unknown job, old attempt, wrong rank or node)."""
        with self.lock:
            record = self.profiles.record_for(w)
            gang = record.gang
            if w.rank not in gang.ranks or gang.ranks[w.rank].node != w.node:
                gang.add(w)  # raises with the reason
            last = gang.ranks[w.rank].windows
            if last and last[-1].first_step == w.first_step and last[-1].at_ms >= w.at_ms:
                gang.add(w)  # raises: a duplicate

    def heartbeats(self, batch: Iterable[tuple[NodeHeartbeat, int]]) -> Applied:
        """Take node heartbeats (with their event times)."""
        now = self.clock()
        out = Outcome()
        rows: list[dict[str, Any]] = []
        with self.lock:
            for hb, at_ms in batch:
                out.extend(self.profiles.heartbeat(hb, at_ms or now))
                rows.append(
                    {
                        "node": hb.node,
                        "at_ms": at_ms or now,
                        "cpu_util": hb.cpu_util,
                        "gpu_util": hb.gpu_util,
                        "memory_used_mib": hb.memory_used_mib,
                        "net_rx_bytes_per_s": hb.net_rx_bytes_per_s,
                        "net_tx_bytes_per_s": hb.net_tx_bytes_per_s,
                        "temperature_c": max((g.temperature_c for g in hb.gpus), default=0.0),
                        "power_w": sum(g.power_w for g in hb.gpus),
                        "throttled": any(g.throttled for g in hb.gpus),
                        "samples": 1,
                        "rollup": False,
                    }
                )
            return self._commit(out, now, samples=rows)

    def registered(self, r: NodeRegistered) -> None:
        """A node (re-)registered. When it is degraded here, say so again: the scheduler may
        have forgotten (a node that was lost and came back starts out ready there)."""
        with self.lock:
            self.profiles.registered(r)
            state = self.profiles.tracker.node(r.node)
            if not state.degraded:
                return
            with self.engine.begin() as conn:
                store.record(
                    conn,
                    NODE_DEGRADED.type,
                    NodeHealth(node=r.node, reason=state.reason, evidence=state.evidence),
                    actor=ACTOR,
                    subject=r.node,
                )
        self.on_change()

    def tick(self) -> Applied:
        """Analyse held windows whose time came; probation recoveries."""
        now = self.clock()
        with self.lock:
            return self._commit(self.profiles.tick(now), now)

    def set_node_health(self, node: str, degraded: bool, reason: str, actor: str) -> bool:
        """An operator's decision; False when the node already was in that state."""
        now = self.clock()
        with self.lock:
            change = self.profiles.tracker.set(node, degraded, reason, actor, now)
            if change is None:
                return False
            self._commit(Outcome(health=[change]), now, actor=actor)
            return True

    # -- writing ---------------------------------------------------------------------------------

    def _commit(
        self,
        out: Outcome,
        now: int,
        *,
        samples: Sequence[dict[str, Any]] = (),
        actor: str = ACTOR,
    ) -> Applied:
        applied = Applied(windows=len(out.analysed), health=list(out.health))
        if not (out.analysed or out.findings or out.health or samples):
            return applied
        with self.engine.begin() as conn:
            if out.analysed:
                conn.execute(store.windows.insert(), [store.window_row(w) for w in out.analysed])
                steps: dict[tuple[str, int], int] = {}
                for w in out.analysed:
                    key = (w.job_id, w.attempt)
                    steps[key] = max(steps.get(key, 0), w.last_step)
                for (job_id, attempt), step in steps.items():
                    conn.execute(
                        store.jobs.update()
                        .where(store.jobs.c.job_id == job_id, store.jobs.c.attempt == attempt)
                        .values(last_step=step)
                    )
            if samples:
                conn.execute(store.node_samples.insert(), list(samples))
            for record, change in out.findings:
                self._finding(conn, record, change.state, change.finding, now)
                applied.findings.append((record.job_id, change.state, change.finding))
            for health in out.health:
                self._health(conn, health, now, actor)
        if out.findings or out.health:
            self.on_change()
        return applied

    @staticmethod
    def _finding(conn: sa.Connection, record: JobRecord, state: str, f: Finding, now: int) -> None:
        rank = -1 if f.rank is None else f.rank
        if state == "raised":
            conn.execute(
                store.findings.insert().values(
                    job_id=record.job_id,
                    attempt=record.attempt,
                    kind=f.kind,
                    rank=rank,
                    node=f.node,
                    phase=f.phase,
                    cause=f.cause,
                    summary=f.summary,
                    evidence_json=store.dumps(f.evidence),
                    raised_step=f.raised_step,
                    step=f.step,
                    raised_ms=now,
                    cleared_ms=0,
                )
            )
        else:
            conn.execute(
                store.findings.update()
                .where(
                    store.findings.c.job_id == record.job_id,
                    store.findings.c.attempt == record.attempt,
                    store.findings.c.kind == f.kind,
                    store.findings.c.rank == rank,
                    store.findings.c.cleared_ms == 0,
                )
                .values(cleared_ms=now, step=f.step)
            )
        store.record(
            conn,
            JOB_PROFILE_FINDING.type,
            JobProfileFinding(
                job_id=record.job_id,
                attempt=record.attempt,
                kind=f.kind,
                state="raised" if state == "raised" else "cleared",
                rank=f.rank,
                node=f.node,
                phase=f.phase,
                cause=f.cause,
                summary=f.summary if state == "raised" else f"cleared: {f.summary}",
                step=f.step,
                evidence=f.evidence,
            ),
            actor=ACTOR,
            subject=record.job_id,
        )
        _log.info(
            "finding " + state,
            job=record.job_id,
            attempt=record.attempt,
            kind=f.kind,
            rank=f.rank,
            phase=f.phase,
            cause=f.cause,
            step=f.step,
        )

    def _health(self, conn: sa.Connection, h: HealthChange, now: int, actor: str) -> None:
        state = self.profiles.tracker.node(h.node)
        values = {
            "degraded": h.degraded,
            "degraded_for": state.degraded_for,
            "reason": h.reason,
            "evidence_json": store.dumps(h.evidence),
            "since_ms": now,
        }
        updated = conn.execute(
            store.nodes.update().where(store.nodes.c.node == h.node).values(**values)
        )
        if not updated.rowcount:
            conn.execute(store.nodes.insert().values(node=h.node, **values))
        store.record(
            conn,
            NODE_DEGRADED.type if h.degraded else NODE_RECOVERED.type,
            NodeHealth(node=h.node, reason=h.reason, evidence=h.evidence),
            actor=actor,
            subject=h.node,
        )
        _log.warning(
            "node degraded" if h.degraded else "node recovered", node=h.node, reason=h.reason
        )


def _row_finding(row: Any) -> Finding:
    return Finding(
        kind=row.kind,
        rank=None if row.rank < 0 else row.rank,
        node=row.node,
        phase=row.phase,
        cause=row.cause,
        summary=row.summary,
        evidence=orjson.loads(row.evidence_json),
        step=row.step,
        raised_step=row.raised_step,
    )


__all__ = ["ACTOR", "Applied", "Recorder", "now_ms"]
