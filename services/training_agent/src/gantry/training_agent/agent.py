"""The node agent: registers the node, runs the workers placed on it, reports everything.

What it promises, on the bus (all events signed with the ``training-agent`` service key):

- ``gantry.node.registered`` at start (and again after a reconnect), then
  ``gantry.metrics.node.heartbeat`` every ``heartbeat_s`` with the node's utilisation; a
  SIGKILLed agent simply stops heartbeating (and its workers die with it, on Linux).
- For each ``gantry.job.scheduled`` from the scheduler (source ``gantry/scheduler``, a
  ``svc-`` key) that places workers here: the job's data grant from governance (when it reads
  data), its input model downloaded from the registry into ``<job dir>/model`` (when the spec
  names ``model``; ``GANTRY_MODEL_DIR`` points there; a failed download fails the job), one
  process per worker with the rendezvous environment, ``gantry.job.workers``
  "started", the workers' output as ``gantry.log.job`` batches, their progress as
  ``gantry.metrics.job.progress``, their step timings as ``gantry.metrics.job.step`` and rank
  0's evaluations during training (``eval_every``) as ``gantry.metrics.job.evaluation``.
- A worker that crashes after training began restarts the node's workers from the last
  checkpoint ("restarted"), up to ``restart_limit`` times; past it, or a worker that fails
  before its first step, reports "failed" with the worker's last error line.
- Once all of this node's workers exit 0, where rank 0 ran: the metrics it wrote
  (``metrics.json``; a malformed file is noted in the job's log and ignored), the model it
  exported registered in the governance registry (with the job, its dataset versions, code
  version and metrics), and for a spec with ``output`` the Parquet files under
  ``$GANTRY_OUTPUT_DIR/dataset/`` committed as a version of that dataset on the job's behalf
  (a refusal fails the job, and the files are kept); then "succeeded" carries the metrics, the
  model and the dataset version.
- For each ``gantry.job.stop.requested`` naming this node and an attempt running here:
  SIGTERM (the runtime checkpoints at the next step boundary), ``grace_s`` to exit, SIGKILL;
  "checkpointed" with the stored step, then "stopped".
- For each ``gantry.job.trace.requested`` from the profiler (source ``gantry/profiler``, a
  ``svc-`` key) for an attempt running here: the request to this node's workers of the asked
  ranks, then what they record uploaded to the profiler (:mod:`gantry.training_agent.traces`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gantry.core import GantryError, Unavailable, get_logger
from gantry.core.health import HealthServer, connected
from gantry.events import Bus, ConsumerRunner, ConsumerSpec, Delivery, PermanentError, Publisher
from gantry.events.catalog import (
    JOB_EVALUATION,
    JOB_PROGRESS,
    JOB_SCHEDULED,
    JOB_STEP_METRICS,
    JOB_STOP_REQUESTED,
    JOB_WORKERS,
    NODE_HEARTBEAT,
    NODE_REGISTERED,
    TRACE_REQUESTED,
    JobEvaluation,
    JobProgress,
    JobScheduled,
    JobStepMetrics,
    JobStopRequested,
    JobWorkersReported,
    NodeHeartbeat,
    TraceRequested,
    WorkerPlacement,
)
from gantry.events.envelope import EventEnvelope
from gantry.security.keyring import SERVICE_KID_PREFIX, Keyring
from gantry.security.tls import nats_tls
from gantry.training.outputs import MAX_METRIC_NAME, MAX_METRICS
from gantry.training_agent.governance import GovernanceLink, Grant
from gantry.training_agent.inventory import NodeInventory, UsageSampler
from gantry.training_agent.launch import (
    die_with_parent,
    read_step,
    worker_command,
    worker_environment,
    write_spec,
)
from gantry.training_agent.logs import (
    MAX_LINE_CHARS,
    SERVICE_NAME,
    LogBatcher,
    LogStream,
    event,
)
from gantry.training_agent.outputs import (
    OutputRefused,
    commit_output,
    fetch_input_model,
    job_metrics,
    register_model,
)
from gantry.training_agent.settings import AgentSettings
from gantry.training_agent.traces import (
    PROFILER_SOURCE,
    ProfilerLink,
    TraceRelay,
    prepare_trace_dir,
    trace_dir,
)

_log = get_logger("gantry.training_agent")

#: Only the scheduler places and stops jobs; its events must be signed by a service key.
SCHEDULER_SOURCE = "gantry/scheduler"
#: Exit code reported when a worker could not be started at all (as a shell says it).
CANNOT_START = 127
#: Worker exit codes that no restart can cure: a misconfigured job, an exhausted DP budget.
_FINAL_EXIT_CODES = (2, 3)
_RESTART_GRACE_S = 5.0

_SAFE_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

Fate = Literal["stop", "abort", "restart"]
Status = Literal["started", "checkpointed", "restarted", "succeeded", "failed", "stopped"]


@dataclass(eq=False)
class _Worker:
    rank: int
    generation: int
    process: asyncio.subprocess.Process
    fate: Fate | None = None  # None: runs to its own end; otherwise the agent ends it
    returncode: int | None = None
    last_stderr: str = ""
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    def signal(self, signum: int) -> None:
        """Signal the worker's whole process group (it leads its own session)."""
        if self.returncode is None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
        elif not self.gone.is_set():  # exited, but its children hold the pipes open
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)


