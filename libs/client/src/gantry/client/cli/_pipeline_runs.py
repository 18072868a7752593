"""How ``gantry pipelines`` shows a run: its graph, its steps, their details and job logs.

Shared with ``gantry experiments`` (the state colours, durations, ``k=v`` lists). An
``experiment`` step has no job of its own: its trials are jobs, and once it succeeded it names
the best trial's job in ``outputs["job"]``, which is the job shown for it and whose logs
``--logs`` reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import State, fmt_ms
from gantry.client.config import ClientSettings
from gantry.core import GantryError

if TYPE_CHECKING:
    from gantry.client.workflows import RunInfo, StepRunInfo

#: The mark of each step state in a run's graph.
MARKS = {
    "succeeded": "✓",
    "failed": "✗",
    "skipped": "⊘",
    "cancelled": "⊘",
}
_BUSY = "…"
#: The colour of each state of a run, a step, an experiment or a trial.
STYLE = {
    "queued": "yellow",
    "pending": "dim",
    "starting": "cyan",
    "running": "cyan",
    "succeeded": "bold green",
    "checked": "green",
    "failed": "bold red",
    "cancelled": "dim",
    "skipped": "yellow",
    "pruned": "yellow",
}
#: The widest step kind (``experiment``), so step lines line up.
KIND_WIDTH = 10


def styled(text: str) -> str:
    """``text`` (a state) escaped and in its colour, as rich markup."""
    style = STYLE.get(text)
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


def say(state: State, text: str) -> None:
    """A line of plain text on stdout (no markup, no highlighting)."""
    state.out.print(text, markup=False, highlight=False)


def mark(state: str) -> str:
    """✓, ✗, ⊘, or … for a state that is not an end."""
    return MARKS.get(state, _BUSY)


def span(ms: int | None) -> str:
    """``850ms``, ``42s``, ``3m 05s``, ``2h 03m``; "" for None."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def pairs(values: Any) -> str:
    """``a=1, b=2``, by key."""
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def metrics_text(values: Any) -> str:
    """``accuracy=0.91, loss=0.3141``, by name, to 4 significant digits."""
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()))


def step_line(s: StepRunInfo, width: int) -> str:
    """One step in a line, for following a run: mark, name, kind, state, attempt, reason."""
    line = f"{mark(s.state)} {s.name:<{width}}  {s.kind:<{KIND_WIDTH}}  {s.state}"
    if s.attempt > 1:
        line += f" (attempt {s.attempt})"
    return line + (f"  {s.reason}" if s.reason else "")


def job_of(s: StepRunInfo) -> str:
    """The step's job: its current or last attempt's, or an experiment step's best trial's."""
    if s.job_id:
        return s.job_id
    found = next((a.job_id for a in reversed(s.attempts) if a.job_id), "")
    return found or (s.outputs.get("job", "") if s.kind == "experiment" else "")


def print_run(state: State, run: RunInfo) -> None:
    """The run: a header, the graph, the steps table, then each step's outputs and lineage."""
    out = state.out
    out.print(
        f"run {escape(run.id)} of {escape(run.pipeline)} (revision {run.revision}): "
        f"{styled(run.state)}",
        highlight=False,
    )
    if run.reason:
        say(state, f"  {run.reason}")
    scheduled = f" for {fmt_ms(run.scheduled_ms)} UTC" if run.scheduled_ms else ""
    facts = [
        f"trigger {run.trigger}{scheduled}",
        f"owner {run.owner}",
        f"started {fmt_ms(run.started_ms)} UTC" if run.started_ms else "not started",
        f"took {span(run.duration_ms)}" if run.duration_ms is not None else "",
    ]
    say(state, "  " + ", ".join(f for f in facts if f))
    if run.params:
        say(state, f"  params: {pairs(run.params)}")
    if not run.steps:
        return
    say(state, "")
    for line in graph(run):
        say(state, line)
    table = Table(title="steps")
    for col in ("step", "kind", "state", "attempt", "job", "took", "reason"):
        table.add_column(col, justify="right" if col in ("attempt", "took") else "left")
    for s in run.steps:
        table.add_row(
            escape(s.name),
            escape(s.kind),
            styled(s.state),
            str(s.attempt) if s.attempt else "",
            escape(s.job_id or (job_of(s) if s.kind == "experiment" else "")),
            span(s.duration_ms),
            escape(s.reason),
        )
    out.print(table)
    for s in run.steps:
        lines = step_details(s)
        if lines:
            say(state, f"{s.name}:")
            for line in lines:
                say(state, f"  {line}")


