"""``python -m gantry.client.demo`` (``make demo``): governed data, its audit trail and the
training jobs that use it, end to end.

Starts the embedded platform (NATS, the audit, governance, scheduler, serving and profiler
services, two
local node agents) in a fresh temporary data directory. A data steward registers the
``customers`` dataset with PII columns and uploads rows (sharded and encrypted at rest); an
annotator reads them raw; an ml-developer reads the same version de-identified, and is refused
when asking for it raw (:mod:`gantry.client.demo_data`). Then the scheduling story
(:mod:`gantry.client.demo_jobs`): a 2-worker training job on that version runs only in the
trusted pool, a retried submit returns the same job, and a high-priority job preempts a
low-priority one, which resumes from its checkpoint; the job table, placements, GPU-hours by
user and one job's logs are printed. Then training for real (:mod:`gantry.client.demo_training`):
the tabular example trains on 2 workers on the governed ``churn`` table, is preempted by a
high-priority job, resumes from its checkpoint, finishes, and its model appears in the registry
with its lineage. Then serving (:mod:`gantry.client.demo_serving`): that model is deployed and
answers over REST and gRPC; a second version (its INT8 quantisation) goes out as a canary and is
promoted by its checks; a deliberately broken third version is rolled back automatically, and
the rollout history is read back from the audit log. Then profiling
(:mod:`gantry.client.demo_profiler`): the training job's per-rank profile with its plot, and a
2-worker job whose rank 1 data loader is slowed on purpose, which the profiler names as the
straggler with the phase, the cause and the evidence. An outside service, ``feature-store``,
reports 1,000 reads of its own as signed ``gantry.data.accessed`` events through the SDK. Then,
as an auditor: waits until the log holds everything, counts the events with a query, prints the
access report for ``dataset/customers`` (the refused raw read among them), waits for a signed
checkpoint, has the server verify the whole log and checks one inclusion proof locally. Last,
the compliance officer's view (:mod:`gantry.client.demo_compliance`): the developer's repeated
raw reads raise a denial-storm anomaly, which the officer acknowledges; a signed data-subject
report traces one customer's e-mail to the dataset versions, jobs and models holding it, each
link proven by an audit entry; and a signed compliance report of the run is generated,
verified against the log and downloaded as PDF and CSV. Exits 0
when every step worked, 1 (with the failing step and the services' last log lines) otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gantry.client.cli import access_table, configure_cli_logging
from gantry.client.demo_data import (
    ANNOTATOR,
    DATASET,
    DEVELOPER,
    DataSummary,
    governance_story,
    samples_table,
)
from gantry.client.demo_jobs import AGENTS, SCHEDULER_ENV, JobsSummary, jobs_story
from gantry.client.demo_profiler import ProfilerSummary, profiler_story
from gantry.client.demo_serving import CANARY as SERVING_CANARY
from gantry.client.demo_serving import MODEL as SERVED_MODEL
from gantry.client.demo_serving import ServingSummary, serving_story
from gantry.client.demo_training import TrainingSummary, training_story
from gantry.client.errors import RemoteNotFound
from gantry.core import (
    CommonSettings,
    GantryError,
    IntegrityError,
    Unavailable,
    load_settings,
    new_id,
)
from gantry.core.runfile import run_info
from gantry.supervisor.platform import CONSOLE, DEFAULT_SERVICES, Platform

if TYPE_CHECKING:
    from gantry.client.audit import AuditClient
    from gantry.client.demo_compliance import ComplianceSummary
    from gantry.security.treehead import TreeHead

# Modules that import gantry.events are imported where used, after main() set up logging.

EVENT_TYPE = "gantry.data.accessed"
ACTORS = ("alice", "bob", "carol", "dave", "erin", "frank")
SERVICE_ACCOUNT = "feature-store"
RESOURCE = "dataset/customers"

T = TypeVar("T")


@dataclass
class Summary:
    """What the demo achieved."""

    emitted: int = 0
    data: DataSummary | None = None
    jobs: JobsSummary | None = None
    training: TrainingSummary | None = None
    serving: ServingSummary | None = None
    profiler: ProfilerSummary | None = None
    compliance: ComplianceSummary | None = None
    denied_in_report: int = 0
    in_log: int = 0
    report_rows: int = 0
    verified_events: int = 0
    checkpoints: int = 0
    proof_index: int = -1
    console_url: str = ""
    elapsed_s: float = 0.0


class _Steps:
    """Remembers which step runs, for the failure message."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.current = "starting"

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.current = name
        started = time.monotonic()
        yield
        self.console.print(
            f"[green]✓[/] {escape(name)} [dim]({time.monotonic() - started:.1f}s)[/]"
        )


