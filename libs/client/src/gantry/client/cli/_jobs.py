"""``gantry jobs``, ``gantry nodes``, ``gantry queues`` and ``gantry usage``: the scheduler.

Submit training jobs and follow them to the end, read their logs, and look at what the
cluster has and who used it. The scheduler is found like every service: ``GANTRY_DATA_DIR``'s
``run/scheduler.json`` written by the running service (see
:meth:`~gantry.client.config.ClientSettings.address`). A watch that ends with the job's end
exits 0 when it succeeded and 1 when it failed or was cancelled, so scripts can wait on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    EXIT_FAILED,
    DataDirOpt,
    State,
    TokenOpt,
    command_settings,
    fmt_ms,
    state_of,
    time_window,
)
from gantry.client.config import ClientSettings
from gantry.core import InvalidInput, Unavailable

if TYPE_CHECKING:
    from gantry.client.scheduler import (
        JobInfo,
        JobProgress,
        LogLine,
        QueueInfo,
        Resources,
        SchedulerClient,
    )

jobs_app = typer.Typer(help="Training jobs: submit, follow, logs, cancel.", no_args_is_help=True)
nodes_app = typer.Typer(help="The cluster's nodes and what is free on them.", no_args_is_help=True)
queues_app = typer.Typer(help="Queues, quotas and fair share.", no_args_is_help=True)

JobArg = Annotated[
    str, typer.Argument(help="Job id, or name (its newest job).", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]

_STATE_STYLE = {
    "pending": "yellow",
    "scheduled": "cyan",
    "running": "green",
    "stopping": "magenta",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "dim",
    "ready": "green",
    "degraded": "yellow",
    "lost": "bold red",
}


@contextlib.contextmanager
def scheduler_client(settings: ClientSettings) -> Iterator[SchedulerClient]:
    """A :class:`SchedulerClient` for the configured scheduler address and bearer token."""
    from gantry.client.scheduler import SchedulerClient

    with SchedulerClient(
        settings.address("scheduler"), settings.bearer(), tls=settings.tls
    ) as client:
        yield client


# ---------------------------------------------------------------------- jobs


@jobs_app.command("submit")
def jobs_submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A TrainingJob YAML file.", show_default=False)],
    request_id: Annotated[
        str,
        typer.Option("--request-id", help="Idempotency key: a repeat returns the first job."),
    ] = "",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only validate and check it could be placed.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Then follow its state until it ends.")
    ] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit a training job; print its id and state (and follow it with --watch)."""
    if dry_run and watch:
        raise InvalidInput("--watch follows a submitted job: drop it or --dry-run")
    spec = _read_spec(file)
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with scheduler_client(settings) as client:
        result = client.submit(spec, request_id=request_id, dry_run=dry_run)
        job = result.job
        if dry_run:
            state.out.print(
                f"dry run: job {job.name} is valid; it would be {job.state} in queue {job.queue}",
                markup=False,
            )
        elif result.duplicate:
            state.out.print(
                f"job {job.id} ({job.name}) was already submitted with request id "
                f"{job.request_id or request_id}; it is {job.state}",
                markup=False,
            )
        else:
            state.out.print(
                f"submitted job {job.id} ({job.name}) to queue {job.queue}: {job.state}",
                markup=False,
            )
        if job.reason:
            state.out.print(f"  {job.reason}", markup=False)
        if watch:
            _until_done(state, client, job)


def _read_spec(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(
            f"no job file {file}", hint="give the path of a TrainingJob YAML file"
        ) from None
    except IsADirectoryError:
        raise InvalidInput(f"{file} is a directory, not a job file") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"the job file {file} is not UTF-8 text") from None
    except OSError as exc:
        raise InvalidInput(f"can't read the job file {file}: {exc.strerror or exc}") from None


