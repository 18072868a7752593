"""Charts drawn on the server as SVG: line charts, heat maps, stacked bars, graphs.

Pages embed the returned markup directly, so a chart costs no request, no script and no asset
from the network; every text is escaped. Sizes are in SVG user units; the stylesheet scales the
drawing to its container.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

#: Series colours (colour-blind-safe, Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: Colours of states in graphs.
STATE_COLOURS = {
    "succeeded": "#dcf3e5",
    "completed": "#dcf3e5",
    "skipped": "#eeeeee",
    "failed": "#fde2e2",
    "cancelled": "#fde2e2",
    "running": "#e2e9fd",
    "pending": "#fdf1dc",
    "waiting": "#fdf1dc",
    "dataset": "#eef6ff",
    "job": "#f3eefe",
    "model": "#ecf9f1",
}


@dataclass(frozen=True)
class Series:
    """One line: a name and its (x, y) points."""

    name: str
    points: Sequence[tuple[float, float]]
    colour: str = ""


@dataclass(frozen=True)
class Node:
    """A box of a graph: id, label, a state (its colour), an optional link and sub-label."""

    id: str
    label: str
    state: str = ""
    href: str = ""
    detail: str = ""
    layer: int | None = None


@dataclass(frozen=True)
class Edge:
    """An arrow between two nodes' ids."""

    source: str
    target: str
    label: str = ""


def _num(value: float) -> str:
    """A compact axis label."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e3:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _tick(value: float, ticks: Sequence[float]) -> str:
    """A tick label with as many decimals as the step between ticks needs (0.826, 0.828...
    stay distinct), compact (k, M) for large values."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 0.0
    if step <= 0 or abs(value) >= 1e3 or step >= 1:
        return _num(value)
    digits = max(0, -math.floor(math.log10(step)))
    return f"{value:.{digits}f}"


def _ticks(lo: float, hi: float, count: int = 5, *, whole: bool = False) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (whole numbers only, with
    ``whole``: trials, steps, epochs)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    if whole:
        raw = max(raw, 1.0)
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    start = math.floor(lo / step) * step
    out = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            out.append(round(v, 12))
        v += step
    return out


def _svg(parts: list[str]) -> Markup:
    """The drawing as markup: every text put into ``parts`` went through ``escape``."""
    return Markup("".join(parts))  # noqa: S704 - built from escaped text only


def empty(message: str, *, width: int = 640, height: int = 80) -> Markup:
    """A placeholder drawing that says why there is no chart."""
    return _svg(
        [
            f'<svg class="chart empty" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img"><text x="{width / 2}" y="{height / 2}" '
            f'text-anchor="middle">{escape(message)}</text></svg>'
        ]
    )


def line_chart(
    series: Sequence[Series],
    *,
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    width: int = 640,
    height: int = 260,
    y_min: float | None = None,
    y_max: float | None = None,
    bands: Sequence[tuple[float, float, str]] = (),
) -> Markup:
    """Lines over a shared x axis; ``bands`` shade x ranges (start, end, colour)."""
    pts = [p for s in series for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
    if not pts:
        return empty(f"{title}: no data yet" if title else "no data yet", width=width)
    left, right, top, bottom = 56, 16, 28 if title or len(series) > 1 else 12, 40
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0 = min(ys) if y_min is None else y_min
    y1 = max(ys) if y_max is None else y_max
    if x1 == x0:  # one x: centre it
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:  # one value: centre it
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (min(max(y, y0), y1) - y0) / (y1 - y0) * ph

    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title or y_label)}">'
    ]
    if title:
        parts.append(f'<text x="{left}" y="16" font-weight="600">{escape(title)}</text>')
    for a, b, colour in bands:
        xa, xb = sx(max(a, x0)), sx(min(b, x1))
        if xb > xa:
            parts.append(
                f'<rect x="{xa:.1f}" y="{top}" width="{xb - xa:.1f}" height="{ph}" '
                f'fill="{escape(colour)}" opacity="0.25"/>'
            )
    y_ticks = _ticks(y0, y1)
    for t in y_ticks:
        y = sy(t)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eceff4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick(t, y_ticks)}</text>'
        )
    x_ticks = _ticks(x0, x1, 6, whole=all(float(x).is_integer() for x in xs))
    for t in x_ticks:
        x = sx(t)
        parts.append(
            f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_tick(t, x_ticks)}</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#c9ced8"/>'
    )
    for i, s in enumerate(series):
        colour = s.colour or PALETTE[i % len(PALETTE)]
        good = [p for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
        if not good:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(good))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{path}">'
            f"<title>{escape(s.name)}</title></polyline>"
        )
        if len(good) <= 40:  # few points: mark each one
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{colour}"/>'
                for x, y in good
            )
    if len(series) > 1:  # the legend goes above the plot, right of the title
        lx = left + (8 * len(title) + 24 if title else 0)
        for i, s in enumerate(series):
            colour = s.colour or PALETTE[i % len(PALETTE)]
            parts.append(
                f'<rect x="{lx}" y="{top - 16}" width="10" height="10" fill="{colour}"/>'
                f'<text x="{lx + 14}" y="{top - 7}">{escape(s.name)}</text>'
            )
            lx += 24 + 7 * len(s.name)
    if x_label:
        parts.append(
            f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">'
            f"{escape(x_label)}</text>"
        )
    if y_label:
        parts.append(
            f'<text transform="translate(12 {top + ph / 2}) rotate(-90)" text-anchor="middle">'
            f"{escape(y_label)}</text>"
        )
    parts.append("</svg>")
    return _svg(parts)


