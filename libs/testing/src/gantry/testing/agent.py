"""A minimal node agent: registers real inventory over NATS and runs placed workers as processes.

It stands in for the training agent until that service exists, so the scheduler can be tested
against processes that behave like nodes::

    python -m gantry.testing.agent --node n1 --gpus 4 --gpu-model A100 --gpu-memory 80Gi

What it promises, on the bus (all events signed with the ``training-agent`` service key):

- ``gantry.node.registered`` at start (and again after a reconnect), then
  ``gantry.metrics.node.heartbeat`` every ``heartbeat_s`` with an increasing ``seq``; a
  SIGKILLed agent simply stops heartbeating (and its workers die with it, on Linux).
- For each ``gantry.job.scheduled`` from the scheduler (source ``gantry/scheduler``, a
  ``svc-`` key) that places workers here: one process per worker, ``gantry.job.workers``
  "started", the workers' output as ``gantry.log.job`` batches, then "succeeded" once all of
  this node's workers exited 0, or "failed" as soon as one did not (the others are killed).
  A redelivered event for an attempt seen before starts nothing.
- For each ``gantry.job.stop.requested`` naming this node and an attempt running here:
  SIGTERM, ``grace_s`` to exit, SIGKILL; "checkpointed" with the step the workers wrote to
  ``$GANTRY_CHECKPOINT_DIR/step`` (when there is one), then "stopped".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import importlib
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from gantry.core import (
    CommonSettings,
    GantryError,
    InvalidInput,
    Unavailable,
    configure_logging,
    get_logger,
    load_settings,
    new_id,
)
from gantry.events import Bus, ConsumerRunner, ConsumerSpec, Delivery, PermanentError, Publisher
from gantry.events.catalog import (
    JOB_LOG,
    JOB_SCHEDULED,
    JOB_STOP_REQUESTED,
    JOB_WORKERS,
    NODE_HEARTBEAT,
    NODE_REGISTERED,
    EventData,
    GpuDevice,
    JobLogLines,
    JobScheduled,
    JobStopRequested,
    JobWorkersReported,
    NodeHeartbeat,
    NodeRegistered,
    WorkerPlacement,
)
from gantry.events.envelope import EventEnvelope
from gantry.sched.spec import parse_memory_mib
from gantry.security.keyring import SERVICE_KID_PREFIX, Keyring

#: This process's boot id: a re-registration with another one tells the scheduler that the
#: agent restarted and the workers it ran are gone.
BOOT_ID = uuid.uuid4().hex[:12]
_log = get_logger("gantry.testing.agent")

SERVICE_NAME = "training-agent"
SOURCE = f"gantry/{SERVICE_NAME}"
#: Only the scheduler places and stops jobs; its events must be signed by a service key.
SCHEDULER_SOURCE = "gantry/scheduler"
#: Exit code reported when a worker could not be started at all (as a shell says it).
CANNOT_START = 127

_SAFE_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_LINE_CHARS = 4096
_PR_SET_PDEATHSIG = 1


class AgentOptions(BaseModel):
    """Options of the node agent itself (environment ``GANTRY_AGENT__*``)."""

    heartbeat_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between heartbeats (5): the scheduler declares a node lost after "
        "a few missed ones, so this bounds how fast node loss is noticed.",
    )
    checkpoint_root: Path | None = Field(
        default=None,
        description="Parent of every job's checkpoint directory; default <data_dir>/"
        "checkpoints, shared by all agents with the same data_dir so a requeued job resumes "
        "on another node.",
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="Seconds workers get to checkpoint after SIGTERM when the agent itself "
        "shuts down (10), before SIGKILL.",
    )
    log_flush_s: float = Field(
        default=0.5, gt=0, description="Seconds worker output waits to be batched (0.5)."
    )
    log_batch_lines: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Most lines per gantry.log.job event (100): with lines cut at 4096 "
        "characters a batch of ordinary output stays well under the 256 KiB event limit.",
    )


class AgentSettings(CommonSettings):
    """Everything the agent reads from the environment (``GANTRY_*``), loaded once in main."""

    agent: AgentOptions = Field(default_factory=AgentOptions)

    @property
    def keys_dir(self) -> Path:
        """Where key files live (created by ``gantry admin init``)."""
        return self.data_dir / "keys"

    @property
    def checkpoint_root(self) -> Path:
        """Parent of every job's checkpoint directory."""
        return self.agent.checkpoint_root or self.data_dir / "checkpoints"


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """What a node offers the scheduler: CPUs, memory, GPUs and topology labels."""

    node: str
    pool: str = "default"
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def detect(
        cls,
        node: str,
        pool: str = "default",
        *,
        gpus: bool = True,
        labels: Mapping[str, str] | None = None,
    ) -> NodeInventory:
        """This machine's real CPU count and memory, and its CUDA GPUs when torch sees any
        (``gpus=False`` skips the torch import)."""
        return cls(
            node=node,
            pool=pool,
            cpu_milli=_cpu_count() * 1000,
            memory_mib=_memory_mib(),
            gpus=detect_cuda_gpus() if gpus else (),
            labels=dict(labels or {}),
        )

    def to_event(self, *, heartbeat_s: float) -> NodeRegistered:
        """The registration event for this inventory."""
        return NodeRegistered(
            node=self.node,
            pool=self.pool,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpus=list(self.gpus),
            labels=dict(self.labels),
            heartbeat_s=heartbeat_s,
            agent=f"gantry.testing.agent/{BOOT_ID}",
        )


