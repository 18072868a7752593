"""The ``gantry`` command line: run the platform, administer it, emit events, audit.

::

    gantry up [--data-dir .gantry] [--nats-port 4222]
    gantry admin init | token create | service-account create
    gantry events emit TYPE --data '{...}' --source S --actor A
    gantry audit query | export | report | verify | proof

Settings (``GANTRY_DATA_DIR``, ``GANTRY_TOKEN``, ``GANTRY_AUDIT_ADDR``) are loaded once in
:func:`main` and handed to every command; ``--data-dir`` and ``--token`` override them. Every
error Gantry raises on purpose is printed as ``gantry: error: <message>`` with exit status 2.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import enum
import errno
import itertools
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import structlog
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    FileSizeColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from typer.core import TyperGroup

from gantry.client.config import ClientSettings
from gantry.client.errors import RemoteNotFound
from gantry.core import (
    CommonSettings,
    ConfigError,
    GantryError,
    IntegrityError,
    InvalidInput,
    load_settings,
)
from gantry.supervisor.platform import DEFAULT_NATS_PORT, Platform

if TYPE_CHECKING:
    from gantry.client.audit import AuditClient, Filter
    from gantry.events import EventEnvelope
    from gantry.security import TrustStore
    from gantry.security.treehead import TreeHead

# Modules that import gantry.events are imported inside the commands, after main() has set up
# logging: the event library binds its loggers to the logging set-up of import time.

EXIT_ERROR = 2
EXIT_FAILED = 1
#: The key id of the audit service's signing key (``keys/trusted/svc-audit.pub``).
AUDIT_KEY_ID = "svc-audit"


# ---------------------------------------------------------------------- plumbing


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


class _Group(TyperGroup):
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


app = typer.Typer(
    cls=_Group,
    name="gantry",
    help="Gantry: run the platform, administer it, emit events and audit what happened.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
admin_app = typer.Typer(help="Keys, tokens and service accounts.", no_args_is_help=True)
token_app = typer.Typer(help="Identity tokens.", no_args_is_help=True)
account_app = typer.Typer(help="Service accounts of outside services.", no_args_is_help=True)
events_app = typer.Typer(help="The event bus.", no_args_is_help=True)
audit_app = typer.Typer(help="The tamper-evident audit log.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
admin_app.add_typer(token_app, name="token")
admin_app.add_typer(account_app, name="service-account")
app.add_typer(events_app, name="events")
app.add_typer(audit_app, name="audit")


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Gantry: run the platform, administer it, emit events and audit what happened."""
    if not isinstance(ctx.obj, State):  # invoked without main(), e.g. by a test runner
        settings = load_settings(ClientSettings)
        configure_cli_logging(settings)
        ctx.obj = State(settings)


def _state(ctx: typer.Context) -> State:
    state = ctx.obj
    if not isinstance(state, State):
        raise ConfigError("internal: settings were not loaded")
    return state


def _settings(
    ctx: typer.Context, data_dir: Path | None = None, token: str | None = None
) -> ClientSettings:
    """The loaded settings with this command's ``--data-dir`` / ``--token`` applied."""
    settings = _state(ctx).settings
    update: dict[str, Any] = {}
    if data_dir is not None:
        update["data_dir"] = data_dir
    if token is not None:
        update["token"] = token
    return settings.model_copy(update=update) if update else settings


@contextlib.contextmanager
def _audit_client(settings: ClientSettings) -> Iterator[AuditClient]:
    from gantry.client.audit import AuditClient

    with AuditClient(settings.address("audit"), settings.bearer()) as client:
        yield client


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


def _window(since: str | None, until: str | None) -> tuple[int, int]:
    since_ms = parse_time(since) if since else 0
    until_ms = parse_time(until) if until else 0
    if since_ms and until_ms and since_ms >= until_ms:
        raise InvalidInput(f"--since ({since}) must be before --until ({until})")
    return since_ms, until_ms