def step_details(s: StepRunInfo) -> list[str]:
    """What a step made and used, its earlier attempts, and where an experiment's trials are."""
    lines = []
    if s.outputs:
        lines.append(f"outputs: {pairs(s.outputs)}")
    if s.metrics:
        lines.append(f"metrics: {metrics_text(s.metrics)}")
    if s.inputs or s.produced:
        used = ", ".join(a.text for a in s.inputs) or "nothing"
        made = ", ".join(a.text for a in s.produced) or "nothing"
        lines.append(f"lineage: {used} → {made}")
    experiment = s.outputs.get("experiment", "") if s.kind == "experiment" else ""
    if experiment:
        best = f"best trial {s.outputs['trial']}; " if s.outputs.get("trial") else ""
        lines.append(f"trials: {best}see 'gantry experiments get {experiment}'")
    if len(s.attempts) > 1:
        for a in s.attempts:
            job = f" (job {a.job_id})" if a.job_id else ""
            why = f": {a.reason}" if a.reason else ""
            lines.append(f"attempt {a.number}{job}: {a.state or 'running'}{why}")
    return lines


def graph(run: RunInfo) -> list[str]:
    """The run as a small text graph: each step in order, indented under the step it waits for
    longest, with its mark (✓ succeeded, ✗ failed, ⊘ skipped or cancelled, … not done) and the
    steps it waits for."""
    depth: dict[str, int] = {}
    for s in run.steps:  # the pipeline's order puts parents first
        depth[s.name] = 1 + max((depth.get(p, 0) for p in s.depends_on), default=-1)
    lines = []
    for s in run.steps:
        indent = "   " * depth[s.name]
        branch = "└─ " if depth[s.name] else ""
        after = f" ← {', '.join(s.depends_on)}" if s.depends_on else ""
        lines.append(f"{indent[3:]}{branch}{mark(s.state)} {s.name} ({s.kind}){after}")
    return lines


def print_logs(state: State, settings: ClientSettings, run: RunInfo, tail: int) -> None:
    """The last ``tail`` lines of each step's job, from the scheduler; a step whose logs cannot
    be read says why, and the others are still shown."""
    from gantry.client.cli._jobs import scheduler_client

    steps = [(s, job_of(s)) for s in run.steps if job_of(s)]
    if not steps:
        say(state, "no step has run a job yet: no logs")
        return
    try:
        with scheduler_client(settings) as client:
            for s, job_id in steps:
                whose = ", the best trial" if s.kind == "experiment" else ""
                say(state, f"── {s.name} (job {job_id}{whose}): the last {tail} log lines ──")
                try:
                    with client.logs(job_id, tail=tail) as lines:
                        count = 0
                        for line in lines:
                            count += 1
                            where = f"w{line.worker}" + (
                                " gantry" if line.stream == "gantry" else ""
                            )
                            say(state, f"{where}| {line.text.removesuffix(chr(10))}")
                    if not count:
                        say(state, "(no log lines)")
                except GantryError as exc:
                    say(state, f"(no logs: {exc.message})")
    except GantryError as exc:  # the scheduler cannot be found at all
        say(state, f"no logs: {exc.message}")


__all__ = [
    "KIND_WIDTH",
    "MARKS",
    "STYLE",
    "graph",
    "job_of",
    "mark",
    "metrics_text",
    "pairs",
    "print_logs",
    "print_run",
    "say",
    "span",
    "step_details",
    "step_line",
    "styled",
]
