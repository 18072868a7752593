"""``gantry sessions``: dev sessions — a Jupyter server or a shell on a slice of a GPU, reading
your datasets de-identified, culled when idle, resumable with its files.

::

    gantry sessions start FILE [--dry-run] [--wait/--no-wait] [--timeout S] [--json]
    gantry sessions list [--state S] [--json]
    gantry sessions get NAME [--json]
    gantry sessions stop NAME [--reason TEXT]
    gantry sessions resume NAME [--wait] [--timeout S] [--json]

The workflows service runs dev sessions and is found like every service:
``GANTRY_WORKFLOWS_ADDR``, else ``GANTRY_DATA_DIR``'s ``run/workflows.json`` (see
:meth:`~gantry.client.config.ClientSettings.address`). The login token of a session's server
is only ever shown to its owner, and only while it can be used. ``start`` (which waits unless
told ``--no-wait``) and ``resume --wait`` exit 1 unless the session ends up running; every error
is ``gantry: error: ...`` with exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress
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
from gantry.client.cli._pipeline_runs import say, span, styled
from gantry.client.cli._pipelines import read_document, workflows_client

if TYPE_CHECKING:
    from gantry.client.workflows import SessionInfo, WorkflowsClient

sessions_app = typer.Typer(
    help="Dev sessions: a Jupyter server or a shell on a slice of a GPU, culled when idle, "
    "resumable with its files.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="The dev session's name.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.1,
        help="With --wait: give up after this many seconds (the session goes on starting).",
    ),
]

#: Seconds between two looks at a session while waiting for it.
POLL_S = 1.0
#: What the token is, said next to it.
LOGIN_NOTE = (
    "the login token: Authorization: token <it>, or ?token=<it> in a browser; only you see "
    "it, and it changes at every resume"
)


def _as_json(value: Any) -> str:
    return json.dumps(dataclasses.asdict(value), indent=2)


def duration(seconds: float) -> str:
    """``45s``, ``30m``, ``1h 30m``, ``8h``, ``2d 4h``: a document's duration, compactly."""
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts[:2]) or "0s"


def gpus_text(gpus: float) -> str:
    """``1``, ``0.25 (a slice)``, or ``none``."""
    if gpus <= 0:
        return "none"
    return f"{gpus:g}" + (" (a slice)" if gpus < 1 else "")


# ---------------------------------------------------------------------- the words


def _fields(s: SessionInfo) -> list[tuple[str, str]]:
    rows = [
        ("url", s.url),
        ("token", f"{s.token}  ({LOGIN_NOTE})" if s.token and not s.done else ""),
        ("interface", s.interface),
        ("owner", s.owner),
        ("GPUs", gpus_text(s.gpus)),
        ("data", f"{s.dataset} (de-identified)" if s.dataset else ""),
        ("idle timeout", duration(s.idle_timeout_s) if s.idle_timeout_s else ""),
        ("lifetime", duration(s.lifetime_s) if s.lifetime_s else ""),
    ]
    if s.generation:  # not a dry run
        rows += [
            ("active", f"{s.active_s:.0f} seconds"),
            ("generation", str(s.generation)),
            ("job", s.job_id),
            ("created (UTC)", fmt_ms(s.created_ms)),
            ("started (UTC)", fmt_ms(s.started_ms)),
            ("ended (UTC)", fmt_ms(s.ended_ms)),
        ]
    return rows


def _print_fields(state: State, s: SessionInfo) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in _fields(s):
        if value:
            grid.add_row(label, escape(value))
    state.out.print(grid)


def _history_table(s: SessionInfo) -> Table:
    n = len(s.history)
    table = Table(title=f"{n} generation{'' if n == 1 else 's'}")
    for col in ("#", "job", "started (UTC)", "ended (UTC)", "took", "how", "active-s"):
        table.add_column(col, justify="right" if col in ("#", "took", "active-s") else "left")
    for g in s.history:
        table.add_row(
            str(g.number),
            escape(g.job_id),
            fmt_ms(g.started_ms),
            fmt_ms(g.ended_ms),
            span(g.duration_ms),
            styled(g.how) if g.how else "running",
            f"{g.active_s:.0f}",
        )
    return table


def _headline(state: State, s: SessionInfo) -> None:
    state.out.print(f"dev session {escape(s.name)}: {styled(s.state)}", highlight=False)
    if s.reason:
        say(state, f"  {s.reason}")


def print_session(state: State, s: SessionInfo) -> None:
    """The session: its state and why, where to reach it (and, for its owner, the token), what
    it may use, and every generation."""
    _headline(state, s)
    _print_fields(state, s)
    if s.history:
        state.out.print(_history_table(s))


def _what_next(state: State, s: SessionInfo, *, quiet: bool) -> None:
    """After start or resume: how to follow, or resume, the session."""
    said = state.err if quiet else state.out  # --json keeps stdout parseable
    if s.running:
        return
    if s.done:
        text = f"resume it with 'gantry sessions resume {s.name}'"
    else:
        text = f"follow it with 'gantry sessions get {s.name}'"
    said.print(text, markup=False, highlight=False)


# ---------------------------------------------------------------------- start, resume