@dataclass(eq=False)
class _Attempt:
    job: JobScheduled
    mine: list[WorkerPlacement]
    job_dir: Path
    output_dir: Path
    correlation_id: str
    causation_id: str
    workers: dict[int, _Worker] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    finished: bool = False
    restarts: int = 0
    generation: int = 0
    stepped: bool = False  # a worker reported a training step since the last (re)start
    grant: Grant | None = None
    model_dir: Path | None = None  # the job's input model, downloaded
    last_progress: float = 0.0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.attempt)

    def running(self) -> list[_Worker]:
        return [w for w in self.workers.values() if not w.gone.is_set()]


async def _wait_gone(workers: Sequence[_Worker], within_s: float) -> None:
    """Wait up to ``within_s`` seconds for every worker's process to be gone."""
    if not workers or within_s <= 0:
        return
    waits = [asyncio.ensure_future(w.gone.wait()) for w in workers]
    _, pending = await asyncio.wait(waits, timeout=within_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _durable_name(node: str) -> str:
    return "agent-" + re.sub(r"[^A-Za-z0-9_-]", "_", node)


class NodeAgent:
    """One node: registers ``inventory``, heartbeats, runs the workers placed on it.

    :meth:`run` serves until :meth:`stop` (or SIGTERM/SIGINT through :func:`serve`); it then
    stops heartbeating and consuming, stops the workers (reporting "stopped"), and closes NATS.
    ``ready`` is set once the node has registered and its consumer is bound. While it runs, an
    HTTP server on ``health_host``:``health_port`` (:attr:`health_port` once started) answers
    ``/healthz``, ``/readyz`` (ready while the node is registered and NATS connected) and
    ``/metrics``.
    """

    def __init__(
        self,
        settings: AgentSettings,
        inventory: NodeInventory,
        *,
        keyring: Keyring | None = None,
    ) -> None:
        self.settings = settings
        self.options = settings.agent
        self.inventory = inventory
        self.node = inventory.node
        self.keyring = keyring or Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.governance = GovernanceLink(settings, self.keyring)
        profiler = ProfilerLink(settings, self.governance.token)
        self.traces = TraceRelay(profiler, self.node, wait_s=self.options.trace_wait_s)
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()  # finished attempts
        self._tasks: set[asyncio.Task[None]] = set()
        self._preexec = die_with_parent()
        self._bus: Bus | None = None
        self._publisher: Publisher | None = None
        self._metrics: Publisher | None = None
        self._logs: LogBatcher | None = None
        self._usage = UsageSampler()
        self.heartbeats = 0
        self.probes = HealthServer()
        self._registered = self.probes.flag("node", down="not registered")
        self.probes.add_check("nats", connected(self._nats_connected))

    def stop(self) -> None:
        """Begin a clean shutdown."""
        self._stopping.set()

    def running_jobs(self) -> list[str]:
        """Jobs with workers running here, for heartbeats."""
        return sorted({a.job_id for a in self._attempts.values() if a.running()})

    @property
    def health_port(self) -> int:
        """The port of the health server (once :meth:`run` started it)."""
        return self.probes.port

    def _nats_connected(self) -> bool:
        bus = self._bus
        return bus is not None and bool(bus.nc.is_connected)

    async def run(self) -> None:
        """Register, heartbeat and run workers until stopped; then shut down in order."""
        self.probes.start(self.options.health_port, self.options.health_host)
        try:
            await self._run()
        finally:
            self._registered.clear()
            self.probes.stop()

    async def _run(self) -> None:
        bus = self._bus = await Bus.connect(
            self.settings.nats, name=f"gantry-agent-{self.node}", tls=nats_tls(self.settings.tls)
        )
        try:
            await bus.ensure_streams()
            publisher = self._publisher = Publisher(bus, signer=self.key)
            # metrics are frequent and short-lived: a publish that cannot be stored soon is
            # dropped rather than queued behind the job's reports
            self._metrics = Publisher(bus, signer=self.key, ack_timeout_s=2.0, retry_for_s=2.0)
            logs = self._logs = LogBatcher(publisher, self.node, self.options)
            runner = ConsumerRunner(
                bus,
                ConsumerSpec(
                    durable=_durable_name(self.node),
                    stream="JOBS",
                    filter_subject="gantry.job.>",
                    batch_size=50,
                    fetch_timeout_s=0.5,
                ),
                self._handle,
                publisher=publisher,
                verifier=self.keyring.trust(),
            )
            await self._register()
            consumer = asyncio.create_task(runner.run(), name=f"agent-{self.node}-jobs")
            heartbeat = asyncio.create_task(self._heartbeat(bus), name="heartbeat")
            flusher = asyncio.create_task(logs.run(self._stopping), name="logs")
            self.ready.set()
            self._registered.set()
            _log.info(
                "node agent ready",
                node=self.node,
                health=self.probes.port,
                gpus=len(self.inventory.gpus),
                offers=self.inventory.describe(),
                address=self.inventory.address,
            )
            await self._stopping.wait()

            _log.info("node agent stopping", node=self.node)
            self._registered.clear()
            runner.stop()
            await heartbeat
            await consumer
            await self._stop_everything()
            await flusher
            await logs.flush()
        finally:
            self._kill_everything()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await bus.close()
            _log.info("node agent stopped", node=self.node)

    # -- registration and heartbeats ---------------------------------------------------------

    async def _register(self) -> None:
        assert self._publisher is not None
        data = self.inventory.to_event(heartbeat_s=self.options.heartbeat_s)
        await self._publisher.publish(event(NODE_REGISTERED.type, data, subject=self.node))
        _log.info("node registered", node=self.node, pool=self.inventory.pool)

    def _heartbeat_data(self, seq: int) -> NodeHeartbeat:
        gpus = self._usage.gpus()
        return NodeHeartbeat(
            node=self.node,
            seq=seq,
            jobs=self.running_jobs(),
            gpu_util=sum(g.util for g in gpus) / len(gpus) if gpus else 0.0,
            cpu_util=self._usage.cpu_util(),
            memory_used_mib=self._usage.memory_used_mib(),
            gpus=gpus,
            **self._usage.network(),
        )

    async def _heartbeat(self, bus: Bus) -> None:
        interval = self.options.heartbeat_s
        # a heartbeat that cannot be stored within one interval is stale: skip it, do not queue
        beats = Publisher(bus, signer=self.key, ack_timeout_s=interval, retry_for_s=interval)
        reconnects = int(bus.nc.stats.get("reconnects", 0))
        loop = asyncio.get_running_loop()
        next_at = delivered_at = loop.time()
        seq = 0
        while not self._stopping.is_set():
            seq += 1
            try:
                now_reconnects = int(bus.nc.stats.get("reconnects", 0))
                if now_reconnects != reconnects:  # the server may have forgotten us
                    reconnects = now_reconnects
                    await self._register()
                data = self._heartbeat_data(seq)
                await beats.publish(event(NODE_HEARTBEAT.type, data, subject=self.node))
                self.heartbeats = seq
                delivered_at = loop.time()
            except GantryError as exc:
                _log.warning("heartbeat not sent", node=self.node, seq=seq, error=str(exc))
                silent_s = loop.time() - delivered_at
                fence = self.options.fence_after_s
                if fence and silent_s >= fence and self._attempts:
                    await self._fence_all(silent_s)
            next_at = max(next_at + interval, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=next_at - loop.time())

    # -- the JOBS stream -----------------------------------------------------------------------

    async def _handle(self, batch: Sequence[Delivery]) -> None:
        """Start or stop workers, pass on trace requests; other events are not ours."""
        ours = (JOB_SCHEDULED.type, JOB_STOP_REQUESTED.type)
        for delivery in batch:  # refuse the whole batch before any side effect
            ev = delivery.event
            if ev.type in ours and (
                ev.source != SCHEDULER_SOURCE
                or not (delivery.signer or "").startswith(SERVICE_KID_PREFIX)
            ):
                raise PermanentError(
                    f"{ev.type} from {ev.source!r} signed by {delivery.signer!r} is "
                    f"refused: only the scheduler ({SCHEDULER_SOURCE}, a service key) places "
                    "and stops jobs"
                )
            if ev.type == TRACE_REQUESTED.type and (
                ev.source != PROFILER_SOURCE
                or not (delivery.signer or "").startswith(SERVICE_KID_PREFIX)
            ):
                raise PermanentError(
                    f"{ev.type} from {ev.source!r} signed by {delivery.signer!r} is refused: "
                    f"only the profiler ({PROFILER_SOURCE}, a service key) asks for traces"
                )
        for delivery in batch:
            ev = delivery.event
            if ev.type == JOB_SCHEDULED.type:
                await self._on_scheduled(ev, JobScheduled.model_validate(ev.data))
            elif ev.type == JOB_STOP_REQUESTED.type:
                self._on_stop(JobStopRequested.model_validate(ev.data))
            elif ev.type == TRACE_REQUESTED.type:
                self._on_trace(TraceRequested.model_validate(ev.data))

    async def _on_scheduled(self, ev: EventEnvelope, job: JobScheduled) -> None:
        await self._fence_superseded(job)
        mine = sorted((p for p in job.placements if p.node == self.node), key=lambda p: p.worker)
        if not mine:
            return
        key = (job.job_id, job.attempt)
        if key in self._attempts or key in self._seen:
            _log.info("duplicate placement ignored", job=job.job_id, attempt=job.attempt)
            return
        if not _SAFE_JOB_ID.fullmatch(job.job_id) or ".." in job.job_id:
            raise PermanentError(f"job id {job.job_id!r} cannot name a job directory")
        job_dir = self.settings.checkpoint_root / job.job_id
        attempt = _Attempt(
            job=job,
            mine=mine,
            job_dir=job_dir,
            output_dir=job_dir / f"output-{job.attempt}",
            correlation_id=ev.correlation_id,
            causation_id=ev.id,
        )
        self._attempts[key] = attempt
        ranks = [p.worker for p in mine]
        try:
            command = worker_command(job.spec)
            write_spec(job, job_dir)
            if job.datasets:
                attempt.grant = await self._grant(attempt)
            attempt.model_dir = await fetch_input_model(
                self.governance, job, job_dir, functools.partial(self.note, attempt)
            )
            await self._start_workers(attempt, command, resume=job.resume)
        except (GantryError, OSError) as exc:
            attempt.failed = True
            message = exc.message if isinstance(exc, GantryError) else str(exc)
            hint = getattr(exc, "hint", "")
            _log.warning("workers could not start", job=job.job_id, error=message)
            self.note(
                attempt, f"cannot start the workers: {message}" + (f" ({hint})" if hint else "")
            )
            for worker in attempt.workers.values():
                worker.fate = "abort"
            await self._terminate(list(attempt.workers.values()), grace_s=0)
            attempt.started.set()  # lets watchers of started workers see the failure
            await self._report(
                attempt, ranks, "failed", exit_code=CANNOT_START, message=f"cannot start: {message}"
            )
            self._finish(attempt)
            return
        _log.info("workers started", job=job.job_id, attempt=job.attempt, workers=len(mine))
        await self._report(attempt, sorted(attempt.workers), "started")
        attempt.started.set()

    # -- data grants ---------------------------------------------------------------------------

    async def _fence_all(self, silent_s: float) -> None:
        """Stop every worker: this node has been cut off from the platform for ``silent_s``
        seconds, so the scheduler is placing its jobs elsewhere (they resume from their
        checkpoints there)."""
        attempts = [a for a in self._attempts.values() if not a.finished]
        _log.warning(
            "cut off from the platform; stopping every worker",
            node=self.node,
            silent_s=round(silent_s, 1),
            attempts=[f"{a.job_id}#{a.attempt}" for a in attempts],
        )
        for attempt in attempts:
            for worker in attempt.workers.values():
                worker.fate = "abort"
            await self._terminate(list(attempt.workers.values()), grace_s=0)
            self._finish(attempt)

    async def _fence_superseded(self, job: JobScheduled) -> None:
        """Stop this node's workers of an older attempt of ``job``: the scheduler has placed a
        newer one (this node was cut off, or lost, meanwhile), and two attempts must never
        train, and write checkpoints, side by side."""
        stale = [
            a
            for (job_id, number), a in self._attempts.items()
            if job_id == job.job_id and number < job.attempt and not a.finished
        ]
        for attempt in stale:
            _log.warning(
                "older attempt superseded; stopping its workers",
                job=job.job_id,
                attempt=attempt.attempt,
                newer=job.attempt,
            )
            self.note(
                attempt,
                f"attempt {attempt.attempt} was superseded by attempt {job.attempt} "
                "elsewhere: its workers are stopped",
            )
            for worker in attempt.workers.values():
                worker.fate = "abort"
            await self._terminate(list(attempt.workers.values()), grace_s=0)
            self._finish(attempt)

    async def _grant(self, attempt: _Attempt) -> Grant:
        grant = await self.governance.issue_grant(attempt.job)
        self._write_grant(attempt, grant)
        attempt.tasks.append(self._spawn_task(self._renew_grant(attempt)))
        return grant

    def _write_grant(self, attempt: _Attempt, grant: Grant) -> None:
        path = attempt.job_dir / "grant"
        tmp = attempt.job_dir / f".grant.{os.getpid()}.tmp"  # agents may share the directory
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(grant.token)
        tmp.replace(path)

    def _forget_grant(self, attempt: _Attempt) -> None:
        """Remove the attempt's grant file once it ended: a credential is not left on disk
        (unless a later attempt, maybe on another agent, has written its own there)."""
        if attempt.grant is None:
            return
        path = attempt.job_dir / "grant"
        with contextlib.suppress(OSError):
            if path.read_text() == attempt.grant.token:
                path.unlink()

    async def _renew_grant(self, attempt: _Attempt) -> None:
        """Issue a fresh grant when two thirds of the current one's life have passed."""
        while not attempt.finished:
            grant = attempt.grant
            if grant is None:
                return
            left_s = grant.expires_ms / 1000 - time.time()
            await asyncio.sleep(max(1.0, left_s / 3))
            if attempt.finished:
                return
            try:
                renewed = await self.governance.issue_grant(attempt.job)
            except GantryError as exc:
                self.note(attempt, f"data grant not renewed: {exc.message}; retrying")
                await asyncio.sleep(min(30.0, max(1.0, left_s / 10)))
                continue
            attempt.grant = renewed
            self._write_grant(attempt, renewed)
            _log.info("data grant renewed", job=attempt.job_id)

    # -- starting and watching workers --------------------------------------------------------

    async def _start_workers(self, attempt: _Attempt, command: list[str], *, resume: bool) -> None:
        attempt.stepped = False
        attempt.output_dir.mkdir(parents=True, exist_ok=True)
        base = dict(os.environ)
        base["GANTRY_DATA_DIR"] = str(self.settings.worker_data_dir)
        if attempt.grant is not None:
            base["GANTRY_DATA_GRANT"] = attempt.grant.token
            base["GANTRY_DATA_GRANT_FILE"] = str(attempt.job_dir / "grant")
            base["GANTRY_TOKEN"] = self.governance.token()
            base["GANTRY_GOVERNANCE_ADDR"] = self.governance.address()
        for local_rank, placement in enumerate(attempt.mine):
            env = worker_environment(
                attempt.job,
                placement,
                local_rank=local_rank,
                local_world_size=len(attempt.mine),
                job_dir=attempt.job_dir,
                output_dir=attempt.output_dir,
                resume=resume,
                restarts=attempt.restarts,
                cuda_mps=self.options.cuda_mps,
                trace_dir=prepare_trace_dir(attempt.job_dir, attempt.attempt),
                model_dir=attempt.model_dir,
                base=base,
            )
            await self._spawn(attempt, placement.worker, command, env)

    async def _spawn(
        self, attempt: _Attempt, rank: int, command: list[str], env: dict[str, str]
    ) -> None:
        read_fd, write_fd = os.pipe()
        env["GANTRY_PROGRESS_FD"] = str(write_fd)
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own group: signals reach the worker's children too
                preexec_fn=self._preexec,
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        worker = _Worker(rank=rank, generation=attempt.generation, process=process)
        attempt.workers[rank] = worker
        assert process.stdout is not None and process.stderr is not None
        pumps = [
            self._spawn_task(self._pump(attempt, worker, "stdout", process.stdout)),
            self._spawn_task(self._pump(attempt, worker, "stderr", process.stderr)),
            self._spawn_task(self._progress(attempt, worker, read_fd)),
        ]
        self._spawn_task(self._watch(attempt, worker, pumps))

    def _spawn_task(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def note(self, attempt: _Attempt, text: str) -> None:
        """A line of the agent's own in the job's log (``gantry jobs logs`` shows it)."""
        if self._logs is not None:
            self._logs.add(
                attempt.job_id, attempt.attempt, 0, "gantry", f"[agent {self.node}] {text}"
            )

    async def _pump(
        self, attempt: _Attempt, worker: _Worker, stream: LogStream, reader: asyncio.StreamReader
    ) -> None:
        def emit(raw: bytes) -> None:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if stream == "stderr" and line.strip():
                worker.last_stderr = line[:MAX_LINE_CHARS]
            assert self._logs is not None
            self._logs.add(attempt.job_id, attempt.attempt, worker.rank, stream, line)

        buffer = b""
        while chunk := await reader.read(65536):
            *lines, buffer = (buffer + chunk).split(b"\n")
            for raw in lines:
                emit(raw)
            if len(buffer) > MAX_LINE_CHARS * 4:  # a very long line: cut it
                emit(buffer)
                buffer = b""
        if buffer:
            emit(buffer)

    async def _progress(self, attempt: _Attempt, worker: _Worker, fd: int) -> None:
        """Read the worker's progress pipe; publish progress and step metrics."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            while line := await reader.readline():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    await self._on_record(attempt, worker, record)
        finally:
            transport.close()

    async def _on_record(self, attempt: _Attempt, worker: _Worker, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if worker.generation != attempt.generation:
            return
        now = time.time()
        try:
            if kind == "progress":
                attempt.stepped = True
                final = record.get("total_steps") and record.get("step") == record.get(
                    "total_steps"
                )
                if not final and now - attempt.last_progress < self.options.progress_interval_s:
                    return
                attempt.last_progress = now
                data: Any = JobProgress(
                    job_id=attempt.job_id,
                    attempt=attempt.attempt,
                    step=int(record["step"]),
                    total_steps=int(record.get("total_steps") or 0),
                    epoch=int(record.get("epoch") or 0),
                    loss=_finite(record.get("loss")),
                    samples_per_s=max(0.0, float(record.get("samples_per_s") or 0.0)),
                    eta_s=_finite(record.get("eta_s")),
                    at_ms=int(now * 1000),
                )
                await self._publish_metric(JOB_PROGRESS.type, data, attempt)
            elif kind == "steps":
                attempt.stepped = True
                fields = {
                    k: record[k]
                    for k in (
                        "first_step",
                        "last_step",
                        "step_ms",
                        "step_ms_max",
                        "data_ms",
                        "compute_ms",
                        "forward_ms",
                        "backward_ms",
                        "comm_ms",
                        "optimizer_ms",
                        "samples",
                        "tokens",
                        "memory_mib",
                    )
                    if k in record
                }
                data = JobStepMetrics(
                    job_id=attempt.job_id,
                    attempt=attempt.attempt,
                    node=self.node,
                    worker=worker.rank,
                    loss=_finite(record.get("loss")),
                    at_ms=int(now * 1000),
                    **fields,
                )
                await self._publish_metric(JOB_STEP_METRICS.type, data, attempt)
            elif kind == "evaluation":
                data = JobEvaluation(
                    job_id=attempt.job_id,
                    attempt=attempt.attempt,
                    node=self.node,
                    step=int(record["step"]),
                    epoch=int(record["epoch"]),
                    metrics=_evaluation_metrics(record["metrics"]),
                    at_ms=int(now * 1000),
                )
                await self._publish_metric(JOB_EVALUATION.type, data, attempt)
            elif kind == "epsilon":
                self.note(attempt, f"dp-sgd epsilon spent: {float(record['epsilon']):.4f}")
        except (KeyError, TypeError, ValueError) as exc:  # a malformed record: note, go on
            _log.warning("bad progress record", job=attempt.job_id, error=str(exc))

    async def _publish_metric(self, type_: str, data: Any, attempt: _Attempt) -> None:
        assert self._metrics is not None
        try:
            await self._metrics.publish(
                event(type_, data, subject=attempt.job_id, correlation_id=attempt.correlation_id)
            )
        except GantryError as exc:  # metrics are best effort
            _log.debug("metric dropped", job=attempt.job_id, error=str(exc))

    async def _watch(
        self, attempt: _Attempt, worker: _Worker, pumps: list[asyncio.Task[None]]
    ) -> None:
        """Wait for the worker to end; restart or report unless the agent ended it."""
        waiting = asyncio.ensure_future(worker.process.wait())
        try:
            while not (await asyncio.wait({waiting}, timeout=1.0))[0]:
                if worker.process.returncode is not None:
                    worker.signal(signal.SIGKILL)  # left children holding its output pipes
        finally:
            waiting.cancel()  # only when the agent itself is cancelled
        code = waiting.result()
        await asyncio.gather(*pumps, return_exceptions=True)
        worker.returncode = 128 - code if code < 0 else code  # killed by N: 128 + N
        worker.gone.set()
        if worker.fate is not None or worker.generation != attempt.generation:
            return
        await attempt.started.wait()
        if attempt.failed or attempt.finished:
            return
        if worker.returncode != 0:
            await self._on_crash(attempt, worker)
            return
        await self._maybe_complete(attempt)

    async def _on_crash(self, attempt: _Attempt, worker: _Worker) -> None:
        code = worker.returncode or 0
        message = worker.last_stderr or f"worker {worker.rank} exited with {code}"
        others = [w for w in attempt.running() if w.fate is None]
        restartable = (
            code not in _FINAL_EXIT_CODES
            and (attempt.stepped or code > 128)
            and attempt.restarts < self.options.restart_limit
            and not self._stopping.is_set()
        )
        if restartable:
            await self._restart(attempt, worker, others, message)
            return
        attempt.failed = True
        for other in others:
            other.fate = "abort"
        why = ""
        if code in _FINAL_EXIT_CODES:
            why = "; a restart cannot help (misconfigured job or privacy budget spent)"
        elif attempt.stepped and attempt.restarts >= self.options.restart_limit:
            why = f"; restart limit {self.options.restart_limit} reached"
        elif not attempt.stepped and code <= 128:
            why = "; it failed before its first training step, so it was not restarted"
        _log.warning("worker failed", job=attempt.job_id, worker=worker.rank, code=code)
        self.note(attempt, f"worker {worker.rank} failed with exit code {code}: {message}{why}")
        await self._report(
            attempt,
            sorted([worker.rank, *(w.rank for w in others)]),
            "failed",
            exit_code=code,
            message=message,
        )
        await self._terminate(others, grace_s=self.options.shutdown_grace_s)
        self._finish(attempt)

    async def _restart(
        self, attempt: _Attempt, crashed: _Worker, others: list[_Worker], message: str
    ) -> None:
        """Stop the node's other workers and start them all again from the last checkpoint."""
        attempt.restarts += 1
        attempt.generation += 1
        for other in others:
            other.fate = "restart"
        await self._terminate(others, grace_s=_RESTART_GRACE_S)
        step = read_step(attempt.job_dir) or 0
        text = (
            f"worker {crashed.rank} crashed (exit {crashed.returncode}: {message}); restarting "
            f"the workers from the checkpoint of step {step} "
            f"(restart {attempt.restarts} of {self.options.restart_limit})"
        )
        _log.warning("restarting workers", job=attempt.job_id, restarts=attempt.restarts, step=step)
        self.note(attempt, text)
        ranks = sorted(p.worker for p in attempt.mine)
        await self._report(attempt, ranks, "restarted", step=step, message=text)
        await asyncio.sleep(self.options.restart_backoff_s)
        if attempt.finished or attempt.failed or self._stopping.is_set():
            return
        try:
            await self._start_workers(attempt, worker_command(attempt.job.spec), resume=True)
        except (GantryError, OSError) as exc:
            attempt.failed = True
            await self._report(
                attempt, ranks, "failed", exit_code=CANNOT_START, message=f"cannot restart: {exc}"
            )
            self._finish(attempt)

    async def _maybe_complete(self, attempt: _Attempt) -> None:
        """Once every worker here is gone: register the model, report the natural ends."""
        if attempt.finished or attempt.running():
            return
        natural = sorted(
            w.rank
            for w in attempt.workers.values()
            if w.fate is None and w.generation == attempt.generation
        )
        if not natural or attempt.failed:
            self._finish(attempt)
            return
        attempt.finished = True
        model, metrics, dataset_version = "", {}, ""
        if 0 in natural:  # rank 0's node: what the job leaves is here
            note = functools.partial(self.note, attempt)
            metrics = job_metrics(attempt.output_dir, note)
            try:
                model = await register_model(self.governance, attempt.job, attempt.output_dir, note)
                dataset_version = await commit_output(
                    self.governance, attempt.job, attempt.output_dir, note
                )
            except OutputRefused as refused:
                self.note(attempt, refused.text)
                self._finish(attempt)
                await self._report(attempt, natural, "failed", exit_code=0, message=refused.text)
                return
        self._finish(attempt)
        _log.info(
            "workers succeeded",
            job=attempt.job_id,
            attempt=attempt.attempt,
            model=model,
            dataset_version=dataset_version,
        )
        await self._report(
            attempt,
            natural,
            "succeeded",
            model=model,
            metrics=metrics,
            dataset_version=dataset_version,
        )

    def _finish(self, attempt: _Attempt) -> None:
        attempt.finished = True
        for task in attempt.tasks:
            task.cancel()
        self._forget_grant(attempt)
        self._attempts.pop(attempt.key, None)
        self._seen[attempt.key] = None
        while len(self._seen) > 10_000:
            self._seen.popitem(last=False)

    # -- deep traces ---------------------------------------------------------------------------

    def _on_trace(self, request: TraceRequested) -> None:
        """Pass a trace request to this node's workers of the attempt; upload what they record."""
        attempt = self._attempts.get((request.job_id, request.attempt))
        if attempt is None or attempt.finished or attempt.failed:
            return  # not running here
        ranks = [p.worker for p in attempt.mine if not request.ranks or p.worker in request.ranks]
        if not ranks or not self.traces.claim(request.trace_id):
            return
        self.note(attempt, f"deep trace {request.trace_id} of {request.steps} steps, ranks {ranks}")
        directory = trace_dir(attempt.job_dir, attempt.attempt)
        self._spawn_task(self.traces.relay(request, directory, ranks, lambda: not attempt.finished))

    # -- stopping ------------------------------------------------------------------------------

    def _on_stop(self, request: JobStopRequested) -> None:
        if request.nodes and self.node not in request.nodes:
            return
        attempt = self._attempts.get((request.job_id, request.attempt))
        if attempt is None or attempt.failed:
            _log.info("stop for an attempt not running here", job=request.job_id)
            return
        wanted = set(request.workers)
        targets = [
            w for w in attempt.running() if w.fate is None and (not wanted or w.rank in wanted)
        ]
        if not targets:
            return
        for worker in targets:
            worker.fate = "stop"
        self._spawn_task(self._stop_workers(attempt, targets, request.grace_s, request.reason))

    async def _stop_workers(
        self, attempt: _Attempt, workers: list[_Worker], grace_s: float, reason: str
    ) -> None:
        """SIGTERM, grace, SIGKILL; report the checkpoint the workers left, then "stopped"."""
        _log.info("stopping workers", job=attempt.job_id, workers=[w.rank for w in workers])
        self.note(attempt, f"stopping workers {[w.rank for w in workers]} ({reason})")
        await self._terminate(workers, grace_s=grace_s)
        ranks = sorted(w.rank for w in workers)
        step = read_step(attempt.job_dir)
        if step is not None:
            await self._report(attempt, ranks, "checkpointed", step=step)
        await self._report(attempt, ranks, "stopped", message=reason)
        await self._maybe_complete(attempt)

    async def _terminate(self, workers: Sequence[_Worker], *, grace_s: float) -> None:
        alive = [w for w in workers if not w.gone.is_set()]
        for worker in alive:
            worker.signal(signal.SIGTERM)
        await _wait_gone(alive, grace_s)
        stubborn = [w for w in alive if not w.gone.is_set()]
        for worker in stubborn:
            worker.signal(signal.SIGKILL)
        await _wait_gone(stubborn, 10.0)

    async def _stop_everything(self) -> None:
        stops = []
        for attempt in list(self._attempts.values()):
            targets = [w for w in attempt.running() if w.fate is None]
            for worker in targets:
                worker.fate = "stop"
            if targets:
                stops.append(
                    self._stop_workers(attempt, targets, self.options.shutdown_grace_s, "shutdown")
                )
        await asyncio.gather(*stops)
        # failures and stop requests still in hand finish their reports
        pending = {t for t in self._tasks if not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=30)

    def _kill_everything(self) -> None:
        for attempt in list(self._attempts.values()):
            for worker in attempt.running():
                worker.signal(signal.SIGKILL)

    async def _report(
        self,
        attempt: _Attempt,
        workers: list[int],
        status: Status,
        *,
        exit_code: int = 0,
        message: str = "",
        step: int = 0,
        model: str = "",
        metrics: dict[str, float] | None = None,
        dataset_version: str = "",
    ) -> None:
        assert self._publisher is not None and self._logs is not None
        await self._logs.flush()  # a job's output arrives before the news of its end
        data = JobWorkersReported(
            job_id=attempt.job_id,
            attempt=attempt.attempt,
            node=self.node,
            workers=workers,
            status=status,
            exit_code=exit_code,
            message=message[:2000],
            step=step,
            restarts=attempt.restarts,
            model=model,
            metrics=metrics or {},
            dataset_version=dataset_version,
        )
        ev = event(
            JOB_WORKERS.type,
            data,
            subject=attempt.job_id,
            correlation_id=attempt.correlation_id,
            causation_id=attempt.causation_id,
        )
        try:
            await self._publisher.publish(ev)
        except Unavailable as exc:
            _log.error("worker report lost", job=attempt.job_id, status=status, error=str(exc))


def _evaluation_metrics(raw: Any) -> dict[str, float]:
    """An evaluation record's metrics: names to numbers, the non-finite ones left out; a
    ValueError or TypeError for anything else (the record is then dropped)."""
    if not isinstance(raw, dict):
        raise TypeError(f"evaluation metrics are a {type(raw).__name__}, not an object")
    if len(raw) > MAX_METRICS:
        raise ValueError(f"{len(raw)} evaluation metrics, more than {MAX_METRICS}")
    metrics = {}
    for name, value in raw.items():
        if len(name) > MAX_METRIC_NAME:
            raise ValueError(f"an evaluation metric's name is longer than {MAX_METRIC_NAME}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"evaluation metric {name!r} is {value!r}, not a number")
        number = _finite(value)
        if number is not None:
            metrics[name] = number
    return metrics


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number


__all__ = ["CANNOT_START", "SCHEDULER_SOURCE", "NodeAgent"]