def _fmt_ms(ms: int) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso_ms(ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


# ---------------------------------------------------------------------- up


@app.command("up")
def up(
    ctx: typer.Context,
    data_dir: DataDirOpt = None,
    nats_port: Annotated[
        int, typer.Option("--nats-port", help="Preferred NATS port (0 = any free port).")
    ] = DEFAULT_NATS_PORT,
) -> None:
    """Run NATS and the Gantry services in the foreground until Ctrl-C."""
    settings = _settings(ctx, data_dir)
    state = _state(ctx)
    platform = Platform(settings.data_dir, nats_port=nats_port)

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        platform.start()
        _print_where(state.out, platform)
        dead = platform.wait()
        if dead is not None:
            print(
                f"gantry: error: {dead} exited unexpectedly; stopping the platform",
                file=sys.stderr,
            )
            code = EXIT_FAILED
    except KeyboardInterrupt:
        state.err.print("stopping Gantry…")
    finally:
        # A second Ctrl-C must not interrupt the orderly shutdown.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            platform.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code:
        raise typer.Exit(code)
    state.err.print("Gantry stopped.")


def _print_where(out: Console, platform: Platform) -> None:
    table = Table(
        title=f"Gantry is up — data dir {escape(str(platform.data_dir))}", show_header=False
    )
    table.add_column("what", style="bold")
    table.add_column("where")
    table.add_row("NATS", platform.nats_url)
    for name in platform.services:
        info = platform.service_info(name)
        table.add_row(f"{name} gRPC", str(info.get("grpc", "")))
        if info.get("metrics"):
            table.add_row(f"{name} metrics", str(info["metrics"]))
    table.add_row("admin token", escape(str(platform.data_dir / "admin.token")))
    out.print(table)
    out.print("Press Ctrl-C to stop.")


# ---------------------------------------------------------------------- admin


@admin_app.command("init")
def admin_init(ctx: typer.Context, data_dir: DataDirOpt = None) -> None:
    """Create the key directory (kept if it exists) and write a fresh admin token."""
    from gantry.client import admin

    settings = _settings(ctx, data_dir)
    result = admin.init(settings.data_dir)
    out = _state(ctx).out
    verb = "created" if result.created_keys else "kept existing"
    out.print(
        f"{verb} keys in {result.keys_dir} (token-signing key id {result.issuer_kid})",
        markup=False,
    )
    out.print(f"admin token written to {result.token_path} (mode 0600, valid 12h)", markup=False)


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    user: Annotated[str, typer.Option("--user", help="Subject of the token.")],
    role: Annotated[
        list[str], typer.Option("--role", help="A role from the RBAC policy (repeatable).")
    ],
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime: 30m, 12h, 7d (max 30d).")] = "12h",
    data_dir: DataDirOpt = None,
) -> None:
    """Issue a token and print it."""
    from gantry.client import admin
    from gantry.security import parse_ttl

    settings = _settings(ctx, data_dir)
    print(admin.create_token(settings.data_dir, user, list(role), parse_ttl(ttl)))


@account_app.command("create")
def service_account_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Service account name, e.g. feature-store.")],
    ttl: Annotated[str, typer.Option("--ttl", help="Token lifetime (max 30d).")] = "12h",
    data_dir: DataDirOpt = None,
) -> None:
    """Create a signing key and a 'service' token for an outside service."""
    from gantry.client import admin

    settings = _settings(ctx, data_dir)
    token, key_path = admin.create_service_account(settings.data_dir, name, ttl=ttl)
    print(f"signing key: {key_path}")
    print(f"token: {token}")


# ---------------------------------------------------------------------- events


