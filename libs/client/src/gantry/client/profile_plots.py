"""Pictures of a profile: PNGs drawn with matplotlib (Agg) and a self-contained HTML page.

::

    from gantry.client.profile_plots import html_job, plot_job, plot_nodes

    plot_job(profile, Path("job.png"))             # phase bars per rank + busy-time timeline
    Path("job.html").write_text(html_job(profile))  # the same, as inline SVG, with tables
    plot_nodes(nodes, cluster, Path("nodes.png"))  # allocated vs actually used, per node

Every phase has one colour everywhere; ``comm`` (waiting on the other ranks, not work) is grey
and hatched. The straggler is red. The HTML page loads nothing: its SVG is drawn here, its CSS
is inline, it has no script, and every text from the service is escaped.

The PNGs are drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas directly, never
through pyplot, so importing this module changes no global matplotlib state.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gantry.client.profiler import (
    PHASES,
    ClusterInfo,
    FindingInfo,
    JobProfileInfo,
    NodeInfo,
    RankInfo,
)

#: The colour of each phase, in PNGs and HTML alike.
PHASE_COLOURS = {
    "data": "#8172b3",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "optimizer": "#dd8452",
    "comm": "#b8b8b8",
}
#: The straggler's colour (and a degraded node's).
ALERT = "#c44e52"
#: Rank lines of the timeline (red is kept for the straggler).
_RANK_COLOURS = (
    "#4c72b0", "#55a868", "#dd8452", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
    "#64b5cd", "#2f4b7c",
)  # fmt: skip
_DPI = 120


# ---------------------------------------------------------------------- words


def verdict(profile: JobProfileInfo) -> str:
    """The profile's verdict in a few words, for titles: the straggler if one stands, else
    the first standing finding, else that none stands."""
    s = profile.straggler
    if s is not None:
        ratio = s.evidence.get("ratio")
        times = f"{ratio:.2f}x the others' busy time, " if _is_number(ratio) else ""
        cause = f" ({s.cause.replace('_', ' ')})" if s.cause else ""
        return f"rank {s.rank} on {s.node} is a straggler: {times}{s.phase} phase{cause}"
    if profile.standing:
        f = profile.standing[0]
        who = f" (rank {f.rank} on {f.node})" if f.rank is not None else ""
        return f"{f.kind.replace('_', ' ')}{who}"
    return "no standing findings"


def _title(profile: JobProfileInfo) -> str:
    name = f"{profile.name} ({profile.job_id})" if profile.name else profile.job_id
    return f"{name}, attempt {profile.attempt}"


def _rank_label(r: RankInfo) -> str:
    return f"rank {r.rank} · {r.node}" if r.node else f"rank {r.rank}"


def _straggler_rank(profile: JobProfileInfo) -> int | None:
    s = profile.straggler
    return s.rank if s is not None else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finding_label(f: FindingInfo) -> str:
    kind = f.kind.replace("_", " ")
    return f"{kind} r{f.rank}" if f.rank is not None else kind


# ---------------------------------------------------------------------- PNG: a job


def plot_job(profile: JobProfileInfo, path: Path) -> Path:
    """Write a PNG of ``profile`` to ``path`` and return it: (top) one stacked bar per rank of
    its recent per-step phase times, the straggler's label red; (bottom) each rank's busy
    time (step minus comm) over the steps, with the findings at the step they were raised."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    straggler = _straggler_rank(profile)
    top_height = max(1.6, 0.45 * len(ranks) + 0.8)
    fig = Figure(figsize=(10, top_height + 3.6))
    FigureCanvasAgg(fig)
    bars, timeline = fig.subplots(2, 1, gridspec_kw={"height_ratios": [top_height, 3.2]})
    fig.suptitle(
        textwrap.fill(f"{_title(profile)}: {verdict(profile)}", 100),
        color=ALERT if straggler is not None else "black",
        fontsize=11,
    )

    for y, r in enumerate(ranks):
        left = 0.0
        for phase in PHASES:
            width = r.recent.phase(phase)
            bars.barh(
                y, width, left=left, height=0.6, color=PHASE_COLOURS[phase],
                hatch="//" if phase == "comm" else None, edgecolor="white", linewidth=0.5,
                label=phase if y == 0 else None,
            )  # fmt: skip
            left += width
    bars.set_yticks(range(len(ranks)), [_rank_label(r) for r in ranks])
    for label, r in zip(bars.get_yticklabels(), ranks, strict=True):
        if r.rank == straggler:
            label.set_color(ALERT)
            label.set_fontweight("bold")
    bars.invert_yaxis()
    bars.set_xlabel("ms per step (recent steps)")
    bars.grid(axis="x", alpha=0.3)
    if ranks:
        bars.legend(ncols=len(PHASES), loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                    frameon=False)  # fmt: skip
    else:
        bars.text(0.5, 0.5, "no steps reported yet", ha="center", transform=bars.transAxes)

    for i, r in enumerate(ranks):
        points = sorted(r.timeline, key=lambda p: p.last_step)
        is_straggler = r.rank == straggler
        timeline.plot(
            [p.last_step for p in points], [p.times.busy_ms for p in points],
            marker="." if len(points) < 60 else None, linewidth=2.0 if is_straggler else 1.2,
            color=ALERT if is_straggler else _RANK_COLOURS[i % len(_RANK_COLOURS)],
            label=_rank_label(r),
        )  # fmt: skip
    for f in profile.findings:
        if f.raised_step <= 0:
            continue
        colour = ALERT if f.standing else "#7f7f7f"
        timeline.axvline(f.raised_step, color=colour, linestyle="--" if f.standing else ":")
        timeline.annotate(
            _finding_label(f), (f.raised_step, 1.0), xycoords=("data", "axes fraction"),
            xytext=(3, -12), textcoords="offset points", color=colour, fontsize=8,
        )  # fmt: skip
    timeline.set_xlabel("step")
    timeline.set_ylabel("busy ms per step\n(step minus comm)")
    timeline.set_ylim(bottom=0)
    timeline.grid(alpha=0.3)
    if ranks:
        timeline.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    return path


