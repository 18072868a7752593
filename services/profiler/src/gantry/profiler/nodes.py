"""Node health and utilisation (domain; no I/O).

A node becomes **degraded** — the scheduler then places no new gang on it — when:

- it was the slow one (a ``slow_compute`` straggler ran there) in ``slow_jobs`` different jobs
  within ``slow_window_s``: one slow job may be the job's fault, several are the node's; or
- one of its GPUs reported throttling (a thermal or hardware slowdown; running at its power
  cap under load is not throttling) in
  ``throttle_heartbeats`` heartbeats in a row.

It **recovers** when a throttled node has sent ``recover_heartbeats`` clean heartbeats in a
row, when a node degraded for slowness has served its ``probation_s`` (nothing runs there to
prove it fast, so it gets another chance; if it is still slow it is marked again), or when an
operator says so. Heartbeats also give each node's recent utilisation, which with the
placements the scheduler made gives allocation against actual use, per node and cluster-wide.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gantry.core import NotFound
from gantry.events.catalog import NodeHeartbeat, NodeRegistered


@dataclass(frozen=True)
class NodeHealthConfig:
    """Thresholds of node health (the profiler's settings ``nodes.*``)."""

    slow_jobs: int = 2
    slow_window_s: float = 3600.0
    throttle_heartbeats: int = 3
    recover_heartbeats: int = 6
    probation_s: float = 1800.0
    utilisation_window_s: float = 300.0
    """Utilisation is the mean over this many recent seconds of heartbeats."""


@dataclass(frozen=True)
class HealthChange:
    """A node marked degraded, or recovered."""

    node: str
    degraded: bool
    reason: str
    evidence: dict[str, Any]


@dataclass
class NodeState:
    """What the profiler knows of one node."""

    node: str
    pool: str = "default"
    cpus: float = 0.0
    gpus: int = 0
    degraded: bool = False
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    since_ms: int = 0
    degraded_for: str = ""  # "slow" | "throttled" | "operator"
    last_seen_ms: int = 0
    jobs: list[str] = field(default_factory=list)
    memory_used_mib: int = 0
    throttled: bool = False
    temperature_c: float = 0.0
    power_w: float = 0.0
    net_rx_bytes_per_s: float = 0.0
    net_tx_bytes_per_s: float = 0.0
    slow: dict[str, int] = field(default_factory=dict)
    """job id -> when a slow_compute straggler of that job last ran here (ms)."""
    throttled_run: int = 0
    clean_run: int = 0
    samples: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=720))
    """(at_ms, cpu_util, gpu_util) of recent heartbeats."""

    def utilisation(self, now_ms: int, window_s: float) -> tuple[float, float]:
        """Mean (cpu_util, gpu_util) over the recent window (0 without heartbeats)."""
        since = now_ms - window_s * 1000
        recent = [(c, g) for at, c, g in self.samples if at >= since]
        if not recent:
            return 0.0, 0.0
        return (
            sum(c for c, _ in recent) / len(recent),
            sum(g for _, g in recent) / len(recent),
        )

    def slow_jobs(self, now_ms: int, window_s: float) -> list[str]:
        since = now_ms - window_s * 1000
        return sorted(job for job, at in self.slow.items() if at >= since)


