"""The chaos bench's training jobs: submitted steadily, followed to the end, then judged.

Each job is one CPU worker (``cpus: 0.5``, no GPU) running :data:`WORKER`: ``steps`` steps of
``pause_s`` each, its step written to ``$GANTRY_CHECKPOINT_DIR/step`` after every step (where
the node agent reads a job's checkpoint) and read back when the scheduler restarts it with
``GANTRY_RESUME=1``, so a requeued job resumes instead of starting over.

Submitting: job ``chaos-<n>`` with request id ``<run>-<n>``, every ``every_s``; a failed submit
(the scheduler killed, a NATS leader election) is repeated with the same request id until the
scheduler answers, so a submit that was stored but not answered is not a second job. A job
counts as submitted once the scheduler returned its id. A refusal (an invalid spec, a denied
call) is not repeated; it is counted apart.

Following: a thread asks the scheduler for every job not yet final, once a second. At the end,
:meth:`JobLoad.settle` waits until every submitted job is final (or a deadline), then
:meth:`JobLoad.verdict` reads each job once more and sorts them: ``succeeded``; ``failed`` or
``cancelled`` with a reason; failed without one; and lost (the scheduler does not know the id,
or the job was not final at the deadline).
"""

from __future__ import annotations

import math
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from gantry.client.errors import RemoteNotFound, RemotePermissionDenied
from gantry.client.scheduler import TERMINAL_STATES, JobInfo, SchedulerClient
from gantry.core import GantryError, InvalidInput, Unauthenticated
from gantry.supervisor.platform import Platform

OWNER = "chaos-dev"
WORKER = """\
import os, pathlib, sys, time
steps, pause = int(sys.argv[1]), float(sys.argv[2])
ckpt = pathlib.Path(os.environ["GANTRY_CHECKPOINT_DIR"]) / "step"
step = 0
if os.environ.get("GANTRY_RESUME") == "1" and ckpt.exists():
    step = int(ckpt.read_text())
    print(f"resuming from checkpoint at step {step}", flush=True)
while step < steps:
    time.sleep(pause)
    step += 1
    tmp = ckpt.with_name("step.tmp")
    tmp.write_text(str(step))
    os.replace(tmp, ckpt)
    print(f"step {step}/{steps}", flush=True)
print("done", flush=True)
"""
_REFUSED = (InvalidInput, RemotePermissionDenied, Unauthenticated)


@dataclass
class Tracked:
    """A job the bench submitted, as last seen."""

    seq: int
    request_id: str
    job_id: str = ""
    submitted_at: float = math.nan
    state: str = ""
    reason: str = ""
    attempt: int = 0
    final_at: float = math.nan  #: when the bench first saw it final
    missing: bool = False  #: the scheduler answered NotFound for its id
    refused: str = ""  #: the scheduler refused the submit for good
    history: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in TERMINAL_STATES


