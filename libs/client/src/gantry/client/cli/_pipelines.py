"""``gantry pipelines``: submit pipelines and cron pipelines, run them, follow their runs.

::

    gantry pipelines submit FILE [--dry-run] [--json]
    gantry pipelines list [--json]
    gantry pipelines get NAME [--json]
    gantry pipelines delete NAME
    gantry pipelines run NAME [--param k=v ...] [--request-id ID] [--wait] [--timeout S] [--json]
    gantry pipelines runs list [--pipeline P] [--state S] [--limit N] [--json]
    gantry pipelines runs get RUN [--logs N] [--json]
    gantry pipelines runs cancel RUN [--reason TEXT]
    gantry pipelines runs retry RUN [--from STEP]

The workflows service is found like every service: ``GANTRY_WORKFLOWS_ADDR``, else
``GANTRY_DATA_DIR``'s ``run/workflows.json`` written by the running service (see
:meth:`~gantry.client.config.ClientSettings.address`); ``runs get --logs`` also reads the
steps' job logs from the scheduler. ``run --wait`` exits 1 unless the run succeeded.

How a run is shown (its graph, steps, details and logs) lives in ``_pipeline_runs``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress, TaskID
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
from gantry.client.cli._pipeline_runs import (
    pairs,
    print_logs,
    print_run,
    say,
    span,
    step_line,
    styled,
)
from gantry.client.config import ClientSettings
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.workflows import PipelineInfo, RunInfo, WorkflowsClient

pipelines_app = typer.Typer(
    help="Pipelines and cron schedules: submit them, run them, follow their runs.",
    no_args_is_help=True,
)
runs_app = typer.Typer(
    help="Runs of pipelines: the history, one run step by step, cancel, retry.",
    no_args_is_help=True,
)
pipelines_app.add_typer(runs_app, name="runs")

NameArg = Annotated[str, typer.Argument(help="The pipeline's name.", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]

#: Seconds between two looks at a run while waiting for it.
POLL_S = 1.0


@contextlib.contextmanager
def workflows_client(settings: ClientSettings) -> Iterator[WorkflowsClient]:
    """A :class:`WorkflowsClient` for the configured workflows address and bearer token."""
    from gantry.client.workflows import WorkflowsClient

    with WorkflowsClient(
        settings.address("workflows"), settings.bearer(), tls=settings.tls
    ) as client:
        yield client


def _as_json(value: Any) -> str:
    return json.dumps(dataclasses.asdict(value), indent=2)


def _local_and_utc(ms: int) -> str:
    """``2026-12-01 04:00:00 CET (2026-12-01 03:00:00 UTC)``: this machine's time, then UTC
    (only UTC where the machine keeps UTC)."""
    local = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).astimezone()
    if not local.utcoffset():  # this machine keeps UTC: once is enough
        return f"{fmt_ms(ms)} UTC"
    return f"{local.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} ({fmt_ms(ms)} UTC)"


def read_document(
    file: Path, what: str = "pipeline", example: str = "a Pipeline or CronPipeline"
) -> str:
    """The text of a YAML document file; :class:`InvalidInput` saying what is wrong with the
    path (``what``: the kind of file, for the messages)."""
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(
            f"no {what} file {file}", hint=f"give the path of {example} YAML file"
        ) from None
    except IsADirectoryError:
        raise InvalidInput(f"{file} is a directory, not {_article(what)} file") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"the {what} file {file} is not UTF-8 text") from None
    except OSError as exc:
        raise InvalidInput(f"can't read the {what} file {file}: {exc.strerror or exc}") from None


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def parse_params(given: list[str]) -> dict[str, str]:
    """``--param name=value`` options as a mapping; :class:`InvalidInput` for a bad one."""
    params: dict[str, str] = {}
    for text in given:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidInput(f"--param {text!r} is not name=value", hint="e.g. --param epochs=20")
        if name in params:
            raise InvalidInput(f"--param {name} is given twice", hint="give each parameter once")
        params[name] = value
    return params


# ---------------------------------------------------------------------- pipelines


def _steps_table(p: PipelineInfo, title: str) -> Table:
    table = Table(title=title)
    for col in ("#", "step", "kind", "after", "gate", "retries"):
        table.add_column(col, justify="right" if col in ("#", "retries") else "left")
    for i, s in enumerate(p.step_graph(), 1):
        table.add_row(
            str(i),
            escape(s.name),
            escape(s.kind),
            escape(", ".join(s.depends_on)) or "-",
            escape(s.gate),
            str(s.retries) if s.retries else "",
        )
    return table


def _schedule_lines(p: PipelineInfo) -> list[tuple[str, str]]:
    s = p.schedule
    if s is None:
        return []
    rows = [("schedule", f"{s.cron} ({s.timezone}), concurrency {s.concurrency}")]
    if s.suspended:
        rows.append(("next fire", "none: the schedule is suspended"))
    elif s.next_fire_ms:
        rows.append(("next fire", _local_and_utc(s.next_fire_ms)))
    if s.missed:
        rows.append(("missed fires", f"{s.missed} (the service was down past their deadline)"))
    return rows


@pipelines_app.command("submit")
def pipelines_submit(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Argument(help="A Pipeline or CronPipeline YAML file.", show_default=False)
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check it; nothing is stored.")
    ] = False,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check a pipeline file and store it as the pipeline's next revision.

    Prints its steps in the order they run, with what each waits for and its gate.
    """
    spec = read_document(file)
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        result = client.submit(spec, dry_run=dry_run)
    p = result.pipeline
    if as_json:
        print(json.dumps({**dataclasses.asdict(p), "replaced": result.replaced}, indent=2))
        return
    state = state_of(ctx)
    n = len(p.steps)
    steps = f"{n} step{'' if n == 1 else 's'}"
    if dry_run:
        say(state, f"dry run: {p.kind} {p.name} is valid ({steps}); nothing was stored")
    elif result.replaced:
        say(
            state,
            f"submitted {p.kind} {p.name} revision {p.revision} ({steps}), replacing revision "
            f"{p.revision - 1}",
        )
    else:
        say(state, f"submitted {p.kind} {p.name} revision {p.revision} ({steps})")
    state.out.print(_steps_table(p, "steps, in the order they run"))
    for name, value in _schedule_lines(p):
        say(state, f"{name}: {value}")
    if not dry_run and p.schedule is None:
        say(state, f"start a run with 'gantry pipelines run {p.name}'")


