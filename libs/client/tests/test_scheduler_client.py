"""The scheduler SDK and ``gantry jobs|nodes|queues|usage`` against an in-memory fake service.

The fake is no model of the real scheduler's policy: it keeps jobs in a dict, validates specs
with the same parser the service uses (:func:`gantry.sched.spec.parse_job`), moves jobs only
when a test tells it to, and records every request so tests can check what the client sent.
Tokens: ``admin-token`` may do anything, ``viewer-token`` may not cancel.
"""

from __future__ import annotations

import dataclasses
import io
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from rich.console import Console
from typer.testing import CliRunner

from gantry.client import cli
from gantry.client.cli._common import State
from gantry.client.config import ClientSettings
from gantry.client.errors import RemoteNotFound, RemotePermissionDenied
from gantry.client.scheduler import JobInfo, Resources, SchedulerClient
from gantry.core import Conflict, InvalidInput, Unauthenticated, Unavailable, load_settings
from gantry.core.runfile import write_run_file
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.sched.spec import parse_job

pytestmark = pytest.mark.timeout(30)

TOKENS = {"admin-token": "admin", "viewer-token": "viewer"}
TERMINAL = {"succeeded", "failed", "cancelled"}

SPEC = """\
apiVersion: gantry/v1
kind: TrainingJob
metadata: {name: resnet-ft, queue: vision, priority: high, labels: {team: cv}}
spec:
  replicas: 4
  minReplicas: 2
  resources: {gpus: 1, cpus: 8, memory: 32Gi}
  entrypoint: {module: train}
"""


# ---------------------------------------------------------------------- the fake service