def declared_gpus(count: int, model: str, memory_mib: int) -> tuple[GpuDevice, ...]:
    """``count`` identical GPUs, for nodes that declare hardware they do not have."""
    return tuple(GpuDevice(index=i, model=model, memory_mib=memory_mib) for i in range(count))


def detect_cuda_gpus() -> tuple[GpuDevice, ...]:
    """The CUDA GPUs torch sees here; none when torch is missing or CUDA unavailable."""
    if importlib.util.find_spec("torch") is None:
        return ()
    torch: Any = importlib.import_module("torch")  # untyped on purpose: mypy need not read it
    if not torch.cuda.is_available():
        return ()
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            GpuDevice(index=index, model=str(props.name), memory_mib=int(props.total_memory) >> 20)
        )
    return tuple(devices)


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):  # the CPUs this process may use (containers, taskset)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _memory_mib() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) >> 10  # kB
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20


# -- what a worker runs, and with which environment ------------------------------------------


def worker_command(spec: Mapping[str, Any]) -> list[str]:
    """The argv of a job's workers from its TrainingJob ``spec``: ``entrypoint.command`` (a
    list, or a string split like a shell would) or ``entrypoint.module`` run by this Python,
    followed by ``entrypoint.args``."""
    entry = spec.get("entrypoint")
    if not isinstance(entry, Mapping):
        raise InvalidInput(
            "job spec has no entrypoint",
            hint="give spec.entrypoint as {module: train} or {command: [python, train.py]}",
        )
    args = entry.get("args") or []
    if isinstance(args, str) or not isinstance(args, Sequence):
        raise InvalidInput("spec.entrypoint.args must be a list of strings")
    module, command = entry.get("module"), entry.get("command")
    if bool(module) == bool(command):
        raise InvalidInput("spec.entrypoint needs exactly one of module or command")
    if module:
        head = [sys.executable, "-m", str(module)]
    elif isinstance(command, str):
        head = shlex.split(command)
    elif isinstance(command, Sequence):
        head = [str(part) for part in command]
    else:
        raise InvalidInput("spec.entrypoint.command must be a list of strings or a string")
    return [*head, *(str(a) for a in args)]


def master_port(job_id: str) -> int:
    """The rendezvous port of a job's workers: the same on every node, below the ephemeral
    port range so it rarely collides with outgoing connections."""
    return 20000 + zlib.crc32(job_id.encode()) % 10000


def worker_environment(
    job: JobScheduled,
    placement: WorkerPlacement,
    *,
    local_rank: int,
    local_world_size: int,
    checkpoint_dir: Path,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The environment of one worker: ``base`` plus the torch.distributed variables and
    Gantry's own (job, attempt, checkpoint directory, resume flag, GPUs)."""
    env = dict(base)
    env.update(
        GANTRY_JOB_ID=job.job_id,
        GANTRY_ATTEMPT=str(job.attempt),
        GANTRY_NODE=placement.node,
        GANTRY_CHECKPOINT_DIR=str(checkpoint_dir),
        GANTRY_GPU_MILLI=str(sum(milli for _, milli in placement.gpus)),
        CUDA_VISIBLE_DEVICES=",".join(str(index) for index, _ in placement.gpus),
        RANK=str(placement.worker),
        WORLD_SIZE=str(len(job.placements)),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port(job.job_id)),
    )
    if job.resume:
        env["GANTRY_RESUME"] = "1"
    else:
        env.pop("GANTRY_RESUME", None)
    return env


