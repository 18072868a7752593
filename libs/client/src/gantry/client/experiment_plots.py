"""Pictures of an experiment: a figure drawn with matplotlib (Agg), as a PNG or an HTML page.

::

    from gantry.client.experiment_plots import html_experiment, write_experiment_plot

    write_experiment_plot(info, Path("hpo.png"))               # the three views below
    Path("hpo.html").write_text(html_experiment(info))          # the same, with the trials

The figure answers three questions about a search. (a) *Did it improve?* The objective of each
trial in trial order — succeeded trials as dots, pruned ones as crosses where they stopped,
failed ones left out — and the best so far as a step line (up for ``maximize``, down for
``minimize``). (b) *Did early stopping work?* Every trial's learning curve (the objective after
each epoch), pruned trials faded and ending in a cross, the best trial red. (c) *What mattered?*
One panel per parameter: its value against the objective, on a log axis when its values span
more than two decades, one column per value for a ``choice``.

Every colour means the same in every panel: blue succeeded, orange pruned, red the best trial.
The figure is drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas directly, never
through pyplot, so importing this module changes no global matplotlib state. The HTML page
loads nothing: the figure is inline SVG, its CSS is inline, it has no script, and every text
from the service is escaped.
"""

from __future__ import annotations

import html
import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gantry.client.workflows import ExperimentInfo, ParameterInfo, TrialInfo

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Succeeded trials.
DONE = "#4c72b0"
#: Trials the pruner stopped.
PRUNED = "#dd8452"
#: The best trial.
BEST = "#c44e52"
#: The best-so-far line.
TREND = "#55a868"
#: Trials still running (their curves so far).
RUNNING = "#8c8c8c"
#: How many decades a parameter's values must span to be drawn on a log axis.
LOG_DECADES = 2.0
_DPI = 120
_PER_ROW = 3  # parameter panels per row


# ---------------------------------------------------------------------- words


def headline(info: ExperimentInfo) -> str:
    """The experiment in a line, for titles: its state and the best trial so far."""
    best = info.best
    pruned = len(info.pruned)
    trials = f"{len(info.trials)} of {info.budget_trials} trials ({pruned} pruned)"
    if best is None or best.value is None:
        return f"{info.name}: {info.state}, {trials}, no trial succeeded yet"
    values = best.values_text(info.parameters)
    return (
        f"{info.name}: {info.state}, {trials}; best trial {best.number}: "
        f"{info.metric} {best.value:.4g} ({values})"
    )


def _objective(info: ExperimentInfo) -> str:
    return f"{info.metric} ({info.goal})"


# ---------------------------------------------------------------------- the figure


def experiment_figure(info: ExperimentInfo) -> Figure:
    """The figure of ``info``: (a) the objective of every trial in trial order with the best so
    far, (b) every trial's learning curve, (c) one panel per parameter against the objective.

    Its axes are, in order, (a), (b) and one per parameter in :meth:`ExperimentInfo.space`
    order, each titled (``lr``, ...). Nothing is drawn through pyplot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    space = info.space()
    rows = math.ceil(len(space) / _PER_ROW)
    fig = Figure(figsize=(13, 4.4 + 3.4 * rows))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(
        1 + rows, 2 * _PER_ROW, height_ratios=[4.4] + [3.4] * rows, hspace=0.55, wspace=0.9
    )
    fig.suptitle(
        textwrap.fill(headline(info), 130),
        color=BEST if info.state in ("failed", "cancelled") else "black",
        fontsize=11,
    )
    _trials_panel(fig.add_subplot(grid[0, :_PER_ROW]), info)
    _curves_panel(fig.add_subplot(grid[0, _PER_ROW:]), info)
    for i, param in enumerate(space):
        row, col = divmod(i, _PER_ROW)
        _parameter_panel(fig.add_subplot(grid[1 + row, 2 * col : 2 * col + 2]), info, param)
    return fig


def write_experiment_plot(info: ExperimentInfo, path: Path) -> Path:
    """Write the figure of ``info`` (:func:`experiment_figure`) to ``path`` as a PNG; ``path``."""
    experiment_figure(info).savefig(path, dpi=_DPI, format="png", bbox_inches="tight")
    return path


def _stop_value(t: TrialInfo) -> float | None:
    """Where a trial ended up: its objective, else its last reported epoch's."""
    if t.value is not None:
        return t.value
    return t.curve[-1][1] if t.curve else None