class NodeTracker:
    """Every node's health and recent utilisation."""

    def __init__(self, config: NodeHealthConfig | None = None) -> None:
        self.config = config or NodeHealthConfig()
        self.nodes: dict[str, NodeState] = {}

    def node(self, name: str) -> NodeState:
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeState(name)
        return state

    def registered(self, r: NodeRegistered) -> None:
        """A node's inventory (from its agent)."""
        state = self.node(r.node)
        state.pool = r.pool
        state.cpus = r.cpu_milli / 1000
        state.gpus = len(r.gpus)

    def heartbeat(self, hb: NodeHeartbeat, now_ms: int) -> HealthChange | None:
        """Take a heartbeat; the health change it causes, if any."""
        cfg = self.config
        state = self.node(hb.node)
        state.last_seen_ms = now_ms
        state.jobs = list(hb.jobs)
        state.memory_used_mib = hb.memory_used_mib
        state.net_rx_bytes_per_s = hb.net_rx_bytes_per_s
        state.net_tx_bytes_per_s = hb.net_tx_bytes_per_s
        state.samples.append((now_ms, hb.cpu_util, hb.gpu_util))
        throttled = [g.index for g in hb.gpus if g.throttled]
        state.throttled = bool(throttled)
        state.temperature_c = max((g.temperature_c for g in hb.gpus), default=0.0)
        state.power_w = sum(g.power_w for g in hb.gpus)
        if throttled:
            state.throttled_run += 1
            state.clean_run = 0
        else:
            state.clean_run += 1
            state.throttled_run = 0
        if not state.degraded and state.throttled_run >= cfg.throttle_heartbeats:
            hottest = max(hb.gpus, key=lambda g: g.temperature_c)
            return self._mark(
                state,
                True,
                "throttled",
                f"GPU {', '.join(map(str, throttled))} throttled in {state.throttled_run} "
                "heartbeats in a row (thermal or hardware slowdown)",
                {
                    "throttled_gpus": throttled,
                    "heartbeats": state.throttled_run,
                    "temperature_c": hottest.temperature_c,
                    "power_w": state.power_w,
                },
                now_ms,
            )
        if (
            state.degraded
            and state.degraded_for == "throttled"
            and state.clean_run >= cfg.recover_heartbeats
        ):
            return self._mark(
                state,
                False,
                "",
                f"no throttling in {state.clean_run} heartbeats in a row",
                {"heartbeats": state.clean_run},
                now_ms,
            )
        return None

    def slow_in_job(
        self, node: str, job_id: str, evidence: dict[str, Any], now_ms: int
    ) -> HealthChange | None:
        """A ``slow_compute`` straggler of ``job_id`` runs on ``node``."""
        cfg = self.config
        state = self.node(node)
        state.slow[job_id] = now_ms
        for job in [j for j, at in state.slow.items() if at < now_ms - cfg.slow_window_s * 1000]:
            del state.slow[job]
        jobs = state.slow_jobs(now_ms, cfg.slow_window_s)
        if state.degraded or len(jobs) < cfg.slow_jobs:
            return None
        return self._mark(
            state,
            True,
            "slow",
            f"slowest rank in {len(jobs)} jobs within {cfg.slow_window_s / 60:.0f} min "
            f"({', '.join(jobs)}): its compute is slower than its peers'",
            {"jobs": jobs, "last": evidence},
            now_ms,
        )

    def tick(self, now_ms: int) -> list[HealthChange]:
        """Recoveries that come with time (probation of nodes degraded for slowness)."""
        changes = []
        for state in self.nodes.values():
            if (
                state.degraded
                and state.degraded_for == "slow"
                and now_ms - state.since_ms >= self.config.probation_s * 1000
            ):
                state.slow.clear()
                changes.append(
                    self._mark(
                        state,
                        False,
                        "",
                        f"probation: {self.config.probation_s / 60:.0f} min since it was "
                        "marked slow; it gets new work again and is marked again if still slow",
                        {"probation_s": self.config.probation_s},
                        now_ms,
                    )
                )
        return changes

    def set(
        self, node: str, degraded: bool, reason: str, actor: str, now_ms: int
    ) -> HealthChange | None:
        """An operator marks a node degraded or recovered (None when it already is)."""
        if node not in self.nodes:
            raise NotFound(
                "node",
                node,
                hint="name a node that registered or sent heartbeats (`gantry profile nodes`)",
            )
        state = self.nodes[node]
        if state.degraded == degraded:
            return None
        state.slow.clear()
        state.throttled_run = state.clean_run = 0
        why = reason or ("marked by an operator" if degraded else "recovered by an operator")
        return self._mark(state, degraded, "operator", why, {"by": actor}, now_ms)

    def restore(
        self,
        node: str,
        *,
        degraded: bool,
        reason: str,
        evidence: dict[str, Any],
        since_ms: int,
        degraded_for: str,
    ) -> None:
        """Put back a node's health as stored (after a restart)."""
        state = self.node(node)
        state.degraded = degraded
        state.reason = reason
        state.evidence = evidence
        state.since_ms = since_ms
        state.degraded_for = degraded_for

    @staticmethod
    def _mark(
        state: NodeState,
        degraded: bool,
        why: str,
        reason: str,
        evidence: dict[str, Any],
        now_ms: int,
    ) -> HealthChange:
        state.degraded = degraded
        state.degraded_for = why if degraded else ""
        state.reason = reason
        state.evidence = evidence
        state.since_ms = now_ms
        return HealthChange(state.node, degraded, reason, evidence)


__all__ = ["HealthChange", "NodeHealthConfig", "NodeState", "NodeTracker"]
