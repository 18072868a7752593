"""The demo's profiling chapter: where the training time went, and a slowed worker found.

1. ``dev-engineer`` reads the profiler's profile of ``churn-model``, the job the training
   chapter ran: per rank, how each step splits into data, forward, backward, communication and
   the optimizer; the demo writes its plot (PNG) and page (HTML).
2. ``dev-engineer`` submits ``slow-loader``: the ``sequences`` example on 2 workers, whose rank 1
   data loader is deliberately slowed (1.5 ms per sample) after 40 steps. The profiler names
   rank 1 as the straggler, in the data phase, with the cause and the evidence; the demo prints
   the verdict, how many steps after the slowdown it came, and writes the plot. Then it asks
   for a deep trace (``torch.profiler``) of 5 steps of every rank: the agents pass the request
   to the workers and upload what they record; the demo downloads both files and reads them.
3. The nodes: health, utilisation and what is allocated against what is used.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gantry.client.admin import create_token
from gantry.client.demo_data import DEVELOPER
from gantry.client.errors import RemoteNotFound
from gantry.client.profile_plots import html_job, plot_job, plot_nodes
from gantry.client.profiler import FindingInfo, JobProfileInfo, ProfilerClient
from gantry.client.scheduler import SchedulerClient
from gantry.core import Unavailable

JOB = "slow-loader"
SLOW_FROM = 40
STEPS = 1000
TRACE_STEPS = 5
WAIT_S = 180.0


@dataclass
class ProfilerSummary:
    """What the chapter achieved."""

    training_profile: JobProfileInfo | None = None
    verdict: FindingInfo | None = None
    detection_steps: int = 0
    trace_events: int = 0
    pictures: list[Path] = field(default_factory=list)
    nodes: int = 0


def slow_loader_yaml() -> str:
    """The deliberately slowed job."""
    return f"""apiVersion: gantry/v1
kind: TrainingJob
metadata: {{name: {JOB}, priority: high}}
spec:
  replicas: 2
  resources: {{gpus: 0, cpus: 1, memory: 1Gi}}
  entrypoint:
    task: gantry.training.examples.sequences:task
    args: [max_steps={STEPS}, length=128, slow_rank=1, slow_ms=1.5, slow_after={16 * SLOW_FROM}]
  training: {{precision: fp32}}
  maxRuntime: 10m
