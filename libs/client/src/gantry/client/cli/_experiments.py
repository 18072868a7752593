"""``gantry experiments``: hyperparameter searches — submit one, follow its trials, see the best.

::

    gantry experiments submit FILE [--dry-run] [--wait] [--timeout S] [--json]
    gantry experiments list [--state S] [--json]
    gantry experiments get NAME [--plot hpo.png] [--html hpo.html] [--json]
    gantry experiments cancel NAME [--reason TEXT]

The workflows service runs experiments and is found like every service:
``GANTRY_WORKFLOWS_ADDR``, else ``GANTRY_DATA_DIR``'s ``run/workflows.json`` (see
:meth:`~gantry.client.config.ClientSettings.address`). ``submit --wait`` exits 1 unless the
search succeeded (found a best trial); every error is ``gantry: error: ...`` with exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress
from rich.table import Table

from gantry.client.cli._common import (
    EXIT_FAILED,
    DataDirOpt,
    State,
    TokenOpt,
    command_settings,
    fmt_ms,
    state_of,
)
from gantry.client.cli._following import follow, note
from gantry.client.cli._pipeline_runs import say, styled
from gantry.client.cli._pipelines import read_document, workflows_client
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.workflows import ExperimentInfo, TrialInfo, WorkflowsClient

experiments_app = typer.Typer(
    help="Experiments (hyperparameter searches): submit them, follow their trials, see the best.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="The experiment's name.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]

#: Seconds between two looks at an experiment while waiting for it.
POLL_S = 1.0

_METHODS = {"tpe": "tpe (Bayesian: TPE)", "random": "random"}
_PRUNERS = {
    "asha": "asha (successive halving)",
    "hyperband": "hyperband",
    "median": "median (stops trials below the median at the same epoch)",
    "none": "none (every trial runs to the end)",
}


def _as_json(value: Any) -> str:
    return json.dumps(dataclasses.asdict(value), indent=2)


def _check_suffix(path: Path | None, suffixes: tuple[str, ...], flag: str) -> None:
    if path is not None and path.suffix.lower() not in suffixes:
        raise InvalidInput(
            f"{flag} {path} should end in {' or '.join(suffixes)}",
            hint=f"e.g. {flag} hpo{suffixes[0]}",
        )


def _value(v: float | None) -> str:
    return f"{v:.4g}" if v is not None else ""


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------- the words


def _budget(e: ExperimentInfo) -> str:
    hours = f", {e.budget_gpu_hours:g} device-hours" if e.budget_gpu_hours else ""
    return f"{_count(e.budget_trials, 'trial')}{hours}"


def _used(e: ExperimentInfo) -> str:
    parts = [
        f"{n} {state}"
        for state in ("pruned", "failed", "cancelled")
        if (n := len(e.trials_in(state)))
    ]
    if e.active:
        parts.append(f"{len(e.active)} running")
    trials = f"{len(e.trials)} of {_count(e.budget_trials, 'trial')}" + (
        f" ({', '.join(parts)})" if parts else ""
    )
    budget = f" of {e.budget_gpu_hours:g}" if e.budget_gpu_hours else ""
    hours = f"{e.device_hours:.2f}{budget} device-hours ({e.device_s:.0f} device-seconds)"
    return f"{trials}; {hours}"


def _best_line(e: ExperimentInfo) -> str:
    best = e.best
    if best is None:
        return "none yet" if not e.done else "none: no trial succeeded"
    facts = [f"{best.number}: {e.metric} {_value(best.value)}"]
    if best.epochs:
        facts[0] += f" after {_count(best.epochs, 'epoch')}"
    facts[0] += f" ({best.values_text(e.parameters)})"
    if best.model:
        facts.append(f"model {best.model}")
    if best.job_id:
        facts.append(f"job {best.job_id}")
    return ", ".join(facts)


def _fields(e: ExperimentInfo) -> list[tuple[str, str]]:
    rows = [
        ("objective", f"{e.goal} {e.metric}"),
        ("method", _METHODS.get(e.method, e.method)),
        ("pruner", _PRUNERS.get(e.pruner, e.pruner)),
        ("budget", _budget(e)),
    ]
    if e.state != "checked":
        rows.append(("used", _used(e)))
    rows += [
        ("parallelism", f"up to {_count(e.parallelism, 'trial')} at a time"),
        ("space", "; ".join(f"{p.name}: {p.text}" for p in e.space())),
        ("owner", e.owner),
        ("pipeline run", e.run_id),
        ("created (UTC)", fmt_ms(e.created_ms)),
        ("finished (UTC)", fmt_ms(e.finished_ms)),
    ]
    if e.state != "checked":
        rows.append(("best trial", _best_line(e)))
    return rows


def _print_fields(state: State, e: ExperimentInfo) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in _fields(e):
        if value:
            grid.add_row(label, escape(value))
    state.out.print(grid)


def _trials_table(e: ExperimentInfo) -> Table:
    best = e.best
    table = Table(title=f"{_count(len(e.trials), 'trial')} ({e.goal} {e.metric}; ★ the best)")
    for col in ("#", "state", "values", "value", "epochs", "device-s", "reason"):
        right = col in ("#", "value", "epochs", "device-s")
        table.add_column(col, justify="right" if right else "left")
    for t in e.trials:
        is_best = best is not None and t.number == best.number
        table.add_row(
            f"{t.number} ★" if is_best else str(t.number),
            styled(t.state),
            escape(t.values_text(e.parameters)),
            _value(t.value),
            str(t.epochs) if t.epochs else "",
            f"{t.device_s:.0f}" if t.device_s else "",
            escape(t.reason),
        )
    return table


def print_experiment(state: State, e: ExperimentInfo) -> None:
    """The experiment: its state and why, its settings, what it used, the best trial and every
    trial."""
    state.out.print(f"experiment {escape(e.name)}: {styled(e.state)}", highlight=False)
    if e.reason:
        say(state, f"  {e.reason}")
    _print_fields(state, e)
    if e.trials:
        state.out.print(_trials_table(e))


# ---------------------------------------------------------------------- submit


@experiments_app.command("submit")
def experiments_submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="An Experiment YAML file.", show_default=False)],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check it; nothing is stored or started.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Follow the trials until the search ends.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="With --wait: give up after this many seconds (the search goes on).",
        ),
    ] = 86400.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check an experiment file and start its search, as you.

    Prints its settings and search space. With --wait, follow the trials (started, finished,
    pruned, the best so far) until the search ends, then show it; the exit status is 1 unless
    it found a best trial.
    """
    if dry_run and wait:
        raise InvalidInput(
            "--dry-run starts nothing, so there is nothing to --wait for",
            hint="drop one of them",
        )
    spec = read_document(file, "experiment", "an Experiment")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    said = state.err if as_json else state.out  # --json keeps stdout parseable
    with workflows_client(settings) as client:
        exp = client.submit_experiment(spec, dry_run=dry_run)
        if dry_run:
            if as_json:
                print(_as_json(exp))
                return
            say(state, f"dry run: experiment {exp.name} is valid; nothing was stored or started")
            _print_fields(state, exp)
            return
        said.print(f"started experiment {exp.name}: {exp.reason}", markup=False, highlight=False)
        ended = True
        if wait:
            exp, ended = _follow(state, client, exp, timeout)
    if as_json:
        print(_as_json(exp))
    elif wait:
        print_experiment(state, exp)
    else:
        _print_fields(state, exp)
    follow = f"follow it with 'gantry experiments get {exp.name}'"
    if not wait:
        said.print(follow, markup=False, highlight=False)
    elif not ended:
        said.print(
            f"experiment {exp.name} is still {exp.state} after {timeout:g}s; it goes on: {follow}",
            markup=False,
            highlight=False,
        )
    if wait and not exp.succeeded:
        raise typer.Exit(EXIT_FAILED)