@pipelines_app.command("list")
def pipelines_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List pipelines: kind, revision, owner, steps, schedule and next fire, last run."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        pipelines = client.list()
    if as_json:
        print(json.dumps([dataclasses.asdict(p) for p in pipelines], indent=2))
        return
    n = len(pipelines)
    table = Table(title=f"{n} pipeline{'' if n == 1 else 's'}")
    for col in ("name", "kind", "rev", "owner", "steps", "schedule", "next fire (UTC)", "last run"):
        table.add_column(col, justify="right" if col in ("rev", "steps") else "left")
    for p in pipelines:
        s = p.schedule
        schedule = f"{s.cron} ({s.timezone}), {s.concurrency}" if s is not None else ""
        if s is not None and s.suspended:
            next_fire = "suspended"
        else:
            next_fire = fmt_ms(s.next_fire_ms) if s is not None else ""
        last = f"{p.last_run_id} {styled(p.last_run_state)}" if p.last_run_id else ""
        table.add_row(
            escape(p.name),
            escape(p.kind),
            str(p.revision),
            escape(p.owner),
            str(len(p.steps)),
            escape(schedule),
            next_fire,
            last,
        )
    state_of(ctx).out.print(table)


@pipelines_app.command("get")
def pipelines_get(
    ctx: typer.Context,
    name: NameArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a pipeline: revision, owner, params, schedule, last run, steps.

    A cron pipeline's next fire is shown in local time and in UTC.
    """
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        p = client.get(name)
    if as_json:
        print(_as_json(p))
        return
    state = state_of(ctx)
    say(state, f"{p.kind} {p.name}, revision {p.revision}")
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    rows: list[tuple[str, str]] = [
        ("description", p.description),
        ("owner", p.owner),
        ("params", pairs(p.params)),
        *_schedule_lines(p),
        ("last run", f"{p.last_run_id} ({p.last_run_state})" if p.last_run_id else "none yet"),
        ("created (UTC)", fmt_ms(p.created_ms)),
        ("updated (UTC)", fmt_ms(p.updated_ms)),
    ]
    for label, value in rows:
        if value:
            fields.add_row(label, escape(value))
    state.out.print(fields)
    state.out.print(_steps_table(p, "steps"))


@pipelines_app.command("delete")
def pipelines_delete(
    ctx: typer.Context,
    name: NameArg,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a pipeline that has no active run.

    Its runs stay in the history; a cron pipeline's schedule stops.
    """
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        p = client.delete(name)
    say(
        state_of(ctx),
        f"deleted {p.kind} {p.name} (revision {p.revision}); its runs stay in the history",
    )


# ---------------------------------------------------------------------- running


@pipelines_app.command("run")
def pipelines_run(
    ctx: typer.Context,
    name: NameArg,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", "-p", help="name=value overriding a parameter's default (repeatable)."
        ),
    ] = None,
    request_id: Annotated[
        str,
        typer.Option("--request-id", help="Idempotency key: a repeat returns the first run."),
    ] = "",
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Follow the run's steps until it ends.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="With --wait: give up after this many seconds (the run goes on).",
        ),
    ] = 86400.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Start a run of a pipeline, as you.

    With --wait, follow its steps until it ends, then show it; the exit status is 1 unless it
    succeeded.
    """
    params = parse_params(param or [])
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with workflows_client(settings) as client:
        result = client.start(name, params, request_id=request_id)
        run = result.run
        said = state.err if as_json else state.out  # --json keeps stdout parseable
        if result.duplicate:
            said.print(
                f"run {run.id} of {run.pipeline} was already started with request id "
                f"{request_id}; it is {run.state}",
                markup=False,
                highlight=False,
            )
        else:
            said.print(
                f"started run {run.id} of {run.pipeline} (revision {run.revision}): {run.state}",
                markup=False,
                highlight=False,
            )
        ended = True
        if wait:
            run, ended = _follow(state, client, run, timeout)
    if as_json:
        print(_as_json(run))
    elif wait:
        print_run(state, run)
    follow = f"follow it with 'gantry pipelines runs get {run.id}'"
    if not wait:
        said.print(follow, markup=False, highlight=False)
    elif not ended:
        said.print(
            f"run {run.id} is still {run.state} after {timeout:g}s; it goes on: {follow}",
            markup=False,
            highlight=False,
        )
    if wait and not run.succeeded:
        raise typer.Exit(EXIT_FAILED)


def _follow(
    state: State, client: WorkflowsClient, run: RunInfo, timeout: float
) -> tuple[RunInfo, bool]:
    """Wait for ``run`` to end, showing its steps: a live display on a terminal, else a line on
    stderr per change. The run as last seen, and whether it ended within ``timeout``."""
    live = state.err.is_terminal
    tasks: dict[str, TaskID] = {}
    seen: dict[str, tuple[str, str, int]] = {}
    width = max((len(s.name) for s in run.steps), default=0)

    def show(progress: Progress) -> Callable[[RunInfo], None]:
        def update(r: RunInfo) -> None:
            for s in r.steps:
                line = step_line(s, width)
                if s.name not in tasks:
                    tasks[s.name] = progress.add_task(line, total=1, start=s.state != "pending")
                task = tasks[s.name]
                progress.update(task, description=line, completed=1 if s.done else 0)
                if s.state != "pending":
                    progress.start_task(task)
                change = (s.state, s.reason, s.attempt)
                if not live and s.state != "pending" and seen.get(s.name) != change:
                    note(state, line)
                seen[s.name] = change

        return update

    return follow(
        state,
        lambda on_update: client.wait(
            run.id, timeout_s=timeout, poll_s=POLL_S, on_update=on_update
        ),
        show,
        goes_on=f"run {run.id} goes on (stop it with 'gantry pipelines runs cancel {run.id}')",
    )


# ---------------------------------------------------------------------- runs


@runs_app.command("list")
def runs_list(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Option("--pipeline", help="Only this pipeline's runs.")] = "",
    run_state: Annotated[
        str,
        typer.Option(
            "--state",
            help="Only runs in this state: queued, running, succeeded, failed, cancelled or "
            "skipped.",
        ),
    ] = "",
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N runs.")] = 100,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List runs, newest first: trigger, scheduled fire, state and why.

    A cron pipeline's skipped, queued and missed fires are runs too, with the reason.
    """
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        runs = client.runs(pipeline=pipeline, state=run_state, limit=limit)
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in runs], indent=2))
        return
    n = len(runs)
    title = f"{n} run{'' if n == 1 else 's'}" + (f" of {pipeline}" if pipeline else "")
    table = Table(title=escape(title))
    columns = ("run", "pipeline", "rev", "trigger", "scheduled (UTC)", "started (UTC)", "took")
    for col in (*columns, "state", "reason"):
        table.add_column(col, justify="right" if col in ("rev", "took") else "left")
    for r in runs:
        table.add_row(
            escape(r.id),
            escape(r.pipeline),
            str(r.revision),
            escape(r.trigger),
            fmt_ms(r.scheduled_ms),
            fmt_ms(r.started_ms),
            span(r.duration_ms),
            styled(r.state),
            escape(r.reason),
        )
    state_of(ctx).out.print(table)