def _whole_numbers(ax: Axes) -> None:
    """Ticks on whole trial numbers or epochs only."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _nothing(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=RUNNING)


def _trials_panel(ax: Axes, info: ExperimentInfo) -> None:
    """(a): each trial's objective in trial order, and the best so far."""
    ax.set_title(f"{info.metric} of each trial, and the best so far", fontsize=10)
    ax.set_xlabel("trial")
    ax.set_ylabel(_objective(info))
    ax.grid(alpha=0.3)
    done = [(t.number, t.value) for t in info.trials_in("succeeded") if t.value is not None]
    pruned = [(t.number, v) for t in info.pruned if (v := _stop_value(t)) is not None]
    if not done and not pruned:
        _nothing(ax, "no trial has a value yet")
        return
    if done:
        ax.scatter([n for n, _ in done], [v for _, v in done], color=DONE, s=28, zorder=3,
                   label="succeeded")  # fmt: skip
    if pruned:
        ax.scatter([n for n, _ in pruned], [v for _, v in pruned], color=PRUNED, marker="x",
                   s=36, zorder=3, label="pruned (where it stopped)")  # fmt: skip
    trend = list(info.best_so_far())
    if trend:
        last = max(t.number for t in info.trials)
        xs = [n for n, _ in trend] + [last]
        ys = [v for _, v in trend] + [trend[-1][1]]
        ax.step(xs, ys, where="post", color=TREND, linewidth=1.8, zorder=2, label="best so far")
    best = info.best
    if best is not None and best.value is not None:
        ax.scatter([best.number], [best.value], color=BEST, marker="*", s=160, zorder=4,
                   label=f"best: trial {best.number}")  # fmt: skip
    _whole_numbers(ax)
    ax.legend(fontsize=8, loc="best")


def _curves_panel(ax: Axes, info: ExperimentInfo) -> None:
    """(b): every trial's objective per epoch; pruned trials faded, so early stopping shows."""
    ax.set_title(f"learning curves: {info.metric} after each epoch", fontsize=10)
    ax.set_xlabel("epoch")
    ax.set_ylabel(info.metric)
    ax.grid(alpha=0.3)
    curves = [t for t in info.trials if t.curve]
    if not curves:
        _nothing(ax, "no epoch reported yet")
        return
    labelled: set[str] = set()

    def once(label: str) -> str | None:
        if label in labelled:
            return None
        labelled.add(label)
        return label

    best = info.best
    for t in curves:
        if best is not None and t.number == best.number:
            continue  # drawn last, on top
        epochs, values = zip(*t.curve, strict=True)
        if t.state == "pruned":
            ax.plot(epochs, values, color=PRUNED, alpha=0.35, linewidth=1.0,
                    label=once("pruned (stopped early)"))  # fmt: skip
            ax.scatter([epochs[-1]], [values[-1]], color=PRUNED, alpha=0.6, marker="x", s=24)
        elif t.state == "succeeded":
            ax.plot(epochs, values, color=DONE, alpha=0.8, linewidth=1.2, label=once("succeeded"))
        elif t.state in ("starting", "running"):
            ax.plot(epochs, values, color=RUNNING, linestyle="--", linewidth=1.0,
                    label=once("running"))  # fmt: skip
        else:  # failed or cancelled: what it reported before
            ax.plot(epochs, values, color=RUNNING, alpha=0.3, linestyle=":", linewidth=1.0,
                    label=once(t.state))  # fmt: skip
    if best is not None and best.curve:
        epochs, values = zip(*best.curve, strict=True)
        ax.plot(epochs, values, color=BEST, linewidth=2.2, zorder=4,
                label=f"best: trial {best.number}")  # fmt: skip
    _whole_numbers(ax)
    ax.legend(fontsize=8, loc="best")


