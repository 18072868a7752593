"""The demo's scheduling story: a governed training job, a preemption, an idempotent submit.

Two local node agents declare hardware this machine does not have, 4 A100 GPUs each:
``onprem-1`` in pool ``onprem``, which the scheduler trusts with personal data, and ``cloud-1``
in pool ``cloud``, which it does not (:data:`SCHEDULER_ENV` says so). An admin gives queue
``research`` a quota of 4 GPUs. Then:

1. ``dev-engineer`` submits ``train-churn``, 2 workers reading the de-identified version of
   ``customers`` the governance story committed. That dataset has PII columns, so the
   scheduler places it in trusted pools only: on ``onprem-1``. A retry of the same submission
   with the same request id returns the same job instead of a second one.
2. ``rita-researcher``'s low-priority ``sweep-low`` takes the whole quota; ``dev-engineer``'s
   high-priority ``eval-high`` then preempts it: ``sweep-low`` checkpoints its step, goes back
   to the queue, and resumes from that step once ``eval-high`` is done.

The workers are real processes (``python -c``) that print their rank and a few ``step N/M
loss X`` lines; they are told which dataset version they read but do not fetch it (the test
agent asks governance for no read grants). Every wait has a deadline; a job that fails, or a
wait that times out, raises a :class:`~gantry.core.GantryError` naming the job, its state and
the scheduler's reason.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gantry.client.admin import create_token
from gantry.client.demo_data import DATASET, DEVELOPER
from gantry.client.scheduler import JobInfo, LogLine, NodeInfo, SchedulerClient, UsageRow
from gantry.core import IntegrityError, Unavailable
from gantry.supervisor.platform import LocalAgent

RESEARCHER = "rita-researcher"
ADMIN = "demo-admin"
QUEUE = "research"
QUOTA_GPUS = 4
TRUSTED_POOL, UNTRUSTED_POOL = "onprem", "cloud"
#: The demo's nodes: hardware declared, since a laptop has no A100s.
AGENTS = (
    LocalAgent(node="onprem-1", pool=TRUSTED_POOL, gpus=4, cpus=16, memory="64Gi"),
    LocalAgent(node="cloud-1", pool=UNTRUSTED_POOL, gpus=4, cpus=16, memory="64Gi"),
)
#: The scheduler's settings for the story: which pools are trusted, short stop grace.
SCHEDULER_ENV = {
    "GANTRY_SCHEDULER__POOLS": json.dumps({TRUSTED_POOL: True, UNTRUSTED_POOL: False}),
    "GANTRY_SCHEDULER__STOP_GRACE_S": "5",
}
#: Longest wait for any one thing (a node, a job's end), and for the whole story, which takes
#: about 12 s on a 2-core machine: far past those, something is broken, not slow.
WAIT_S = 30.0
STORY_S = 90.0

#: The workers' program: rank and world size, then steps; checkpoints its step on SIGTERM and
#: resumes from it when the scheduler restarts it (GANTRY_RESUME=1).
WORKER = """\
import math, os, pathlib, signal, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
steps, pause, data = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ckpt = pathlib.Path(os.environ["GANTRY_CHECKPOINT_DIR"]) / "step"
step = 0
if os.environ.get("GANTRY_RESUME") == "1" and ckpt.exists():
    step = int(ckpt.read_text())
    print(f"resuming from checkpoint at step {step}", flush=True)
print(f"rank {rank} of {world} on {os.environ['GANTRY_NODE']}, GPUs "
      f"{os.environ['CUDA_VISIBLE_DEVICES']}, data {data}", flush=True)