def job_yaml(name: str, run_id: str, steps: int, pause_s: float) -> str:
    """A one-worker CPU TrainingJob running :data:`WORKER`."""
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": {"chaos-run": run_id}},
        "spec": {
            "replicas": 1,
            "resources": {"cpus": 0.5, "memory": "256Mi"},
            "entrypoint": {
                "command": [sys.executable, "-c", WORKER],
                "args": [str(steps), f"{pause_s:g}"],
            },
            "maxRuntime": "10m",
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


class JobLoad:
    """Submits and follows the jobs (see the module)."""

    def __init__(
        self,
        platform: Platform,
        token: str,
        clock: Callable[[], float],
        *,
        run_id: str,
        every_s: float,
        steps: int,
        pause_s: float,
    ) -> None:
        self.platform, self.token, self.clock = platform, token, clock
        self.run_id, self.every_s, self.steps, self.pause_s = run_id, every_s, steps, pause_s
        self.jobs: list[Tracked] = []
        self._stop_submitting = threading.Event()
        self._give_up = threading.Event()
        self._stop_following = threading.Event()
        self._clients: dict[str, SchedulerClient] = {}
        self._lock = threading.Lock()
        self._submitter = threading.Thread(
            target=self._submit_loop, name="chaos-submit", daemon=True
        )
        self._follower = threading.Thread(
            target=self._follow_loop, name="chaos-follow", daemon=True
        )

    # ------------------------------------------------------------------ threads

    def start(self) -> None:
        """Start submitting and following."""
        self._submitter.start()
        self._follower.start()

    def stop_submitting(self, timeout_s: float) -> None:
        """No new job; the submit in flight is repeated for up to ``timeout_s`` more."""
        self._stop_submitting.set()
        if self._submitter.is_alive():
            self._submitter.join(timeout_s)
            self._give_up.set()
            self._submitter.join()

    def counts(self) -> Counter[str]:
        """Jobs by last seen state (``submitting`` before the scheduler answered)."""
        return Counter(j.state or ("submitting" if not j.job_id else "?") for j in self.jobs)

    def _client(self) -> SchedulerClient:
        address = self.platform.address("scheduler")  # Unavailable while it restarts
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._clients[address] = SchedulerClient(address, self.token, timeout_s=5)
            return client

    def _submit_loop(self) -> None:
        next_at = self.clock()
        seq = 0
        while not self._stop_submitting.wait(max(0.0, next_at - self.clock())):
            next_at = max(next_at + self.every_s, self.clock())
            seq += 1
            job = Tracked(seq, f"{self.run_id}-{seq}")
            self.jobs.append(job)
            self._submit(job)

    def _submit(self, job: Tracked) -> None:
        spec = job_yaml(f"chaos-{job.seq}", self.run_id, self.steps, self.pause_s)
        while True:
            try:
                info = self._client().submit(spec, request_id=job.request_id).job
            except _REFUSED as exc:
                job.refused = f"{type(exc).__name__}: {exc}"
                return
            except GantryError:
                if self._give_up.wait(0.5):
                    return
                continue
            job.job_id, job.submitted_at = info.id, self.clock()
            self._seen(job, info)
            return

    def _follow_loop(self) -> None:
        while not self._stop_following.wait(1.0):
            self.poll()

    def poll(self) -> None:
        """Ask the scheduler for every submitted job not final yet."""
        for job in list(self.jobs):
            if not job.job_id or job.final:
                continue
            try:
                self._seen(job, self._client().get(job.job_id))
            except RemoteNotFound:
                job.missing = True
            except GantryError:
                return  # the scheduler is away: try again next round

    def _seen(self, job: Tracked, info: JobInfo) -> None:
        job.missing = False
        job.state, job.reason, job.attempt = info.state, info.reason, info.attempt
        if job.final and math.isnan(job.final_at):
            job.final_at = self.clock()

    # ------------------------------------------------------------------ the end

    def settle(self, timeout_s: float) -> float:
        """Wait until every submitted job is final (at most ``timeout_s``); seconds waited."""
        started = self.clock()
        while self.clock() - started < timeout_s:
            if all(j.final for j in self.jobs if j.job_id):
                break
            self._stop_following.wait(0.5)
        self._stop_following.set()
        if self._follower.is_alive():
            self._follower.join()
        self.poll()
        return self.clock() - started

    def verdict(self) -> dict[str, Any]:
        """The jobs' figures and the jobs that break the promise (see the module)."""
        for job in self.jobs:  # once more, with the history, for the evidence
            if job.job_id:
                self._final_read(job)
        submitted = [j for j in self.jobs if j.job_id]
        done = [j for j in submitted if j.state == "succeeded"]
        ended = [j for j in submitted if j.state in ("failed", "cancelled")]
        lost = [j for j in submitted if j.missing or not j.final]
        figures: dict[str, Any] = {
            "jobs_total": len(submitted),
            "jobs_finished": len(done),
            "jobs_failed_with_reason": sum(1 for j in ended if j.reason.strip()),
            "jobs_failed_without_reason": sum(1 for j in ended if not j.reason.strip()),
            "jobs_lost": len(lost),
            "jobs_requeued": sum(1 for j in submitted if j.attempt > 1),
            "job_attempts": sum(j.attempt for j in submitted),
            "jobs_refused": sum(1 for j in self.jobs if j.refused),
            "jobs_unanswered": sum(1 for j in self.jobs if not j.job_id and not j.refused),
        }
        figures["jobs_listed"], figures["jobs_duplicated"] = self._duplicates()
        problems = [self._describe(j) for j in lost + [j for j in ended if not j.reason.strip()]]
        figures["job_problems"] = problems[:20]
        figures["job_failure_reasons"] = dict(Counter(j.reason[:120] for j in ended).most_common(5))
        return figures

    def _final_read(self, job: Tracked) -> None:
        for _ in range(20):
            try:
                info = self._client().get(job.job_id)
            except RemoteNotFound:
                job.missing = True
                return
            except GantryError:
                self._stop_following.wait(0.5)
                continue
            self._seen(job, info)
            job.history = [f"{h.attempt}:{h.state}:{h.reason}" for h in info.history]
            return

    def _duplicates(self) -> tuple[int, int]:
        """The bench's jobs the scheduler lists, and how many of them are beyond one per name
        (a submit stored twice); (-1, -1) when it cannot list them."""
        for _ in range(10):
            try:
                listed = self._client().list(owner=OWNER, limit=10_000)
            except GantryError:
                self._stop_following.wait(1.0)
                continue
            names = Counter(j.name for j in listed if j.labels.get("chaos-run") == self.run_id)
            return sum(names.values()), sum(n - 1 for n in names.values() if n > 1)
        return -1, -1

    @staticmethod
    def _describe(job: Tracked) -> dict[str, Any]:
        return {
            "job": job.job_id,
            "name": f"chaos-{job.seq}",
            "submitted_at_s": round(job.submitted_at, 1),
            "state": job.state or "unknown",
            "missing": job.missing,
            "reason": job.reason,
            "attempt": job.attempt,
            "history": job.history[-8:],
        }

    def close(self) -> None:
        """Close the scheduler channels."""
        for client in self._clients.values():
            client.close()


__all__ = ["OWNER", "WORKER", "JobLoad", "Tracked", "job_yaml"]