class FakeScheduler(pb_grpc.SchedulerServiceServicer):
    """Jobs, nodes, queues and usage in memory; what it was sent in ``requests``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, pb.Job] = {}
        self.requests: list[Any] = []
        self.logs: dict[str, list[pb.LogLine]] = {}
        self.log_feed: queue.Queue[pb.LogLine | None] = queue.Queue()  # lines --follow gets
        self.on_watch: Callable[[str], None] | None = None  # runs once a watch is listening
        self._watchers: list[queue.Queue[pb.Job | None]] = []
        self.nodes = [
            pb.Node(
                name="node-a", pool="general", state="ready", cpu_milli=64_000,
                cpu_free_milli=40_000, memory_mib=512 * 1024, memory_free_mib=256 * 1024,
                gpus=[pb.Gpu(index=i, model="A100", memory_mib=81920,
                             free_milli=500 if i == 0 else (0 if i < 4 else 1000))
                      for i in range(8)],
                jobs=["job-1"],
            ),
            pb.Node(
                name="node-b", pool="trusted", state="degraded", reason="gpu 1 xid 79",
                cpu_milli=32_000, cpu_free_milli=32_000, memory_mib=128 * 1024,
                memory_free_mib=128 * 1024,
                gpus=[pb.Gpu(index=i, model="T4", free_milli=1000) for i in range(2)],
            ),
        ]  # fmt: skip
        self.queues = {
            "vision": pb.Queue(
                name="vision", cohort="lab", weight=2, pending=1, running=1,
                quota=pb.Resources(gpus=16, cpus=256, memory_mib=2 << 20),
                used=pb.Resources(gpus=4, cpus=32, memory_mib=128 * 1024),
                borrowing_limit=pb.Resources(gpus=8), dominant_share=0.25,
            ),
        }  # fmt: skip

    # ------------------------------------------------------------------ helpers

    def _caller(self, context: grpc.ServicerContext) -> str:
        token = str(dict(context.invocation_metadata()).get("authorization", ""))
        token = token.removeprefix("Bearer ")
        if token not in TOKENS:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        return TOKENS[token]

    def _job(self, ref: str, context: grpc.ServicerContext) -> pb.Job:
        self._caller(context)
        with self.lock:
            if ref in self.jobs:
                return self.jobs[ref]
            named = [j for j in self.jobs.values() if j.name == ref]
        if not named:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {ref!r} not found")
        return max(named, key=lambda j: j.submitted_ms)

    def advance(self, job_id: str, state: str, reason: str = "", *, workers: int = -1) -> None:
        """Move a job to ``state`` as the scheduler would, and tell every watcher."""
        with self.lock:
            job = self.jobs[job_id]
            at = job.submitted_ms + 1000 * (len(job.history))
            job.state, job.reason = state, reason
            if state == "running":
                job.workers = job.replicas if workers < 0 else workers
                job.started_ms = job.started_ms or at
                job.placements.extend(
                    pb.WorkerPlacement(worker=w, node="node-a", gpu_index=[w], gpu_milli=[1000])
                    for w in range(job.workers)
                )
            if state in TERMINAL:
                job.finished_ms, job.workers = at, 0
                del job.placements[:]
            job.history.append(pb.JobEvent(at_ms=at, state=state, reason=reason, attempt=1))
            copy = pb.Job()
            copy.CopyFrom(job)
            for watcher in self._watchers:
                watcher.put(copy)

    def end_watches(self) -> None:
        """End every open watch stream (as a restarting service would)."""
        with self.lock:
            for watcher in self._watchers:
                watcher.put(None)

    # ------------------------------------------------------------------ jobs

    def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.SubmitJobResponse:
        owner = self._caller(context)
        self.requests.append(request)
        try:
            doc = parse_job(request.spec_yaml)
        except InvalidInput as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        request_id = request.request_id or doc.metadata.request_id
        submitted_ms = int(time.time() * 1000) - 90_000  # 1m30s ago: jobs list shows age 1m
        with self.lock:
            for existing in self.jobs.values():
                if request_id and existing.request_id == request_id:
                    return pb.SubmitJobResponse(job=existing, duplicate=True)
            job = pb.Job(
                id="" if request.dry_run else f"job-{len(self.jobs) + 1}",
                name=doc.metadata.name, queue=doc.metadata.queue, owner=owner,
                priority=doc.metadata.priority_value, state="pending",
                reason="waiting for 4 GPUs: queue vision is at its quota",
                replicas=doc.spec.replicas, min_replicas=doc.spec.min_replicas or 0,
                submitted_ms=submitted_ms, spec_yaml=request.spec_yaml,
                request_id=request_id, labels=doc.metadata.labels,
                gpu_milli=doc.spec.resources.milli_gpus, predicted_runtime_s=5400,
                history=[pb.JobEvent(at_ms=submitted_ms, state="pending",
                                     reason="submitted", attempt=0)],
            )  # fmt: skip
            if not request.dry_run:
                self.jobs[job.id] = job
        return pb.SubmitJobResponse(job=job)

    def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return self._job(request.id, context)

    def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        self._caller(context)
        self.requests.append(request)
        with self.lock:
            jobs = [
                j for j in self.jobs.values()
                if request.queue in ("", j.queue) and request.owner in ("", j.owner)
                and (request.state in ("", j.state)
                     or (request.state == "active" and j.state not in TERMINAL))
            ]  # fmt: skip
        return pb.ListJobsResponse(jobs=jobs[: request.limit or 100])

    def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.Job:
        caller = self._caller(context)
        job = self._job(request.id, context)
        if caller != "admin":
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"'{caller}' may not cancel job/{job.id}: no role grants it",
            )
        if job.state in TERMINAL:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} is {job.state}")
        self.advance(job.id, "cancelled", request.reason or f"cancelled by {caller}")
        return self.jobs[job.id]

    def WatchJobs(self, request: pb.WatchJobsRequest, context: Any) -> Iterator[pb.Job]:
        self._caller(context)
        feed: queue.Queue[pb.Job | None] = queue.Queue()
        with self.lock:
            current = [j for j in self.jobs.values() if request.id in ("", j.id)]
            self._watchers.append(feed)
        try:
            if request.include_current:
                yield from current
            if self.on_watch is not None:
                self.on_watch(request.id)
            while context.is_active():
                try:
                    job = feed.get(timeout=0.05)
                except queue.Empty:
                    continue
                if job is None:
                    return
                if request.id in ("", job.id):
                    yield job
        finally:
            with self.lock:
                self._watchers.remove(feed)

    def JobLogs(self, request: pb.JobLogsRequest, context: Any) -> Iterator[pb.LogLine]:
        job = self._job(request.id, context)
        self.requests.append(request)
        kept = self.logs.get(job.id, [])
        yield from kept[-request.tail :] if request.tail else kept
        while request.follow and context.is_active():
            try:
                line = self.log_feed.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                return
            yield line

    # ------------------------------------------------------------------ cluster

    def ListNodes(self, request: Any, context: Any) -> pb.ListNodesResponse:
        self._caller(context)
        return pb.ListNodesResponse(nodes=self.nodes)

    def ListQueues(self, request: Any, context: Any) -> pb.ListQueuesResponse:
        self._caller(context)
        return pb.ListQueuesResponse(queues=list(self.queues.values()))

    def SetQuota(self, request: pb.SetQuotaRequest, context: Any) -> pb.Queue:
        self._caller(context)
        self.requests.append(request)
        old = self.queues.get(request.queue)
        q = pb.Queue(
            name=request.queue, cohort=request.cohort, quota=request.quota,
            weight=request.weight or (old.weight if old else 1.0),
        )  # fmt: skip
        if request.has_borrowing_limit:
            q.borrowing_limit.CopyFrom(request.borrowing_limit)
        self.queues[request.queue] = q
        return q

    def Usage(self, request: pb.UsageRequest, context: Any) -> pb.UsageResponse:
        self._caller(context)
        self.requests.append(request)
        keys = {"user": ["alice", "bob"], "queue": ["vision", "research"], "pool": ["general"]}
        rows = [
            pb.UsageRow(key=k, gpu_hours=10.0 * (i + 1), cpu_hours=80.0 * (i + 1),
                        queueing_hours=0.5 * (i + 1), jobs=3 * (i + 1))
            for i, k in enumerate(keys[request.group_by])
        ]  # fmt: skip
        return pb.UsageResponse(rows=rows, group_by=request.group_by)

    def last(self, kind: type[Any]) -> Any:
        """The last request of this message type."""
        return next(r for r in reversed(self.requests) if isinstance(r, kind))


@dataclass
class RunningFake:
    address: str
    service: FakeScheduler


@pytest.fixture
def sched() -> Iterator[RunningFake]:
    """A fresh fake scheduler on a free local port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service = FakeScheduler()
    pb_grpc.add_SchedulerServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield RunningFake(f"127.0.0.1:{port}", service)
    server.stop(None).wait()


