"""The embedded platform behind ``gantry up``: one nats-server, every service and local node
agents, supervised.

:class:`Platform` starts a :class:`~gantry.supervisor.nats_server.NatsServer` under
``<data_dir>/nats``, then each service as a child process ``python -m gantry.<service>``
(services are never imported here), then each :class:`LocalAgent` as a node agent process
``python -m gantry.training_agent`` named ``agent-<node>``. Every child's stdout and stderr are
merged into one log stream, each line prefixed with the child's name. A service is ready when
it has written ``<data_dir>/run/<service>.json`` with its own pid and its gRPC health check
answers SERVING; a node agent is ready when it logs that it registered its node and is ready
(it has no gRPC API: the scheduler learns of it over NATS).

Files the platform keeps under ``<data_dir>/run/``:

    nats.json          {"url": ..., "pid": ...}  where the event bus listens (read by the SDK)

NATS runs with one user per service, as on a cluster (gantry.events.topology): each child gets
its own user and password (``<data_dir>/nats/credentials.env``, mode 0600), so a service can
publish only its own event types and read only the streams it consumes. The platform creates
the streams as ``admin`` before any service starts.
    <service>.json     written by each service: pid, gRPC address, metrics URL
    platform.lock      held while a platform runs, so two never share one data directory
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.core import Conflict, InvalidInput, NatsSettings, NotFound, Unavailable
from gantry.events import Bus
from gantry.events.nats_auth import (
    ensure_credentials,
    password_of,
    render_auth_conf,
    write_credentials,
)
from gantry.events.topology import ADMIN_USER, SERVICE_USERS
from gantry.security.bootstrap import init_data_dir
from gantry.supervisor.nats_server import NatsServer, port_is_free

DEFAULT_NATS_PORT = 4222
#: The services ``gantry up`` runs, in start order.
DEFAULT_SERVICES = ("audit", "governance", "scheduler", "serving", "profiler", "workflows")
#: The web console: a service without a bus connection, answering HTTP (``gantry up`` runs it).
CONSOLE = "console"
#: The node agent module local agents run.
AGENT_MODULE = "gantry.training_agent"
#: What a node agent logs once its node is registered and it takes placements.
AGENT_READY = "node agent ready"
_TAIL_LINES = 40
_POLL_S = 0.05
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True, kw_only=True)
class LocalAgent:
    """A node agent the platform runs on this machine, and the node it registers.

    Each field left at None is detected by the agent from this machine: CPUs and memory
    always, GPUs through torch's CUDA view. ``gpus`` declares that many identical GPUs of
    ``gpu_model`` instead (for trying GPU jobs, or several nodes, on one machine); ``cpus``
    and ``memory`` (a quantity such as ``16Gi``) likewise declare what the node offers.
    ``heartbeat_s`` is the agent's heartbeat interval (None: the agent's default, 5 s).
    """

    node: str
    pool: str = "default"
    gpus: int | None = None
    gpu_model: str = "A100"
    gpu_memory: str = "80Gi"
    cpus: float | None = None
    memory: str | None = None
    heartbeat_s: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Run the agent inside this network namespace (``ip netns exec``; root only), as if on
    #: a host of its own.
    netns: str | None = None

    def __post_init__(self) -> None:
        for what, value in (("node", self.node), ("pool", self.pool)):
            if not _NODE_NAME.fullmatch(value):
                raise InvalidInput(
                    f"invalid {what} name {value!r} for a local agent",
                    hint="use 1-63 letters, digits, '.', '_' or '-', starting with a letter "
                    "or digit",
                )
        if self.gpus is not None and self.gpus < 0:
            raise InvalidInput(f"a local agent cannot declare {self.gpus} GPUs", hint="0 or more")
        if self.cpus is not None and self.cpus <= 0:
            raise InvalidInput(f"a local agent cannot declare {self.cpus:g} CPUs", hint="> 0")
        if self.heartbeat_s is not None and self.heartbeat_s <= 0:
            raise InvalidInput(f"heartbeat_s must be positive, not {self.heartbeat_s:g}")
        for key in self.labels:
            if not key or "=" in key:
                raise InvalidInput(f"invalid label key {key!r} for node {self.node}")

    @property
    def name(self) -> str:
        """The child's name in the platform (``agent-<node>``): it prefixes its log lines."""
        return f"agent-{self.node}"

    def argv(self) -> list[str]:
        """The agent's command line (NATS and the data directory come from the environment)."""
        argv = [sys.executable, "-m", AGENT_MODULE, "--node", self.node, "--pool", self.pool]
        if self.gpus is not None:
            argv += ["--gpus", str(self.gpus), "--gpu-model", self.gpu_model]
            argv += ["--gpu-memory", self.gpu_memory]
        if self.cpus is not None:
            argv += ["--cpus", f"{self.cpus:g}"]
        if self.memory is not None:
            argv += ["--memory", self.memory]
        if self.heartbeat_s is not None:
            argv += ["--heartbeat", f"{self.heartbeat_s:g}"]
        for key, value in sorted(self.labels.items()):
            argv += ["--label", f"{key}={value}"]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        return argv