@events_app.command("emit")
def events_emit(
    ctx: typer.Context,
    type_: Annotated[str, typer.Argument(metavar="TYPE", help="e.g. gantry.data.accessed")],
    source: Annotated[str, typer.Option("--source", help="The producing service.")],
    actor: Annotated[str, typer.Option("--actor", help="The principal that caused it.")],
    data: Annotated[str, typer.Option("--data", help="Event data as a JSON object.")] = "{}",
    subject: Annotated[
        str | None, typer.Option("--subject", help="Resource id.", show_default=False)
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            help="Service-account signing key (default: <data-dir>/keys/accounts/<source>.pem).",
            show_default=False,
        ),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="NATS URL (default: the running platform's).")
    ] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Publish one signed event."""
    from gantry.client.emit import build_event

    settings = _settings(ctx, data_dir)
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise InvalidInput(f"--data is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidInput('--data must be a JSON object, e.g. \'{"dataset": "customers"}\'')
    event = build_event(type_, payload, source=source, actor=actor, subject=subject)
    if key is None:
        default_key = settings.data_dir / "keys" / "accounts" / f"{source}.pem"
        key = default_key if default_key.is_file() else None
    if key is None:
        _state(ctx).err.print(
            f"warning: no signing key for {source!r}; the event is unsigned and the audit "
            "service will refuse it (create one: gantry admin service-account create)",
            markup=False,
        )
    ack = asyncio.run(_publish(event, url=url, data_dir=settings.data_dir, key=key))
    duplicate = " (duplicate, stored once)" if getattr(ack, "duplicate", False) else ""
    _state(ctx).out.print(
        f"published {event.type} id={event.id} stream={ack.stream} seq={ack.seq}{duplicate}",
        markup=False,
    )


async def _publish(
    event: EventEnvelope, *, url: str | None, data_dir: Path, key: Path | None
) -> Any:
    from gantry.client.emit import connect

    async with await connect(
        source=event.source, actor=event.actor, url=url, data_dir=data_dir, key_path=key
    ) as emitter:
        return await emitter.publisher.publish(event)


# ---------------------------------------------------------------------- audit


class DecisionChoice(enum.StrEnum):
    """Values of --decision."""

    allow = "allow"
    deny = "deny"


class ExportFormat(enum.StrEnum):
    """Values of --format."""

    jsonl = "jsonl"
    csv = "csv"


ActorOpt = Annotated[
    list[str] | None,
    typer.Option("--actor", help="Only these actors (repeatable).", show_default=False),
]
TypeOpt = Annotated[
    list[str] | None,
    typer.Option("--type", help="Only these event types (repeatable).", show_default=False),
]
ResourceOpt = Annotated[
    str, typer.Option("--resource", help="e.g. dataset/customers.", show_default=False)
]
ActionOpt = Annotated[str, typer.Option("--action", help="e.g. read.", show_default=False)]
DecisionOpt = Annotated[
    DecisionChoice | None, typer.Option("--decision", help="allow or deny.", show_default=False)
]
CorrelationOpt = Annotated[
    str, typer.Option("--correlation-id", help="One request's events.", show_default=False)
]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="ISO time or span ago (1h, 30m).", show_default=False),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", help="ISO time or span ago (exclusive).", show_default=False),
]


def _filter(
    actors: list[str] | None,
    types: list[str] | None,
    resource: str,
    action: str,
    decision: DecisionChoice | None,
    correlation_id: str,
    since: str | None,
    until: str | None,
) -> Filter:
    from gantry.client.audit import Filter

    since_ms, until_ms = _window(since, until)
    return Filter(
        actors=tuple(actors or ()),
        types=tuple(types or ()),
        resource=resource,
        action=action,
        decision=decision.value if decision else "",
        correlation_id=correlation_id,
        since_ms=since_ms,
        until_ms=until_ms,
    )


def _record_json(r: Any) -> dict[str, Any]:
    return {
        "index": r.index,
        "event_id": r.event_id,
        "time": _iso_ms(r.time_ms),
        "type": r.type,
        "actor": r.actor,
        "subject": r.subject,
        "resource": r.resource,
        "action": r.action,
        "decision": r.decision,
        "correlation_id": r.correlation_id,
        "event": json.loads(r.event_json),
    }


def _decision_text(decision: str) -> str:
    return {"allow": "[green]allow[/]", "deny": "[red]deny[/]"}.get(decision, escape(decision))


@audit_app.command("query")
def audit_query(
    ctx: typer.Context,
    actor: ActorOpt = None,
    type_: TypeOpt = None,
    resource: ResourceOpt = "",
    action: ActionOpt = "",
    decision: DecisionOpt = None,
    correlation_id: CorrelationOpt = "",
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="At most N records; 0 = all.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List audit records matching the filters, oldest first."""
    settings = _settings(ctx, data_dir, token)
    state = _state(ctx)
    flt = _filter(actor, type_, resource, action, decision, correlation_id, since, until)
    page = min(limit + 1, 1000) if limit else 1000
    with _audit_client(settings) as client:
        found = client.query(flt, page_size=page)
        records = list(itertools.islice(found, limit + 1) if limit else found)
    more = bool(limit) and len(records) > limit
    records = records[:limit] if limit else records
    if as_json:
        for r in records:
            print(json.dumps(_record_json(r), sort_keys=True))
    else:
        table = Table(title=f"{len(records)} audit record{'s' if len(records) != 1 else ''}")
        for col in ("#", "time (UTC)", "type", "actor", "resource", "action", "decision"):
            table.add_column(col, justify="right" if col == "#" else "left")
        table.add_column("event id", overflow="fold")
        for r in records:
            table.add_row(
                str(r.index),
                _fmt_ms(r.time_ms),
                escape(r.type),
                escape(r.actor),
                escape(r.resource),
                escape(r.action),
                _decision_text(r.decision),
                escape(r.event_id),
            )
        state.out.print(table)
    if more:
        state.err.print(f"showing the first {limit}; pass --limit 0 for all")