@pytest.fixture
def client(sched: RunningFake) -> Iterator[SchedulerClient]:
    with SchedulerClient(sched.address, "admin-token", timeout_s=10) as c:
        yield c


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


# ---------------------------------------------------------------------- the SDK


def test_jobs_are_plain_records_and_requests_carry_the_arguments(
    sched: RunningFake, client: SchedulerClient
) -> None:
    result = client.submit(SPEC, request_id="nightly-1")
    job = result.job
    assert isinstance(job, JobInfo) and not result.duplicate
    assert (job.id, job.name, job.queue, job.owner, job.state) == (
        "job-1", "resnet-ft", "vision", "admin", "pending",
    )  # fmt: skip
    assert (job.replicas, job.min_replicas, job.gpu_milli, job.gpus) == (4, 2, 1000, 4.0)
    assert job.labels == {"team": "cv"} and job.priority == 1000 and not job.terminal
    assert job.history[0].reason == "submitted"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "running"  # type: ignore[misc]

    again = client.submit(SPEC, request_id="nightly-1")
    assert again.duplicate and again.job.id == "job-1"
    dry = client.submit(SPEC, dry_run=True)
    assert dry.job.id == "" and sched.service.last(pb.SubmitJobRequest).dry_run
    assert len(client.list()) == 1

    assert client.get("job-1") == client.get("resnet-ft") == job
    assert [j.id for j in client.list(queue="vision", state="active", owner="admin")] == ["job-1"]
    sent = sched.service.last(pb.ListJobsRequest)
    assert (sent.queue, sent.state, sent.owner, sent.limit) == ("vision", "active", "admin", 100)
    assert client.list(state="running") == []

    sched.service.advance("job-1", "running")
    running = client.get("job-1")
    assert running.placements[0].shares() == ((0, 1000),) and running.started_ms > 0
    cancelled = client.cancel("job-1", reason="wrong data")
    assert cancelled.state == "cancelled" and cancelled.terminal
    assert cancelled.history[-1].reason == "wrong data"


