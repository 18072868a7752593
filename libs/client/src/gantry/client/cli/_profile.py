"""``gantry profile``: where a job's step time goes, node health, and deep traces.

::

    gantry profile job J [--attempt N] [--plot job.png] [--html job.html] [--json]
    gantry profile nodes [--plot nodes.png] [--json]
    gantry profile mark NODE --degraded|--recovered [--reason TEXT]
    gantry profile trace J --steps N [--rank R ...] [--wait/--no-wait] [--timeout S] [--out DIR]
    gantry profile traces J

The profiler service is found like every service: ``GANTRY_PROFILER_ADDR``, else
``GANTRY_DATA_DIR``'s ``run/profiler.json`` written by the running service (see
:meth:`~gantry.client.config.ClientSettings.address`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from gantry.client.cli._common import (
    EXIT_FAILED,
    DataDirOpt,
    State,
    TokenOpt,
    command_settings,
    fmt_ms,
    state_of,
    transfer_progress,
)
from gantry.client.config import ClientSettings
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.profiler import (
        ClusterInfo,
        FindingInfo,
        JobProfileInfo,
        NodeInfo,
        ProfilerClient,
        TraceFileInfo,
        TraceInfo,
    )

profile_app = typer.Typer(
    help="Profiling: where jobs spend their steps, stragglers, node health, deep traces.",
    no_args_is_help=True,
)

JobArg = Annotated[str, typer.Argument(help="Job id or name (the newest job of that name).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Also write a PNG picture here.", show_default=False)
]

#: Seconds between two looks at a trace while waiting for it.
POLL_S = 1.0

_STYLE = {
    "ok": "green",
    "degraded": "bold red",
    "raised": "bold red",
    "cleared": "dim",
    "ready": "green",
    "pending": "cyan",
    "partial": "yellow",
    "failed": "bold red",
    "expired": "bold red",
    "running": "cyan",
}
_PERFETTO_HINT = (
    "open a file in https://ui.perfetto.dev (Open trace file) or in Chrome at "
    "chrome://tracing (Load); both read the .json.gz as it is"
)


@contextlib.contextmanager
def profiler_client(settings: ClientSettings) -> Iterator[ProfilerClient]:
    """A :class:`ProfilerClient` for the configured profiler address and bearer token."""
    from gantry.client.profiler import ProfilerClient

    with ProfilerClient(
        settings.address("profiler"), settings.bearer(), tls=settings.tls
    ) as client:
        yield client


def _styled(text: str) -> str:
    style = _STYLE.get(text)
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


def _print(state: State, text: str) -> None:
    """A line of plain text (no markup, no highlighting)."""
    state.out.print(text, markup=False, highlight=False)


def _check_suffix(path: Path | None, suffixes: tuple[str, ...], flag: str) -> None:
    if path is not None and path.suffix.lower() not in suffixes:
        raise InvalidInput(
            f"{flag} {path} should end in {' or '.join(suffixes)}",
            hint=f"e.g. {flag} out{suffixes[0]}",
        )


def _as_json(value: Any) -> str:
    return json.dumps(dataclasses.asdict(value), indent=2)


# ---------------------------------------------------------------------- job


@profile_app.command("job")
def profile_job(
    ctx: typer.Context,
    job: JobArg,
    attempt: Annotated[
        int, typer.Option("--attempt", min=0, help="Attempt to show (0: the latest).")
    ] = 0,
    plot: PlotOpt = None,
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
    """Show where each rank of a job spends its steps, and the profiler's verdicts."""
    _check_suffix(plot, (".png",), "--plot")
    _check_suffix(html_path, (".html", ".htm"), "--html")
    settings = command_settings(ctx, data_dir, token)
    with profiler_client(settings) as client:
        profile = client.job_profile(job, attempt=attempt)
    state = state_of(ctx)
    if as_json:
        print(_as_json(profile))
    else:
        _print_job(state, profile)
    _write_pictures(state, profile, plot, html_path, quiet=as_json)