@audit_app.command("export")
def audit_export(
    ctx: typer.Context,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="jsonl or csv.")] = (
        ExportFormat.jsonl
    ),
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write to FILE (default: stdout).", show_default=False),
    ] = None,
    actor: ActorOpt = None,
    type_: TypeOpt = None,
    resource: ResourceOpt = "",
    action: ActionOpt = "",
    decision: DecisionOpt = None,
    correlation_id: CorrelationOpt = "",
    since: SinceOpt = None,
    until: UntilOpt = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Export matching records as JSON lines or CSV."""
    settings = _settings(ctx, data_dir, token)
    state = _state(ctx)
    flt = _filter(actor, type_, resource, action, decision, correlation_id, since, until)
    with _audit_client(settings) as client:
        chunks = client.export(flt, fmt=fmt.value)
        if output is None:
            sys.stdout.flush()
            sink = sys.stdout.buffer
            for chunk in chunks:
                sink.write(chunk)
            sink.flush()
            return
        records, size = _export_to_file(state, chunks, output, fmt)
    header = 1 if fmt is ExportFormat.csv else 0
    state.err.print(f"wrote {max(records - header, 0):,} records ({size:,} bytes) to {output}")


def _export_to_file(
    state: State, chunks: Iterator[bytes], output: Path, fmt: ExportFormat
) -> tuple[int, int]:
    partial = output.with_name(f".{output.name}.part")
    lines = size = 0
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[lines]:,} lines"),
        FileSizeColumn(),
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
    )
    try:
        with progress, partial.open("wb") as fh:
            task = progress.add_task(f"exporting {fmt.value} to {output}", total=None, lines=0)
            for chunk in chunks:
                fh.write(chunk)
                lines += chunk.count(b"\n")
                size += len(chunk)
                progress.update(task, completed=size, lines=lines)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return lines, size


@audit_app.command("report")
def audit_report(
    ctx: typer.Context,
    resource: Annotated[str, typer.Argument(help="e.g. dataset/customers")],
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Who accessed RESOURCE, how, how often allowed and denied, first and last time."""
    settings = _settings(ctx, data_dir, token)
    since_ms, until_ms = _window(since, until)
    with _audit_client(settings) as client:
        report = client.access_report(resource, since_ms, until_ms)
    if as_json:
        rows = [
            {
                "actor": r.actor,
                "action": r.action,
                "allowed": r.allowed,
                "denied": r.denied,
                "first": _iso_ms(r.first_ms),
                "last": _iso_ms(r.last_ms),
            }
            for r in report.rows
        ]
        print(json.dumps({"resource": report.resource, "total": report.total, "rows": rows}))
        return
    _state(ctx).out.print(access_table(report))


def access_table(report: Any) -> Table:
    """A rich table of an access report (actor, action, allowed, denied, first, last)."""
    table = Table(title=f"Access to {escape(report.resource)} — {report.total:,} accesses")
    table.add_column("actor")
    table.add_column("action")
    table.add_column("allowed", justify="right", style="green")
    table.add_column("denied", justify="right", style="red")
    table.add_column("first (UTC)")
    table.add_column("last (UTC)")
    for r in report.rows:
        table.add_row(
            escape(r.actor),
            escape(r.action),
            f"{r.allowed:,}",
            f"{r.denied:,}",
            _fmt_ms(r.first_ms),
            _fmt_ms(r.last_ms),
        )
    return table


@audit_app.command("verify")
def audit_verify(ctx: typer.Context, data_dir: DataDirOpt = None, token: TokenOpt = None) -> None:
    """Have the server recompute the log, then check the latest signed head locally.

    The head is checked against the trusted keys and, with a consistency proof, against the
    head this command saw last time (kept in <data-dir>/cli/last_head.json).
    """
    settings = _settings(ctx, data_dir, token)
    out = _state(ctx).out
    with _audit_client(settings) as client:
        report = client.verify()
        if not report.ok:
            out.print(
                f"[red]FAILED[/]: {len(report.problems)} problem(s) in {report.events_checked:,} "
                f"events; first bad index {report.first_bad_index}"
            )
            for p in report.problems:
                out.print(f"  index {p.index}: {p.kind}: {p.detail}", markup=False)
            raise typer.Exit(EXIT_FAILED)
        out.print(
            f"[green]OK[/]: the server recomputed {report.events_checked:,} events and "
            f"{report.checkpoints_checked:,} signed checkpoints"
        )
        trust = audit_trust(settings)
        try:
            latest = client.checkpoint()
        except RemoteNotFound:
            out.print("no signed checkpoint yet; nothing more to check")
            return
        store = settings.data_dir / "cli" / "last_head.json"
        try:
            latest.check_signature(trust)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
        seen = _load_head(store)
        try:
            message = _check_history(client, trust, seen, latest)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: history rewritten: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
    out.print(
        f"[green]OK[/]: checkpoint of size {latest.tree_size:,} signed by {escape(latest.key_id)} "
        f"at {_iso_ms(latest.timestamp_ms)}; {message}"
    )
    _save_head(store, latest)