def test_server_errors_become_typed_errors_with_the_message(
    sched: RunningFake, client: SchedulerClient
) -> None:
    with pytest.raises(InvalidInput, match=r"spec\.replicas: .*greater than or equal to 1"):
        client.submit(SPEC.replace("replicas: 4", "replicas: 0"))
    with pytest.raises(RemoteNotFound, match="job 'nope' not found"):
        client.get("nope")
    job = client.submit(SPEC).job
    with SchedulerClient(sched.address, "viewer-token") as viewer:
        with pytest.raises(RemotePermissionDenied, match=f"'viewer' may not cancel job/{job.id}"):
            viewer.cancel(job.id)
    client.cancel(job.id)
    with pytest.raises(Conflict, match="is cancelled"):
        client.cancel(job.id)
    with SchedulerClient(sched.address, "stolen") as stranger:
        with pytest.raises(Unauthenticated, match="unknown token"):
            stranger.nodes()
    with SchedulerClient(_dead_address(), "t", timeout_s=5) as c:
        with pytest.raises(Unavailable, match=r"scheduler service at .* is unreachable"):
            c.queues()
        with pytest.raises(Unavailable, match="unreachable"):
            list(c.watch())


def test_arguments_are_checked_before_sending(client: SchedulerClient) -> None:
    with pytest.raises(InvalidInput, match="the job spec is empty"):
        client.submit("  \n")
    with pytest.raises(InvalidInput, match="a job id or name is needed"):
        client.get("")
    with pytest.raises(InvalidInput, match="limit must be 0 or more"):
        client.list(limit=-1)
    with pytest.raises(InvalidInput, match="tail must be 0 or more"):
        client.logs("job-1", tail=-5)
    with pytest.raises(InvalidInput, match="weight must be 0 or more, not -1"):
        client.set_quota("q", gpus=1, cpus=1, memory_mib=1, weight=-1)
    with pytest.raises(InvalidInput, match="cannot group usage by 'team'"):
        client.usage("team")


def test_a_watch_can_be_cancelled_from_another_thread(client: SchedulerClient) -> None:
    client.submit(SPEC)
    seen: list[JobInfo] = []
    with client.watch() as updates:
        timer = threading.Timer(0.3, updates.cancel)
        timer.start()
        seen.extend(updates)  # blocks until cancelled: the fake never ends a watch
        timer.join()
    assert [j.id for j in seen] == ["job-1"]


def test_logs_arrive_as_the_server_sends_them(sched: RunningFake, client: SchedulerClient) -> None:
    job = client.submit(SPEC).job
    sched.service.logs[job.id] = [
        pb.LogLine(at_ms=w, worker=w, stream="stdout", text=f"kept {w}") for w in range(3)
    ]
    assert [line.text for line in client.logs(job.id, tail=2)] == ["kept 1", "kept 2"]
    assert sched.service.last(pb.JobLogsRequest).tail == 2
    with client.logs(job.id, follow=True, tail=1) as lines:
        assert next(lines).text == "kept 2"
        sched.service.log_feed.put(pb.LogLine(worker=1, stream="stderr", text="epoch 1"))
        assert next(lines).text == "epoch 1"  # delivered while the stream is still open
        sched.service.log_feed.put(None)
        assert list(lines) == []


