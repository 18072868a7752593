"""Following something the workflows service runs (a pipeline run, an experiment, a dev
session) until it gets where it is going, the same way for every command that waits.

:func:`follow` shows a live display on stderr while a client's ``wait`` call polls (only on a
terminal: elsewhere the command prints its own lines, see :func:`note`), keeps stdout for the
result, turns a wait that gives up (:class:`~gantry.client.workflows.WaitTimeout`) into the
thing as last seen, and Ctrl-C into a message saying the thing goes on, with exit status 1.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TypeVar

import typer
from rich.progress import Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

from gantry.client.cli._common import EXIT_FAILED, State

_T = TypeVar("_T")

#: A client's wait call, given the callback to call on each change it sees.
Wait = Callable[[Callable[[_T], None]], _T]


def follow(
    state: State,
    wait: Wait[_T],
    show: Callable[[Progress], Callable[[_T], None]],
    *,
    goes_on: str,
    columns: Sequence[ProgressColumn] = (),
) -> tuple[_T, bool]:
    """Run ``wait`` under a live display; the thing as last seen, and whether the wait ended
    before its timeout.

    ``show`` gets the display (a spinner, the task's description, then ``columns``, then the
    time elapsed) before the wait starts, adds its tasks, and returns what ``wait`` calls on
    each change. ``goes_on`` says, after Ctrl-C, that the thing carries on and how to stop
    it (``run r-1 goes on (stop it with '...')``).
    """
    from gantry.client.workflows import WaitTimeout

    progress = Progress(
        SpinnerColumn(finished_text=" "),
        TextColumn("{task.description}", markup=False),
        *columns,
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
        disable=not state.err.is_terminal,
    )
    on_change = show(progress)
    with progress:
        try:
            return wait(on_change), True
        except WaitTimeout as exc:
            progress.stop()
            last: _T = exc.last
            return last, False
        except KeyboardInterrupt:
            progress.stop()
            state.err.print(f"stopped waiting; {goes_on}", markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED) from None


def note(state: State, text: str) -> None:
    """A line on stderr with the time (UTC) in front, for what happened while following."""
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    state.err.print(f"{stamp}  {text}", markup=False, highlight=False)


__all__ = ["Wait", "follow", "note"]