def _poll(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    """Call ``probe`` until it returns a value; raise :class:`Unavailable` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise Unavailable(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


async def _emit_events(
    url: str, data_dir: Path, key_path: Path, count: int, run_id: str, console: Console
) -> list[str]:
    from gantry.client.emit import connect

    rng = random.Random(20260131)
    async with await connect(
        source=SERVICE_ACCOUNT,
        actor="svc-feature-store",
        url=url,
        data_dir=data_dir,
        key_path=key_path,
    ) as emitter:
        events = [
            emitter.build(
                EVENT_TYPE,
                {
                    "dataset": "customers" if rng.random() < 0.6 else "transactions",
                    "rows": rng.randint(1, 5000),
                    "view": "deidentified",
                    "decision": "deny" if i % 10 == 0 else "allow",
                    "purpose": "feature-engineering",
                },
                actor=rng.choice(ACTORS),
                correlation_id=run_id,
            )
            for i in range(count)
        ]
        progress = Progress(
            TextColumn("emitting signed events"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        with progress:
            task = progress.add_task("emit", total=count)
            for start in range(0, count, 100):
                batch = events[start : start + 100]
                await emitter.emit_many(batch)
                progress.advance(task, len(batch))
    return [e.id for e in events]


def run(
    data_dir: Path,
    *,
    count: int = 1000,
    rows: int = 20_000,
    nats_port: int = 0,
    console: Console | None = None,
    log_sink: Callable[[str], None] | None = None,
    steps: _Steps | None = None,
    keep: bool = False,
) -> Summary:
    """Run the demo against a platform it starts in ``data_dir``; raise GantryError on failure.

    ``keep`` leaves the platform (and its web console) running after the demo until Ctrl-C.
    """
    from gantry.client.admin import create_service_account, create_token
    from gantry.client.audit import AuditClient

    console = console or Console()
    steps = steps or _Steps(console)
    started = time.monotonic()
    started_ms = int(time.time() * 1000)
    summary = Summary()
    run_id = new_id()
    platform = Platform(
        data_dir,
        nats_port=nats_port,
        services=(*DEFAULT_SERVICES, CONSOLE),
        agents=AGENTS,
        service_env={"GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.5", **SCHEDULER_ENV},
        log_sink=log_sink,
    )
    try:
        with steps.step(
            "platform started (NATS; audit, governance, scheduler, serving, profiler and "
            f"workflows services; {len(AGENTS)} node agents)"
        ):
            platform.start(timeout_s=60)
        summary.console_url = platform.console_url
        console.print(
            f"[bold]web console:[/] {summary.console_url} — log in with the token in "
            f"{escape(str(data_dir / 'admin.token'))}"
        )
        summary.data = governance_story(
            platform.address("governance"), data_dir, steps.step, console, rows=rows
        )
        console.print(samples_table("annotator's raw view", summary.data.raw_sample))
        console.print(
            samples_table("ml-developer's de-identified view", summary.data.deidentified_sample)
        )
        console.print(f"[yellow]refused:[/] {escape(summary.data.denied)}")
        summary.jobs = jobs_story(
            platform.address("scheduler"),
            data_dir,
            steps.step,
            console,
            version=summary.data.version,
        )
        summary.training = training_story(
            platform.address("scheduler"),
            platform.address("governance"),
            platform.address("workflows"),
            data_dir,
            steps.step,
            console,
            canary=SERVING_CANARY,
        )
        model = summary.training.model
        rest_url = run_info(data_dir, "serving", "http")
        if model is None or rest_url is None:
            raise Unavailable("no trained model or no serving REST address to continue with")
        summary.serving = serving_story(
            platform.address("serving"),
            platform.address("governance"),
            rest_url,
            platform.address("audit"),
            data_dir,
            steps.step,
            console,
            model=model,
            deployed=summary.training.deployed,
        )
        summary.profiler = profiler_story(
            platform.address("scheduler"),
            platform.address("profiler"),
            data_dir,
            steps.step,
            console,
            trained_job=summary.training.job.id if summary.training.job else "churn-model",
        )
        with steps.step(f"service account {SERVICE_ACCOUNT!r} created"):
            _token, key_path = create_service_account(data_dir, SERVICE_ACCOUNT)
        with steps.step(f"{count:,} signed {EVENT_TYPE} events emitted"):
            ids = asyncio.run(
                _emit_events(platform.nats_url, data_dir, key_path, count, run_id, console)
            )
            summary.emitted = len(ids)
        with steps.step("auditor token created"):
            token = create_token(data_dir, "demo-auditor", ["auditor"], dt.timedelta(hours=1))
        with AuditClient(platform.address("audit"), token) as client:
            summary = _audit(client, steps, data_dir, ids, run_id, summary, console)
        if summary.data is not None:
            from gantry.client.demo_compliance import compliance_story

            summary.compliance = compliance_story(
                platform.address("governance"),
                platform.address("audit"),
                data_dir,
                steps.step,
                console,
                version=summary.data.version,
                since_ms=started_ms,
            )
        if keep:
            console.print(
                f"[bold]the platform keeps running:[/] web console {summary.console_url} "
                f"(token: {escape(str(data_dir / 'admin.token'))}); Ctrl-C stops it"
            )
            with contextlib.suppress(KeyboardInterrupt):
                platform.wait()
    finally:
        platform.stop()
    summary.elapsed_s = time.monotonic() - started
    return summary


def _audit(
    client: AuditClient,
    steps: _Steps,
    data_dir: Path,
    ids: list[str],
    run_id: str,
    summary: Summary,
    console: Console,
) -> Summary:
    from gantry.client.admin import keyring
    from gantry.client.audit import Filter

    flt = Filter(types=[EVENT_TYPE], correlation_id=run_id)

    def logged() -> list[int] | None:
        indexes = [r.index for r in client.query(flt, page_size=1000)]
        return indexes if len(indexes) >= len(ids) else None

    with steps.step("events ingested into the audit log"):
        indexes = _poll("the audit log to hold every event", logged, timeout_s=30)
    with steps.step(f"query types=[{EVENT_TYPE}] counted them"):
        summary.in_log = sum(1 for _ in client.query(flt, page_size=1000))
        if summary.in_log != len(ids):
            raise IntegrityError(f"the log holds {summary.in_log} of {len(ids)} emitted events")
    with steps.step(f"access report for {RESOURCE} shows the governed reads"):

        def governed() -> Any:
            report = client.access_report(RESOURCE)
            denied = sum(r.denied for r in report.rows if r.actor == DEVELOPER)
            ready = {DEVELOPER, ANNOTATOR} <= {r.actor for r in report.rows}
            return report if ready and denied >= 1 else None

        report = _poll("the governance service's reads in the audit log", governed, timeout_s=30)
        summary.report_rows = len(report.rows)
        summary.denied_in_report = sum(r.denied for r in report.rows if r.actor == DEVELOPER)
    console.print(access_table(report))

    needed = max(indexes) + 1

    def covering() -> TreeHead | None:
        try:
            head = client.checkpoint()
        except RemoteNotFound:
            return None
        return head if head.tree_size >= needed else None

    with steps.step("signed checkpoint covers every event"):
        head = _poll(f"a checkpoint of size {needed}", covering, timeout_s=20)
    with steps.step("server verified the whole log"):
        result = client.verify()
        if not result.ok:
            problems = "; ".join(f"index {p.index}: {p.kind}" for p in result.problems[:5])
            raise IntegrityError(f"the server found problems in the log: {problems}")
        summary.verified_events = result.events_checked
        summary.checkpoints = result.checkpoints_checked
    with steps.step("inclusion proof checked locally"):
        trust = keyring(data_dir).trust()
        event_id = ids[len(ids) // 2]
        index, _raw, _head = client.prove_inclusion(trust, event_id=event_id)
        head.check_signature(trust)
        summary.proof_index = index
    return summary


def _summary_table(summary: Summary) -> Table:
    table = Table(title="Gantry demo", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("result", justify="right")
    if summary.data is not None:
        d = summary.data
        table.add_row(f"dataset {DATASET!r}", f"{d.rows:,} rows, {d.shards} encrypted shards")
        table.add_row("version", d.version[:12])
        table.add_row("de-identified columns", ", ".join(d.deidentified_columns))
        table.add_row("raw read by ml-developer", f"refused, {summary.denied_in_report} in report")
    if summary.jobs is not None:
        _jobs_rows(table, summary.jobs)
    t = summary.training
    if t is not None and t.model is not None:
        accuracy = t.model.metrics.get("accuracy")
        table.add_row(
            "churn-model (2 workers, real training)",
            f"preempted at step {t.preempted_at_step}, resumed at {t.resumed_at_step}"
            + (f"; held-out accuracy {accuracy:.3f}" if accuracy is not None else ""),
        )
        table.add_row(
            "registered model", f"{t.model.name} v{t.model.version}, lineage to its job and data"
        )
    v = summary.serving
    if v is not None and v.promoted is not None and v.rolled_back is not None:
        table.add_row(
            f"{SERVED_MODEL} served (REST {v.rest_url})",
            f"v{max(v.rolled_back.weights(), default=0)} at 100%; "
            f"{v.requests:,} requests during the rollouts",
        )
        table.add_row("canary v2 (INT8)", f"promoted ({v.int8_bytes:,} bytes vs {v.float_bytes:,})")
        table.add_row("canary v3 (broken)", f"rolled back automatically in {v.rollback_s:.1f}s")
    pr = summary.profiler
    if pr is not None and pr.verdict is not None:
        f = pr.verdict
        table.add_row(
            "slow-loader: straggler found",
            f"rank {f.rank} ({f.phase}, {f.cause}), {pr.detection_steps} steps after the slowdown",
        )
        table.add_row("deep trace (torch.profiler, 5 steps)", f"{pr.trace_events:,} events")
        table.add_row("profile plots", f"{len(pr.pictures)} under {pr.pictures[0].parent}")
    table.add_row("events emitted by feature-store (signed)", f"{summary.emitted:,}")
    table.add_row("events in the audit log", f"{summary.in_log:,}")
    table.add_row(f"access report rows ({RESOURCE})", f"{summary.report_rows:,}")
    table.add_row(
        "verify",
        f"OK ({summary.verified_events:,} events, {summary.checkpoints:,} signed "
        f"checkpoint{'' if summary.checkpoints == 1 else 's'})",
    )
    table.add_row("inclusion proof", f"OK (entry {summary.proof_index:,})")
    if summary.console_url:
        table.add_row(
            "web console",
            f"{summary.console_url} (ran with the demo; --keep or 'gantry up' keeps one running)",
        )
    c = summary.compliance
    if c is not None:
        table.add_row("anomaly raised (denial storm)", c.anomaly_reason)
        table.add_row(
            "data-subject report (signed, verified)",
            f"{c.subject_versions} version(s), jobs {', '.join(c.subject_jobs)}, models "
            f"{', '.join(c.subject_models)}; {c.subject_proven} links proven",
        )
        table.add_row(
            "compliance report (signed, verified)",
            f"{c.report_id[:8]} over {c.report_tree_size:,} events: "
            + ", ".join(str(p) for p in c.report_files),
        )
    table.add_row("elapsed", f"{summary.elapsed_s:.1f}s")
    return table


def _jobs_rows(table: Table, jobs: JobsSummary) -> None:
    table.add_row("nodes (4 A100 declared on each)", "\n".join(jobs.nodes))
    if jobs.train is not None:
        nodes = ", ".join(sorted({p.node for p in jobs.train.placements}))
        table.add_row(
            f"{jobs.train.name} ({jobs.train.replicas} workers, {DATASET})",
            f"{jobs.train.state} on {nodes} (trusted pool)",
        )
        table.add_row("submitted twice, same request id", f"one job, {jobs.duplicate_id}")
    if jobs.low is not None and jobs.high is not None:
        table.add_row(
            f"{jobs.high.name} preempted {jobs.low.name}",
            f"resumed at step {jobs.resumed_from_step}; both {jobs.low.state}",
        )
    table.add_row("GPU-hours by user", "\n".join(f"{r.key} {r.gpu_hours:.4f}" for r in jobs.usage))


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when every step worked, 1 when one failed (with a clear message)."""
    parser = argparse.ArgumentParser(prog="python -m gantry.client.demo", description=__doc__)
    parser.add_argument(
        "--data-dir", type=Path, help="use this data directory (default: a fresh temporary one)"
    )
    parser.add_argument("--events", type=int, default=1000, help="events to emit (1000)")
    parser.add_argument("--rows", type=int, default=20_000, help="customer rows (20,000)")
    parser.add_argument(
        "--nats-port", type=int, default=0, help="preferred NATS port (default: any free one)"
    )
    parser.add_argument("--verbose", action="store_true", help="stream the services' logs")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the platform and its web console running after the demo, until Ctrl-C",
    )
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error("--events must be at least 1")
    configure_cli_logging(load_settings(CommonSettings))
    console = Console()
    logs: collections.deque[str] = collections.deque(maxlen=30)

    def sink(line: str) -> None:
        logs.append(line)
        if args.verbose:
            print(line, flush=True)

    steps = _Steps(console)
    with contextlib.ExitStack() as stack:
        data_dir: Path = args.data_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="gantry-demo-"))
        )
        console.print(f"[bold]Gantry demo[/] — data dir {data_dir}")
        try:
            summary = run(
                data_dir,
                count=args.events,
                rows=args.rows,
                nats_port=args.nats_port,
                console=console,
                log_sink=sink,
                steps=steps,
                keep=args.keep,
            )
        except GantryError as exc:
            print(f"demo failed while {steps.current}: {exc}", file=sys.stderr)
            if logs and not args.verbose:
                print("last service log lines:", file=sys.stderr)
                for line in logs:
                    print(f"  {line}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("demo interrupted", file=sys.stderr)
            return 130
    console.print(_summary_table(summary))
    return 0


__all__ = ["Summary", "main", "run"]


if __name__ == "__main__":
    sys.exit(main())