@dataclass(frozen=True)
class ExternalNats:
    """A NATS server or cluster the platform uses instead of starting its own.

    ``url`` lists the servers (comma separated); ``credentials`` maps each user's password
    variable (``GANTRY_NATS_<USER>_PASSWORD``) to its password, as ``gantry admin init``
    writes them; ``stream_replicas`` is 3 on a three-server cluster.
    """

    url: str
    credentials: Mapping[str, str]
    stream_replicas: int = 1


def local_agents(
    count: int, *, gpus: int | None = None, gpu_model: str = "A100"
) -> list[LocalAgent]:
    """``count`` agents for this machine, as ``gantry up --agents`` runs them.

    One agent is named after the host and offers the whole machine (GPUs detected unless
    ``gpus`` declares them). Several are ``local-1`` .. ``local-<count>`` and split the
    machine's CPUs and memory evenly between them; they declare ``gpus`` GPUs each, or none,
    since each would otherwise claim the same devices.
    """
    if count < 0:
        raise InvalidInput(f"cannot run {count} local agents", hint="0 or more")
    if count == 1:
        host = _host_node_name()
        return [LocalAgent(node=host, gpus=gpus, gpu_model=gpu_model)]
    cpus, memory_mib = _machine()
    return [
        LocalAgent(
            node=f"local-{i}",
            gpus=gpus if gpus is not None else 0,
            gpu_model=gpu_model,
            cpus=round(max(cpus / count, 0.001), 3),
            memory=f"{max(memory_mib // count, 1)}Mi",
        )
        for i in range(1, count + 1)
    ]


def _host_node_name() -> str:
    """This host's name as a node name (its first label, cleaned)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]).strip("-._")
    return host[:63] or "localhost"


def _machine() -> tuple[int, int]:
    """CPUs this process may use, and the machine's memory in MiB."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return cpus or 1, int(memory) >> 20


def _print_line(line: str) -> None:
    print(line, flush=True)