@jobs_app.command("list")
def jobs_list(
    ctx: typer.Context,
    queue: Annotated[str, typer.Option("--queue", "-q", help="Only this queue.")] = "",
    job_state: Annotated[
        str,
        typer.Option("--state", "-s", help="Only this state; 'active' = every job not finished."),
    ] = "",
    owner: Annotated[str, typer.Option("--owner", help="Only this owner's jobs.")] = "",
    limit: Annotated[int, typer.Option("--limit", min=0, help="At most N jobs.")] = 100,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List jobs: id, name, queue, state, workers, GPUs, age, progress and why (when pending)."""
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        jobs = client.list(queue=queue, state=job_state, owner=owner, limit=limit)
    if as_json:
        print(json.dumps([dataclasses.asdict(j) for j in jobs], indent=2))
        return
    now_ms = _now_ms()
    table = Table(title=f"{len(jobs)} job{'' if len(jobs) == 1 else 's'}")
    # the progress column only when some job reported progress: narrow terminals keep room
    progress = any(j.progress is not None for j in jobs)
    columns = ("id", "name", "queue", "state", "workers", "GPUs", "age")
    for col in (*columns, *(("progress",) if progress else ()), "reason"):
        table.add_column(
            col, justify="right" if col in ("workers", "GPUs", "age", "progress") else "left"
        )
    for j in jobs:
        cells = [
            escape(j.id),
            escape(j.name),
            escape(j.queue),
            _styled(j.state),
            f"{j.workers}/{j.replicas}",
            f"{j.gpus:g}" if j.gpus else "-",
            _age(now_ms - j.submitted_ms) if j.submitted_ms else "",
        ]
        if progress:
            cells.append(_progress_short(j.progress) if j.progress else "")
        table.add_row(*cells, escape(j.reason))
    state_of(ctx).out.print(table)


@jobs_app.command("get")
def jobs_get(
    ctx: typer.Context,
    job_id: JobArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a job: its shape, state (and why), progress, placements and history."""
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        job = client.get(job_id)
    if as_json:
        print(json.dumps(dataclasses.asdict(job), indent=2))
        return
    out = state_of(ctx).out
    out.print(f"job {escape(job.id)} ({escape(job.name)}): {_styled(job.state)}")
    if job.reason:
        label = "why pending" if job.state == "pending" else "reason"
        out.print(f"  {label}: {escape(job.reason)}")
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    replicas = (
        f"{job.min_replicas}..{job.replicas} (elastic)"
        if job.min_replicas and job.min_replicas < job.replicas
        else str(job.replicas)
    )
    rows: list[tuple[str, str]] = [
        ("queue", job.queue),
        ("owner", job.owner),
        ("priority", str(job.priority)),
        ("replicas", replicas),
        ("workers", f"{job.workers} (attempt {job.attempt})"),
        ("progress", _progress_line(job.progress) if job.progress else ""),
        (
            "restarts",
            f"{job.restarts} (workers restarted from a checkpoint)" if job.restarts else "",
        ),
        ("model", job.model),
        ("dataset version", job.dataset_version),
        ("metrics", ", ".join(f"{k}={v:.4g}" for k, v in sorted(job.metrics.items()))),
        ("GPU per worker", f"{job.gpu_milli / 1000:g}"),
        ("pools", job.pool or "any"),
        ("submitted", fmt_ms(job.submitted_ms)),
        ("started", fmt_ms(job.started_ms)),
        ("finished", fmt_ms(job.finished_ms)),
        (
            "predicted runtime",
            _age(int(job.predicted_runtime_s * 1000)) if job.predicted_runtime_s else "",
        ),
        ("request id", job.request_id),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(job.labels.items()))),
    ]
    for name, value in rows:
        if value:
            fields.add_row(name, escape(value))
    out.print(fields)
    if job.placements:
        placed = Table(title="placements")
        for col in ("worker", "node", "GPUs"):
            placed.add_column(col)
        for p in job.placements:
            gpus = ", ".join(
                f"{i}" if milli >= 1000 else f"{i} ({milli}m)" for i, milli in p.shares()
            )
            placed.add_row(str(p.worker), escape(p.node), gpus or "-")
        out.print(placed)
    if job.history:
        history = Table(title="history")
        for col in ("time (UTC)", "after", "state", "attempt", "reason"):
            history.add_column(col, justify="right" if col == "after" else "left")
        for e in job.history:
            after = _age(e.at_ms - job.submitted_ms) if job.submitted_ms else ""
            history.add_row(
                fmt_ms(e.at_ms), after, _styled(e.state), str(e.attempt), escape(e.reason)
            )
        out.print(history)