def read_step(checkpoint_dir: Path) -> int | None:
    """The training step a worker wrote to ``<checkpoint_dir>/step``, if it wrote one."""
    try:
        step = int((checkpoint_dir / "step").read_text().strip())
    except (OSError, ValueError):
        return None
    return step if step >= 0 else None


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook making a worker die with the agent (Linux ``PR_SET_PDEATHSIG``): a
    SIGKILLed agent is a lost node, and a lost node's workers are gone too."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the agent died before the hook ran
            os._exit(1)

    return hook


# -- running workers --------------------------------------------------------------------------

Fate = Literal["stop", "abort"]
LogStream = Literal["stdout", "stderr", "gantry"]


@dataclass(eq=False)
class _Worker:
    rank: int
    process: asyncio.subprocess.Process
    fate: Fate | None = None  # None: runs to its own end; "stop"/"abort": the agent ends it
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
    job_id: str
    attempt: int
    checkpoint_dir: Path
    correlation_id: str
    causation_id: str
    workers: dict[int, _Worker] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    finished: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.attempt)

    def running(self) -> list[_Worker]:
        return [w for w in self.workers.values() if not w.gone.is_set()]


class _LogBatcher:
    """Worker output lines, batched per (job, attempt, worker, stream) into gantry.log.job."""

    def __init__(self, publisher: Publisher, node: str, options: AgentOptions) -> None:
        self._publisher = publisher
        self._node = node
        self._flush_s = options.log_flush_s
        self._max = options.log_batch_lines
        self._pending: dict[tuple[str, int, int, LogStream], tuple[int, list[str]]] = {}
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()

    def add(self, attempt: _Attempt, worker: int, stream: LogStream, line: str) -> None:
        key = (attempt.job_id, attempt.attempt, worker, stream)
        _, lines = self._pending.setdefault(key, (int(time.time() * 1000), []))
        lines.append(line[:_MAX_LINE_CHARS])
        if len(lines) >= self._max:
            self._full.set()

    async def flush(self) -> None:
        """Publish everything pending now (in the order it was written, per worker)."""
        async with self._lock:
            pending, self._pending = self._pending, {}
            self._full.clear()
            for (job_id, attempt, worker, stream), (at_ms, lines) in pending.items():
                for start in range(0, len(lines), self._max):
                    data = JobLogLines(
                        job_id=job_id,
                        attempt=attempt,
                        node=self._node,
                        worker=worker,
                        stream=stream,
                        lines=lines[start : start + self._max],
                        at_ms=at_ms,
                    )
                    try:
                        await self._publisher.publish(_event(JOB_LOG.type, data, subject=job_id))
                    except GantryError as exc:  # logs are best effort; the job goes on
                        _log.warning("log lines dropped", job=job_id, error=str(exc))

    async def run(self, stopping: asyncio.Event) -> None:
        """Flush every ``log_flush_s`` (sooner when a batch is full) until ``stopping``."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), timeout=self._flush_s)
            await self.flush()
        await self.flush()


def _event(
    type_: str,
    data: EventData,
    *,
    subject: str,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> EventEnvelope:
    return EventEnvelope(
        type=type_,
        source=SOURCE,
        subject=subject,
        actor=f"{SERVICE_KID_PREFIX}{SERVICE_NAME}",
        correlation_id=correlation_id or new_id(),
        causation_id=causation_id,
        data=data.model_dump(mode="json"),
    )


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
    ``ready`` is set once the node has registered and its consumer is bound.
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
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()  # finished attempts
        self._tasks: set[asyncio.Task[None]] = set()
        self._preexec = _die_with_parent()
        self._bus: Bus | None = None
        self._publisher: Publisher | None = None
        self._logs: _LogBatcher | None = None
        self.heartbeats = 0

    def stop(self) -> None:
        """Begin a clean shutdown."""
        self._stopping.set()

    def running_jobs(self) -> list[str]:
        """Jobs with workers running here, for heartbeats."""
        return sorted({a.job_id for a in self._attempts.values() if a.running()})

    async def run(self) -> None:
        """Register, heartbeat and run workers until stopped; then shut down in order."""
        bus = self._bus = await Bus.connect(self.settings.nats, name=f"gantry-agent-{self.node}")
        try:
            await bus.ensure_streams()
            publisher = self._publisher = Publisher(bus, signer=self.key)
            logs = self._logs = _LogBatcher(publisher, self.node, self.options)
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
            _log.info("node agent ready", node=self.node, gpus=len(self.inventory.gpus))
            await self._stopping.wait()

            _log.info("node agent stopping", node=self.node)
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
        await self._publisher.publish(_event(NODE_REGISTERED.type, data, subject=self.node))
        _log.info("node registered", node=self.node, pool=self.inventory.pool)

    async def _heartbeat(self, bus: Bus) -> None:
        interval = self.options.heartbeat_s
        # a heartbeat that cannot be stored within one interval is stale: skip it, do not queue
        beats = Publisher(bus, signer=self.key, ack_timeout_s=interval, retry_for_s=interval)
        reconnects = int(bus.nc.stats.get("reconnects", 0))
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        seq = 0
        while not self._stopping.is_set():
            seq += 1
            try:
                now_reconnects = int(bus.nc.stats.get("reconnects", 0))
                if now_reconnects != reconnects:  # the server may have forgotten us
                    reconnects = now_reconnects
                    await self._register()
                data = NodeHeartbeat(node=self.node, seq=seq, jobs=self.running_jobs())
                await beats.publish(_event(NODE_HEARTBEAT.type, data, subject=self.node))
                self.heartbeats = seq
            except GantryError as exc:
                _log.warning("heartbeat not sent", node=self.node, seq=seq, error=str(exc))
            next_at = max(next_at + interval, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=next_at - loop.time())

    # -- the JOBS stream -----------------------------------------------------------------------

    async def _handle(self, batch: Sequence[Delivery]) -> None:
        """Start or stop workers; events other than scheduled/stop are not ours and skipped."""
        ours = (JOB_SCHEDULED.type, JOB_STOP_REQUESTED.type)
        for delivery in batch:  # refuse the whole batch before any side effect
            event = delivery.event
            if event.type in ours and (
                event.source != SCHEDULER_SOURCE
                or not (delivery.signer or "").startswith(SERVICE_KID_PREFIX)
            ):
                raise PermanentError(
                    f"{event.type} from {event.source!r} signed by {delivery.signer!r} is "
                    f"refused: only the scheduler ({SCHEDULER_SOURCE}, a service key) places "
                    "and stops jobs"
                )
        for delivery in batch:
            event = delivery.event
            if event.type == JOB_SCHEDULED.type:
                await self._on_scheduled(event, JobScheduled.model_validate(event.data))
            elif event.type == JOB_STOP_REQUESTED.type:
                self._on_stop(JobStopRequested.model_validate(event.data))

    async def _on_scheduled(self, event: EventEnvelope, job: JobScheduled) -> None:
        mine = sorted((p for p in job.placements if p.node == self.node), key=lambda p: p.worker)
        if not mine:
            return
        key = (job.job_id, job.attempt)
        if key in self._attempts or key in self._seen:
            _log.info("duplicate placement ignored", job=job.job_id, attempt=job.attempt)
            return
        if not _SAFE_JOB_ID.fullmatch(job.job_id) or ".." in job.job_id:
            raise PermanentError(f"job id {job.job_id!r} cannot name a checkpoint directory")
        attempt = _Attempt(
            job_id=job.job_id,
            attempt=job.attempt,
            checkpoint_dir=self.settings.checkpoint_root / job.job_id,
            correlation_id=event.correlation_id,
            causation_id=event.id,
        )
        self._attempts[key] = attempt
        try:
            command = worker_command(job.spec)
            attempt.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            for local_rank, placement in enumerate(mine):
                env = worker_environment(
                    job,
                    placement,
                    local_rank=local_rank,
                    local_world_size=len(mine),
                    checkpoint_dir=attempt.checkpoint_dir,
                    base=os.environ,
                )
                await self._spawn(attempt, placement.worker, command, env)
        except (InvalidInput, OSError) as exc:
            attempt.failed = True
            ranks = [p.worker for p in mine]
            _log.warning("workers could not start", job=job.job_id, error=str(exc))
            for worker in attempt.workers.values():
                worker.fate = "abort"
            await self._terminate(list(attempt.workers.values()), grace_s=0)
            attempt.started.set()  # lets watchers of started workers see the failure
            await self._report(
                attempt, ranks, "failed", exit_code=CANNOT_START, message=f"cannot start: {exc}"
            )
            self._finish(attempt)
            return
        _log.info("workers started", job=job.job_id, attempt=job.attempt, workers=len(mine))
        await self._report(attempt, sorted(attempt.workers), "started")
        attempt.started.set()

    async def _spawn(
        self, attempt: _Attempt, rank: int, command: list[str], env: dict[str, str]
    ) -> None:
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: signals reach the worker's children too
            preexec_fn=self._preexec,
        )
        worker = _Worker(rank=rank, process=process)
        attempt.workers[rank] = worker
        assert process.stdout is not None and process.stderr is not None
        pumps = [
            self._spawn_task(self._pump(attempt, worker, "stdout", process.stdout)),
            self._spawn_task(self._pump(attempt, worker, "stderr", process.stderr)),
        ]
        self._spawn_task(self._watch(attempt, worker, pumps))

    def _spawn_task(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pump(
        self, attempt: _Attempt, worker: _Worker, stream: LogStream, reader: asyncio.StreamReader
    ) -> None:
        def emit(raw: bytes) -> None:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if stream == "stderr" and line.strip():
                worker.last_stderr = line[:_MAX_LINE_CHARS]
            assert self._logs is not None
            self._logs.add(attempt, worker.rank, stream, line)

        buffer = b""
        while chunk := await reader.read(65536):
            *lines, buffer = (buffer + chunk).split(b"\n")
            for raw in lines:
                emit(raw)
            if len(buffer) > _MAX_LINE_CHARS * 4:  # a very long line: cut it
                emit(buffer)
                buffer = b""
        if buffer:
            emit(buffer)

    async def _watch(
        self, attempt: _Attempt, worker: _Worker, pumps: list[asyncio.Task[None]]
    ) -> None:
        """Wait for the worker to end; report its end unless the agent ended it."""
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
        if worker.fate is not None:
            return
        await attempt.started.wait()
        if attempt.failed or attempt.finished:
            return
        if worker.returncode != 0:
            attempt.failed = True
            others = [w for w in attempt.running() if w.fate is None]
            for other in others:
                other.fate = "abort"
            message = worker.last_stderr or f"worker {worker.rank} exited with {code}"
            _log.warning(
                "worker failed", job=attempt.job_id, worker=worker.rank, code=worker.returncode
            )
            await self._report(
                attempt,
                sorted([worker.rank, *(w.rank for w in others)]),
                "failed",
                exit_code=worker.returncode,
                message=message,
            )
            await self._terminate(others, grace_s=self.options.shutdown_grace_s)
            self._finish(attempt)
            return
        await self._maybe_complete(attempt)

    async def _maybe_complete(self, attempt: _Attempt) -> None:
        """Once every worker here is gone: report the ones that ran to their end."""
        if attempt.finished or attempt.running():
            return
        self._finish(attempt)
        natural = sorted(w.rank for w in attempt.workers.values() if w.fate is None)
        if natural and not attempt.failed:
            _log.info("workers succeeded", job=attempt.job_id, attempt=attempt.attempt)
            await self._report(attempt, natural, "succeeded")

    def _finish(self, attempt: _Attempt) -> None:
        attempt.finished = True
        self._attempts.pop(attempt.key, None)
        self._seen[attempt.key] = None
        while len(self._seen) > 10_000:
            self._seen.popitem(last=False)

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
        await self._terminate(workers, grace_s=grace_s)
        ranks = sorted(w.rank for w in workers)
        step = read_step(attempt.checkpoint_dir)
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
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=30)

    def _kill_everything(self) -> None:
        for attempt in list(self._attempts.values()):
            for worker in attempt.running():
                worker.signal(signal.SIGKILL)

    async def _report(
        self,
        attempt: _Attempt,
        workers: list[int],
        status: Literal["started", "checkpointed", "succeeded", "failed", "stopped"],
        *,
        exit_code: int = 0,
        message: str = "",
        step: int = 0,
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
        )
        event = _event(
            JOB_WORKERS.type,
            data,
            subject=attempt.job_id,
            correlation_id=attempt.correlation_id,
            causation_id=attempt.causation_id,
        )
        try:
            await self._publisher.publish(event)
        except Unavailable as exc:
            _log.error("worker report lost", job=attempt.job_id, status=status, error=str(exc))


async def serve(settings: AgentSettings, inventory: NodeInventory) -> None:
    """Run an agent until SIGTERM or SIGINT."""
    agent = NodeAgent(settings, inventory)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m gantry.testing.agent``."""
    p = argparse.ArgumentParser(
        prog="python -m gantry.testing.agent",
        description="A test node agent: registers this machine (or declared hardware) with the "
        "scheduler over NATS and runs the workers placed on it. NATS and keys come from "
        "GANTRY_NATS__URL and GANTRY_DATA_DIR like every Gantry service.",
    )
    p.add_argument("--node", default=socket.gethostname(), help="node name (default: hostname)")
    p.add_argument("--pool", default="default", help="node pool (default: default)")
    p.add_argument("--gpus", type=int, help="declare this many GPUs (default: detect via torch)")
    p.add_argument("--gpu-model", default="A100", help="model of declared GPUs (default A100)")
    p.add_argument("--gpu-memory", default="80Gi", help="memory per declared GPU (default 80Gi)")
    p.add_argument("--cpus", type=float, help="declare this many CPUs (default: detect)")
    p.add_argument("--memory", help="declare this much memory, e.g. 256Gi (default: detect)")
    p.add_argument("--rack", help="topology label rack=<RACK>")
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a topology label"
    )
    p.add_argument("--heartbeat", type=float, help="seconds between heartbeats (default 5)")
    p.add_argument("--checkpoint-root", type=Path, help="default <data-dir>/checkpoints")
    p.add_argument("--data-dir", type=Path, help="keys live in <data-dir>/keys")
    return p


