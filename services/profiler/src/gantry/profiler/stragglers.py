"""Straggler, imbalance and bottleneck detection for one gang (domain; no I/O).

In synchronous data-parallel training every rank waits for the slowest at each gradient
all-reduce, so every rank's *step* time is the same: the straggler does not show in it. It
shows in how the step is spent. A rank's **busy time** is its step minus the time it waited
on the others (data + forward + backward + optimizer); the straggler's busy time is above the
others', and the others' communication wait is about its excess — they were waiting for it.

:class:`GangAnalyzer` takes each rank's windows (:class:`~gantry.profiler.windows.Window`),
cuts the step axis where any rank's window starts or ends, so each **segment** has one
window of every rank, and judges the most recent segments (at least ``horizon_steps`` steps
and ``min_segments`` segments):

- **straggler**: a rank whose busy time, over the median of the other ranks (leave-one-out,
  so a gang of two works too), has a step-weighted *lower* median across those segments of at
  least ``threshold``, at least ``min_excess_ms`` more per step, seen in two or more of its own
  windows, while the other ranks wait at least ``corroboration`` of that excess. The lower
  median means one slow segment (one slow step, a hiccup) never raises an alarm. The verdict
  names the phase with the largest excess (data, forward, backward, optimizer) and the cause:
  ``slow_data_loading`` (data), ``longer_samples`` or ``more_samples`` (compute, with more
  tokens or samples per step than the others), else ``slow_compute`` (the node is slow: it
  counts towards marking the node degraded). It clears once the ratio falls below
  ``clear_threshold``.
- **data_imbalance**: tokens (or, without tokens, samples) per step differ between ranks by
  at least ``imbalance``.
- **input_bound**: most ranks spend at least ``input_bound`` of the step waiting for data.
- **comm_bound**: most ranks spend at least ``comm_bound`` of the step waiting on
  communication, with no straggler to explain it.

Every verdict comes with its evidence in numbers and a sentence that says it in words.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gantry.profiler.windows import BUSY_PHASES, PHASES, MetricRejected, Window

Kind = Literal["straggler", "data_imbalance", "input_bound", "comm_bound"]


@dataclass(frozen=True)
class DetectionConfig:
    """Thresholds of the analyses (the profiler's settings ``detection.*``)."""

    threshold: float = 1.5
    """A straggler's busy time is at least this multiple of the other ranks' median."""
    clear_threshold: float = 1.25
    """...and the verdict clears below this multiple."""
    horizon_steps: int = 30
    """Judge at least this many of the most recent steps..."""
    min_segments: int = 2
    """...in at least this many segments."""
    min_excess_ms: float = 1.0
    """Ignore excesses smaller than this per step (timer noise on tiny steps)."""
    corroboration: float = 0.5
    """The other ranks must wait at least this fraction of a straggler's excess."""
    imbalance: float = 0.15
    """Tokens or samples per step that differ by this fraction are an imbalance."""
    input_bound: float = 0.3
    """Waiting this fraction of the step for data makes a gang input-bound."""
    comm_bound: float = 0.5
    """Waiting this fraction of the step on communication makes it communication-bound."""
    max_segments: int = 256
    """Segments kept per gang (memory bound)."""
    max_windows: int = 64
    """Windows kept per rank (memory bound)."""


@dataclass(frozen=True)
class Segment:
    """Steps ``first_step..last_step`` and the window of each rank that covers them."""

    first_step: int
    last_step: int
    ranks: Mapping[int, Window]

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1


@dataclass
class Finding:
    """A verdict about a gang (see the module doc)."""

    kind: Kind
    rank: int | None
    node: str
    phase: str
    cause: str
    summary: str
    evidence: dict[str, Any]
    step: int
    raised_step: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.kind, -1 if self.rank is None else self.rank


@dataclass(frozen=True)
class Change:
    """A finding raised, or one cleared."""

    state: Literal["raised", "cleared"]
    finding: Finding


@dataclass
class _Rank:
    node: str
    windows: deque[Window] = field(default_factory=deque)


class GangAnalyzer:
    """The analyses of one attempt of one job, fed window by window."""

    def __init__(
        self,
        job_id: str,
        attempt: int,
        nodes: Mapping[int, str],
        config: DetectionConfig | None = None,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.config = config or DetectionConfig()
        self.ranks = {rank: _Rank(node) for rank, node in nodes.items()}
        self.segments: deque[Segment] = deque(maxlen=self.config.max_segments)
        self.active: dict[tuple[str, int], Finding] = {}
        self.cursor = 0
        """The last step already cut into segments."""
        self.windows_seen = 0

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def add(self, window: Window) -> list[Change]:
        """Take one window; the findings it raised or cleared."""
        rank = self.ranks.get(window.rank)
        if rank is None:
            raise MetricRejected(
                f"job {self.job_id} attempt {self.attempt} has no rank {window.rank} "
                f"(ranks 0-{self.world_size - 1})",
                reason="unknown_rank",
            )
        if window.node != rank.node:
            raise MetricRejected(
                f"rank {window.rank} of job {self.job_id} runs on {rank.node}, not on "
                f"{window.node}",
                reason="wrong_node",
            )
        if rank.windows:
            last = rank.windows[-1]
            if window.first_step <= last.last_step:
                if window.first_step >= last.first_step or window.at_ms <= last.at_ms:
                    raise MetricRejected(
                        f"job {self.job_id} rank {window.rank}: steps {window.first_step}-"
                        f"{window.last_step} were already reported",
                        reason="duplicate",
                    )
                self._restarted(window.first_step)  # resumed from an earlier checkpoint
        rank.windows.append(window)
        while len(rank.windows) > self.config.max_windows:
            rank.windows.popleft()
        self.windows_seen += 1
        if not self._cut():
            return []
        return self._judge()

    def _restarted(self, step: int) -> None:
        """The gang restarted from a checkpoint before ``step``: start the segments again."""
        for rank in self.ranks.values():
            rank.windows.clear()
        self.segments.clear()
        self.cursor = step - 1

    # -- segments ----------------------------------------------------------------------------

    def _cut(self) -> bool:
        """Cut the steps every rank has reported into segments; True when any were cut."""
        if any(not r.windows for r in self.ranks.values()):
            return False
        frontier = min(r.windows[-1].last_step for r in self.ranks.values())
        if frontier <= self.cursor:
            return False
        bounds = {frontier}
        for r in self.ranks.values():
            for w in r.windows:
                for b in (w.first_step - 1, w.last_step):
                    if self.cursor < b < frontier:
                        bounds.add(b)
        start = self.cursor
        for end in sorted(bounds):
            covering: dict[int, Window] = {}
            for index, r in self.ranks.items():
                found = _covering(r.windows, end)
                if found is not None and found.first_step <= start + 1:
                    covering[index] = found
            if len(covering) >= 2:
                self.segments.append(Segment(start + 1, end, covering))
            start = end
        self.cursor = frontier
        return True

    def recent(self) -> list[Segment]:
        """The segments the verdicts are judged on, newest first."""
        out: list[Segment] = []
        steps = 0
        for segment in reversed(self.segments):
            out.append(segment)
            steps += segment.steps
            if steps >= self.config.horizon_steps and len(out) >= self.config.min_segments:
                break
        return out

    # -- verdicts ----------------------------------------------------------------------------

    def _judge(self) -> list[Change]:
        cfg = self.config
        recent = self.recent()
        steps = sum(s.steps for s in recent)
        if len(recent) < cfg.min_segments or steps < cfg.horizon_steps:
            return []  # too early to judge: at least horizon_steps steps in min_segments
        step = recent[0].last_step
        found: dict[tuple[str, int], Finding] = {}
        for rank in self.ranks:
            finding = self._straggler(rank, recent, step)
            if finding is not None:
                found[finding.key] = finding
        stragglers = [f for f in found.values() if f.kind == "straggler"]
        for finding in (
            self._imbalance(recent, step),
            self._bound("data", recent, step, stragglers),
            self._bound("comm", recent, step, stragglers),
        ):
            if finding is not None:
                found[finding.key] = finding
        return self._settle(found, recent, step)

    def _settle(
        self, found: dict[tuple[str, int], Finding], recent: Sequence[Segment], step: int
    ) -> list[Change]:
        """Raise new findings, keep standing ones up to date, clear those that ended."""
        changes: list[Change] = []
        for key, finding in found.items():
            standing = self.active.get(key)
            if standing is None:
                finding.raised_step = step
                self.active[key] = finding
                changes.append(Change("raised", finding))
            else:
                finding.raised_step = standing.raised_step
                self.active[key] = finding
        for key in list(self.active):
            if key in found:
                continue
            if self._still(self.active[key], recent):
                continue
            ended = self.active.pop(key)
            ended.step = step
            changes.append(Change("cleared", ended))
        return changes

    def _still(self, finding: Finding, recent: Sequence[Segment]) -> bool:
        """Whether a standing finding is above its clearing threshold (hysteresis)."""
        cfg = self.config
        if finding.kind == "straggler" and finding.rank is not None:
            stats = self._rank_stats(finding.rank, recent)
            return stats is not None and stats["ratio"] >= cfg.clear_threshold
        if finding.kind == "data_imbalance":
            spread = _spread(recent)
            return spread is not None and spread[0] >= 1 + cfg.imbalance / 2
        if finding.kind in ("input_bound", "comm_bound"):
            phase = "data" if finding.kind == "input_bound" else "comm"
            limit = cfg.input_bound if phase == "data" else cfg.comm_bound
            return _share(recent, phase) >= limit * 0.8
        return False

    def _rank_stats(self, rank: int, recent: Sequence[Segment]) -> dict[str, Any] | None:
        ratios, excess, wait, weights = [], [], [], []
        phases: dict[str, list[float]] = {p: [] for p in PHASES}
        windows = set()
        mine_busy, theirs_busy = [], []
        for s in recent:
            mine = s.ranks.get(rank)
            others = [w for r, w in s.ranks.items() if r != rank]
            if mine is None or not others:
                continue
            their_busy = statistics.median(w.busy_ms for w in others)
            ratios.append(mine.busy_ms / max(their_busy, 1e-6))
            excess.append(mine.busy_ms - their_busy)
            wait.append(statistics.median(w.comm_ms for w in others))
            for p in PHASES:
                phases[p].append(mine.phase(p) - statistics.median(w.phase(p) for w in others))
            weights.append(s.steps)
            windows.add(mine.first_step)
            mine_busy.append(mine.busy_ms)
            theirs_busy.append(their_busy)
        if not weights:
            return None
        return {
            "ratio": _lower_median(ratios, weights),
            "excess_ms": _lower_median(excess, weights),
            "others_wait_ms": _lower_median(wait, weights),
            "phase_excess_ms": {p: _lower_median(v, weights) for p, v in phases.items()},
            "busy_ms": _lower_median(mine_busy, weights),
            "others_busy_ms": _lower_median(theirs_busy, weights),
            "windows": len(windows),
            "steps": sum(weights),
        }

    def _straggler(self, rank: int, recent: Sequence[Segment], step: int) -> Finding | None:
        cfg = self.config
        stats = self._rank_stats(rank, recent)
        if stats is None:
            return None
        standing = ("straggler", rank) in self.active
        threshold = cfg.clear_threshold if standing else cfg.threshold
        if (
            stats["ratio"] < threshold
            or stats["excess_ms"] < cfg.min_excess_ms
            or (not standing and stats["windows"] < 2)
            or stats["others_wait_ms"] < cfg.corroboration * stats["excess_ms"]
        ):
            return None
        excess: dict[str, float] = stats["phase_excess_ms"]
        phase = max(BUSY_PHASES, key=lambda p: excess[p])
        load = _load_ratio(rank, recent)
        cause = "slow_compute"
        if phase == "data":
            cause = "slow_data_loading"
        elif phase in ("forward", "backward") and load is not None:
            what, ratio = load
            if ratio >= 1 + cfg.imbalance:
                cause = "longer_samples" if what == "tokens" else "more_samples"
        node = self.ranks[rank].node
        evidence = {
            "ratio": round(stats["ratio"], 3),
            "busy_ms": round(stats["busy_ms"], 2),
            "others_busy_ms": round(stats["others_busy_ms"], 2),
            "excess_ms": round(stats["excess_ms"], 2),
            "others_wait_ms": round(stats["others_wait_ms"], 2),
            "phase_excess_ms": {p: round(v, 2) for p, v in excess.items()},
            "steps_judged": stats["steps"],
            "windows": stats["windows"],
            "first_step": recent[-1].first_step,
            "last_step": step,
        }
        if load is not None:
            evidence[f"{load[0]}_ratio"] = round(load[1], 3)
        return Finding(
            kind="straggler",
            rank=rank,
            node=node,
            phase=phase,
            cause=cause,
            summary=_straggler_summary(rank, node, phase, cause, evidence, load),
            evidence=evidence,
            step=step,
        )

    def _imbalance(self, recent: Sequence[Segment], step: int) -> Finding | None:
        cfg = self.config
        spread = _spread(recent)
        standing = ("data_imbalance", -1) in self.active
        limit = 1 + (cfg.imbalance / 2 if standing else cfg.imbalance)
        if spread is None or spread[0] < limit:
            return None
        ratio, what, heavy, light, per_rank = spread
        node = self.ranks[heavy].node
        return Finding(
            kind="data_imbalance",
            rank=heavy,
            node=node,
            phase="data",
            cause=f"more_{what}",
            summary=(
                f"data imbalance: rank {heavy} gets {ratio:.2f}x the {what} per step of rank "
                f"{light} ({per_rank[heavy]:.0f} vs {per_rank[light]:.0f}); balance the shards "
                f"(e.g. bucket sequences by length) so every rank does the same work"
            ),
            evidence={
                "ratio": round(ratio, 3),
                "unit": what,
                f"{what}_per_step": {str(r): round(v, 1) for r, v in per_rank.items()},
                "heaviest_rank": heavy,
                "lightest_rank": light,
            },
            step=step,
        )

    def _bound(
        self,
        phase: Literal["data", "comm"],
        recent: Sequence[Segment],
        step: int,
        stragglers: Iterable[Finding],
    ) -> Finding | None:
        cfg = self.config
        kind: Kind = "input_bound" if phase == "data" else "comm_bound"
        limit = cfg.input_bound if phase == "data" else cfg.comm_bound
        if (kind, -1) in self.active:
            limit *= 0.8
        share = _share(recent, phase)
        if share < limit:
            return None
        if phase == "comm" and any(True for _ in stragglers):
            return None  # the others wait for a straggler: that verdict explains it
        if phase == "data":
            summary = (
                f"input-bound: the ranks spend {share:.0%} of each step waiting for data; "
                "add data-loader workers (num_workers), prefetch, or cache the dataset"
            )
        else:
            summary = (
                f"communication-bound: the ranks spend {share:.0%} of each step waiting on "
                "the gradient all-reduce; use larger batches, gradient accumulation or "
                "compression, or place the gang closer together"
            )
        return Finding(
            kind=kind,
            rank=None,
            node="",
            phase=phase,
            cause="",
            summary=summary,
            evidence={"share": round(share, 3), "threshold": limit},
            step=step,
        )

    # -- what the API shows ---------------------------------------------------------------------

    def rank_summary(self) -> dict[int, dict[str, float]]:
        """Each rank's per-step means over the recent segments (for tables and plots)."""
        recent = self.recent()
        out: dict[int, dict[str, float]] = {}
        for rank in self.ranks:
            rows = [(s.ranks[rank], s.steps) for s in recent if rank in s.ranks]
            if not rows:
                continue
            total = sum(n for _, n in rows)
            summary = {f"{p}_ms": sum(w.phase(p) * n for w, n in rows) / total for p in PHASES}
            summary["step_ms"] = sum(w.step_ms * n for w, n in rows) / total
            summary["busy_ms"] = sum(w.busy_ms * n for w, n in rows) / total
            summary["samples_per_step"] = sum(w.samples_per_step * n for w, n in rows) / total
            summary["tokens_per_step"] = sum(w.tokens_per_step * n for w, n in rows) / total
            out[rank] = summary
        return out


def _covering(windows: Iterable[Window], step: int) -> Window | None:
    found = None
    for w in windows:
        if w.first_step <= step <= w.last_step:
            found = w
    return found


def _lower_median(values: Sequence[float], weights: Sequence[int]) -> float:
    """The step-weighted lower median: one outlying segment never moves it past the others."""
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(weights) / 2
    seen = 0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    return pairs[-1][0]


def _per_rank(recent: Sequence[Segment], attr: str) -> dict[int, float]:
    sums: dict[int, float] = {}
    steps: dict[int, int] = {}
    for s in recent:
        for rank, w in s.ranks.items():
            sums[rank] = sums.get(rank, 0.0) + getattr(w, attr) * s.steps
            steps[rank] = steps.get(rank, 0) + s.steps
    return {r: sums[r] / steps[r] for r in sums if steps[r]}


def _load(recent: Sequence[Segment]) -> tuple[str, dict[int, float]] | None:
    tokens = _per_rank(recent, "tokens_per_step")
    if len(tokens) >= 2 and all(v > 0 for v in tokens.values()):
        return "tokens", tokens
    samples = _per_rank(recent, "samples_per_step")
    if len(samples) >= 2 and all(v > 0 for v in samples.values()):
        return "samples", samples
    return None


def _load_ratio(rank: int, recent: Sequence[Segment]) -> tuple[str, float] | None:
    """How much more work (tokens, else samples, per step) ``rank`` gets than the others."""
    load = _load(recent)
    if load is None or rank not in load[1]:
        return None
    what, per_rank = load
    others = [v for r, v in per_rank.items() if r != rank]
    return what, per_rank[rank] / statistics.median(others)


def _spread(recent: Sequence[Segment]) -> tuple[float, str, int, int, dict[int, float]] | None:
    load = _load(recent)
    if load is None:
        return None
    what, per_rank = load
    heavy = max(per_rank, key=lambda r: per_rank[r])
    light = min(per_rank, key=lambda r: per_rank[r])
    return per_rank[heavy] / per_rank[light], what, heavy, light, per_rank


def _share(recent: Sequence[Segment], phase: str) -> float:
    """The lower median over ranks of the fraction of the step spent in ``phase``."""
    shares = []
    for rank, value in _per_rank(recent, f"{phase}_ms").items():
        step = _per_rank(recent, "step_ms").get(rank, 0.0)
        if step > 0:
            shares.append(value / step)
    if not shares:
        return 0.0
    shares.sort()
    return shares[(len(shares) - 1) // 2]


_PHASE_WORDS = {
    "data": "waiting for data",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "the optimizer step",
}
_CAUSE_WORDS = {
    "slow_data_loading": "its data loader is slow",
    "longer_samples": "its samples are longer (more tokens per step)",
    "more_samples": "it gets more samples per step",
    "slow_compute": "its node computes slowly (contention, throttling or a weaker device)",
}


def _straggler_summary(
    rank: int,
    node: str,
    phase: str,
    cause: str,
    ev: Mapping[str, Any],
    load: tuple[str, float] | None,
) -> str:
    extra = ""
    if cause in ("longer_samples", "more_samples") and load is not None:
        extra = f" ({load[1]:.2f}x the {load[0]} of the others)"
    return (
        f"rank {rank} on {node} is a straggler: {ev['ratio']:.2f}x the busy time of the other "
        f"ranks ({ev['busy_ms']:.1f} vs {ev['others_busy_ms']:.1f} ms per step), "
        f"{ev['phase_excess_ms'][phase]:.1f} ms more in {_PHASE_WORDS[phase]}; the others wait "
        f"{ev['others_wait_ms']:.1f} ms per step for it. Cause: {_CAUSE_WORDS[cause]}{extra}."
    )


__all__ = [
    "Change",
    "DetectionConfig",
    "Finding",
    "GangAnalyzer",
    "Kind",
    "Segment",
]