def checkpoint(*_):
    if rank == 0:
        ckpt.write_text(str(step))
    print(f"SIGTERM: checkpointed at step {step}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, checkpoint)
while step < steps:
    time.sleep(pause)
    step += 1
    if rank == 0:
        print(f"step {step}/{steps} loss {0.05 + 2 * math.exp(-step / 6):.3f}", flush=True)
print(f"rank {rank} done", flush=True)
"""
_STEP = re.compile(r"step (\d+)/(\d+)")
_RESUMED = re.compile(r"resuming from checkpoint at step (\d+)")


@dataclass
class JobsSummary:
    """What the scheduling story showed."""

    nodes: list[str] = field(default_factory=list)
    train: JobInfo | None = None
    train_pool_reason: str = ""
    request_id: str = ""
    duplicate_id: str = ""
    low: JobInfo | None = None
    high: JobInfo | None = None
    resumed_from_step: int = -1
    usage: list[UsageRow] = field(default_factory=list)

    @property
    def jobs(self) -> list[JobInfo]:
        """The story's jobs, in submit order."""
        return [j for j in (self.train, self.low, self.high) if j is not None]


def job_yaml(
    name: str,
    *,
    replicas: int,
    gpus: int,
    steps: int,
    priority: str = "normal",
    data: tuple[str, str] | None = None,
) -> str:
    """A TrainingJob document in queue ``research`` running :data:`WORKER`."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "resources": {"gpus": gpus, "gpuModels": ["A100"], "cpus": 1, "memory": "2Gi"},
        "entrypoint": {
            "command": [sys.executable, "-c", WORKER],
            "args": [str(steps), "0.25", f"{data[0]}@{data[1][:12]}" if data else "none"],
        },
        "maxRuntime": "10m",
    }
    if data:
        spec["data"] = [{"dataset": data[0], "version": data[1], "view": "deidentified"}]
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "queue": QUEUE, "priority": priority},
        "spec": spec,
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def jobs_story(
    address: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    version: str,
) -> JobsSummary:
    """Run the story against the scheduler at ``address``; raise on any surprise.

    ``version`` is the ``customers`` version the training job reads.
    """
    summary = JobsSummary()
    tokens = {
        user: create_token(data_dir, user, [role], dt.timedelta(hours=1))
        for user, role in (
            (ADMIN, "platform-admin"),
            (DEVELOPER, "ml-developer"),
            (RESEARCHER, "ml-developer"),
        )
    }
    with contextlib.ExitStack() as stack:
        admin, dev, rita = (
            stack.enter_context(
                SchedulerClient(address, tokens[user], timeout_s=10, stream_timeout_s=10)
            )
            for user in (ADMIN, DEVELOPER, RESEARCHER)
        )
        story = _Story(admin, step, console, summary)
        console.print(
            f"[bold]Training jobs[/] — two node agents declare 4 A100 GPUs each; pool "
            f"{TRUSTED_POOL} is trusted with personal data, pool {UNTRUSTED_POOL} is not"
        )
        with step("node agents registered: onprem-1 (onprem), cloud-1 (cloud)"):
            summary.nodes = story.nodes()
        with step(f"admin set queue {QUEUE}'s quota to {QUOTA_GPUS} GPUs (SetQuota)"):
            admin.set_quota(QUEUE, gpus=QUOTA_GPUS, cpus=32, memory_mib=128 << 10)
        story.train(dev, version)
        story.preemption(dev, rita)
        with step("usage report counted every user's GPU time"):
            summary.usage = story.usage({DEVELOPER, RESEARCHER})
        summary.train, summary.low, summary.high = (admin.get(j.id) for j in summary.jobs)
        console.print(jobs_table(summary.jobs))
        console.print(placements_table(summary.jobs))
        console.print(usage_table(summary.usage))
        train = summary.jobs[0]
        console.print(f"[bold]logs of {train.name}[/] ({train.id}), worker by worker:")
        for line in story.logs(train.id):
            console.print(f"  w{line.worker}| {escape(line.text)}", highlight=False)
    return summary


@dataclass
class _Seen:
    """A job as last polled, with the last training step its workers printed."""

    job: JobInfo
    step: int = 0
    steps: int = 0


class _Story:
    """The story's steps; every wait polls until :data:`WAIT_S` has passed, or until
    :data:`STORY_S` has since the story began, whichever comes first."""

    def __init__(
        self,
        admin: SchedulerClient,
        step: Callable[[str], contextlib.AbstractContextManager[None]],
        console: Console,
        summary: JobsSummary,
    ) -> None:
        self.admin = admin
        self.step = step
        self.console = console
        self.summary = summary
        self._story_deadline = time.monotonic() + STORY_S

    def _deadline(self, what: str) -> Callable[[str], None]:
        """A check that raises :class:`Unavailable` once the wait for ``what`` is too long."""
        started = time.monotonic()
        until = min(started + WAIT_S, self._story_deadline)

        def check(detail: str = "") -> None:
            if time.monotonic() >= until:
                raise Unavailable(
                    f"timed out after {time.monotonic() - started:.0f}s waiting for {what}"
                    + (f": {detail}" if detail else ""),
                    hint="run the demo with --verbose to see the scheduler's and agents' logs",
                )

        return check

    def nodes(self) -> list[str]:
        """Wait until both demo nodes are ready; describe them."""
        wanted = [a.node for a in AGENTS]
        check = self._deadline(f"nodes {', '.join(wanted)} to register")
        while True:
            ready = {n.name: n for n in self.admin.nodes() if n.state == "ready"}
            if set(wanted) <= set(ready):
                return [_describe_node(ready[name]) for name in wanted]
            check(f"ready: {', '.join(sorted(ready)) or 'none'}")
            time.sleep(0.2)

    def train(self, dev: SchedulerClient, version: str) -> None:
        """A 2-worker job on personal data: trusted pool only; a retried submit is one job."""
        summary = self.summary
        spec = job_yaml("train-churn", replicas=2, gpus=1, steps=6, data=(DATASET, version))
        summary.request_id = f"train-churn-{uuid.uuid4().hex[:8]}"
        with self.step(f"{DEVELOPER} submitted train-churn: 2 workers on {DATASET}@{version[:8]}"):
            job = dev.submit(spec, request_id=summary.request_id).job
            summary.train = job
        with self.step("a retry with the same request id returned the same job"):
            again = dev.submit(spec, request_id=summary.request_id)
            if not again.duplicate or again.job.id != job.id:
                raise IntegrityError(
                    f"a repeated submit with request id {summary.request_id} created job "
                    f"{again.job.id} next to {job.id}"
                )
            summary.duplicate_id = again.job.id
        with self.step("train-churn ran in the trusted pool and succeeded"):
            (job,) = self.finish([job])
            job = self.admin.get(job.id)  # with its history
            nodes = _nodes_of(job)
            trusted = {a.node for a in AGENTS if a.pool == TRUSTED_POOL}
            if not nodes or not set(nodes) <= trusted:
                raise IntegrityError(
                    f"train-churn reads personal data but ran on {', '.join(nodes) or 'nothing'}"
                )
        summary.train = job
        summary.train_pool_reason = next(
            (h.reason.removeprefix("queued; ") for h in job.history if "trusted" in h.reason),
            "",
        )
        self.console.print(
            f"  train-churn ran on [bold]{escape(', '.join(nodes))}[/] (pool {TRUSTED_POOL}): it "
            f"{escape(summary.train_pool_reason or 'was not restricted to any pool')}"
        )

    def preemption(self, dev: SchedulerClient, rita: SchedulerClient) -> None:
        """A low-priority job holding the quota is preempted, requeued, and resumes."""
        low_spec = job_yaml("sweep-low", replicas=1, gpus=QUOTA_GPUS, steps=20, priority="low")
        high_spec = job_yaml("eval-high", replicas=1, gpus=QUOTA_GPUS, steps=6, priority="high")
        with self.step(f"{RESEARCHER}'s low-priority sweep-low holds the quota"):
            low = rita.submit(low_spec).job
            self.summary.low = low
            self.wait([low], "sweep-low to train a few steps", lambda seen: seen[0].step >= 3)
        with self.step(f"{DEVELOPER}'s high-priority eval-high preempted sweep-low"):
            high = dev.submit(high_spec).job
            self.summary.high = high

            def preempted(seen: list[_Seen]) -> bool:
                low = seen[0].job
                return low.attempt >= 2 or f"preempted for {high.id}" in low.reason

            self.wait([low, high], "sweep-low to be preempted", preempted)
        with self.step("eval-high ran, then sweep-low resumed from its checkpoint"):
            low, high = self.finish([low, high])
            resumed = [
                int(m.group(1)) for line in self.logs(low.id) if (m := _RESUMED.search(line.text))
            ]
            if low.attempt < 2 or not resumed:
                raise IntegrityError(
                    f"sweep-low was not preempted and resumed (attempt {low.attempt}, "
                    f"resumed from step {resumed or 'none'})"
                )
        self.summary.low, self.summary.high = low, high
        self.summary.resumed_from_step = resumed[0]
        history = Table(title=f"sweep-low ({low.id}), as the scheduler recorded it")
        for col in ("attempt", "state", "reason"):
            history.add_column(col, justify="right" if col == "attempt" else "left")
        for h in self.admin.get(low.id).history:
            history.add_row(str(h.attempt), h.state, escape(h.reason))
        self.console.print(history)

    def usage(self, users: set[str]) -> list[UsageRow]:
        """The usage report by user, once it counts every user's GPU time."""
        check = self._deadline(f"the usage report to count {', '.join(sorted(users))}")
        while True:
            rows = self.admin.usage("user")
            if users <= {r.key for r in rows if r.gpu_hours > 0}:
                return sorted(rows, key=lambda r: (-r.gpu_hours, r.key))
            check(f"it counts {', '.join(r.key for r in rows) or 'nobody'}")
            time.sleep(0.2)

    def finish(self, jobs: list[JobInfo]) -> list[JobInfo]:
        """Wait until every job has ended; each must have succeeded."""
        seen = self.wait(jobs, "the jobs to finish", lambda seen: all(s.job.terminal for s in seen))
        return [s.job for s in seen]

    def wait(
        self, jobs: list[JobInfo], what: str, until: Callable[[list[_Seen]], bool]
    ) -> list[_Seen]:
        """Poll ``jobs``, showing their state and steps, until ``until`` holds.

        A job that fails or is cancelled meanwhile, or a wait past its deadline, raises.
        """
        progress = Progress(
            TextColumn("  {task.description:<10}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("steps  {task.fields[state]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        check = self._deadline(what)
        with progress:
            tasks = {j.id: progress.add_task(j.name, total=None, state=j.state) for j in jobs}
            while True:
                seen = [self._poll(j.id) for j in jobs]
                for s in seen:
                    progress.update(
                        tasks[s.job.id],
                        completed=s.step,
                        total=s.steps or None,
                        state=s.job.state
                        + (f" (attempt {s.job.attempt})" if s.job.attempt > 1 else ""),
                    )
                bad = [s.job for s in seen if s.job.terminal and s.job.state != "succeeded"]
                if bad:
                    j = bad[0]
                    tail = " | ".join(line.text for line in self.logs(j.id)[-5:])
                    raise IntegrityError(
                        f"job {j.name} ({j.id}) {j.state} while waiting for {what}: {j.reason}"
                        + (f"; its last output: {tail}" if tail else "")
                    )
                if until(seen):
                    return seen
                check("; ".join(f"{x.job.name} {x.job.state} ({x.job.reason})" for x in seen))
                time.sleep(0.25)

    def _poll(self, job_id: str) -> _Seen:
        job = self.admin.get(job_id)
        for line in reversed(self.logs(job_id, tail=5)):
            m = _STEP.search(line.text)
            if m:
                return _Seen(job, int(m.group(1)), int(m.group(2)))
        return _Seen(job)

    def logs(self, job_id: str, tail: int = 0) -> list[LogLine]:
        """A job's kept log lines (the last ``tail``; 0 = all)."""
        with self.admin.logs(job_id, tail=tail) as lines:
            return list(lines)


def _describe_node(node: NodeInfo) -> str:
    trust = "trusted" if node.pool == TRUSTED_POOL else "untrusted"
    return f"{node.name}: {node.pool}, {trust}"


def _nodes_of(job: JobInfo) -> list[str]:
    """The nodes of the job's last placement (kept after it ended)."""
    return sorted({p.node for p in job.placements})


# ---------------------------------------------------------------------- tables


def jobs_table(jobs: list[JobInfo]) -> Table:
    """The story's jobs: owner, priority, state, attempts, GPUs, first start to end."""
    table = Table(title=f"jobs in queue {QUEUE} (took: first start to end)")
    for col in ("name", "owner", "priority", "state", "tries", "GPUs", "took"):
        table.add_column(col, justify="left" if col in ("name", "owner", "state") else "right")
    for j in jobs:
        ran = (j.finished_ms - j.started_ms) / 1000 if j.finished_ms and j.started_ms else 0.0
        table.add_row(
            escape(j.name),
            escape(j.owner),
            str(j.priority),
            j.state,
            str(j.attempt),
            f"{j.gpus:g}",
            f"{ran:.1f}s" if ran else "",
        )
    return table


def placements_table(jobs: list[JobInfo]) -> Table:
    """Where each worker of each job's last attempt ran."""
    table = Table(title="placements (last attempt)")
    for col in ("job", "worker", "node", "pool", "GPU indexes"):
        table.add_column(col)
    pools = {a.node: a.pool for a in AGENTS}
    for j in jobs:
        for p in j.placements:
            table.add_row(
                escape(j.name),
                str(p.worker),
                escape(p.node),
                escape(pools.get(p.node, "?")),
                ", ".join(str(i) for i in p.gpu_index) or "-",
            )
    return table


def usage_table(rows: list[UsageRow]) -> Table:
    """GPU-hours (and GPU-seconds: demo jobs are short) per user."""
    table = Table(title="usage by user")
    for col in ("user", "GPU-hours", "GPU-seconds", "CPU-hours", "jobs"):
        table.add_column(col, justify="left" if col == "user" else "right")
    for r in rows:
        table.add_row(
            escape(r.key),
            f"{r.gpu_hours:.4f}",
            f"{r.gpu_hours * 3600:,.1f}",
            f"{r.cpu_hours:.4f}",
            str(r.jobs),
        )
    return table


__all__ = [
    "AGENTS",
    "QUEUE",
    "RESEARCHER",
    "SCHEDULER_ENV",
    "JobsSummary",
    "job_yaml",
    "jobs_story",
    "jobs_table",
    "placements_table",
    "usage_table",
]