# ---------------------------------------------------------------------- PNG: nodes


def plot_nodes(nodes: Sequence[NodeInfo], cluster: ClusterInfo, path: Path) -> Path:
    """Write a PNG comparing, node by node, what the scheduler allocated with what is actually
    used (GPUs; CPUs on nodes without a GPU) as paired bars, degraded nodes red; return
    ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [
        (unit, sorted((n for n in nodes if n.unit == unit), key=lambda n: n.node))
        for unit in ("GPUs", "CPUs")
    ]
    groups = [(unit, members) for unit, members in groups if members] or [("GPUs", [])]
    widest = max(len(members) for _, members in groups)
    width = max(7.0, 1.1 * widest + 2)
    fig = Figure(figsize=(width, 3.4 * len(groups) + 0.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    summary = (
        f"{cluster.nodes} nodes, {cluster.degraded} degraded, {cluster.running_jobs} running "
        f"jobs; GPUs allocated {cluster.gpus_allocated:g} / busy {cluster.gpus_busy:.1f} of "
        f"{cluster.gpus}; CPUs allocated {cluster.cpus_allocated:g} / busy "
        f"{cluster.cpus_busy:.1f} of {cluster.cpus:g}"
    )
    fig.suptitle(textwrap.fill(summary, int(width * 11)), fontsize=10)
    for ax, (unit, members) in zip(axes, groups, strict=True):
        xs = range(len(members))
        allocated = [n.allocated for n in members]
        used = [n.used for n in members]
        ax.bar([x - 0.2 for x in xs], allocated, width=0.4, label="allocated",
               color=[ALERT if n.degraded else "#4c72b0" for n in members])  # fmt: skip
        ax.bar([x + 0.2 for x in xs], used, width=0.4, label="actually used", hatch="..",
               edgecolor="white",
               color=[("#e8a0a2" if n.degraded else "#55a868") for n in members])  # fmt: skip
        for x, n in zip(xs, members, strict=True):
            ax.hlines(n.capacity, x - 0.45, x + 0.45, colors="black", linewidth=1,
                      label="capacity" if x == 0 else None)  # fmt: skip
        ax.set_xticks(list(xs), [n.node + (" (degraded)" if n.degraded else "") for n in members])
        for label, n in zip(ax.get_xticklabels(), members, strict=True):
            if n.degraded:
                label.set_color(ALERT)
                label.set_fontweight("bold")
        ax.set_ylabel(unit)
        top = max((max(n.capacity, n.allocated, n.used) for n in members), default=1.0)
        ax.set_ylim(0, top * 1.3 or 1.0)  # headroom for the legend above the capacity lines
        ax.set_title(f"{unit}: allocated vs actually used, per node", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if members:
            ax.legend(fontsize=8, ncols=3, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no nodes reported", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    return path


# ---------------------------------------------------------------------- HTML


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1000px; }
h1 { font-size: 20px; margin-bottom: 4px; } h2 { font-size: 16px; margin-top: 28px; }
.verdict { font-weight: 600; } .alert { color: #c44e52; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
tr.straggler td { color: #c44e52; font-weight: 600; }
.finding { border-left: 4px solid #c44e52; padding: 4px 12px; margin: 10px 0; }
.finding.cleared { border-color: #aaa; color: #555; }
.swatch { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
""".strip()


