"""What every ``gantry`` command shares: state, options, error handling, logging and times.

Settings are loaded once (in :func:`gantry.client.cli.main` or the root callback) and kept in
:class:`State` on the click context; :func:`command_settings` applies a command's
``--data-dir`` / ``--token`` on top. :class:`GantryGroup` turns Gantry's typed errors into
``gantry: error: <message>`` and exit status 2.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import structlog
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from typer.core import TyperGroup

from gantry.client.config import ClientSettings
from gantry.core import CommonSettings, ConfigError, GantryError, InvalidInput

if TYPE_CHECKING:
    from gantry.client.audit import AuditClient
    from gantry.client.governance import GovernanceClient
    from gantry.security import TrustStore

# Modules that import gantry.events are imported inside the commands, after main() has set up
# logging: the event library binds its loggers to the logging set-up of import time.

EXIT_ERROR = 2
EXIT_FAILED = 1
#: The key id of the audit service's signing key (``keys/trusted/svc-audit.pub``).
AUDIT_KEY_ID = "svc-audit"


# ---------------------------------------------------------------------- state and errors


@dataclass
class State:
    """What every command receives: the settings loaded once, and the consoles."""

    settings: ClientSettings
    out: Console = field(default_factory=lambda: Console(soft_wrap=True))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))


def print_error(exc: GantryError) -> None:
    """Print ``gantry: error: <message>`` (and the hint) to stderr."""
    print(f"gantry: error: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"gantry: hint: {exc.hint}", file=sys.stderr)


class GantryGroup(TyperGroup):
    """The root command group: turns Gantry's typed errors into a message and exit status 2."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GantryError as exc:
            print_error(exc)
            raise typer.Exit(EXIT_ERROR) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            where = f" {exc.filename}" if exc.filename else ""
            print(f"gantry: error: {exc.strerror or exc}{where}", file=sys.stderr)
            raise typer.Exit(EXIT_ERROR) from None


def state_of(ctx: typer.Context) -> State:
    """The :class:`State` that main() (or the root callback) put on the context."""
    state = ctx.obj
    if not isinstance(state, State):
        raise ConfigError("internal: settings were not loaded")
    return state


def command_settings(
    ctx: typer.Context, data_dir: Path | None = None, token: str | None = None
) -> ClientSettings:
    """The loaded settings with this command's ``--data-dir`` / ``--token`` applied."""
    settings = state_of(ctx).settings
    update: dict[str, Any] = {}
    if data_dir is not None:
        update["data_dir"] = data_dir
    if token is not None:
        update["token"] = token
    return settings.model_copy(update=update) if update else settings


# ---------------------------------------------------------------------- service access


@contextlib.contextmanager
def audit_client(settings: ClientSettings) -> Iterator[AuditClient]:
    """An :class:`AuditClient` for the configured audit address and bearer token."""
    from gantry.client.audit import AuditClient

    with AuditClient(settings.address("audit"), settings.bearer(), tls=settings.tls) as client:
        yield client


@contextlib.contextmanager
def governance_client(settings: ClientSettings) -> Iterator[GovernanceClient]:
    """A :class:`GovernanceClient` (datasets and models) for the configured address and token."""
    from gantry.client.governance import GovernanceClient

    with GovernanceClient(
        settings.address("governance"), settings.bearer(), tls=settings.tls
    ) as client:
        yield client


@contextlib.contextmanager
def transfer_progress(
    state: State, description: str, total: int | None
) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on stderr (only on a terminal); yields the callback to advance it.

    The callback may be called from another thread (gRPC pulls uploads from its own).
    """
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=state.err,
        transient=True,
        disable=not state.err.is_terminal,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def audit_trust(settings: ClientSettings) -> TrustStore:
    """The audit service's public key alone, from ``<data-dir>/keys/trusted/svc-audit.pub``.

    Tree heads are checked against this key only: the trusted directory also holds keys of
    service accounts, whose holders must not be able to sign a head the CLI accepts.
    """
    from gantry.client import admin
    from gantry.security import TrustStore

    ring = admin.keyring(settings.data_dir)
    raw = ring.trust().public_key_bytes(AUDIT_KEY_ID)
    if raw is None:
        raise ConfigError(
            f"the audit service's public key {AUDIT_KEY_ID}.pub is not in {ring.trusted_dir}",
            hint="copy keys/trusted/svc-audit.pub there from the platform's data directory",
        )
    return TrustStore({AUDIT_KEY_ID: raw})


# ---------------------------------------------------------------------- shared options


DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Platform data directory (default: GANTRY_DATA_DIR or .gantry).",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="Bearer token (default: GANTRY_TOKEN, else <data-dir>/admin.token).",
        show_default=False,
    ),
]


# ---------------------------------------------------------------------- times


_RELATIVE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, *, now: dt.datetime | None = None) -> int:
    """Unix milliseconds for an ISO 8601 time (``2026-01-31T12:00:00Z``) or ``<n><unit>`` ago.

    Units: s, m, h, d, w (``30m`` is thirty minutes ago). Naive ISO times are UTC.
    """
    match = _RELATIVE.match(text)
    if match:
        current = now or dt.datetime.now(dt.UTC)
        delta = dt.timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])
        return int((current - delta).timestamp() * 1000)
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(
            f"invalid time {text!r}",
            hint="use ISO 8601 like 2026-01-31T12:00:00Z, or a span ago like 30m, 1h, 7d",
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="ISO time or span ago (1h, 30m).", show_default=False),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", help="ISO time or span ago (exclusive).", show_default=False),
]


def time_window(since: str | None, until: str | None) -> tuple[int, int]:
    """``--since`` / ``--until`` as Unix milliseconds (0 where not given)."""
    since_ms = parse_time(since) if since else 0
    until_ms = parse_time(until) if until else 0
    if since_ms and until_ms and since_ms >= until_ms:
        raise InvalidInput(f"--since ({since}) must be before --until ({until})")
    return since_ms, until_ms


def fmt_ms(ms: int) -> str:
    """Unix milliseconds as ``YYYY-MM-DD HH:MM:SS`` (UTC) for tables; empty for 0."""
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def iso_ms(ms: int) -> str:
    """Unix milliseconds as ISO 8601 UTC with milliseconds and a ``Z``."""
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


# ---------------------------------------------------------------------- logging


def configure_cli_logging(settings: CommonSettings) -> None:
    """Send library log lines to stderr, errors only unless ``GANTRY_LOG_LEVEL`` is set.

    Standard output stays clean for command output (exports, tokens, JSON).
    """
    level = settings.log_level if "log_level" in settings.model_fields_set else "ERROR"
    numeric = logging.getLevelName(level.upper())
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            numeric if isinstance(numeric, int) else logging.ERROR
        ),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*args: Any) -> structlog.PrintLogger:
    return structlog.PrintLogger(sys.stderr)  # looked up per logger: tests swap sys.stderr
