"""Benchmark: a chaos soak — the whole platform under a workload while its processes are
SIGKILLed, then a check that nothing was lost, duplicated or forged.

    python bench/chaos.py [--quick] [--seed N] [--duration S] [--kill-every S] [--grace S]
                          [--rows N] [--keep]

**The platform.** Three nats-servers on loopback in one JetStream cluster
(:class:`~gantry.supervisor.nats_cluster.NatsCluster`: every write fsynced, the per-service NATS
users), every stream with three replicas; the embedded platform on it (audit, governance,
scheduler, serving, profiler, workflows as child processes) with two node agents ``n1`` and
``n2`` declaring 2 CPUs each and no GPU (heartbeat every 2 s; the scheduler takes a node as
lost after 10 s of silence and gives workers 5 s to stop).

**Before the chaos.** A data steward commits ``chaos-data`` (``--rows`` rows, one PII column);
an ml-developer registers a tiny MLP (4 -> 8 -> 2, ``torch.export``) and deploys it; the
service account ``chaos-probe`` gets its signing key.

**The workload** (threads of this process, for ``--duration`` seconds):

- training jobs: one every ``JOB_EVERY_S`` (3 s; one CPU worker, ``JOB_STEPS`` steps of
  ``JOB_PAUSE_S``: 8 of 0.25 s, checkpointing its step after each and resuming from it when
  requeued); a failed submit is repeated with the same request id until the scheduler answers;
- dataset reads: the annotator reads the committed version raw, every ``READ_EVERY_S`` (0.5 s);
- serving traffic: a gRPC inference on the model every ``SERVE_EVERY_S`` (50 ms; 2 s
  deadline);
- outside events: ``ext.chaos.tick`` events with a sequence number, signed with the service
  account's key, one every ``EVENT_EVERY_S`` (0.1 s), each sent once the last was acknowledged.

**The chaos** (bench/_chaos_monkey.py): every ``--kill-every`` seconds a target drawn from a
``random.Random(--seed)`` — a kind (service, agent, NATS server: each 1/3), then one of that
kind; all six services can be drawn, audit included — is SIGKILLed, restarted after a drawn
pause of 1-3 s and waited for until ready (serving: until the model answers again; a NATS
server: until every stream has a leader and all replicas current again). One target is down at
a time, so never two NATS servers; the next kill comes one period after the last, but never
sooner than half a period after the target was ready, so some time lies outside the windows.

**The checks**, after the chaos stopped and every target is back (traffic stops too):

- every submitted job (the scheduler returned its id) must reach a final state within the
  settle time: ``jobs_finished`` succeeded, ``jobs_failed_with_reason`` failed or cancelled
  with the scheduler's reason, ``jobs_lost`` unknown to the scheduler or not final (must be 0;
  so must ``jobs_failed_without_reason`` and ``jobs_duplicated``, jobs of one name stored
  twice); ``jobs_requeued`` ran more than one attempt;
- ``events_published``: outside events JetStream acknowledged; ``events_in_audit``: how many
  of them the audit log holds (queried by type and the run's correlation id, waiting for the
  ingest to catch up; must equal events_published); ``events_duplicated``: ids the log holds
  more than once (must be 0); ``events_unacked_in_audit``: events whose publish gave up but
  which were stored all the same (allowed: an ack can be lost);
- ``audit_verified``: the audit service's Verify (recomputes the whole Merkle log and checks
  every signed checkpoint) said ok;
- ``serving_error_rate``: failed inference calls over calls outside every kill window
  ``[kill - 0.5 s, ready + --grace]`` (a call is outside when its whole span is);
  ``serving_error_rate_inside`` the same inside; ``reads_*`` the same for dataset reads.

Also: kills by kind and target, ``kill_log`` (when, what, how long down), ``down_s_*``, and
the phases' durations. Exits 1 when a check fails (listed in ``failures``), a target could
not be restarted, or nothing was measured — after printing the JSON object as the LAST line
(also written to bench/results/chaos.json). A timeline is drawn to bench/results/chaos.png
when matplotlib is installed. The platform's logs go to ``<work>/platform.log``; the work
directory is kept (and named) when a check fails or with ``--keep``.

``--quick``: 120 s of chaos, a kill every 9 s: under five minutes on 2 cores with start-up,
settling and checks. The default: 600 s, a kill every 10 s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _chaos_jobs import OWNER, JobLoad
from _chaos_load import (
    SOURCE,
    EventLoad,
    ReadLoad,
    ServingLoad,
    create_dataset,
    deploy_model,
    wait_model_ready,
)
from _chaos_monkey import Monkey, targets_of
from _chaos_report import audit_events, kill_figures, plot, rates, windows
from _common import RESULTS, emit_result
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gantry.client.admin import create_service_account, create_token
from gantry.client.audit import AuditClient
from gantry.core import GantryError, configure_logging
from gantry.events.nats_auth import ensure_credentials
from gantry.supervisor.nats_cluster import NatsCluster
from gantry.supervisor.platform import ExternalNats, LocalAgent, Platform

AGENTS = (
    LocalAgent(node="n1", cpus=2, memory="4Gi", gpus=0, heartbeat_s=2),
    LocalAgent(node="n2", cpus=2, memory="4Gi", gpus=0, heartbeat_s=2),
)
SERVICE_ENV = {
    "GANTRY_SCHEDULER__HEARTBEAT_TIMEOUT_S": "10",
    "GANTRY_SCHEDULER__STOP_GRACE_S": "5",
    "GANTRY_SERVING__TORCH_THREADS": "1",
    "GANTRY_AUDIT__CHECKPOINT_EVERY_S": "2",
}
JOB_EVERY_S, JOB_STEPS, JOB_PAUSE_S = 3.0, 8, 0.25
READ_EVERY_S, SERVE_EVERY_S, EVENT_EVERY_S = 0.5, 0.05, 0.1
SERVE_TIMEOUT_S = 2.0
BEFORE_S = 0.5  #: a kill window opens this long before the SIGKILL
TARGETS = {
    "jobs_lost": "== 0",
    "jobs_failed_without_reason": "== 0",
    "jobs_duplicated": "== 0",
    "events_in_audit": "== events_published",
    "events_duplicated": "== 0",
    "audit_verified": "true",
}


@dataclass(frozen=True)
class Plan:
    """How long and how hard."""

    quick: bool
    seed: int
    duration_s: float
    kill_every_s: float
    grace_s: float
    settle_s: float  #: longest wait for every job to be final after the chaos
    audit_wait_s: float  #: longest wait for the audit log to hold every acknowledged event
    rows: int

    @classmethod
    def make(cls, args: argparse.Namespace) -> Plan:
        duration, every = (120.0, 9.0) if args.quick else (600.0, 10.0)
        return cls(
            quick=args.quick,
            seed=args.seed,
            duration_s=args.duration or duration,
            kill_every_s=args.kill_every or every,
            grace_s=args.grace,
            settle_s=60.0 if args.quick else 120.0,
            audit_wait_s=45.0 if args.quick else 90.0,
            rows=args.rows,
        )


class Soak:
    """One run: start, load, kill, settle, check (see the module)."""

    def __init__(self, plan: Plan, work: Path, console: Console, log: TextIO) -> None:
        self.plan, self.work, self.console, self.log = plan, work, console, log
        self.started = time.monotonic()
        self.zero = self.started  #: the bench's clock starts when the workload does
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        self.run_id = uuid.uuid4().hex[:12]
        self.figures: dict[str, Any] = {"quick": plan.quick, "seed": plan.seed}

    def clock(self) -> float:
        """Seconds since the workload started."""
        return time.monotonic() - self.zero

    def say(self, text: str) -> None:
        self.console.print(f"[dim]\\[{self.clock():6.1f}s][/] {text}", highlight=False)

    def sink(self, line: str) -> None:
        self.tail.append(line)
        self.log.write(line + "\n")

    def run(self) -> dict[str, Any]:
        """The whole soak; the figures (``failures`` lists what broke a promise)."""
        data = self.work / "data"
        credentials = ensure_credentials(data / "nats" / "credentials.env")
        with contextlib.ExitStack() as stack:
            self.console.print(f"[bold]chaos soak[/] seed {self.plan.seed}, work dir {self.work}")
            cluster = NatsCluster(self.work / "nats", credentials).start()
            stack.callback(cluster.stop)
            platform = Platform(
                data,
                nats=ExternalNats(url=cluster.url, credentials=credentials, stream_replicas=3),
                agents=AGENTS,
                service_env=SERVICE_ENV,
                log_sink=self.sink,
            )
            stack.callback(platform.stop)
            platform.start(timeout_s=240)
            self.figures["startup_s"] = round(time.monotonic() - self.started, 1)
            self.console.print(
                f"platform up in {self.figures['startup_s']}s: 3 NATS servers, "
                f"{len(platform.services)} services, {len(AGENTS)} agents"
            )
            self._soak(platform, cluster)
        self.figures["wall_s"] = round(time.monotonic() - self.started, 1)
        return self.figures

    def _soak(self, platform: Platform, cluster: NatsCluster) -> None:
        plan, figures = self.plan, self.figures
        began = time.monotonic()
        tokens = {
            role: create_token(platform.data_dir, user, [role], dt.timedelta(hours=3))
            for user, role in (
                ("chaos-steward", "data-steward"),
                ("chaos-annotator", "annotator"),
                (OWNER, "ml-developer"),
                ("chaos-app", "model-consumer"),
                ("chaos-auditor", "auditor"),
            )
        }
        _token, key_path = create_service_account(platform.data_dir, SOURCE)
        version = create_dataset(platform.address("governance"), tokens["data-steward"], plan.rows)
        deploy_model(
            platform.address("governance"),
            platform.address("serving"),
            tokens["ml-developer"],
            self.work / "model",
        )
        figures["setup_s"] = round(time.monotonic() - began, 1)
        self.zero = time.monotonic()
        jobs = JobLoad(platform, tokens["ml-developer"], self.clock, run_id=self.run_id,
                       every_s=JOB_EVERY_S, steps=JOB_STEPS, pause_s=JOB_PAUSE_S)  # fmt: skip
        serving = ServingLoad(platform, tokens["model-consumer"], self.clock,
                              interval_s=SERVE_EVERY_S, timeout_s=SERVE_TIMEOUT_S)  # fmt: skip
        reads = ReadLoad(platform, tokens["annotator"], self.clock, version=version,
                         rows=plan.rows, interval_s=READ_EVERY_S)  # fmt: skip
        events = EventLoad(platform, key_path, self.clock, run_id=self.run_id,
                           interval_s=EVENT_EVERY_S)  # fmt: skip
        monkey = Monkey(
            platform,
            cluster,
            targets_of(platform, cluster),
            seed=plan.seed,
            every_s=plan.kill_every_s,
            pause_s=(1.0, 3.0),
            clock=self.clock,
            say=self.say,
            probes={"serving": lambda: wait_model_ready(platform, tokens["model-consumer"], 90)},
        )
        loads = (serving, reads, events)
        try:
            for load in loads:
                load.start()
            jobs.start()
            monkey.start(until=plan.duration_s)
            self._watch(monkey, jobs, serving, reads, events)
            monkey.stop()
            figures["chaos_s"] = round(self.clock(), 1)
            self.say(
                "chaos over; "
                + ("every target is back" if not monkey.stopped else "[red]the chaos broke off[/]")
                + ": stopping the traffic, settling"
            )
        finally:
            monkey.stop()
            for load in loads:
                load.stop()
            jobs.stop_submitting(timeout_s=60)
        figures["settle_s"] = round(jobs.settle(plan.settle_s), 1)
        figures.update(jobs.verdict())
        jobs.close()
        self._check_audit(platform, tokens["auditor"], events)
        spans = windows(monkey.kills, BEFORE_S, plan.grace_s)
        figures.update(kill_figures(monkey.kills))
        figures.update(rates("serving", serving.calls, spans))
        figures.update(rates("reads", reads.calls, spans))
        figures["kill_windows_s"] = round(
            sum(min(end, figures["chaos_s"]) - max(start, 0.0) for start, end in spans), 1
        )
        figures["grace_s"], figures["kill_every_s"] = plan.grace_s, plan.kill_every_s
        figures["failures"] = self._failures(monkey, events)
        figures["ok"] = not figures["failures"]
        figures["targets"] = TARGETS
        finished = [j.final_at for j in jobs.jobs if j.final_at == j.final_at]
        if plot(RESULTS / "chaos.png", monkey.kills, spans, serving.calls, finished,
                list(events.acked.values()), self.clock()):  # fmt: skip
            figures["plot"] = "bench/results/chaos.png"

    def _watch(
        self, monkey: Monkey, jobs: JobLoad, serving: ServingLoad, reads: ReadLoad,
        events: EventLoad,
    ) -> None:  # fmt: skip
        """Show progress until the chaos time is over (or a target could not come back)."""
        progress = Progress(
            BarColumn(bar_width=16),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
        )
        with progress:
            task = progress.add_task("chaos", total=self.plan.duration_s, status="")
            while self.clock() < self.plan.duration_s and not monkey.stopped:
                time.sleep(0.5)
                down = monkey.down
                counts = jobs.counts()
                status = (
                    f"kills {len(monkey.kills)}"
                    + (f" ([red]{down.target.name} down[/])" if down else "")
                    + f" · jobs {counts.get('succeeded', 0)}/{sum(counts.values())} done"
                    + f" · events {len(events.acked)}"
                    + f" · serving {len(serving.calls)} ({serving.errors} err)"
                    + f" · reads {len(reads.calls)} ({reads.errors} err)"
                )
                progress.update(task, completed=min(self.clock(), self.plan.duration_s),
                                status=status)  # fmt: skip

    def _check_audit(self, platform: Platform, token: str, events: EventLoad) -> None:
        figures = self.figures
        acked = set(events.acked)
        seen, waited = audit_events(
            platform.address("audit"), token, self.run_id, acked, self.plan.audit_wait_s
        )
        figures["events_published"] = len(acked)
        figures["events_attempted"] = len(events.attempted)
        figures["events_in_audit"] = len(acked & set(seen))
        figures["events_duplicated"] = sum(1 for n in seen.values() if n > 1)
        figures["events_unacked_in_audit"] = len(set(seen) - acked)
        figures["audit_wait_s"] = round(waited, 1)
        missing = sorted(acked - set(seen), key=lambda i: events.acked[i])
        if missing:
            figures["events_missing_first"] = [
                {"id": i, "acked_at_s": round(events.acked[i], 2)} for i in missing[:10]
            ]
        figures["audit_verified"] = False
        for _ in range(10):
            try:
                with AuditClient(platform.address("audit"), token, timeout_s=120) as audit:
                    result = audit.verify()
            except GantryError as exc:
                figures["audit_verify_error"] = str(exc)
                time.sleep(2)
                continue
            figures["audit_verified"] = bool(result.ok)
            figures["audit_events_checked"] = result.events_checked
            figures["audit_checkpoints_checked"] = result.checkpoints_checked
            if not result.ok:
                figures["audit_problems"] = [
                    f"index {p.index}: {p.kind}" for p in list(result.problems)[:10]
                ]
            figures.pop("audit_verify_error", None)
            break

    def _failures(self, monkey: Monkey, events: EventLoad) -> list[str]:
        f = self.figures
        out = [
            f"{name} is {f[name]} (must be 0)"
            for name in ("jobs_lost", "jobs_failed_without_reason", "events_duplicated")
            if f[name]
        ]
        if f["jobs_duplicated"] != 0:
            out.append(f"jobs_duplicated is {f['jobs_duplicated']} (-1: could not list)")
        elif f["jobs_listed"] < f["jobs_total"]:
            out.append(f"the scheduler lists {f['jobs_listed']} of {f['jobs_total']} jobs")
        if f["events_in_audit"] < f["events_published"]:
            out.append(
                f"the audit log holds {f['events_in_audit']} of {f['events_published']} "
                "acknowledged events"
            )
        if not f["audit_verified"]:
            out.append("the audit log did not verify")
        if monkey.failed is not None:
            out.append(f"{monkey.failed.target.name} could not be restarted: {monkey.failed.error}")
        if monkey.error:
            out.append(f"the chaos monkey stopped: {monkey.error}")
        if events.failure:
            out.append(f"the event emitter could not run: {events.failure}")
        if not f["jobs_total"] or not f["events_published"] or not f["kills"]:
            out.append("nothing was measured (no job, no acknowledged event or no kill)")
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120 s of chaos, under 5 minutes")
    parser.add_argument("--seed", type=int, default=2, help="the kill schedule's seed (2)")
    parser.add_argument("--duration", type=float, default=0, help="seconds of chaos")
    parser.add_argument("--kill-every", type=float, default=0, help="seconds between kills")
    parser.add_argument(
        "--grace", type=float, default=2.0, help="seconds a kill window lasts past ready"
    )
    parser.add_argument("--rows", type=int, default=2000, help="rows of the dataset read")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    plan = Plan.make(args)
    configure_logging("bench-chaos", level="CRITICAL", json=False)  # the SDK's retries: quiet
    console = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="gantry-chaos-"))
    with (work / "platform.log").open("w", encoding="utf-8", buffering=1) as log:
        soak = Soak(plan, work, console, log)
        try:
            figures = soak.run()
        except Exception as exc:  # the soak could not run: say why, in the JSON too
            console.print(f"[red]the soak stopped:[/] {exc}")
            for line in list(soak.tail)[-20:]:
                console.print(f"  {line}", highlight=False, markup=False)
            figures = {**soak.figures, "ok": False, "failures": [f"the soak stopped: {exc}"]}
    keep = args.keep or not figures.get("ok")
    if keep:
        console.print(f"work directory kept: {work} (platform.log, nats/n*/nats-server.log)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    for failure in figures.get("failures", []):
        console.print(f"[red]FAILED:[/] {failure}")
    emit_result("chaos", figures)
    return 0 if figures.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