def html_job(profile: JobProfileInfo) -> str:
    """A self-contained HTML page of ``profile``: the phase bars and the busy-time timeline as
    inline SVG, a table of ranks by phase, and the findings with their summary and evidence.
    It references nothing outside itself."""
    e = html.escape
    straggler = _straggler_rank(profile)
    alert = " alert" if straggler is not None else ""
    facts = (
        f"{profile.state}, world size {profile.world_size}, step {profile.last_step}; "
        f"{profile.samples_per_s:.1f} samples/s, compute {profile.compute_fraction:.0%} of "
        f"step time, utilisation {profile.gpu_util:.0%}"
    )
    legend = (
        "".join(
            f'<span class="swatch" style="background:{_swatch(p)}"></span>{e(p)}' for p in PHASES
        )
        + " (comm: waiting on the other ranks)"
    )
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(_title(profile))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(_title(profile))}</h1>",
        f'<p class="verdict{alert}">{e(verdict(profile))}</p>',
        f"<p>{e(facts)}</p>",
        "<h2>Where each rank's step goes (recent steps)</h2>",
        f"<p>{legend}</p>",
        _svg_bars(profile.ranks, straggler),
        "<h2>Busy time over the steps</h2>",
        _svg_timeline(profile, straggler),
        "<h2>Ranks by phase (ms per step, recent)</h2>",
        _rank_table(profile.ranks, straggler),
        "<h2>Findings</h2>",
        *(_finding_html(f) for f in profile.findings),
        "" if profile.findings else "<p>none</p>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _swatch(phase: str) -> str:
    colour = PHASE_COLOURS[phase]
    if phase == "comm":  # hatched, as in the bars
        return f"repeating-linear-gradient(45deg, {colour} 0 3px, #fff 3px 5px)"
    return colour


def _rank_table(ranks: Sequence[RankInfo], straggler: int | None) -> str:
    e = html.escape
    head = ["rank", "node", "step", *PHASES, "busy", "step ms", "samples/step", "tokens/step"]
    rows = []
    for r in sorted(ranks, key=lambda r: r.rank):
        t = r.recent
        cells = [
            f"<td>{r.rank}</td>",
            f'<td class="text">{e(r.node)}</td>',
            f"<td>{r.last_step}</td>",
            *(f"<td>{t.phase(p):.1f}</td>" for p in PHASES),
            f"<td>{t.busy_ms:.1f}</td><td>{t.step_ms:.1f}</td>",
            f"<td>{t.samples_per_step:g}</td><td>{t.tokens_per_step:g}</td>",
        ]
        css = ' class="straggler"' if r.rank == straggler else ""
        rows.append(f"<tr{css}>{''.join(cells)}</tr>")
    header = "".join(f"<th>{e(h)}</th>" for h in head)
    return f'<table class="ranks"><tr>{header}</tr>{"".join(rows)}</table>'


def _finding_html(f: FindingInfo) -> str:
    e = html.escape
    who = f"rank {f.rank} on {f.node}" if f.rank is not None else "the whole gang"
    when = f"raised at step {f.raised_step}"
    if not f.standing:
        when += f", cleared at step {f.step}"
    facts = ", ".join(
        x for x in (f.phase and f"phase {f.phase}", f.cause and f"cause {f.cause}") if x
    )
    evidence = "".join(
        f'<tr><td class="text">{e(str(k))}</td><td class="text">{e(_evidence_value(v))}</td></tr>'
        for k, v in f.evidence.items()
    )
    return (
        f'<div class="finding {"standing" if f.standing else "cleared"}">'
        f"<h3>{e(f.kind.replace('_', ' '))} ({e(f.state)}): {e(who)}, {e(when)}</h3>"
        f"<p>{e(f.summary)}</p>"
        + (f"<p>{e(facts)}</p>" if facts else "")
        + (f'<table class="evidence">{evidence}</table>' if evidence else "")
        + "</div>"
    )