def _check_history(
    client: AuditClient, trust: TrustStore, seen: TreeHead | None, latest: TreeHead
) -> str:
    """Check that ``latest`` extends ``seen``; raise IntegrityError if it does not."""
    if seen is None:
        return "first verification from this data dir (head remembered)"
    if seen.tree_size > latest.tree_size:
        raise IntegrityError(
            f"the log shrank from {seen.tree_size} to {latest.tree_size} entries since last seen"
        )
    if seen.tree_size == latest.tree_size:
        if seen.root_hash != latest.root_hash:
            raise IntegrityError(f"the root of the log of size {seen.tree_size} has changed")
        return f"unchanged since last seen (size {seen.tree_size:,})"
    try:
        first, _ = client.prove_consistency(trust, seen.tree_size, latest.tree_size)
    except RemoteNotFound:
        raise IntegrityError(
            f"the checkpoint of size {seen.tree_size} seen before is gone from the server"
        ) from None
    if first.root_hash != seen.root_hash:
        raise IntegrityError(f"the root of the log of size {seen.tree_size} has changed")
    return f"consistent with the head of size {seen.tree_size:,} seen before"


def _load_head(path: Path) -> TreeHead | None:
    from gantry.security.treehead import TreeHead

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return TreeHead(
            int(raw["tree_size"]),
            bytes.fromhex(raw["root_hash"]),
            int(raw["timestamp_ms"]),
            str(raw["key_id"]),
            base64.b64decode(raw["signature"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot read the remembered tree head {path}: {exc}",
            hint="delete the file to start remembering afresh",
        ) from None


def _save_head(path: Path, head: TreeHead) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "tree_size": head.tree_size,
        "root_hash": head.root_hash.hex(),
        "timestamp_ms": head.timestamp_ms,
        "key_id": head.key_id,
        "signature": base64.b64encode(head.signature).decode("ascii"),
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@audit_app.command("proof")
def audit_proof(
    ctx: typer.Context,
    event_id: Annotated[str, typer.Argument(help="The event's id.")],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Prove that an event is in the signed log, checking the proof locally."""
    settings = _settings(ctx, data_dir, token)
    out = _state(ctx).out
    trust = audit_trust(settings)
    with _audit_client(settings) as client:
        try:
            index, raw, head = client.prove_inclusion(trust, event_id=event_id)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
    event = json.loads(raw)
    if event.get("id") != event_id:
        found = escape(repr(event.get("id")))
        out.print(f"[red]FAILED[/]: the proven entry {index} is event {found}")
        raise typer.Exit(EXIT_FAILED)
    out.print(
        f"[green]OK[/]: event {escape(event_id)} ({escape(str(event.get('type')))}) is entry "
        f"{index:,} of the log of size {head.tree_size:,}, root {head.root_hash.hex()[:16]}…, "
        f"signed by {escape(head.key_id)} at {_iso_ms(head.timestamp_ms)}"
    )


# ---------------------------------------------------------------------- entry point


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


def main(argv: list[str] | None = None) -> int:
    """The ``gantry`` console script: load settings once, run the command, return its status."""
    try:
        settings = load_settings(ClientSettings)
    except GantryError as exc:
        print_error(exc)
        return EXIT_ERROR
    configure_cli_logging(settings)
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="gantry", standalone_mode=True, obj=State(settings))
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return EXIT_FAILED
    return 0


__all__ = [
    "AUDIT_KEY_ID",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "DecisionChoice",
    "ExportFormat",
    "State",
    "access_table",
    "app",
    "audit_trust",
    "configure_cli_logging",
    "main",
    "parse_time",
    "print_error",
]


if __name__ == "__main__":
    sys.exit(main())