def inventory_from_args(args: argparse.Namespace) -> NodeInventory:
    """The inventory the command line declares, detected where it declares nothing."""
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"bad --label {item!r}", hint="write --label key=value")
        labels[key] = value
    if args.rack:
        labels["rack"] = args.rack
    inventory = NodeInventory.detect(args.node, args.pool, gpus=args.gpus is None, labels=labels)
    changes: dict[str, Any] = {}
    try:
        if args.gpus is not None:
            memory = parse_memory_mib(args.gpu_memory)
            changes["gpus"] = declared_gpus(args.gpus, args.gpu_model, memory)
        if args.memory is not None:
            changes["memory_mib"] = parse_memory_mib(args.memory)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if args.cpus is not None:
        changes["cpu_milli"] = int(args.cpus * 1000)
    return dataclasses.replace(inventory, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gantry.testing.agent``."""
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    agent: dict[str, Any] = {}
    if args.heartbeat is not None:
        agent["heartbeat_s"] = args.heartbeat
    if args.checkpoint_root is not None:
        agent["checkpoint_root"] = args.checkpoint_root
    if agent:
        overrides["agent"] = agent
    try:
        inventory = inventory_from_args(args)  # a bad flag fails before anything starts
        settings = load_settings(AgentSettings, **overrides)
        configure_logging(SERVICE_NAME, level=settings.log_level, json=settings.log_json)
        asyncio.run(serve(settings, inventory))
    except GantryError as exc:
        print(f"gantry-agent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def spawn_agent(
    nats_url: str,
    data_dir: Path,
    node: str,
    *,
    pool: str = "default",
    gpus: int = 0,
    heartbeat_s: float = 0.2,
    args: Sequence[str] = (),
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start an agent as a separate process (one a test can SIGKILL), logging to
    ``log_path`` (default ``<data_dir>/agent-<node>.log``). ``gpus`` GPUs are declared, so no
    torch import slows the start; the caller kills and waits for the process."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or data_dir / f"agent-{node}.log"
    command = [
        sys.executable,
        "-m",
        "gantry.testing.agent",
        "--node",
        node,
        "--pool",
        pool,
        "--gpus",
        str(gpus),
        "--heartbeat",
        str(heartbeat_s),
        "--data-dir",
        str(data_dir),
        *args,
    ]
    child_env = {**os.environ, **(env or {}), "GANTRY_NATS__URL": nats_url}
    with log_path.open("ab") as log:
        return subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT)


__all__ = [
    "CANNOT_START",
    "SCHEDULER_SOURCE",
    "SOURCE",
    "AgentOptions",
    "AgentSettings",
    "NodeAgent",
    "NodeInventory",
    "build_parser",
    "declared_gpus",
    "detect_cuda_gpus",
    "inventory_from_args",
    "main",
    "master_port",
    "read_step",
    "serve",
    "spawn_agent",
    "worker_command",
    "worker_environment",
]

if __name__ == "__main__":
    sys.exit(main())