def test_set_quota_sends_every_number(sched: RunningFake, client: SchedulerClient) -> None:
    q = client.set_quota(
        "research", gpus=8, cpus=64.5, memory_mib=65536, cohort="lab", weight=2,
        borrowing_limit=Resources(gpus=4),
    )  # fmt: skip
    sent = sched.service.last(pb.SetQuotaRequest)
    assert (sent.quota.gpus, sent.quota.cpus, sent.quota.memory_mib) == (8, 64.5, 65536)
    assert sent.has_borrowing_limit and sent.borrowing_limit.gpus == 4
    assert (q.name, q.cohort, q.weight) == ("research", "lab", 2)
    assert q.quota == Resources(8, 64.5, 65536)
    assert q.borrowing_limit == Resources(gpus=4)
    plain = client.set_quota("solo", gpus=1, cpus=2, memory_mib=3)
    assert not sched.service.last(pb.SetQuotaRequest).has_borrowing_limit
    assert plain.borrowing_limit is None and plain.weight == 1


# ---------------------------------------------------------------------- the CLI


@dataclass
class Result:
    code: int
    out: str
    err: str


Gantry = Callable[..., Result]


@pytest.fixture
def data_dir(sched: RunningFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory whose run file points at the fake, and the admin token in the env."""
    port = int(sched.address.rsplit(":", 1)[1])
    write_run_file(tmp_path, "scheduler", host="127.0.0.1", grpc_port=port, metrics_port=0)
    monkeypatch.setenv("GANTRY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GANTRY_TOKEN", "admin-token")
    monkeypatch.setenv("COLUMNS", "250")
    return tmp_path


@pytest.fixture
def gantry(data_dir: Path) -> Gantry:
    """Run ``gantry ARGS`` with typer's CliRunner; no traceback may reach the user."""
    runner = CliRunner()

    def run(*args: str | Path, obj: State | None = None) -> Result:
        result = runner.invoke(cli.app, [str(a) for a in args], obj=obj)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert "Traceback" not in result.output
        return Result(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(SPEC)
    return path


def test_submit_prints_the_job_and_reports_bad_files_cleanly(
    sched: RunningFake, gantry: Gantry, spec_file: Path, tmp_path: Path
) -> None:
    ok = gantry("jobs", "submit", spec_file, "--request-id", "r-1")
    assert ok.code == 0, ok.err
    assert "submitted job job-1 (resnet-ft) to queue vision: pending" in ok.out
    assert "queue vision is at its quota" in ok.out
    assert sched.service.last(pb.SubmitJobRequest).request_id == "r-1"
    again = gantry("jobs", "submit", spec_file, "--request-id", "r-1")
    assert again.code == 0 and "job-1 (resnet-ft) was already submitted with request id r-1" in (
        again.out
    )
    dry = gantry("jobs", "submit", spec_file, "--dry-run")
    assert dry.code == 0 and "dry run: job resnet-ft is valid" in dry.out
    assert len(sched.service.jobs) == 1

    missing = gantry("jobs", "submit", tmp_path / "nope.yaml")
    assert missing.code == 2 and "gantry: error: no job file" in missing.err
    assert "nope.yaml" in missing.err and "gantry: hint:" in missing.err
    folder = gantry("jobs", "submit", tmp_path)
    assert folder.code == 2 and "is a directory, not a job file" in folder.err
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.replace("module: train", "module: train, shell: bash"))
    invalid = gantry("jobs", "submit", bad)
    assert invalid.code == 2
    assert "gantry: error: the job spec is invalid:" in invalid.err
    assert "spec.entrypoint.shell: is not a known field" in invalid.err
    both = gantry("jobs", "submit", spec_file, "--dry-run", "--watch")
    assert both.code == 2 and "--watch follows a submitted job" in both.err


def test_submit_watch_follows_the_job_until_it_ends(
    sched: RunningFake, gantry: Gantry, spec_file: Path
) -> None:
    def play(job_id: str) -> None:
        sched.service.advance(job_id, "scheduled", "placed on node-a")
        sched.service.advance(job_id, "running")
        sched.service.advance(job_id, "succeeded", "exit 0")

    sched.service.on_watch = play
    done = gantry("jobs", "submit", spec_file, "--watch")
    assert done.code == 0, done.err
    assert _states(done.out) == ["pending", "scheduled", "running", "succeeded"]
    assert "4/4 workers" in done.out and "exit 0" in done.out

    sched.service.on_watch = lambda job_id: sched.service.advance(job_id, "failed", "OOM")
    failed = gantry("jobs", "submit", spec_file, "-w")
    assert failed.code == 1 and "failed" in failed.out and "OOM" in failed.out


def _states(out: str) -> list[str]:
    """The job state each printed line shows, in order."""
    states = ("pending", "scheduled", "running", "stopping", "succeeded", "failed", "cancelled")
    return [word for line in out.splitlines() for word in line.split() if word in states]


def test_list_and_get(sched: RunningFake, gantry: Gantry, spec_file: Path) -> None:
    for _ in range(2):
        assert gantry("jobs", "submit", spec_file).code == 0
    sched.service.advance("job-2", "running", workers=3)
    table = gantry("jobs", "list", "--queue", "vision", "--state", "active", "--limit", "5")
    assert table.code == 0 and "2 jobs" in table.out
    row = next(line for line in table.out.splitlines() if "job-2" in line)
    assert all(cell in row for cell in ("resnet-ft", "vision", "running", "3/4", "3"))
    assert "queue vision is at its quota" in table.out and "1m" in table.out  # pending reason, age
    sent = sched.service.last(pb.ListJobsRequest)
    assert (sent.queue, sent.state, sent.limit) == ("vision", "active", 5)
    listed = json.loads(gantry("jobs", "list", "--json").out)
    assert [j["id"] for j in listed] == ["job-1", "job-2"] and listed[1]["workers"] == 3

    pending = gantry("jobs", "get", "job-1")
    assert pending.code == 0
    assert "job job-1 (resnet-ft): pending" in pending.out
    assert "why pending: waiting for 4 GPUs" in pending.out
    assert "2..4 (elastic)" in pending.out and "team=cv" in pending.out
    assert "history" in pending.out and "submitted" in pending.out
    running = gantry("jobs", "get", "job-2")
    assert "placements" in running.out and "node-a" in running.out
    doc = json.loads(gantry("jobs", "get", "job-2", "--json").out)
    assert doc["state"] == "running" and doc["placements"][2]["gpu_index"] == [2]
    assert doc["spec_yaml"] == SPEC
    missing = gantry("jobs", "get", "nope")
    assert missing.code == 2 and "gantry: error: job 'nope' not found" in missing.err


def test_get_shows_what_a_job_left(sched: RunningFake, gantry: Gantry, spec_file: Path) -> None:
    gantry("jobs", "submit", spec_file)
    sched.service.advance("job-1", "succeeded", "all workers finished")
    with sched.service.lock:
        job = sched.service.jobs["job-1"]
        job.model, job.dataset_version = "churn-classifier:4", "churn-features@5d0c3e8a1f27"
        job.metrics.update({"accuracy": 0.85213, "eval_loss": 0.3312})

    shown = gantry("jobs", "get", "job-1")
    assert shown.code == 0
    assert "churn-classifier:4" in shown.out
    assert "dataset version" in shown.out and "churn-features@5d0c3e8a1f27" in shown.out
    assert "accuracy=0.8521, eval_loss=0.3312" in shown.out
    doc = json.loads(gantry("jobs", "get", "job-1", "--json").out)
    assert doc["metrics"] == {"accuracy": 0.85213, "eval_loss": 0.3312}
    assert doc["dataset_version"] == "churn-features@5d0c3e8a1f27"


def test_watch_one_job_stops_when_it_ends_and_all_jobs_until_the_stream_ends(
    sched: RunningFake, gantry: Gantry, spec_file: Path
) -> None:
    gantry("jobs", "submit", spec_file)
    gantry("jobs", "submit", spec_file)

    def play(job_id: str) -> None:
        if job_id:
            sched.service.advance("job-2", "running")  # another job: not printed
            sched.service.advance(job_id, "running")
            sched.service.advance(job_id, "cancelled", "preempted by prod")
        else:
            sched.service.advance("job-2", "succeeded")
            sched.service.end_watches()

    sched.service.on_watch = play
    one = gantry("jobs", "watch", "job-1")  # the fake keeps the stream open: we must stop
    assert one.code == 1, one.err  # cancelled is not success
    assert "job-2" not in one.out
    assert _states(one.out) == ["pending", "running", "cancelled"]
    assert "preempted by prod" in one.out
    again = gantry("jobs", "watch", "job-1")
    assert again.code == 1 and again.out.count("\n") == 1  # already over: one line

    every = gantry("jobs", "watch")
    assert every.code == 0
    assert "job-1" in every.out and every.out.count("job-2") == 2  # current, then succeeded
    assert "succeeded" in every.out.splitlines()[-1]


def test_cancel(sched: RunningFake, gantry: Gantry, spec_file: Path) -> None:
    gantry("jobs", "submit", spec_file)
    done = gantry("jobs", "cancel", "job-1", "--reason", "bad data")
    assert done.code == 0 and "job job-1 (resnet-ft): cancelled" in done.out
    assert sched.service.jobs["job-1"].history[-1].reason == "bad data"
    denied = gantry("jobs", "cancel", "job-1", "--token", "viewer-token")
    assert denied.code == 2 and "gantry: error: 'viewer' may not cancel job/job-1" in denied.err


class _Gate(io.StringIO):
    """Console output that says when a text has been written (and flushed)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def flush(self) -> None:
        if self.text in self.getvalue():
            self.seen.set()


def test_logs_and_follow(sched: RunningFake, gantry: Gantry, spec_file: Path) -> None:
    gantry("jobs", "submit", spec_file)
    sched.service.logs["job-1"] = [
        pb.LogLine(worker=0, stream="stdout", text="loading [data]\n"),
        pb.LogLine(worker=1, stream="gantry", text="placed on node-a"),
    ]
    kept = gantry("jobs", "logs", "job-1")
    assert kept.code == 0 and kept.out == "w0| loading [data]\nw1 gantry| placed on node-a\n"
    tail = gantry("jobs", "logs", "job-1", "--tail", "1")
    assert tail.out == "w1 gantry| placed on node-a\n"

    # --follow prints each line as it comes: the fake sends the next line only after the
    # CLI has printed the first one, so buffering until the end would never finish.
    out = _Gate("placed on node-a")

    def feed() -> None:
        if out.seen.wait(10):
            sched.service.log_feed.put(pb.LogLine(worker=0, text="epoch 1 loss 0.31"))
        sched.service.log_feed.put(None)

    feeder = threading.Thread(target=feed)
    feeder.start()
    settings = load_settings(ClientSettings)
    followed = gantry("jobs", "logs", "job-1", "-f", obj=State(settings, out=Console(file=out)))
    feeder.join()
    assert followed.code == 0 and out.seen.is_set()
    assert out.getvalue().splitlines()[-1] == "w0| epoch 1 loss 0.31"
    assert sched.service.last(pb.JobLogsRequest).follow
    missing = gantry("jobs", "logs", "nope")
    assert missing.code == 2 and "job 'nope' not found" in missing.err


def test_nodes_list(gantry: Gantry) -> None:
    table = gantry("nodes", "list")
    assert table.code == 0 and "2 nodes" in table.out
    a = next(line for line in table.out.splitlines() if "node-a" in line)
    assert all(cell in a for cell in ("general", "ready", "A100 4.5/8", "40/64", "256Gi/512Gi"))
    assert "job-1" in a
    b = next(line for line in table.out.splitlines() if "node-b" in line)
    assert "degraded (gpu 1 xid 79)" in b and "T4 2/2" in b
    nodes = json.loads(gantry("nodes", "list", "--json").out)
    assert nodes[0]["name"] == "node-a" and len(nodes[0]["gpus"]) == 8
    assert nodes[1]["gpus"][0] == {"index": 0, "model": "T4", "memory_mib": 0, "free_milli": 1000}


def test_queues_list_and_set_quota(sched: RunningFake, gantry: Gantry) -> None:
    table = gantry("queues", "list")
    row = next(line for line in table.out.splitlines() if "vision" in line)
    assert all(cell in row for cell in ("lab", "4/16", "32/256", "128Gi/2Ti", "8 GPUs", "25%"))
    queues = json.loads(gantry("queues", "list", "--json").out)
    assert queues[0]["quota"] == {"gpus": 16, "cpus": 256, "memory_mib": 2 << 20}

    new = gantry("queues", "set-quota", "research", "--gpus", "8", "--cpus", "64",
                 "--memory", "64Gi", "--cohort", "lab", "--weight", "2",
                 "--borrowing-limit-gpus", "4")  # fmt: skip
    assert new.code == 0, new.err
    assert "created queue research: quota 8 GPUs, 64 CPUs, 64Gi memory" in new.out
    sent = sched.service.last(pb.SetQuotaRequest)
    assert (sent.quota.gpus, sent.quota.cpus, sent.quota.memory_mib) == (8, 64, 65536)
    assert (sent.cohort, sent.weight) == ("lab", 2)
    assert sent.has_borrowing_limit and sent.borrowing_limit.gpus == 4

    # Options left out keep the queue's current values; weight 0 asks the service to keep it.
    kept = gantry("queues", "set-quota", "vision", "--gpus", "20")
    assert kept.code == 0 and "updated queue vision" in kept.out
    sent = sched.service.last(pb.SetQuotaRequest)
    assert (sent.quota.gpus, sent.quota.cpus, sent.quota.memory_mib) == (20, 256, 2 << 20)
    assert (sent.cohort, sent.weight, sent.borrowing_limit.gpus) == ("lab", 0, 8)

    bad = gantry("queues", "set-quota", "vision", "--gpus", "1", "--memory", "lots")
    assert bad.code == 2 and "gantry: error: invalid --memory 'lots'" in bad.err
    assert "write e.g. 32Gi" in bad.err
    need = gantry("queues", "set-quota", "vision")
    assert need.code == 2 and "--gpus" in need.err


def test_usage(sched: RunningFake, gantry: Gantry) -> None:
    table = gantry("usage", "--by", "queue", "--since", "7d")
    assert table.code == 0, table.err
    assert "usage by queue, since" in table.out
    assert table.out.index("research") < table.out.index("vision")  # most GPU-hours first
    assert "total" in table.out and "30.0" in table.out  # 10 + 20 GPU-hours
    sent = sched.service.last(pb.UsageRequest)
    week_ago = int(time.time() * 1000) - 7 * 86_400_000
    assert sent.group_by == "queue" and abs(sent.since_ms - week_ago) < 60_000
    assert sent.until_ms == 0
    rows = json.loads(gantry("usage", "--json").out)
    assert rows[0] == {
        "key": "bob", "gpu_hours": 20.0, "cpu_hours": 160.0, "queueing_hours": 1.0, "jobs": 6,
    }  # fmt: skip
    assert sched.service.last(pb.UsageRequest).since_ms == 0
    bad = gantry("usage", "--by", "team")
    assert bad.code == 2 and "team" in bad.err
    when = gantry("usage", "--since", "yesterday")
    assert when.code == 2 and "gantry: error: invalid time 'yesterday'" in when.err


def test_where_the_scheduler_is_and_when_it_is_down(
    gantry: Gantry, data_dir: Path, spec_file: Path
) -> None:
    host, port = _dead_address().rsplit(":", 1)
    write_run_file(data_dir, "scheduler", host=host, grpc_port=int(port), metrics_port=0)
    down = gantry("jobs", "list")
    assert down.code == 2
    assert f"gantry: error: the scheduler service at {host}:{port} is unreachable" in down.err
    assert "gantry up" in down.err
    (data_dir / "run" / "scheduler.json").unlink()
    unknown = gantry("jobs", "submit", spec_file)
    assert unknown.code == 2
    assert "don't know where the scheduler service is" in unknown.err


def test_unknown_token_is_a_clean_error(gantry: Gantry) -> None:
    result = gantry("queues", "list", "--token", "stolen")
    assert result.code == 2 and result.err.strip() == "gantry: error: unknown token"