def _heat(value: float) -> str:
    """White (0) to deep blue (1)."""
    v = min(max(value, 0.0), 1.0)
    r = int(247 - v * (247 - 8))
    g = int(251 - v * (251 - 69))
    b = int(255 - v * (255 - 148))
    return f"#{r:02x}{g:02x}{b:02x}"


def heat_map(
    rows: Sequence[str],
    columns: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    title: str = "",
    labels: Sequence[Sequence[str]] | None = None,
    cell: int = 56,
    marked_rows: Sequence[str] = (),
) -> Markup:
    """A grid coloured by ``values`` in [0, 1] (None: grey, not applicable); ``labels`` are
    drawn in the cells; rows in ``marked_rows`` are outlined in red (e.g. degraded nodes)."""
    if not rows or not columns:
        return empty(f"{title}: nothing to show" if title else "nothing to show")
    label_w = max(80, 8 * max(len(r) for r in rows))
    top = 34 if title else 22
    width = label_w + cell * len(columns) + 10
    height = top + 30 * len(rows) + 10
    parts = [
        f'<svg class="chart heat" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}">'
    ]
    if title:
        parts.append(f'<text x="4" y="14" font-weight="600">{escape(title)}</text>')
    for j, c in enumerate(columns):
        parts.append(
            f'<text x="{label_w + j * cell + cell / 2}" y="{top - 6}" text-anchor="middle">'
            f"{escape(c)}</text>"
        )
    marked = set(marked_rows)
    for i, r in enumerate(rows):
        y = top + i * 30
        parts.append(f'<text x="4" y="{y + 19}">{escape(r)}</text>')
        for j in range(len(columns)):
            v = values[i][j] if j < len(values[i]) else None
            fill = "#e5e7eb" if v is None else _heat(v)
            x = label_w + j * cell
            text = labels[i][j] if labels is not None else ("" if v is None else f"{v:.0%}")
            colour = "#fff" if v is not None and v > 0.55 else "#1d2330"
            parts.append(
                f'<rect x="{x + 1}" y="{y + 1}" width="{cell - 2}" height="28" fill="{fill}">'
                f"<title>{escape(r)} · {escape(columns[j])}: {escape(text)}</title></rect>"
                f'<text x="{x + cell / 2}" y="{y + 19}" text-anchor="middle" '
                f'style="fill:{colour}">{escape(text)}</text>'
            )
        if r in marked:
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{cell * len(columns)}" height="30" '
                'fill="none" stroke="#c53030" stroke-width="2"/>'
            )
    parts.append("</svg>")
    return _svg(parts)


def stacked_bars(
    bars: Sequence[str],
    segments: Sequence[str],
    values: Sequence[Sequence[float]],
    *,
    title: str = "",
    unit: str = "s",
    marked: Sequence[str] = (),
    width: int = 640,
) -> Markup:
    """Horizontal bars (one per entry of ``bars``) split into ``segments``; bars named in
    ``marked`` get a red label (e.g. a straggler rank)."""
    totals = [sum(v) for v in values]
    if not bars or not any(totals):
        return empty(f"{title}: no data yet" if title else "no data yet", width=width)
    left, right = 90, 70
    top = 44 if title else 26
    height = top + 24 * len(bars) + 14
    pw = width - left - right
    vmax = max(totals)
    parts = [
        f'<svg class="chart bars" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}">'
    ]
    if title:
        parts.append(f'<text x="4" y="14" font-weight="600">{escape(title)}</text>')
    lx = left
    for k, seg in enumerate(segments):
        parts.append(
            f'<rect x="{lx}" y="{top - 20}" width="10" height="10" '
            f'fill="{PALETTE[k % len(PALETTE)]}"/><text x="{lx + 14}" y="{top - 11}">'
            f"{escape(seg)}</text>"
        )
        lx += 24 + 7 * len(seg)
    flagged = set(marked)
    for i, bar in enumerate(bars):
        y = top + i * 24
        style = ' style="fill:#c53030;font-weight:600"' if bar in flagged else ""
        parts.append(f'<text x="4" y="{y + 15}"{style}>{escape(bar)}</text>')
        x = float(left)
        for k, seg in enumerate(segments):
            v = values[i][k] if k < len(values[i]) else 0.0
            w = v / vmax * pw if vmax else 0
            if w > 0:
                parts.append(
                    f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="18" '
                    f'fill="{PALETTE[k % len(PALETTE)]}"><title>{escape(bar)} {escape(seg)}: '
                    f"{v:.4g} {escape(unit)}</title></rect>"
                )
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 15}">{totals[i]:.3g} {escape(unit)}</text>')
    parts.append("</svg>")
    return _svg(parts)