@dataclass
class _Child:
    """One supervised process (a service or a node agent) and what the platform knows of it."""

    name: str
    kind: Literal["service", "agent"]
    proc: subprocess.Popen[bytes]
    reader: threading.Thread | None = None
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_TAIL_LINES)
    )
    info: dict[str, Any] = field(default_factory=dict)
    announced: threading.Event = field(default_factory=threading.Event)  # agents: "ready"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Platform:
    """nats-server plus the Gantry services and local node agents as supervised children.

    ``nats_port`` is the preferred NATS port (0 = any free port); when something already
    listens there the platform says so through ``log_sink`` and takes a free port instead — it
    never joins another server. ``services`` start in order, then every one of ``agents``
    (none by default; ``gantry up`` runs one); an agent is a child named ``agent-<node>``
    (:attr:`LocalAgent.name`), and every method taking a service name takes it too.
    ``service_env`` is added to every child's environment (e.g.
    ``GANTRY_AUDIT__CHECKPOINT_EVERY_S``). ``log_sink`` receives every log line (default: print
    to stdout); it is called from reader threads, one line at a time. ``initializer`` creates
    the key directory and the first admin token when ``<data_dir>/keys/issuer.pem`` is missing
    (default: :func:`gantry.security.bootstrap.init_data_dir`).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        nats_port: int = DEFAULT_NATS_PORT,
        services: Sequence[str] = DEFAULT_SERVICES,
        agents: Sequence[LocalAgent] = (),
        service_env: Mapping[str, str] | None = None,
        log_sink: Callable[[str], None] | None = None,
        initializer: Callable[[Path], object] | None = None,
        nats: ExternalNats | None = None,
    ) -> None:
        if not 0 <= nats_port <= 65535:
            raise InvalidInput(f"NATS port must be between 0 and 65535, not {nats_port}")
        for name in services:
            if not name.isidentifier() or not name.islower():
                raise InvalidInput(
                    f"invalid service name {name!r}",
                    hint="services are Python modules gantry.<name>, e.g. 'audit'",
                )
        if len(set(services)) != len(services):
            raise InvalidInput(f"a service is listed twice in {list(services)}")
        nodes = [a.node for a in agents]
        if len(set(nodes)) != len(nodes):
            raise InvalidInput(f"a node is listed twice in {nodes}", hint="name each agent's node")
        self.data_dir = Path(data_dir).absolute()
        self.preferred_nats_port = nats_port
        self.services: tuple[str, ...] = tuple(services)
        self.agents: tuple[LocalAgent, ...] = tuple(agents)
        self.service_env: dict[str, str] = dict(service_env or {})
        self._sink = log_sink if log_sink is not None else _print_line
        self._sink_lock = threading.Lock()
        self._initializer = initializer
        self._nats: NatsServer | None = None
        self._external = nats
        self._started = False
        self._nats_credentials: dict[str, str] = dict(nats.credentials) if nats else {}
        self._children: dict[str, _Child] = {}
        self._stopping = threading.Event()
        self._lock_file: IO[bytes] | None = None
        self._nats_revived = 0

    # ------------------------------------------------------------------ properties

    @property
    def run_dir(self) -> Path:
        """``<data_dir>/run``: where running processes say where they listen."""
        return self.data_dir / "run"

    @property
    def nats_url(self) -> str:
        """URL of the platform's NATS server(s) (valid once started)."""
        if self._external is not None and self._started:
            return self._external.url
        if self._nats is None:
            raise Unavailable("the platform is not started", hint="call start() first")
        return self._nats.url

    def nats_url_for(self, user: str = ADMIN_USER) -> str:
        """The NATS URL(s) with ``user``'s credentials in them (tests and tools; keep private)."""
        secret = password_of(self._nats_credentials, user)
        return ",".join(
            u.replace("nats://", f"nats://{user}:{secret}@", 1) for u in self.nats_url.split(",")
        )

    @property
    def nats_port(self) -> int:
        """The port NATS actually listens on (valid once started)."""
        if self._nats is None:
            raise Unavailable("the platform is not started", hint="call start() first")
        return self._nats.port

    @property
    def console_url(self) -> str:
        """The web console's address (when the platform runs it)."""
        info = self.service_info(CONSOLE)
        return str(info["http"])

    def address(self, name: str) -> str:
        """``host:port`` of service ``name``'s gRPC API."""
        info = self.service_info(name)
        if "grpc" not in info:
            raise InvalidInput(f"{name} has no gRPC API", hint="ask a service, e.g. 'scheduler'")
        return str(info["grpc"])

    def service_info(self, name: str) -> dict[str, Any]:
        """What service ``name`` wrote into its run file (pid, gRPC address, metrics URL); for
        a node agent: its pid, node and pool."""
        child = self._child(name)
        if not child.info:
            raise Unavailable(
                f"{child.kind} {name!r} is not ready", hint="start the platform first"
            )
        return dict(child.info)

    def pid(self, name: str) -> int | None:
        """The process id of service or agent ``name`` while it runs, else None."""
        child = self._child(name)
        return child.proc.pid if child.alive else None

    def pids(self) -> dict[str, int]:
        """Process ids of every running child (agents as ``agent-<node>``), NATS included (as
        ``"nats"``)."""
        out = {name: c.proc.pid for name, c in self._children.items() if c.alive}
        if self._nats is not None and self._nats.pid is not None and self._nats.running:
            out["nats"] = self._nats.pid
        return out

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 60.0) -> Platform:
        """Start NATS, every service, then every agent; return when all are ready.

        Raises :class:`Unavailable` (with the child's last log lines) when a child exits
        during start-up or is not ready within ``timeout_s``; everything started so far is
        stopped again first. Raises :class:`Conflict` if another platform uses ``data_dir``.
        """
        if self._nats is not None or self._started:
            raise Conflict("the platform is already started", hint="call stop() first")
        deadline = time.monotonic() + timeout_s
        self._stopping.clear()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self._ensure_initialized()
            self._start_nats(max(1.0, min(15.0, deadline - time.monotonic())))
            for name in self.services:  # independent processes: start them together
                self._spawn(name)
            for name in self.services:
                self._wait_ready(name, deadline)
            for agent in self.agents:  # independent of each other: start them together
                self._spawn(agent.name)
            for agent in self.agents:
                self._wait_ready(agent.name, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every agent, then every service, in reverse start order (SIGTERM, SIGKILL
        after ``timeout_s``), then NATS. Idempotent."""
        self._stopping.set()
        self._nats_revived = 0
        children = list(reversed(self._children.values()))
        for child in children:
            if child.alive:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in children:
            self._reap(child, deadline, keep_nats=True)
        self._children.clear()
        self._started = False
        if self._nats is not None:
            nats, self._nats = self._nats, None
            nats.stop(timeout_s)
        (self.run_dir / "nats.json").unlink(missing_ok=True)
        self._release_lock()

    def kill_service(self, name: str) -> None:
        """SIGKILL service or agent ``name`` (crash simulation for tests); wait for it to go."""
        child = self._child(name)
        if child.alive:
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
        self._reap(child, time.monotonic() + 10)
        child.info = {}

    def restart_service(self, name: str, timeout_s: float = 60.0) -> None:
        """Stop service or agent ``name`` gracefully (if it runs) and start it again; wait
        until it is ready."""
        child = self._child(name)
        if child.alive:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        self._reap(child, time.monotonic() + 20)
        child.info = {}
        self._spawn(name)
        self._wait_ready(name, time.monotonic() + timeout_s)

    def wait(self) -> str | None:
        """Block until a child dies or :meth:`stop` is called.

        Returns the name of the process that died (``"nats"`` for the server, ``agent-<node>``
        for an agent), or None when the platform was stopped (or never started).
        """
        while self._nats is not None and not self._stopping.is_set():
            for name, child in self._children.items():
                if not child.alive:
                    return name
            if self._nats is not None and not self._nats.running:
                return "nats"
            self._stopping.wait(0.2)
        return None

    def exit_code(self, name: str) -> int | None:
        """The exit status of child ``name`` if it has exited (negative: killed by signal)."""
        return self._child(name).proc.poll()

    def last_log_lines(self, name: str) -> list[str]:
        """The last few log lines of service or agent ``name``."""
        return list(self._child(name).tail)

    def __enter__(self) -> Platform:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _log(self, line: str) -> None:
        with self._sink_lock:
            self._sink(line)

    def _child(self, name: str) -> _Child:
        child = self._children.get(name)
        if child is None:
            names = [*self.services, *(a.name for a in self.agents)]
            raise NotFound(
                "service", name, hint=f"this platform runs: {', '.join(names) or 'none'}"
            )
        return child

    def _agent(self, name: str) -> LocalAgent | None:
        return next((a for a in self.agents if a.name == name), None)

    def _acquire_lock(self) -> None:
        if self._lock_file is not None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fh = (self.run_dir / "platform.lock").open("ab")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise Conflict(
                f"another Gantry platform is already running with data directory {self.data_dir}",
                hint="stop it first, or pass a different --data-dir",
            ) from None
        self._lock_file = fh

    def _release_lock(self) -> None:
        fh, self._lock_file = self._lock_file, None
        if fh is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    def _ensure_initialized(self) -> None:
        if (self.data_dir / "keys" / "issuer.pem").exists():
            return
        initializer = self._initializer
        if initializer is None:
            initializer = init_data_dir
        self._log(f"gantry | no keys in {self.data_dir / 'keys'}: running 'gantry admin init'")
        initializer(self.data_dir)

    def _start_nats(self, timeout_s: float) -> None:
        if self._external is not None:
            # Tools that read the data directory (the SDK, the CLI) find these credentials.
            write_credentials(self.data_dir / "nats" / "credentials.env", self._nats_credentials)
            self._started = True
            self._create_streams()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _write_json(self.run_dir / "nats.json", {"url": self._external.url, "pid": None})
            self._log(f"gantry | using the NATS servers at {self._external.url}")
            return
        port = self.preferred_nats_port
        if port and not port_is_free("127.0.0.1", port):
            self._log(
                f"gantry | port {port} is taken (another NATS server?); using a free port instead"
            )
            port = 0
        self._nats_credentials = ensure_credentials(self.data_dir / "nats" / "credentials.env")
        self._nats = NatsServer(
            self.data_dir / "nats",
            port=port,
            auth_conf=render_auth_conf(),
            env=self._nats_credentials,
        )
        self._nats.start(timeout_s)
        self._create_streams()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.run_dir / "nats.json", {"url": self._nats.url, "pid": self._nats.pid})
        self._log(f"gantry | nats-server listening on {self._nats.url}")

    def _create_streams(self) -> None:
        """Create (or update) every stream as the admin user, as a cluster's set-up job does."""
        settings = NatsSettings(
            url=self.nats_url,
            user=ADMIN_USER,
            password=password_of(self._nats_credentials, ADMIN_USER),
            stream_replicas=self._stream_replicas,
        )

        async def create() -> None:
            bus = await Bus.connect(settings, name="gantry-up")
            try:
                await bus.ensure_streams()
            finally:
                await bus.close()

        failure: list[BaseException] = []

        def run() -> None:  # its own thread: the caller may be inside an event loop
            try:
                asyncio.run(create())
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=run, name="gantry-streams")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    @property
    def _stream_replicas(self) -> int:
        return self._external.stream_replicas if self._external is not None else 1

    def _nats_user(self, name: str) -> str:
        """The NATS user a child connects as: its own, or admin for a service not in the
        catalog's topology."""
        if self._agent(name) is not None:
            return "training-agent"
        return name if name in SERVICE_USERS else ADMIN_USER

    def _env(self, name: str) -> dict[str, str]:
        """A child's environment: where NATS and the data are, its NATS user, JSON logs;
        services also get free ports (their run files say which)."""
        env = dict(os.environ)
        env.update(
            {
                "GANTRY_DATA_DIR": str(self.data_dir),
                "GANTRY_LOG_JSON": "true",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if name != CONSOLE:  # the console talks to the services' APIs only, never the bus
            user = self._nats_user(name)
            env.update(
                {
                    "GANTRY_NATS__URL": self.nats_url,
                    "GANTRY_NATS__USER": user,
                    "GANTRY_NATS__PASSWORD": password_of(self._nats_credentials, user),
                    "GANTRY_NATS__STREAM_REPLICAS": str(self._stream_replicas),
                }
            )
        if self._agent(name) is None:
            prefix = f"GANTRY_{name.upper()}__"
            env.update(
                {f"{prefix}GRPC_PORT": "0", f"{prefix}METRICS_PORT": "0", f"{prefix}HTTP_PORT": "0"}
            )
        env.update(self.service_env)
        return env

    def _spawn(self, name: str) -> _Child:
        agent = self._agent(name)
        argv = agent.argv() if agent is not None else [sys.executable, "-m", f"gantry.{name}"]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self._env(name),
            cwd=self.data_dir,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children
        )
        child = _Child(name, "agent" if agent is not None else "service", proc)
        self._children[name] = child
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"gantry-log-{name}", daemon=True
        )
        child.reader.start()
        return child

    def _pump(self, child: _Child) -> None:
        stream = child.proc.stdout
        if stream is None:
            return
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                child.tail.append(line)
                if child.kind == "agent" and AGENT_READY in line:
                    child.announced.set()
                self._log(f"{child.name} | {line}")

    def _wait_ready(self, name: str, deadline: float) -> None:
        child = self._child(name)
        run_file = self.run_dir / f"{name}.json"
        agent = self._agent(name)
        while True:
            if not child.alive:
                if child.reader is not None:
                    child.reader.join(2)
                raise Unavailable(
                    f"{child.kind} {name} exited with code {child.proc.returncode} while "
                    "starting" + _tail_text(child),
                    hint="fix the problem its log shows, then run 'gantry up' again",
                )
            if agent is not None:
                if child.announced.is_set():
                    child.info = {"pid": child.proc.pid, "node": agent.node, "pool": agent.pool}
                    self._log(f"gantry | {name} is ready: node {agent.node} in pool {agent.pool}")
                    return
            else:
                info = _read_json(run_file)
                address = info.get("grpc")
                web = info.get("http")
                if info.get("pid") == child.proc.pid and (
                    (isinstance(address, str) and _serving(address))
                    or (address is None and isinstance(web, str) and _answers(web))
                ):
                    child.info = info
                    where = f"gRPC {address}" if address else web
                    self._log(f"gantry | {name} is ready: {where}")
                    return
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                self._reap(child, time.monotonic() + 5)
                raise Unavailable(
                    f"{child.kind} {name} did not become ready in time" + _tail_text(child),
                    hint="see its log lines above; a slow machine may need a longer timeout",
                )
            time.sleep(_POLL_S)

    def _reap(self, child: _Child, deadline: float, *, keep_nats: bool = False) -> None:
        """Wait for ``child`` to exit; SIGKILL it at ``deadline``.

        With ``keep_nats``, a nats-server that died meanwhile is started again, so the child
        can finish its shutdown (publish its last events). Ctrl-C in a terminal reaches
        nats-server too, since it runs in the supervisor's process group.
        """
        while child.alive and time.monotonic() < deadline:
            if keep_nats:
                self._revive_nats()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        if child.alive:
            self._log(f"gantry | {child.name} did not stop in time; killing it")
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            child.proc.wait()
        if child.reader is not None:
            child.reader.join(5)
        if child.kind != "service":  # only services write run files
            return
        run_file = self.run_dir / f"{child.name}.json"
        if _read_json(run_file).get("pid") == child.proc.pid:  # killed: it could not clean up
            run_file.unlink(missing_ok=True)

    def _revive_nats(self) -> None:
        nats = self._nats
        if nats is None or nats.running or self._nats_revived >= 3:
            return
        self._nats_revived += 1
        self._log("gantry | nats-server exited early; restarting it until the services stopped")
        try:
            nats.restart(timeout_s=5)
        except Unavailable as exc:
            self._log(f"gantry | could not restart nats-server: {exc.message}")