def _summary(e: ExperimentInfo) -> str:
    """The search in a line, for the progress display."""
    ended = [
        f"{n} {word}"
        for word, states in (
            ("finished", ("succeeded",)),
            ("pruned", ("pruned",)),
            ("failed", ("failed", "cancelled")),
        )
        if (n := len(e.trials_in(*states)))
    ]
    started = f"{len(e.trials)} of {e.budget_trials} trials started"
    line = f"{e.name}: {started}, {len(e.active)} running" + "".join(f", {x}" for x in ended)
    best = e.best
    if best is not None:
        line += f"; best trial {best.number}: {e.metric} {_value(best.value)}"
    return line


def _trial_event(e: ExperimentInfo, t: TrialInfo, before: str | None) -> str | None:
    """What changed about trial ``t`` since it was ``before`` (None: not seen), in words."""
    if t.state == before or (before is not None and t.state == "running"):
        return None  # no news (starting → running is not worth a line)
    if t.state in ("starting", "running"):
        return f"trial {t.number} started: {t.values_text(e.parameters)}"
    if t.state == "succeeded":
        epochs = f" after {_count(t.epochs, 'epoch')}" if t.epochs else ""
        return f"trial {t.number} succeeded: {e.metric} {_value(t.value)}{epochs}"
    return f"trial {t.number} {t.state}: {t.reason}" if t.reason else f"trial {t.number} {t.state}"