@runs_app.command("get")
def runs_get(
    ctx: typer.Context,
    run_id: RunArg,
    logs: Annotated[
        int,
        typer.Option(
            "--logs", min=0, help="Also the last N log lines of each step's job (0: none)."
        ),
    ] = 0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a run step by step, with its graph, outputs, metrics and lineage.

    Each step's state, attempt, job, duration and reason, its outputs and metrics, and its
    lineage (used → produced); with --logs N, the last N lines of each step's job log.
    """
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        run = client.run(run_id)
    if as_json:
        print(_as_json(run))
        return
    state = state_of(ctx)
    print_run(state, run)
    if logs:
        print_logs(state, settings, run, logs)


# ---------------------------------------------------------------------- cancel, retry


@runs_app.command("cancel")
def runs_cancel(
    ctx: typer.Context,
    run_id: RunArg,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept on the run.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel an active run: its running jobs are cancelled, its pending steps never start."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        run = client.cancel(run_id, reason)
    why = f": {run.reason}" if run.reason else ""
    say(state_of(ctx), f"run {run.id} of {run.pipeline}: {run.state}{why}")


@runs_app.command("retry")
def runs_retry(
    ctx: typer.Context,
    run_id: RunArg,
    from_step: Annotated[
        str,
        typer.Option(
            "--from",
            help="Run this step and every step after it again (default: the failed, "
            "cancelled and not-run steps).",
        ),
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Run a finished run's failed steps again, or everything from --from STEP.

    Steps that succeeded keep their outputs.
    """
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        run = client.retry(run_id, from_step)
    again = [s.name for s in run.steps if not s.done]
    state = state_of(ctx)
    say(state, f"run {run.id} of {run.pipeline}: {run.state}")
    if again:
        say(state, f"  running again: {', '.join(again)}")
    say(state, f"follow it with 'gantry pipelines runs get {run.id}'")


__all__ = ["POLL_S", "parse_params", "pipelines_app", "read_document", "workflows_client"]