def _write_pictures(
    state: State,
    profile: JobProfileInfo,
    plot: Path | None,
    html_path: Path | None,
    *,
    quiet: bool,
) -> None:
    from gantry.client.profile_plots import html_job, plot_job

    said = state.err if quiet else state.out  # --json keeps stdout parseable
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_job(profile, plot)
        said.print(f"wrote the plot to {plot}", markup=False, highlight=False)
    if html_path is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(html_job(profile), encoding="utf-8")
        said.print(f"wrote the HTML page to {html_path}", markup=False, highlight=False)


def _print_job(state: State, p: JobProfileInfo) -> None:
    from gantry.client.profile_plots import verdict

    name = f"{p.name} ({p.job_id})" if p.name else p.job_id
    attempts = f" of {', '.join(map(str, p.attempts))}" if len(p.attempts) > 1 else ""
    state.out.print(
        f"job [bold]{escape(name)}[/], attempt {p.attempt}{attempts}: {_styled(p.state)}, "
        f"owner {escape(p.owner)}, world size {p.world_size}, step {p.last_step}",
        highlight=False,
    )
    _print(
        state,
        f"{p.samples_per_s:.1f} samples/s, compute (forward+backward) {p.compute_fraction:.0%} "
        f"of step time, utilisation {p.gpu_util:.0%}",
    )
    straggler = p.straggler.rank if p.straggler is not None else None
    table = Table(title="ms per step over the recent steps (busy: step minus comm)")
    for col in ("rank", "node", "step", "data", "forward", "backward", "optimizer", "comm"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for col in ("busy ms", "samples/step", "tokens/step"):
        table.add_column(col, justify="right")
    for r in sorted(p.ranks, key=lambda r: r.rank):
        t = r.recent
        table.add_row(
            f"[bold red]{r.rank}[/]" if r.rank == straggler else str(r.rank),
            escape(r.node),
            str(r.last_step),
            *(f"{v:.1f}" for v in (t.data_ms, t.forward_ms, t.backward_ms, t.optimizer_ms)),
            f"{t.comm_ms:.1f}",
            f"{t.busy_ms:.1f}",
            f"{t.samples_per_step:g}",
            f"{t.tokens_per_step:g}",
        )
    state.out.print(table)
    state.out.print(f"verdict: {escape(verdict(p))}", highlight=False)
    for f in p.standing:
        _print_finding(state, f)
    if p.cleared:
        _print(state, "cleared:")
        for f in p.cleared:
            who = f" rank {f.rank} on {f.node}" if f.rank is not None else ""
            _print(
                state,
                f"  {f.kind.replace('_', ' ')}{who}: raised at step {f.raised_step}, cleared at "
                f"step {f.step}",
            )


def _print_finding(state: State, f: FindingInfo) -> None:
    state.out.print(
        f"{_styled(f.state)} {escape(f.kind.replace('_', ' '))} since step {f.raised_step}: "
        f"{escape(f.summary)}",
        highlight=False,
    )
    if f.kind == "straggler":
        ev = f.evidence
        facts = [
            _figure(ev, "ratio", "{:.2f}x the others' busy time"),
            _figure(ev, "excess_ms", "{:.1f} ms more per step"),
            _figure(ev, "others_wait_ms", "the others wait {:.1f} ms per step"),
            f"phase {f.phase}" if f.phase else "",
            f"cause {f.cause.replace('_', ' ')}" if f.cause else "",
        ]
    else:
        facts = [f"{k} {_plain(v)}" for k, v in f.evidence.items()]
    shown = "; ".join(x for x in facts if x)
    if shown:
        _print(state, f"  evidence: {shown}")


def _figure(evidence: Any, key: str, template: str) -> str:
    value = evidence.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return template.format(value)
    return ""


def _plain(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


# ---------------------------------------------------------------------- nodes


@profile_app.command("nodes")
def profile_nodes(
    ctx: typer.Context,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show every node's health and utilisation, and the cluster's allocation against use."""
    _check_suffix(plot, (".png",), "--plot")
    settings = command_settings(ctx, data_dir, token)
    with profiler_client(settings) as client:
        nodes, cluster = client.nodes()
    state = state_of(ctx)
    if as_json:
        print(
            json.dumps(
                {
                    "nodes": [dataclasses.asdict(n) for n in nodes],
                    "cluster": dataclasses.asdict(cluster),
                },
                indent=2,
            )
        )
    else:
        _print_nodes(state, nodes, cluster)
    if plot is not None:
        from gantry.client.profile_plots import plot_nodes

        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_nodes(nodes, cluster, plot)
        (state.err if as_json else state.out).print(
            f"wrote the plot to {plot}", markup=False, highlight=False
        )


def _rate(bytes_per_s: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _print_nodes(state: State, nodes: list[NodeInfo], cluster: ClusterInfo) -> None:
    n = len(nodes)
    table = Table(title=f"{n} node{'' if n == 1 else 's'} (utilisation: the last minutes)")
    for col in ("node", "state", "reason", "CPU util", "GPU util", "allocated/used"):
        table.add_column(col, justify="right" if "util" in col else "left")
    for col in ("throttled", "temp", "net rx/tx", "slow jobs", "jobs"):
        table.add_column(col, justify="right" if col in ("temp", "slow jobs") else "left")
    for node in sorted(nodes, key=lambda x: x.node):
        table.add_row(
            f"[bold red]{escape(node.node)}[/]" if node.degraded else escape(node.node),
            _styled(node.state),
            escape(node.reason),
            f"{node.cpu_util:.0%}",
            f"{node.gpu_util:.0%}" if node.gpus else "-",
            f"{node.allocated:g}/{node.used:.1f} of {node.capacity:g} {node.unit}",
            "[bold red]yes[/]" if node.throttled else "no",
            f"{node.temperature_c:.0f} °C" if node.temperature_c else "-",
            f"{_rate(node.net_rx_bytes_per_s)} / {_rate(node.net_tx_bytes_per_s)}",
            str(node.slow_jobs),
            escape(", ".join(node.jobs)),
        )
    state.out.print(table)
    c = cluster
    _print(
        state,
        f"cluster: {c.nodes} nodes, {c.degraded} degraded, {c.running_jobs} running jobs; "
        f"GPUs allocated {c.gpus_allocated:g}, busy {c.gpus_busy:.1f} (of {c.gpus}); "
        f"CPUs allocated {c.cpus_allocated:g}, busy {c.cpus_busy:.1f} (of {c.cpus:g})",
    )


# ---------------------------------------------------------------------- mark


@profile_app.command("mark")
def profile_mark(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name.", show_default=False)],
    degraded: Annotated[
        bool | None,
        typer.Option(
            "--degraded/--recovered",
            help="Mark the node degraded (the scheduler avoids it) or recovered.",
            show_default=False,
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the audit log.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Override a node's health: mark it degraded or recovered (an operator's decision)."""
    if degraded is None:
        raise InvalidInput(
            "say what the node is: --degraded or --recovered",
            hint=f"e.g. gantry profile mark {node} --degraded --reason 'ECC errors'",
        )
    settings = command_settings(ctx, data_dir, token)
    with profiler_client(settings) as client:
        info = client.set_node_health(node, degraded=degraded, reason=reason)
    why = f": {info.reason}" if info.reason else ""
    _print(state_of(ctx), f"node {info.node} is now {info.state}{why}")


# ---------------------------------------------------------------------- traces


@profile_app.command("trace")
def profile_trace(
    ctx: typer.Context,
    job: JobArg,
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=1000, help="Steps to record (1..1000).")
    ],
    ranks: Annotated[
        list[int] | None,
        typer.Option("--rank", min=0, help="Record this rank (repeatable; default: every rank)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait for the files and download them.")
    ] = True,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="Give up waiting after this many seconds (the profiler reports a trace "
            "nobody answers as expired after 660 s).",
        ),
    ] = 720.0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory for the files (default: ./traces/<trace id>).",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Record a few steps of a job with torch.profiler; wait for and download each rank's
    trace."""
    state = state_of(ctx)
    settings = command_settings(ctx, data_dir, token)
    with profiler_client(settings) as client:
        trace = client.start_trace(job, steps=steps, ranks=tuple(ranks or ()))
        _print(
            state,
            f"trace {trace.trace_id} of job {trace.job_id} (attempt {trace.attempt}): "
            f"{trace.steps} steps of {_ranks_text(trace)}, {trace.state}",
        )
        if not wait:
            _print(state, f"follow it with 'gantry profile traces {job}'")
            return
        trace = _wait(state, client, trace, timeout)
        for f in trace.files:
            if f.state == "failed":
                _print(state, f"rank {f.rank} on {f.node} recorded nothing: {f.reason}")
        if not trace.ready_files:
            _print(state, f"trace {trace.trace_id} failed: no rank recorded a file")
            raise typer.Exit(EXIT_FAILED)
        folder = out if out is not None else Path("traces") / trace.trace_id
        for f in trace.ready_files:
            dest = folder / f"rank{f.rank}.json.gz"
            with transfer_progress(state, f"rank {f.rank}", f.bytes or None) as advance:
                client.download_trace(
                    trace.trace_id, f.rank, dest, sha256=f.sha256, progress=advance
                )
            _print(state, f"rank {f.rank} ({f.node}, steps {_steps(f)}): {dest}")
    _print(state, _PERFETTO_HINT)


def _wait(state: State, client: ProfilerClient, trace: TraceInfo, timeout: float) -> TraceInfo:
    """Poll the trace until it is done; a clear message and exit status 1 after ``timeout``."""
    deadline = time.monotonic() + timeout
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
        disable=not state.err.is_terminal,
    )
    with progress:
        task = progress.add_task(f"trace {trace.trace_id}: {trace.state}", total=None)
        while not trace.done:
            if time.monotonic() >= deadline:
                progress.stop()
                _print(
                    state,
                    f"trace {trace.trace_id} is still {trace.state} after {timeout:g}s; "
                    f"look again with 'gantry profile traces {trace.job_id}'",
                )
                raise typer.Exit(EXIT_FAILED)
            time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
            trace = client.trace(trace.trace_id)
            ready = len(trace.ready_files)
            progress.update(
                task,
                description=f"trace {trace.trace_id}: {trace.state}, "
                f"{ready}/{len(trace.files)} ranks ready",
            )
    return trace


def _ranks_text(trace: TraceInfo) -> str:
    ranks = sorted(f.rank for f in trace.files)
    if not ranks:
        return "every rank"
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _steps(f: TraceFileInfo) -> str:
    if not f.steps:
        return "-"
    return f"{f.first_step}..{f.first_step + f.steps - 1}"


@profile_app.command("traces")
def profile_traces(
    ctx: typer.Context,
    job: JobArg,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List a job's traces."""
    settings = command_settings(ctx, data_dir, token)
    with profiler_client(settings) as client:
        traces = client.traces(job)
    if as_json:
        print(json.dumps([dataclasses.asdict(t) for t in traces], indent=2))
        return
    n = len(traces)
    table = Table(title=f"{n} trace{'' if n == 1 else 's'} of {escape(job)}")
    for col in ("trace", "state", "attempt", "steps", "ranks ready", "requested by", "at (UTC)"):
        table.add_column(col, justify="right" if col in ("attempt", "steps") else "left")
    for t in traces:
        failed = [f"{f.rank}: {f.reason}" for f in t.files if f.state == "failed"]
        ready = f"{len(t.ready_files)}/{len(t.files)}"
        table.add_row(
            escape(t.trace_id),
            _styled(t.state),
            str(t.attempt),
            str(t.steps),
            ready + (f" (failed {escape('; '.join(failed))})" if failed else ""),
            escape(t.requested_by),
            fmt_ms(t.requested_ms),
        )
    state_of(ctx).out.print(table)


__all__ = ["POLL_S", "profile_app", "profiler_client"]