def _evidence_value(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


# ---------------------------------------------------------------------- inline SVG


def _nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _svg_bars(ranks: Sequence[RankInfo], straggler: int | None) -> str:
    e = html.escape
    ordered = sorted(ranks, key=lambda r: r.rank)
    left, width, row, top = 170, 600, 28, 10
    ticks = _nice_ticks(max((sum(r.recent.phase(p) for p in PHASES) for r in ordered), default=0))
    scale = width / ticks[-1]
    height = top + row * max(len(ordered), 1) + 30
    out = [
        f'<svg width="{left + width + 20}" height="{height}" role="img" '
        'aria-label="phase times per rank">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{PHASE_COLOURS["comm"]}"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2"/></pattern></defs>',
    ]
    for i, r in enumerate(ordered):
        y = top + i * row
        colour = ALERT if r.rank == straggler else "#333"
        weight = "bold" if r.rank == straggler else "normal"
        out.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" style="fill:{colour};'
            f'font-weight:{weight}">{e(_rank_label(r))}</text>'
        )
        x = float(left)
        for phase in PHASES:
            ms = r.recent.phase(phase)
            fill = "url(#hatch)" if phase == "comm" else PHASE_COLOURS[phase]
            out.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{ms * scale:.1f}" height="{row - 8}" '
                f'fill="{fill}"><title>{e(f"rank {r.rank} {phase}: {ms:.1f} ms")}</title></rect>'
            )
            x += ms * scale
    axis_y = top + row * max(len(ordered), 1)
    out.extend(_x_axis(ticks, left, scale, axis_y, "ms per step"))
    out.append("</svg>")
    return "".join(out)


def _x_axis(ticks: list[float], left: float, scale: float, y: float, label: str) -> list[str]:
    end = left + (ticks[-1] - ticks[0]) * scale
    out = [f'<line x1="{left}" y1="{y}" x2="{end:.1f}" y2="{y}" stroke="#999"/>']
    for t in ticks:
        x = left + (t - ticks[0]) * scale
        out.append(f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle">{t:g}</text>')
    out.append(
        f'<text x="{left + (ticks[-1] - ticks[0]) * scale / 2:.1f}" y="{y + 28}" '
        f'text-anchor="middle">{html.escape(label)}</text>'
    )
    return out


def _svg_timeline(profile: JobProfileInfo, straggler: int | None) -> str:
    e = html.escape
    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    points = [p for r in ranks for p in r.timeline]
    left, width, top, height = 60, 700, 16, 220
    steps = [p.last_step for p in points] + [f.raised_step for f in profile.findings]
    low, high = min(steps, default=0), max(steps, default=1)
    x_ticks = [low + t for t in _nice_ticks(max(high - low, 1))]
    y_ticks = _nice_ticks(max((p.times.busy_ms for p in points), default=0))
    sx, sy = width / (x_ticks[-1] - low), height / y_ticks[-1]

    def x_of(step: float) -> float:
        return left + (step - low) * sx

    def y_of(ms: float) -> float:
        return top + height - ms * sy

    out = [
        f'<svg width="{left + width + 150}" height="{top + height + 40}" role="img" '
        'aria-label="busy time over steps">'
    ]
    for t in y_ticks:
        y = y_of(t)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.extend(_x_axis(x_ticks, x_of(low), sx, top + height, "step"))
    for i, r in enumerate(ranks):
        colour = ALERT if r.rank == straggler else _RANK_COLOURS[i % len(_RANK_COLOURS)]
        line = " ".join(
            f"{x_of(p.last_step):.1f},{y_of(p.times.busy_ms):.1f}"
            for p in sorted(r.timeline, key=lambda p: p.last_step)
        )
        out.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" '
            f'stroke-width="{2.5 if r.rank == straggler else 1.5}"/>'
        )
        out.append(
            f'<text x="{left + width + 10}" y="{top + 14 + 16 * i}" style="fill:{colour}">'
            f"{e(_rank_label(r))}</text>"
        )
    for f in profile.findings:
        if f.raised_step <= 0:
            continue
        colour = ALERT if f.standing else "#888"
        x = x_of(f.raised_step)
        dash = "6,3" if f.standing else "2,3"
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + height}" stroke="{colour}" '
            f'stroke-dasharray="{dash}"><title>{e(f.summary)}</title></line>'
            f'<text x="{x + 3:.1f}" y="{top + 10}" style="fill:{colour}">'
            f"{e(_finding_label(f))}</text>"
        )
    out.append("</svg>")
    return "".join(out)


__all__ = ["ALERT", "PHASE_COLOURS", "html_job", "plot_job", "plot_nodes", "verdict"]
