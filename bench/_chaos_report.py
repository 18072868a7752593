"""The chaos bench's arithmetic and picture: kill windows, error rates, the audit count, the plot.

A kill window is ``[kill - before_s, ready + grace_s]``; overlapping windows are merged. A
call is *outside* when its whole span (sent to answered) lies outside every window, so a call
that was waiting on a killed process when the kill came is inside.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from _chaos_load import EVENT_TYPE, Call
from _chaos_monkey import KINDS, Kill

from gantry.client.audit import AuditClient, Filter
from gantry.core import GantryError

Window = tuple[float, float]


def windows(kills: Iterable[Kill], before_s: float, grace_s: float) -> list[Window]:
    """The kill windows, merged where they overlap, in time order."""
    out: list[Window] = []
    for start, end in sorted(k.window(before_s, grace_s) for k in kills):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def outside(call: Call, spans: Sequence[Window]) -> bool:
    """Whether ``call`` lies wholly outside every window."""
    return all(call.end < start or call.start > end for start, end in spans)


def rates(name: str, calls: Sequence[Call], spans: Sequence[Window]) -> dict[str, Any]:
    """Calls and errors in all, outside and inside the windows, and the error rates."""
    out = [c for c in calls if outside(c, spans)]
    inside = [c for c in calls if not outside(c, spans)]
    bad_out = [c for c in out if not c.ok]
    bad_in = sum(1 for c in inside if not c.ok)
    figures: dict[str, Any] = {
        f"{name}_requests": len(calls),
        f"{name}_errors": len(bad_out) + bad_in,
        f"{name}_requests_outside": len(out),
        f"{name}_errors_outside": len(bad_out),
        f"{name}_error_rate": round(len(bad_out) / len(out), 5) if out else None,
        f"{name}_error_rate_inside": round(bad_in / len(inside), 4) if inside else None,
    }
    kinds = Counter(c.error.split(":")[0] for c in calls if not c.ok)
    figures[f"{name}_error_kinds"] = dict(kinds.most_common(4))
    if bad_out:  # the evidence: when, and what the client saw
        figures[f"{name}_errors_outside_first"] = [
            {"at_s": round(c.start, 2), "error": c.error} for c in bad_out[:5]
        ]
    return figures


def kill_figures(kills: Sequence[Kill]) -> dict[str, Any]:
    """Kills by kind and target, and how long targets were down."""
    down = [k.down_s for k in kills if k.down_s == k.down_s]  # not nan
    by_kind = Counter(k.target.kind for k in kills)
    return {
        "kills": len(kills),
        "kills_by_kind": {kind: by_kind.get(kind, 0) for kind in KINDS},
        "kills_by_target": dict(sorted(Counter(k.target.name for k in kills).items())),
        "down_s_median": round(statistics.median(down), 2) if down else None,
        "down_s_max": round(max(down), 2) if down else None,
        "kill_log": [
            {
                "at_s": round(k.at, 1),
                "target": k.target.name,
                "pause_s": k.pause_s,
                "down_s": round(k.down_s, 1) if k.down_s == k.down_s else None,
            }
            for k in kills
        ],
    }


def audit_events(
    address: str, token: str, run_id: str, acked: Iterable[str], timeout_s: float
) -> tuple[Counter[str], float]:
    """How often the audit log holds each of the run's events, once it holds every acked one
    (or ``timeout_s`` passed); and the seconds waited."""
    wanted = set(acked)
    started = time.monotonic()
    seen: Counter[str] = Counter()
    with AuditClient(address, token, timeout_s=30) as audit:
        while True:
            with contextlib.suppress(GantryError):  # audit restarting: ask again
                seen = Counter(
                    r.event_id
                    for r in audit.query(
                        Filter(types=[EVENT_TYPE], correlation_id=run_id), page_size=1000
                    )
                )
            if wanted <= set(seen) or time.monotonic() - started > timeout_s:
                return seen, time.monotonic() - started
            time.sleep(1.0)


def plot(
    path: Path,
    kills: Sequence[Kill],
    spans: Sequence[Window],
    serving: Sequence[Call],
    finished_at: Sequence[float],
    acked_at: Sequence[float],
    end: float,
) -> bool:
    """The run as a timeline (kills by target, serving calls and errors per second, jobs
    finished and events acknowledged); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colours = {"service": "tab:blue", "agent": "tab:green", "nats": "tab:orange"}
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(11, 7), sharex=True)
    names = sorted({k.target.name for k in kills})
    for k in kills:
        stop = k.ready_at if k.ready_at == k.ready_at else end
        top.barh(names.index(k.target.name), stop - k.at, left=k.at,
                 color=colours[k.target.kind], height=0.6, zorder=2)  # fmt: skip
    top.set_yticks(range(len(names)), names, fontsize=7)
    top.set_title("killed (SIGKILL to ready again), by target", fontsize=9)
    seconds = range(int(end) + 1)
    ok = Counter(int(c.start) for c in serving if c.ok)
    bad = Counter(int(c.start) for c in serving if not c.ok)
    mid.bar(seconds, [ok[s] for s in seconds], width=1.0, color="tab:gray", label="answered",
            zorder=2)  # fmt: skip
    mid.bar(seconds, [bad[s] for s in seconds], bottom=[ok[s] for s in seconds], width=1.0,
            color="tab:red", label="failed", zorder=2)  # fmt: skip
    mid.set_title("serving calls per second", fontsize=9)
    mid.legend(fontsize=7, loc="upper right")
    bins = list(range(0, int(end) + 5, 5))
    low.hist(list(finished_at), bins=bins, color="tab:green", alpha=0.6, label="jobs final",
             zorder=2)  # fmt: skip
    low.set_ylabel("jobs / 5 s", fontsize=8)
    events = low.twinx()
    acked = Counter(int(t) // 5 * 5 for t in acked_at)
    events.step(bins, [acked[b] for b in bins], where="post", color="tab:purple",
                label="events acked")  # fmt: skip
    events.set_ylabel("events / 5 s", fontsize=8)
    events.set_ylim(bottom=0)
    low.legend(fontsize=7, loc="upper left")
    events.legend(fontsize=7, loc="upper right")
    low.set_xlabel("seconds since the workload started (shaded: kill windows)")
    for axis in (mid, low):
        for start, stop in spans:
            axis.axvspan(start, min(stop, end), color="tab:orange", alpha=0.12, lw=0, zorder=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


__all__ = ["audit_events", "kill_figures", "outside", "plot", "rates", "windows"]