@jobs_app.command("watch")
def jobs_watch(
    ctx: typer.Context,
    job_id: Annotated[
        str, typer.Argument(help="One job (id or name); default: every job you may see.")
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print state changes as they happen: of one job until it ends, or of all until Ctrl-C."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with scheduler_client(settings) as client:
        if job_id:
            job = client.get(job_id)
            _print_update(state, job)
            _until_done(state, client, job)
            return
        seen: dict[str, tuple[Any, ...]] = {}
        with client.watch("", include_current=True) as updates:
            try:
                for job in updates:
                    if seen.get(job.id) != _change(job):
                        seen[job.id] = _change(job)
                        _print_update(state, job)
            except KeyboardInterrupt:
                return


def _until_done(state: State, client: SchedulerClient, job: JobInfo) -> None:
    """Print ``job``'s changes until it ends; exit 1 unless it succeeded."""
    if not job.terminal:
        last = _change(job)
        with client.watch(job.id, include_current=True) as updates:
            try:
                for update in updates:
                    if _change(update) != last:
                        last = _change(update)
                        _print_update(state, update)
                    job = update
                    if job.terminal:
                        break
            except KeyboardInterrupt:
                state.err.print(
                    f"stopped watching; job {job.id} goes on "
                    f"(stop it with 'gantry jobs cancel {job.id}')",
                    markup=False,
                )
                return
        if not job.terminal:
            raise Unavailable(
                f"the scheduler ended the watch before job {job.id} finished",
                hint=f"watch it again with 'gantry jobs watch {job.id}'",
            )
    if job.state != "succeeded":
        raise typer.Exit(EXIT_FAILED)


def _change(job: JobInfo) -> tuple[Any, ...]:
    """What makes an update worth a line."""
    return (job.state, job.reason, job.workers, job.attempt)


def _print_update(state: State, job: JobInfo) -> None:
    at = job.history[-1].at_ms if job.history else _now_ms()
    stamp = dt.datetime.fromtimestamp(at / 1000, dt.UTC).strftime("%H:%M:%S")
    line = f"{stamp}  {escape(job.id)}  {escape(job.name)}  {_styled(job.state)}"
    if not job.terminal:
        line += f"  {job.workers}/{job.replicas} workers"
    if job.reason:
        line += f"  {escape(job.reason)}"
    state.out.print(line, highlight=False)


@jobs_app.command("cancel")
def jobs_cancel(
    ctx: typer.Context,
    job_id: JobArg,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept in the job's history.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel a job; its workers are stopped."""
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        job = client.cancel(job_id, reason)
    state_of(ctx).out.print(f"job {job.id} ({job.name}): {job.state}", markup=False)


@jobs_app.command("logs")
def jobs_logs(
    ctx: typer.Context,
    job_id: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    tail: Annotated[int, typer.Option("--tail", min=0, help="Only the last N lines; 0 = all.")] = 0,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's log lines, each prefixed with its worker (wN|)."""
    settings = command_settings(ctx, data_dir, token)
    out = state_of(ctx).out
    with scheduler_client(settings) as client, client.logs(job_id, follow, tail) as lines:
        try:
            for line in lines:
                _write_log(out.file, line)
        except KeyboardInterrupt:
            return


def _write_log(file: Any, line: LogLine) -> None:
    # Raw, not through rich: log text keeps its own escapes and brackets, and each line is
    # flushed so that ``--follow`` shows it as soon as it arrives.
    source = f"w{line.worker}" + (" gantry" if line.stream == "gantry" else "")
    file.write(f"{source}| {line.text.removesuffix(chr(10))}\n")
    file.flush()


# ---------------------------------------------------------------------- nodes


@nodes_app.command("list")
def nodes_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List nodes: pool, state, address, free/total GPUs by model (or CPU worker slots), CPU,
    memory and their jobs."""
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        nodes = client.nodes()
    if as_json:
        print(json.dumps([dataclasses.asdict(n) for n in nodes], indent=2))
        return
    table = Table(title=f"{len(nodes)} node{'' if len(nodes) == 1 else 's'} (free/total)")
    addresses = any(n.address for n in nodes)  # older agents register none
    for col in ("node", "pool", "state", *(("address",) if addresses else ()), "GPUs"):
        table.add_column(col)
    for col in ("CPUs", "memory", "jobs"):
        table.add_column(col)
    for n in sorted(nodes, key=lambda n: (n.pool, n.name)):
        gpus = ", ".join(
            f"{escape(model or '?')} {free:g}/{total}"
            for model, (free, total) in sorted(n.gpus_by_model().items())
        )
        if n.worker_slots == "cpu":
            gpus = ", ".join(filter(None, ("cpu slots", gpus)))
        health = _styled(n.state) + (f" ({escape(n.reason)})" if n.reason else "")
        cells = [escape(n.name), escape(n.pool), health]
        if addresses:
            cells.append(escape(n.address) or "-")
        table.add_row(
            *cells,
            gpus or "-",
            f"{n.cpu_free_milli / 1000:g}/{n.cpu_milli / 1000:g}",
            f"{_mib(n.memory_free_mib)}/{_mib(n.memory_mib)}",
            escape(", ".join(n.jobs)),
        )
    state_of(ctx).out.print(table)


# ---------------------------------------------------------------------- queues


@queues_app.command("list")
def queues_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List queues: quotas and use (used/quota), borrowing limits, jobs and fair share."""
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        queues = client.queues()
    if as_json:
        print(json.dumps([dataclasses.asdict(q) for q in queues], indent=2))
        return
    table = Table(title=f"{len(queues)} queue{'' if len(queues) == 1 else 's'} (used/quota)")
    for col in ("queue", "cohort", "weight", "GPUs", "CPUs", "memory", "borrow limit"):
        table.add_column(col)
    for col in ("pending", "running", "share"):
        table.add_column(col, justify="right")
    for q in queues:
        table.add_row(
            escape(q.name),
            escape(q.cohort),
            f"{q.weight:g}",
            f"{q.used.gpus:g}/{_num(q.quota.gpus)}",
            f"{q.used.cpus:g}/{_num(q.quota.cpus)}",
            f"{_mib(q.used.memory_mib)}/"
            + ("∞" if q.quota.memory_mib < 0 else _mib(q.quota.memory_mib)),
            _limit(q.borrowing_limit),
            str(q.pending),
            str(q.running),
            f"{q.dominant_share:.0%}",
        )
    state_of(ctx).out.print(table)


@queues_app.command("set-quota")
def queues_set_quota(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="Queue name (created if new).", show_default=False)],
    gpus: Annotated[float, typer.Option("--gpus", min=0, help="Guaranteed GPUs.")],
    cpus: Annotated[
        float | None, typer.Option("--cpus", min=0, help="Guaranteed CPUs.", show_default=False)
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option("--memory", help="Guaranteed memory, e.g. 64Gi or 512Mi.", show_default=False),
    ] = None,
    cohort: Annotated[
        str | None,
        typer.Option("--cohort", help="Cohort it borrows and lends in.", show_default=False),
    ] = None,
    weight: Annotated[
        float, typer.Option("--weight", min=0, help="Fair-share weight; 0 = keep (1 if new).")
    ] = 0,
    borrowing_limit_gpus: Annotated[
        float | None,
        typer.Option(
            "--borrowing-limit-gpus", min=0, help="At most N GPUs borrowed.", show_default=False
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a queue's quota. Options left out keep the queue's current value (a new queue:
    CPUs and memory not limited)."""
    memory_mib = _parse_memory(memory) if memory is not None else None
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        current = next((q for q in client.queues() if q.name == queue), None)
        limit = current.borrowing_limit if current else None
        if borrowing_limit_gpus is not None:
            from gantry.client.scheduler import Resources

            unlimited = Resources(gpus=-1, cpus=-1, memory_mib=-1)
            limit = dataclasses.replace(limit or unlimited, gpus=borrowing_limit_gpus)
        updated = client.set_quota(
            queue,
            gpus=gpus,
            cpus=cpus if cpus is not None else (current.quota.cpus if current else -1),
            memory_mib=(
                memory_mib
                if memory_mib is not None
                else (current.quota.memory_mib if current else -1)
            ),
            cohort=cohort if cohort is not None else (current.cohort if current else ""),
            weight=weight,
            borrowing_limit=limit,
        )
    _print_queue(state_of(ctx), updated, created=current is None)


def _parse_memory(text: str) -> int:
    from gantry.sched.spec import parse_memory_mib

    try:
        return parse_memory_mib(text)
    except ValueError as exc:
        raise InvalidInput(f"invalid --memory {text!r}: {exc}") from None


def _print_queue(state: State, q: QueueInfo, *, created: bool) -> None:
    memory = "∞" if q.quota.memory_mib < 0 else _mib(q.quota.memory_mib)
    quota = f"{_num(q.quota.gpus)} GPUs, {_num(q.quota.cpus)} CPUs, {memory} memory"
    parts = [f"{'created' if created else 'updated'} queue {q.name}: quota {quota}"]
    if q.cohort:
        parts.append(f"cohort {q.cohort}")
    parts.append(f"weight {q.weight:g}")
    if q.borrowing_limit is not None:
        parts.append(f"borrowing limit {_limit(q.borrowing_limit)}")
    state.out.print("; ".join(parts), markup=False)


def _num(value: float) -> str:
    """A quota amount; negative means unlimited."""
    return "∞" if value < 0 else f"{value:g}"


def _limit(limit: Resources | None) -> str:
    if limit is None:
        return "none"
    parts = [
        f"{limit.gpus:g} GPUs" if limit.gpus >= 0 else "",
        f"{limit.cpus:g} CPUs" if limit.cpus >= 0 else "",
        _mib(limit.memory_mib) if limit.memory_mib >= 0 else "",
    ]
    return ", ".join(p for p in parts if p) or "none"


# ---------------------------------------------------------------------- usage


class UsageBy(enum.StrEnum):
    """Values of --by."""

    user = "user"
    queue = "queue"
    pool = "pool"


def usage(
    ctx: typer.Context,
    by: Annotated[UsageBy, typer.Option("--by", help="Group by user, queue or pool.")] = (
        UsageBy.user
    ),
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="From this time: ISO 8601 or ago (7d, 12h); default: all recorded."
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Until this time; default: now.")
    ] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """GPU-hours, CPU-hours, queueing hours and jobs per user, queue or pool."""
    since_ms, until_ms = time_window(since, until)
    settings = command_settings(ctx, data_dir, token)
    with scheduler_client(settings) as client:
        rows = client.usage(by.value, since_ms, until_ms)
    rows.sort(key=lambda r: (-r.gpu_hours, r.key))
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    window = f"since {fmt_ms(since_ms)} UTC" if since_ms else "all recorded"
    table = Table(title=f"usage by {by.value}, {window}", show_footer=len(rows) > 1)
    columns = [
        (by.value, "total"),
        ("GPU-hours", f"{sum(r.gpu_hours for r in rows):,.1f}"),
        ("CPU-hours", f"{sum(r.cpu_hours for r in rows):,.1f}"),
        ("queueing hours", f"{sum(r.queueing_hours for r in rows):,.1f}"),
        ("jobs", f"{sum(r.jobs for r in rows):,}"),
    ]
    for header, footer in columns:
        table.add_column(header, footer, justify="left" if header == by.value else "right")
    for r in rows:
        table.add_row(
            escape(r.key),
            f"{r.gpu_hours:,.1f}",
            f"{r.cpu_hours:,.1f}",
            f"{r.queueing_hours:,.1f}",
            f"{r.jobs:,}",
        )
    state_of(ctx).out.print(table)


# ---------------------------------------------------------------------- formatting


def _now_ms() -> int:
    return int(time.time() * 1000)


def _styled(state: str) -> str:
    style = _STATE_STYLE.get(state)
    return f"[{style}]{escape(state)}[/]" if style else escape(state)


def _age(ms: int) -> str:
    """A span as its largest unit: ``45s``, ``12m``, ``3h``, ``2d``."""
    s = max(ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _progress_line(p: JobProgress) -> str:
    """``step 120/500 (24%) loss 0.4123, 812 samples/s, ETA 1m30s`` (what is known of it)."""
    head = f"step {p.step:,}"
    if p.fraction is not None:
        head += f"/{p.total_steps:,} ({p.fraction:.0%})"
    if p.loss is not None:
        head += f" loss {p.loss:.4f}"
    rest = [
        f"{_rate(p.samples_per_s)} samples/s" if p.samples_per_s else "",
        f"ETA {_duration(p.eta_s)}" if p.eta_s is not None else "",
        f"epoch {p.epoch}" if p.epoch else "",
    ]
    return ", ".join([head, *filter(None, rest)])


def _progress_short(p: JobProgress) -> str:
    """A progress cell of ``gantry jobs list``: ``24% 120/500``, or ``step 120``."""
    if p.fraction is None:
        return f"step {p.step:,}"
    return f"{p.fraction:.0%} {p.step:,}/{p.total_steps:,}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _duration(seconds: float) -> str:
    """A span in its two largest units: ``45s``, ``1m30s``, ``2h05m``, ``3d4h``."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _mib(mib: int) -> str:
    """MiB in the largest binary unit that keeps it readable: ``512Mi``, ``64Gi``, ``1.5Ti``."""
    for unit, size in (("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib >= size:
            return f"{round(mib / size, 1):g}{unit}"
    return f"{mib}Mi"


__all__ = [
    "UsageBy",
    "jobs_app",
    "nodes_app",
    "queues_app",
    "scheduler_client",
    "usage",
]