"""


def rank_table(title: str, profile: JobProfileInfo) -> Table:
    """Per rank: milliseconds per step in each phase (recent steps)."""
    table = Table(title=title, title_justify="left")
    for column in ("rank", "node", "data", "forward", "backward", "optimizer", "comm", "busy"):
        table.add_column(column, justify="left" if column == "node" else "right")
    straggler = profile.straggler
    for r in profile.ranks:
        t = r.recent
        style = "red" if straggler is not None and straggler.rank == r.rank else None
        table.add_row(
            str(r.rank),
            r.node,
            *(f"{v:.1f}" for v in (t.data_ms, t.forward_ms, t.backward_ms, t.optimizer_ms)),
            f"{t.comm_ms:.1f}",
            f"{t.busy_ms:.1f}",
            style=style,
        )
    return table


def profiler_story(
    scheduler_addr: str,
    profiler_addr: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    trained_job: str,
) -> ProfilerSummary:
    """Run the chapter; raise :class:`~gantry.core.GantryError` if a step fails."""
    summary = ProfilerSummary()
    out = data_dir / "profiles"
    out.mkdir(parents=True, exist_ok=True)
    token = create_token(data_dir, DEVELOPER, ["ml-developer"], dt.timedelta(hours=1))
    with (
        ProfilerClient(profiler_addr, token) as profiler,
        SchedulerClient(scheduler_addr, token, timeout_s=10) as scheduler,
    ):
        with step(f"profile of {trained_job} read"):
            profile = _until(
                lambda: _profile(profiler, trained_job, min_ranks=2),
                f"the profile of {trained_job}",
            )
            summary.training_profile = profile
        name = profile.name or trained_job
        console.print(rank_table(f"{name}: ms per step, recent steps", profile))
        console.print(
            f"  {profile.samples_per_s:,.0f} samples/s, forward and backward "
            f"{profile.compute_fraction:.0%} of the step"
        )
        for finding in profile.findings:
            console.print(f"  [dim]{finding.state}:[/] {escape(finding.summary)}")
        summary.pictures += _pictures(profile, out / name)
        with step(f"{DEVELOPER} submitted {JOB}: 2 workers, rank 1's loader slowed on purpose"):
            job = scheduler.submit(slow_loader_yaml()).job
        with step("the profiler named the straggler"):
            slow = _until(lambda: _verdict(profiler, job.id), "the straggler verdict")
        verdict = slow.straggler
        if verdict is None:  # _verdict returned it only with one
            raise Unavailable(f"the straggler verdict of {JOB} went away")
        summary.verdict = verdict
        summary.detection_steps = verdict.raised_step - SLOW_FROM
        console.print(rank_table(f"{JOB}: ms per step, recent steps", slow))
        console.print(f"[red]verdict:[/] {escape(verdict.summary)}")
        console.print(
            f"  found {summary.detection_steps} steps after the slowdown began (step "
            f"{SLOW_FROM}); the profiler published gantry.job.profile.finding for the audit"
        )
        summary.pictures += _pictures(slow, out / JOB)
        with step(f"deep trace of {TRACE_STEPS} steps of {JOB} recorded and downloaded"):
            summary.trace_events = _deep_trace(profiler, job.id, out / "traces")
        console.print(
            f"  {summary.trace_events:,} torch.profiler events from both ranks, stored encrypted; "
            f"open {out / 'traces'}/rank*.json.gz in https://ui.perfetto.dev"
        )
        with contextlib.suppress(Exception):
            scheduler.cancel(job.id, "the demo has seen what it wanted")
        with step("node health and utilisation read"):
            nodes, cluster = profiler.nodes()
            summary.nodes = len(nodes)
        table = Table(title="nodes", title_justify="left")
        for column in ("node", "state", "cpu util", "cpus placed", "gpus placed", "jobs"):
            table.add_column(column)
        for n in nodes:
            table.add_row(
                n.node,
                n.state,
                f"{n.cpu_util:.0%}",
                f"{n.cpus_allocated:g}/{n.cpus:g}",
                f"{n.gpus_allocated:g}/{n.gpus}",
                ", ".join(n.jobs) or "-",
            )
        console.print(table)
        summary.pictures.append(plot_nodes(nodes, cluster, out / "nodes.png"))
    for path in summary.pictures:
        console.print(f"  wrote {path}")
    return summary


def _deep_trace(profiler: ProfilerClient, job: str, out: Path) -> int:
    """Ask for a trace of every rank, wait for it, download and read it; events recorded."""
    trace = profiler.start_trace(job, steps=TRACE_STEPS)
    deadline = time.monotonic() + WAIT_S
    while not trace.done:
        if time.monotonic() > deadline:
            raise Unavailable(f"trace {trace.trace_id} was not ready after {WAIT_S:.0f}s")
        time.sleep(0.5)
        trace = profiler.trace(trace.trace_id)
    if trace.state != "ready":
        reasons = "; ".join(f"rank {f.rank}: {f.reason}" for f in trace.files if f.reason)
        raise Unavailable(f"trace {trace.trace_id} is {trace.state}: {reasons or 'no files'}")
    events = 0
    for f in trace.ready_files:
        path = profiler.download_trace(
            trace.trace_id, f.rank, out / f"rank{f.rank}.json.gz", sha256=f.sha256
        )
        document = json.loads(gzip.decompress(path.read_bytes()))
        events += len(document.get("traceEvents", []))
    if not events:
        raise Unavailable(f"trace {trace.trace_id} holds no events")
    return events


def _pictures(profile: JobProfileInfo, stem: Path) -> list[Path]:
    png = plot_job(profile, stem.with_suffix(".png"))
    page = stem.with_suffix(".html")
    page.write_text(html_job(profile), encoding="utf-8")
    return [png, page]


def _profile(client: ProfilerClient, job: str, *, min_ranks: int) -> JobProfileInfo | None:
    try:
        profile = client.job_profile(job)
    except RemoteNotFound:
        return None
    timeline = all(r.timeline for r in profile.ranks)
    return profile if len(profile.ranks) >= min_ranks and timeline else None


def _verdict(client: ProfilerClient, job: str) -> JobProfileInfo | None:
    profile = _profile(client, job, min_ranks=2)
    return profile if profile is not None and profile.straggler is not None else None


def _until(probe: Callable[[], JobProfileInfo | None], what: str) -> JobProfileInfo:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.5)
    raise Unavailable(f"gave up waiting for {what} after {WAIT_S:.0f}s")


__all__ = ["JOB", "ProfilerSummary", "profiler_story", "rank_table", "slow_loader_yaml"]