@dataclass
class _Layout:
    layer: dict[str, int] = field(default_factory=dict)
    order: dict[int, list[str]] = field(default_factory=dict)


def _layers(nodes: Sequence[Node], edges: Sequence[Edge]) -> _Layout:
    """Longest-path layering (sources at 0); nodes keep their given order within a layer."""
    ids = [n.id for n in nodes]
    known = set(ids)
    incoming: dict[str, list[str]] = {i: [] for i in ids}
    for e in edges:
        if e.source in known and e.target in known and e.source != e.target:
            incoming[e.target].append(e.source)
    layout = _Layout()
    fixed = {n.id: n.layer for n in nodes if n.layer is not None}

    def depth(node: str, trail: frozenset[str]) -> int:
        if node in layout.layer:
            return layout.layer[node]
        if node in fixed:
            layout.layer[node] = int(fixed[node] or 0)
            return layout.layer[node]
        parents = [p for p in incoming[node] if p not in trail]
        d = 0 if not parents else 1 + max(depth(p, trail | {node}) for p in parents)
        layout.layer[node] = d
        return d

    for i in ids:
        depth(i, frozenset())
    for i in ids:
        layout.order.setdefault(layout.layer[i], []).append(i)
    return layout


def graph(
    nodes: Sequence[Node],
    edges: Sequence[Edge],
    *,
    title: str = "",
    box_w: int = 170,
    box_h: int = 44,
) -> Markup:
    """A directed graph drawn left to right in layers (pipelines, lineage)."""
    if not nodes:
        return empty(f"{title}: nothing to show" if title else "nothing to show")
    layout = _layers(nodes, edges)
    gap_x, gap_y = 60, 18
    top = 28 if title else 10
    layers = max(layout.order) + 1
    tallest = max(len(v) for v in layout.order.values())
    width = 20 + layers * (box_w + gap_x)
    height = top + tallest * (box_h + gap_y) + 10
    pos: dict[str, tuple[float, float]] = {}
    for layer, members in layout.order.items():
        offset = (tallest - len(members)) * (box_h + gap_y) / 2
        for k, node_id in enumerate(members):
            pos[node_id] = (10 + layer * (box_w + gap_x), top + offset + k * (box_h + gap_y))
    parts = [
        f'<svg class="chart graph" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title or "graph")}">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#7b8496"/></marker></defs>'
    ]
    if title:
        parts.append(f'<text x="10" y="16" font-weight="600">{escape(title)}</text>')
    for e in edges:
        if e.source not in pos or e.target not in pos:
            continue
        (ax, ay), (bx, by) = pos[e.source], pos[e.target]
        x1, y1 = ax + box_w, ay + box_h / 2
        x2, y2 = bx, by + box_h / 2
        if bx <= ax:  # same or earlier layer: route below
            x1, y1, x2, y2 = ax + box_w / 2, ay + box_h, bx + box_w / 2, by
        mid = (x1 + x2) / 2
        parts.append(
            f'<path d="M {x1:.1f} {y1:.1f} C {mid:.1f} {y1:.1f}, {mid:.1f} {y2:.1f}, '
            f'{x2:.1f} {y2:.1f}" fill="none" stroke="#7b8496" stroke-width="1.4" '
            f'marker-end="url(#arrow)"><title>{escape(e.label)}</title></path>'
        )
    for n in nodes:
        x, y = pos[n.id]
        fill = STATE_COLOURS.get(n.state, "#ffffff")
        label = n.label if len(n.label) <= 24 else n.label[:23] + "…"
        box = (
            f'<g class="node" data-node="{escape(n.id)}" data-state="{escape(n.state)}">'
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6" fill="{fill}" '
            f'stroke="#9aa3b5"/><text x="{x + 8}" y="{y + 18}" font-weight="600">'
            f"{escape(label)}</text>"
            f'<text x="{x + 8}" y="{y + 34}">{escape(n.detail or n.state)}</text>'
            f"<title>{escape(n.label)} {escape(n.state)}</title></g>"
        )
        if n.href:
            box = f'<a href="{escape(n.href)}">{box}</a>'
        parts.append(box)
    parts.append("</svg>")
    return _svg(parts)


__all__ = [
    "PALETTE",
    "Edge",
    "Node",
    "Series",
    "empty",
    "graph",
    "heat_map",
    "line_chart",
    "stacked_bars",
]