def _number_or_none(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def log_axis(param: ParameterInfo, values: Sequence[float]) -> bool:
    """Whether ``param`` is drawn on a log axis: its declared range (else the values tried) is
    positive and spans more than :data:`LOG_DECADES` decades."""
    if param.low is not None and param.high is not None:
        low, high = param.low, param.high
    elif values:
        low, high = min(values), max(values)
    else:
        return False
    return low > 0 and math.log10(high / low) > LOG_DECADES


def _parameter_panel(ax: Axes, info: ExperimentInfo, param: ParameterInfo) -> None:
    """(c): one parameter's value against the objective, for every trial with a value."""
    ax.set_title(param.name, fontsize=10)
    ax.set_ylabel(info.metric)
    ax.grid(alpha=0.3)
    points = [
        (t, t.values.get(param.name, ""), v)
        for t in info.trials_in("succeeded", "pruned")
        if (v := _stop_value(t)) is not None
    ]
    numbers = [_number_or_none(text) for _, text, _ in points]
    categorical = param.kind == "choice" or any(n is None for n in numbers)
    if categorical:
        seen = list(dict.fromkeys(text for _, text, _ in points))
        order = list(param.choices) + [c for c in seen if c not in param.choices]
        position = {c: i for i, c in enumerate(order)}
        xs = [float(position[text]) for _, text, _ in points]
        ax.set_xticks(range(len(order)), order)
        ax.set_xlim(-0.6, max(len(order) - 0.4, 0.6))
        ax.set_xlabel(f"{param.name}: {param.text}" if param.kind else param.name, fontsize=9)
    else:
        xs = [n for n in numbers if n is not None]
        log = log_axis(param, xs)
        if log:
            ax.set_xscale("log")
        if param.low is not None and param.high is not None and param.high > param.low:
            # the whole declared range: where the search looked, and where it did well
            if log:
                ax.set_xlim(param.low / 1.5, param.high * 1.5)
            else:
                pad = (param.high - param.low) * 0.05
                ax.set_xlim(param.low - pad, param.high + pad)
        scale = " (log axis)" if log else ""
        ax.set_xlabel(f"{param.text}{scale}" if param.kind else param.name, fontsize=9)
    if not points:
        _nothing(ax, "no trial has a value yet")
        return
    best = info.best
    for (t, _, value), x in zip(points, xs, strict=True):
        if best is not None and t.number == best.number:
            ax.scatter([x], [value], color=BEST, marker="*", s=140, zorder=4)
        elif t.state == "pruned":
            ax.scatter([x], [value], color=PRUNED, marker="x", s=28, alpha=0.6, zorder=3)
        else:
            ax.scatter([x], [value], color=DONE, s=24, zorder=3)


# ---------------------------------------------------------------------- HTML


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; margin-bottom: 4px; } h2 { font-size: 16px; margin-top: 28px; }
.state { font-weight: 600; } .alert { color: #c44e52; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right; }
td.text, th.text { text-align: left; }
tr.best td { color: #c44e52; font-weight: 600; } tr.pruned td { color: #a0622d; }
svg { max-width: 100%; height: auto; }
""".strip()


def html_experiment(info: ExperimentInfo) -> str:
    """A self-contained HTML page of ``info``: its state and settings, the figure of
    :func:`experiment_figure` as inline SVG, and every trial with its values, objective,
    epochs, device-seconds, model and reason. It references nothing outside itself."""
    e = html.escape
    alert = " alert" if info.state in ("failed", "cancelled") else ""
    budget = f"{info.budget_trials} trials" + (
        f", {info.budget_gpu_hours:g} device-hours" if info.budget_gpu_hours else ""
    )
    facts = [
        ("objective", _objective(info)),
        ("method", info.method),
        ("pruner", info.pruner),
        ("budget", budget),
        ("used", f"{len(info.trials)} trials, {info.device_s:.0f} device-seconds"),
        ("parallelism", str(info.parallelism)),
        ("space", "; ".join(f"{p.name}: {p.text}" for p in info.space())),
        ("owner", info.owner),
    ]
    rows = "".join(f'<tr><td class="text">{e(k)}</td><td class="text">{e(v)}</td></tr>'
                   for k, v in facts if v)  # fmt: skip
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>experiment {e(info.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>experiment {e(info.name)}</h1>",
        f'<p class="state{alert}">{e(info.state)}: {e(info.reason)}</p>',
        f'<table class="facts">{rows}</table>',
        "<h2>Trials, learning curves and parameters</h2>",
        _svg(info),
        "<h2>Trials</h2>",
        _trials_table(info),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _svg(info: ExperimentInfo) -> str:
    """The figure as an ``<svg>`` element (its text drawn as paths: no font is loaded)."""
    import matplotlib

    buffer = io.BytesIO()
    no_metadata = dict.fromkeys(("Date", "Creator", "Format", "Type"))  # no links, no dates
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": info.name}):
        experiment_figure(info).savefig(
            buffer, format="svg", bbox_inches="tight", metadata=no_metadata
        )
    text = buffer.getvalue().decode("utf-8")
    return text[text.index("<svg") :].strip()


def _trials_table(info: ExperimentInfo) -> str:
    e = html.escape
    head = ["trial", "state", "values", info.metric, "epochs", "device-s", "model", "reason"]
    best = info.best
    rows = []
    for t in info.trials:
        value = _stop_value(t)
        cells = [
            f"<td>{t.number}</td>",
            f'<td class="text">{e(t.state)}</td>',
            f'<td class="text">{e(t.values_text(info.parameters))}</td>',
            f"<td>{value:.4g}</td>" if value is not None else "<td></td>",
            f"<td>{t.epochs or ''}</td>",
            f"<td>{t.device_s:.0f}</td>",
            f'<td class="text">{e(t.model)}</td>',
            f'<td class="text">{e(t.reason)}</td>',
        ]
        css = "best" if best is not None and t.number == best.number else t.state
        rows.append(f'<tr class="{e(css)}">{"".join(cells)}</tr>')
    header = "".join(
        f'<th class="text">{e(h)}</th>' if h in ("state", "values", "model", "reason")
        else f"<th>{e(h)}</th>" for h in head
    )  # fmt: skip
    if not rows:
        return "<p>no trials yet</p>"
    return f'<table class="trials"><tr>{header}</tr>{"".join(rows)}</table>'


__all__ = [
    "BEST",
    "DONE",
    "LOG_DECADES",
    "PRUNED",
    "experiment_figure",
    "headline",
    "html_experiment",
    "log_axis",
    "write_experiment_plot",
]
