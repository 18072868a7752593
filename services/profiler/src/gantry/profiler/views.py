"""What the API and the metrics show (read side): job profiles, nodes, cluster utilisation.

A job's profile is built from the database (every window of the attempt, downsampled to at
most ``max_points`` per rank for the timeline) and, while it runs, the live analysis (the
per-rank means the verdicts were judged on). Nodes combine the health tracker's state, the
last minutes of heartbeats and the running attempts' placements.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import NotFound
from gantry.profiler import store
from gantry.profiler.recording import Recorder
from gantry.profiler.windows import PHASES, Window, merge


@dataclass(frozen=True)
class Phases:
    step_ms: float = 0.0
    data_ms: float = 0.0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    comm_ms: float = 0.0
    optimizer_ms: float = 0.0
    busy_ms: float = 0.0
    samples_per_step: float = 0.0
    tokens_per_step: float = 0.0

    @classmethod
    def of(cls, windows: list[Window]) -> Phases:
        """Step-weighted means over ``windows``."""
        steps = sum(w.steps for w in windows)
        if not steps:
            return cls()

        def mean(attr: str) -> float:
            return float(sum(getattr(w, attr) * w.steps for w in windows)) / steps

        return cls(
            step_ms=mean("step_ms"),
            **{f"{p}_ms": mean(f"{p}_ms") for p in PHASES},
            busy_ms=mean("busy_ms"),
            samples_per_step=sum(w.samples for w in windows) / steps,
            tokens_per_step=sum(w.tokens for w in windows) / steps,
        )


@dataclass(frozen=True)
class RankView:
    rank: int
    node: str
    recent: Phases
    overall: Phases
    last_step: int
    memory_mib: int
    timeline: list[Window]


@dataclass(frozen=True)
class FindingView:
    kind: str
    state: str
    rank: int
    node: str
    phase: str
    cause: str
    summary: str
    evidence: dict[str, Any]
    raised_step: int
    step: int
    raised_ms: int
    cleared_ms: int


@dataclass(frozen=True)
class JobView:
    job_id: str
    attempt: int
    name: str
    owner: str
    state: str
    world_size: int
    ranks: list[RankView]
    findings: list[FindingView]
    samples_per_s: float
    compute_fraction: float
    last_step: int
    started_ms: int
    updated_ms: int
    attempts: list[int]
    gpu_util: float
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NodeView:
    node: str
    state: str
    reason: str
    evidence: dict[str, Any]
    since_ms: int
    cpu_util: float
    gpu_util: float
    gpus: int
    gpus_allocated: float
    cpus: float
    cpus_allocated: float
    memory_used_mib: int
    net_rx_bytes_per_s: float
    net_tx_bytes_per_s: float
    throttled: bool
    jobs: list[str]
    last_seen_ms: int
    slow_jobs: int
    temperature_c: float
    power_w: float


@dataclass(frozen=True)
class ClusterView:
    nodes: int = 0
    degraded: int = 0
    gpus: int = 0
    gpus_allocated: float = 0.0
    gpus_busy: float = 0.0
    cpus: float = 0.0
    cpus_allocated: float = 0.0
    cpus_busy: float = 0.0
    running_jobs: int = 0


def resolve_job(recorder: Recorder, job: str) -> str:
    """A job id from an id or a name (the newest job of that name)."""
    with recorder.engine.connect() as conn:
        found = conn.execute(
            sa.select(store.jobs.c.job_id).where(store.jobs.c.job_id == job).limit(1)
        ).first()
        if found is not None:
            return str(found.job_id)
        named = conn.execute(
            sa.select(store.jobs.c.job_id)
            .where(store.jobs.c.name == job)
            .order_by(store.jobs.c.started_ms.desc())
            .limit(1)
        ).first()
    if named is None:
        raise NotFound(
            "profiled job",
            job,
            hint="give a job id or name from `gantry jobs list`; jobs are profiled once scheduled",
        )
    return str(named.job_id)


def job_view(recorder: Recorder, job: str, *, attempt: int = 0, max_points: int = 200) -> JobView:
    """The profile of one attempt (the latest when ``attempt`` is 0)."""
    job_id = resolve_job(recorder, job)
    with recorder.engine.connect() as conn:
        rows = conn.execute(
            sa.select(store.jobs)
            .where(store.jobs.c.job_id == job_id)
            .order_by(store.jobs.c.attempt)
        ).all()
        attempts = [r.attempt for r in rows]
        row = next((r for r in rows if r.attempt == attempt), None) if attempt else rows[-1]
        if row is None:
            raise NotFound(
                f"attempt of job {job_id}",
                str(attempt),
                hint=f"its attempts: {', '.join(map(str, attempts))}",
            )
        windows = store.job_windows(conn, job_id, row.attempt)
        finding_rows = conn.execute(
            sa.select(store.findings)
            .where(store.findings.c.job_id == job_id, store.findings.c.attempt == row.attempt)
            .order_by(store.findings.c.id.desc())
        ).all()
    placements = [p for p in orjson.loads(row.placements_json)]
    by_rank: dict[int, list[Window]] = {}
    for w in windows:
        by_rank.setdefault(w.rank, []).append(w)
    with recorder.lock:
        live = recorder.profiles.jobs.get(job_id)
        recent = (
            live.gang.rank_summary() if live is not None and live.attempt == row.attempt else {}
        )
        tracker = recorder.profiles.tracker
        node_names = sorted({str(p["node"]) for p in placements})
        window_s = tracker.config.utilisation_window_s
        now = recorder.clock()
        utils = []
        for name in node_names:
            state = tracker.nodes.get(name)
            if state is not None:
                cpu, gpu = state.utilisation(now, window_s)
                utils.append(gpu if state.gpus else cpu)
    ranks = []
    for p in sorted(placements, key=lambda p: int(p["worker"])):
        rank = int(p["worker"])
        mine = by_rank.get(rank, [])
        tail = mine[-10:]
        recent_phases = (
            Phases(**{k: v for k, v in recent[rank].items()}) if rank in recent else Phases.of(tail)
        )
        ranks.append(
            RankView(
                rank=rank,
                node=str(p["node"]),
                recent=recent_phases,
                overall=Phases.of(mine),
                last_step=mine[-1].last_step if mine else 0,
                memory_mib=max((w.memory_mib for w in mine), default=0),
                timeline=downsample(mine, max_points),
            )
        )
    findings = [
        FindingView(
            kind=f.kind,
            state="cleared" if f.cleared_ms else "raised",
            rank=f.rank,
            node=f.node,
            phase=f.phase,
            cause=f.cause,
            summary=f.summary,
            evidence=orjson.loads(f.evidence_json),
            raised_step=f.raised_step,
            step=f.step,
            raised_ms=f.raised_ms,
            cleared_ms=f.cleared_ms,
        )
        for f in finding_rows
    ]
    findings.sort(key=lambda f: (f.state != "raised", -f.raised_ms))
    rates = [
        r.recent.samples_per_step / r.recent.step_ms * 1000 for r in ranks if r.recent.step_ms > 0
    ]
    fractions = [
        (r.recent.forward_ms + r.recent.backward_ms) / r.recent.step_ms
        for r in ranks
        if r.recent.step_ms > 0
    ]
    return JobView(
        job_id=job_id,
        attempt=row.attempt,
        name=row.name,
        owner=row.owner,
        state=row.state,
        world_size=len(placements),
        ranks=ranks,
        findings=findings,
        samples_per_s=sum(rates),
        compute_fraction=statistics.median(fractions) if fractions else 0.0,
        last_step=max((r.last_step for r in ranks), default=0),
        started_ms=row.started_ms,
        updated_ms=max((w.at_ms for w in windows), default=row.started_ms),
        attempts=attempts,
        gpu_util=sum(utils) / len(utils) if utils else 0.0,
        nodes=node_names,
    )


def downsample(windows: list[Window], max_points: int) -> list[Window]:
    """At most ``max_points`` windows, neighbours merged (step-weighted)."""
    if max_points <= 0 or len(windows) <= max_points:
        return list(windows)
    per = -(-len(windows) // max_points)
    out = []
    for start in range(0, len(windows), per):
        group = windows[start : start + per]
        merged = group[0]
        for w in group[1:]:
            merged = merge(merged, w)
        out.append(merged)
    return out


def nodes_view(recorder: Recorder) -> tuple[list[NodeView], ClusterView]:
    """Every node's health and utilisation, and the cluster's."""
    with recorder.lock:
        profiles = recorder.profiles
        tracker = profiles.tracker
        now = recorder.clock()
        cfg = tracker.config
        views = []
        for name in sorted(tracker.nodes):
            s = tracker.nodes[name]
            cpu, gpu = s.utilisation(now, cfg.utilisation_window_s)
            gpus_alloc, cpus_alloc = profiles.allocation(name)
            views.append(
                NodeView(
                    node=name,
                    state="degraded" if s.degraded else "ok",
                    reason=s.reason,
                    evidence=dict(s.evidence),
                    since_ms=s.since_ms,
                    cpu_util=cpu,
                    gpu_util=gpu,
                    gpus=s.gpus,
                    gpus_allocated=gpus_alloc,
                    cpus=s.cpus,
                    cpus_allocated=cpus_alloc,
                    memory_used_mib=s.memory_used_mib,
                    net_rx_bytes_per_s=s.net_rx_bytes_per_s,
                    net_tx_bytes_per_s=s.net_tx_bytes_per_s,
                    throttled=s.throttled,
                    jobs=list(s.jobs),
                    last_seen_ms=s.last_seen_ms,
                    slow_jobs=len(s.slow_jobs(now, cfg.slow_window_s)),
                    temperature_c=s.temperature_c,
                    power_w=s.power_w,
                )
            )
        running = sum(1 for r in profiles.jobs.values() if r.running)
    cluster = ClusterView(
        nodes=len(views),
        degraded=sum(1 for v in views if v.state == "degraded"),
        gpus=sum(v.gpus for v in views),
        gpus_allocated=sum(v.gpus_allocated for v in views),
        gpus_busy=sum(v.gpu_util * v.gpus for v in views),
        cpus=sum(v.cpus for v in views),
        cpus_allocated=sum(v.cpus_allocated for v in views),
        cpus_busy=sum(v.cpu_util * v.cpus for v in views),
        running_jobs=running,
    )
    return views, cluster


__all__ = [
    "ClusterView",
    "FindingView",
    "JobView",
    "NodeView",
    "Phases",
    "RankView",
    "downsample",
    "job_view",
    "nodes_view",
    "resolve_job",
]
