"""``gantry sim``: replay a job trace through the scheduling policies, side by side, with plots.

Runs :func:`gantry.sched.simulate` once per ordering on the same cluster and jobs, prints the
figures (average and p50/p95/p99 job completion time and queueing delay, makespan, mean GPU
allocation, preemptions) and writes two plots: the JCT distribution and GPU allocation over
time. With ``--queues`` the jobs queue by the trace's ``queue`` column under the file's quotas,
cohorts and borrowing limits, exactly as in the scheduler service (reclaiming lent quota
preempts borrowers); without it every job is in one unlimited queue.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gantry.client.cli._common import state_of
from gantry.core import InvalidInput


def _placement(name: str, workload: list[Any]) -> Any:
    from gantry.sched import BestFitPolicy, FgdPolicy, GantryPolicy

    if name == "bestfit":
        return BestFitPolicy()
    if not workload:
        raise InvalidInput("the trace has no jobs to learn the workload's shapes from")
    return GantryPolicy(workload) if name == "gantry" else FgdPolicy(workload)


def _plots(results: list[Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        jct = np.sort(r.jct) / 3600
        if len(jct):
            ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=r.ordering)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("Job completion time")
    ax.grid(alpha=0.3)
    ax.legend()
    jct_path = out / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(jct_path, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        if len(r.gpu_alloc_times):
            ax.step(r.gpu_alloc_times / 3600, r.gpu_alloc_fraction * 100, where="post",
                    label=r.ordering, linewidth=0.8)  # fmt: skip
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPU allocated (%)")
    ax.set_title("GPU allocation over time")
    ax.grid(alpha=0.3)
    ax.legend()
    alloc_path = out / "gpu_allocation.png"
    fig.tight_layout()
    fig.savefig(alloc_path, dpi=120)
    plt.close(fig)
    return [jct_path, alloc_path]


def sim(
    ctx: typer.Context,
    nodes: Annotated[
        Path, typer.Option("--nodes", help="Cluster: node CSV (sn,cpu_milli,memory_mib,gpu,model).")
    ],
    jobs: Annotated[
        Path | None, typer.Option("--jobs", help="Jobs: the generic CSV (docs/scheduler.md).")
    ] = None,
    alibaba: Annotated[
        Path | None, typer.Option("--alibaba", help="Jobs: an Alibaba pod list instead.")
    ] = None,
    policies: Annotated[
        str, typer.Option("--policies", help="Orderings to compare, comma-separated.")
    ] = "fifo,sjf-oracle,gantry",
    placement: Annotated[
        str, typer.Option("--placement", help="Placement policy: gantry, fgd or bestfit.")
    ] = "gantry",
    time_scale: Annotated[
        float,
        typer.Option("--time-scale", min=0.001, help="Divide submit times by this (load up)."),
    ] = 1.0,
    out: Annotated[Path, typer.Option("--out", help="Where plots and results go.")] = Path(
        "sim-out"
    ),
    queues: Annotated[
        Path | None,
        typer.Option(
            "--queues",
            help="Queues YAML (quotas, cohorts, borrowing limits, weights; docs/queues.md); "
            "jobs go to the queue their trace's queue column names.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Replay a job trace through the scheduling policies and compare them (with plots)."""
    from gantry.sched import ORDERINGS, Simulator, jobs_from_alibaba, load_jobs_csv, load_queues
    from gantry.sched import load_nodes_csv as load_nodes
    from gantry.sched.simulate import workers_of

    state = state_of(ctx)
    if (jobs is None) == (alibaba is None):
        raise InvalidInput("give exactly one of --jobs and --alibaba")
    orderings = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in orderings if p not in ORDERINGS]
    if unknown or not orderings:
        raise InvalidInput(
            f"unknown ordering {', '.join(unknown) or '(none)'}",
            hint=f"choose from {', '.join(ORDERINGS)}",
        )
    if placement not in ("gantry", "fgd", "bestfit"):
        raise InvalidInput(f"unknown placement {placement!r}", hint="gantry, fgd or bestfit")
    cluster = load_nodes(nodes)
    trace = load_jobs_csv(jobs) if jobs is not None else jobs_from_alibaba(alibaba)  # type: ignore[arg-type]
    if time_scale != 1.0:
        trace = [dataclasses.replace(j, submit_time=j.submit_time / time_scale) for j in trace]
    queue_configs = load_queues(_read_text(queues, "queues file")) if queues else None
    if queue_configs is not None:
        unknown_queues = sorted({j.queue for j in trace} - {q.name for q in queue_configs})
        if unknown_queues:
            raise InvalidInput(
                f"{queues} does not define the trace's queues {', '.join(unknown_queues)}",
                hint=f"add them to {queues}, or change the trace's queue column",
            )
    node_gpus = max(int(cluster.gpu_count.max()), 1)
    workload = [w for j in trace for w in workers_of(j, node_gpus)]
    results = []
    for ordering in orderings:
        simulator = Simulator(
            cluster,
            trace,
            _placement(placement, workload),
            ordering,  # type: ignore[arg-type]
            queues=queue_configs,
        )
        progress = Progress(
            TextColumn(f"simulating {ordering}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=state.err,
            transient=True,
        )
        with progress:
            task = progress.add_task(ordering, total=len(trace))
            simulator.progress = lambda n, t=task, p=progress: p.update(t, completed=n)
            results.append(simulator.run())
    where = f"{len(queue_configs)} queues" if queue_configs else "one queue"
    table = Table(
        title=f"{len(trace):,} jobs on {cluster.num_nodes:,} nodes in {where} "
        f"({placement} placement)"
    )
    summaries = {r.ordering: r.summary() for r in results}
    keys = ["avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queueing_s",
            "p99_queueing_s", "makespan_s", "mean_gpu_alloc", "unplaceable",
            "preemptions"]  # fmt: skip
    table.add_column("figure")
    for ordering in summaries:
        table.add_column(ordering, justify="right")
    for key in keys:
        spec = ",.0f" if key in ("unplaceable", "preemptions") else ",.2f"
        table.add_row(key, *(format(summaries[o][key], spec) for o in summaries))
    state.out.print(table)
    paths = _plots(results, out)
    (out / "results.json").write_text(json.dumps(summaries, indent=2, sort_keys=True))
    state.out.print(f"plots: {', '.join(str(p) for p in paths)}; figures: {out / 'results.json'}")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"no {what} {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"can't read the {what} {path}: {exc}") from None


__all__ = ["sim"]