def _follow(
    state: State, client: WorkflowsClient, exp: ExperimentInfo, timeout: float
) -> tuple[ExperimentInfo, bool]:
    """Wait for the search to end, showing its trials: a live bar of finished trials with the
    counts and the best so far on a terminal, and a line on stderr per trial started or ended
    and per new best. The experiment as last seen, and whether it ended within ``timeout``."""
    seen: dict[int, str] = {}
    best = [-1]

    def show(progress: Progress) -> Callable[[ExperimentInfo], None]:
        task = progress.add_task(_summary(exp), total=exp.budget_trials)

        def update(e: ExperimentInfo) -> None:
            for t in e.trials:
                event = _trial_event(e, t, seen.get(t.number))
                seen[t.number] = t.state
                if event:
                    note(state, event)
            top = e.best
            if top is not None and top.number != best[0]:
                best[0] = top.number
                note(state, f"best so far: trial {top.number}, {e.metric} {_value(top.value)}")
            done = sum(1 for t in e.trials if t.done)
            progress.update(task, description=_summary(e), completed=done)

        return update

    return follow(
        state,
        lambda on_update: client.wait_experiment(
            exp.name, timeout_s=timeout, poll_s=POLL_S, on_update=on_update
        ),
        show,
        columns=(BarColumn(), MofNCompleteColumn()),
        goes_on=f"experiment {exp.name} goes on (stop it with "
        f"'gantry experiments cancel {exp.name}')",
    )


# ---------------------------------------------------------------------- list, get, cancel


@experiments_app.command("list")
def experiments_list(
    ctx: typer.Context,
    exp_state: Annotated[
        str,
        typer.Option(
            "--state", help="Only experiments in this state: running, succeeded, failed, cancelled."
        ),
    ] = "",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List experiments, newest first: objective, trials, the best value, device-hours."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        found = client.experiments(state=exp_state)
    if as_json:
        print(json.dumps([dataclasses.asdict(e) for e in found], indent=2))
        return
    title = _count(len(found), "experiment") + (f" {exp_state}" if exp_state else "")
    table = Table(title=title)
    columns = ("name", "state", "objective", "method", "pruner", "trials", "pruned", "best")
    for col in (*columns, "device-h", "created (UTC)", "reason"):
        right = col in ("trials", "pruned", "best", "device-h")
        table.add_column(col, justify="right" if right else "left")
    for e in found:
        best = e.best
        table.add_row(
            escape(e.name),
            styled(e.state),
            escape(f"{e.goal} {e.metric}"),
            escape(e.method),
            escape(e.pruner),
            f"{len(e.trials)}/{e.budget_trials}",
            str(len(e.pruned)),
            f"{_value(best.value)} (#{best.number})" if best is not None else "",
            f"{e.device_hours:.2f}",
            fmt_ms(e.created_ms),
            escape(e.reason),
        )
    state_of(ctx).out.print(table)


@experiments_app.command("get")
def experiments_get(
    ctx: typer.Context,
    name: NameArg,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also write a PNG here: each trial's objective and the best so far, the "
            "learning curves, and each parameter against the objective.",
            show_default=False,
        ),
    ] = None,
    html_path: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write a self-contained HTML page here.", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show an experiment: its settings, the budget used, the best trial and every trial."""
    _check_suffix(plot, (".png",), "--plot")
    _check_suffix(html_path, (".html", ".htm"), "--html")
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        exp = client.experiment(name)
    state = state_of(ctx)
    if as_json:
        print(_as_json(exp))
    else:
        print_experiment(state, exp)
    _write_pictures(state, exp, plot, html_path, quiet=as_json)


def _write_pictures(
    state: State, exp: ExperimentInfo, plot: Path | None, html_path: Path | None, *, quiet: bool
) -> None:
    from gantry.client.experiment_plots import html_experiment, write_experiment_plot

    said = state.err if quiet else state.out  # --json keeps stdout parseable
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        write_experiment_plot(exp, plot)
        said.print(f"wrote the plot to {plot}", markup=False, highlight=False)
    if html_path is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(html_experiment(exp), encoding="utf-8")
        said.print(f"wrote the HTML page to {html_path}", markup=False, highlight=False)


@experiments_app.command("cancel")
def experiments_cancel(
    ctx: typer.Context,
    name: NameArg,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept on the experiment.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel a running experiment: its running trials' jobs are cancelled, no trial starts."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        exp = client.cancel_experiment(name, reason)
    state = state_of(ctx)
    why = f": {exp.reason}" if exp.reason else ""
    say(state, f"experiment {exp.name}: {exp.state}{why}")
    stopped = exp.trials_in("cancelled")
    if stopped:
        numbers = ", ".join(str(t.number) for t in stopped)
        trials = _count(len(stopped), "running trial")
        say(state, f"  cancelled {trials} ({numbers}) and their jobs")
    if exp.best is not None:
        say(state, f"  the best trial so far stays: {_best_line(exp)}")


__all__ = ["POLL_S", "experiments_app", "print_experiment"]