@sessions_app.command("start")
def sessions_start(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A DevSession YAML file.", show_default=False)],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check it; nothing is started.")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Wait until its server answers (or not)."),
    ] = True,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check a dev session file and start the session, as you.

    By default, wait until its server answers, then print its URL and your login token; the
    exit status is 1 unless it is running by then (it may be waiting for a GPU: it goes on).
    """
    spec = read_document(file, "dev session", "a DevSession")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    said = state.err if as_json else state.out  # --json keeps stdout parseable
    with workflows_client(settings) as client:
        session = client.start_session(spec, dry_run=dry_run)
        if dry_run:
            if as_json:
                print(_as_json(session))
                return
            say(state, f"dry run: dev session {session.name} is valid; nothing was started")
            _print_fields(state, session)
            return
        said.print(
            f"started dev session {session.name}: {session.state} ({session.reason})",
            markup=False,
            highlight=False,
        )
        ended = True
        if wait:
            session, ended = _follow(state, client, session, timeout)
    _show_started(state, session, wait=wait, ended=ended, timeout=timeout, as_json=as_json)


@sessions_app.command("resume")
def sessions_resume(
    ctx: typer.Context,
    name: NameArg,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait until its server answers.")
    ] = False,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Start an ended (culled, expired, stopped or failed) session again, with its files.

    It gets a new login token. With --wait, wait until its server answers, then print its URL
    and the token; the exit status is 1 unless it is running by then.
    """
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    said = state.err if as_json else state.out
    with workflows_client(settings) as client:
        session = client.resume_session(name)
        said.print(
            f"resumed dev session {session.name} (generation {session.generation}): "
            f"{session.state}",
            markup=False,
            highlight=False,
        )
        ended = True
        if wait:
            session, ended = _follow(state, client, session, timeout)
    _show_started(state, session, wait=wait, ended=ended, timeout=timeout, as_json=as_json)


def _show_started(
    state: State, s: SessionInfo, *, wait: bool, ended: bool, timeout: float, as_json: bool
) -> None:
    """The session after start or resume (and the wait): where to reach it, or why it is not
    running; exit status 1 when a wait did not see it running."""
    if as_json:
        print(_as_json(s))
    else:
        if wait:  # where the wait left it (without one, the first line said it)
            _headline(state, s)
        _print_fields(state, s)
    if wait and not ended:
        said = state.err if as_json else state.out
        said.print(
            f"dev session {s.name} is still {s.state} after {timeout:g}s; it goes on",
            markup=False,
            highlight=False,
        )
    _what_next(state, s, quiet=as_json)
    if wait and not s.running:
        raise typer.Exit(EXIT_FAILED)


def _follow(
    state: State, client: WorkflowsClient, session: SessionInfo, timeout: float
) -> tuple[SessionInfo, bool]:
    """Wait until the session runs or ends: a spinner with its state and why on a terminal, and
    a line on stderr per change. The session as last seen, and whether the wait got an answer
    within ``timeout``."""
    seen: list[tuple[str, str]] = []

    def words(s: SessionInfo) -> str:
        return f"dev session {s.name}: {s.state}" + (f" ({s.reason})" if s.reason else "")

    def show(progress: Progress) -> Callable[[SessionInfo], None]:
        task = progress.add_task(words(session), total=None)

        def update(s: SessionInfo) -> None:
            progress.update(task, description=words(s))
            if not seen or seen[-1] != (s.state, s.reason):
                if seen:  # the first look was said when it started
                    note(state, words(s))
                seen.append((s.state, s.reason))

        return update

    return follow(
        state,
        lambda on_change: client.wait_session(
            session.name, timeout_s=timeout, poll_s=POLL_S, on_change=on_change
        ),
        show,
        goes_on=f"dev session {session.name} goes on starting (stop it with "
        f"'gantry sessions stop {session.name}')",
    )


# ---------------------------------------------------------------------- list, get, stop


@sessions_app.command("list")
def sessions_list(
    ctx: typer.Context,
    session_state: Annotated[
        str,
        typer.Option(
            "--state",
            help="Only sessions in this state: starting, running, waiting, culled, expired, "
            "stopped or failed.",
        ),
    ] = "",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List dev sessions, newest first: state, owner, GPUs, where to reach them, why."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        found = client.sessions(state=session_state)
    if as_json:
        print(json.dumps([dataclasses.asdict(s) for s in found], indent=2))
        return
    n = len(found)
    title = f"{n} dev session{'' if n == 1 else 's'}" + (
        f" {session_state}" if session_state else ""
    )
    table = Table(title=title)
    columns = ("name", "state", "owner", "interface", "GPUs", "gen", "active-s", "created (UTC)")
    for col in (*columns, "url", "reason"):
        table.add_column(col, justify="right" if col in ("GPUs", "gen", "active-s") else "left")
    for s in found:
        table.add_row(
            escape(s.name),
            styled(s.state),
            escape(s.owner),
            escape(s.interface),
            f"{s.gpus:g}",
            str(s.generation),
            f"{s.active_s:.0f}",
            fmt_ms(s.created_ms),
            escape(s.url),
            escape(s.reason),
        )
    state_of(ctx).out.print(table)


@sessions_app.command("get")
def sessions_get(
    ctx: typer.Context,
    name: NameArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a dev session: its state and why, its URL (and, if it is yours, its token), what it
    may use, how long it may idle and live, and every generation."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        session = client.session(name)
    if as_json:
        print(_as_json(session))
        return
    print_session(state_of(ctx), session)


@sessions_app.command("stop")
def sessions_stop(
    ctx: typer.Context,
    name: NameArg,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept on the session.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Stop a dev session: its files are saved and its GPU is freed; it can be resumed."""
    settings = command_settings(ctx, data_dir, token)
    with workflows_client(settings) as client:
        session = client.stop_session(name, reason)
    state = state_of(ctx)
    why = f": {session.reason}" if session.reason else ""
    say(state, f"dev session {session.name}: {session.state}{why}")
    say(state, f"its files are saved; resume it with 'gantry sessions resume {session.name}'")


__all__ = ["LOGIN_NOTE", "POLL_S", "duration", "gpus_text", "print_session", "sessions_app"]