def _answers(url: str) -> bool:
    """True when the web service at ``url`` answers its readiness probe."""
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        return False
    try:
        probe = url.rstrip("/") + "/readyz"
        with urllib.request.urlopen(probe, timeout=1.0) as reply:  # noqa: S310 - http(s) only
            return int(reply.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _serving(address: str) -> bool:
    """True when the gRPC health service at ``address`` says SERVING for the whole server.

    The services inherit this process's environment, so they serve TLS exactly when its
    ``GANTRY_TLS__*`` say so, and the check asks the same way (with the same client
    certificate). Settings or files that cannot be used count as not serving: the service
    reads the same ones, fails on them, and its log says why.
    """
    from gantry.core import CommonSettings, ConfigError, load_settings
    from gantry.security.tls import secure_or_insecure_channel

    try:
        tls = load_settings(CommonSettings).tls
        with secure_or_insecure_channel(address, tls) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    except (grpc.RpcError, ConfigError):
        return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict(data)) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _tail_text(child: _Child) -> str:
    lines = list(child.tail)[-15:]
    if not lines:
        return " (it logged nothing)"
    return "; its last log lines:\n  " + "\n  ".join(lines)


__all__ = [
    "AGENT_MODULE",
    "CONSOLE",
    "DEFAULT_NATS_PORT",
    "DEFAULT_SERVICES",
    "ExternalNats",
    "LocalAgent",
    "Platform",
    "local_agents",
]
