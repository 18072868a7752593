"""Wiring (the top layer): settings → keys, database → engine → NATS → gRPC API, metrics.

One :class:`SchedulerService` is one process. Its scheduling loop runs a pass whenever
something changed (a submit, a freed node, a report) and at least every
``pass_interval_s`` (timeouts, heartbeats). ``run()`` serves until SIGTERM/SIGINT (or
:meth:`SchedulerService.stop`), then shuts down in order: NOT_SERVING, consumers, gRPC (calls
in flight get a grace period), the loop, the outbox, NATS and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Counter, Gauge, Histogram

from gantry.core import get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, write_run_file
from gantry.events import BackgroundPublisher, Bus, OutboxRelay, Publisher
from gantry.protos.v1 import scheduler_pb2_grpc
from gantry.scheduler.api import METHOD_RULES, SERVICE, ControlThread, SchedulerApi
from gantry.scheduler.consumers import SchedulerEvents
from gantry.scheduler.control import SOURCE, Control
from gantry.scheduler.settings import SchedulerSettings
from gantry.scheduler.store import connect, migrate, outbox
from gantry.security import AuthInterceptor, Authorizer, Policy, default_policy
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import Keyring
from gantry.security.tls import add_port, nats_tls

SERVICE_NAME = "scheduler"
_log = get_logger("gantry.scheduler")

PASSES = Counter("gantry_scheduler_passes_total", "Scheduling passes run.")
DECISIONS = Counter("gantry_scheduler_decisions_total", "Start and stop decisions taken.")
PASS_SECONDS = Histogram(
    "gantry_scheduler_pass_seconds",
    "Time of one scheduling pass.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
JOBS = Gauge("gantry_scheduler_jobs", "Active jobs by state.", ["state"])
NODES = Gauge("gantry_scheduler_nodes", "Nodes by state.", ["state"])


class SchedulerService:
    """The scheduler service process."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.engine = connect(settings.database_url)
        self.control = Control(self.engine, settings.scheduler)
        self.grpc_port = 0
        self.metrics_port = 0
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._relay: OutboxRelay | None = None

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()
        self._wake.set()

    def kick(self) -> None:
        """Ask for a scheduling pass now (from the event loop)."""
        self._wake.set()

    async def _loop(self, thread: ControlThread) -> None:
        interval = self.settings.scheduler.pass_interval_s
        while not self._stopping.is_set():
            self._wake.clear()
            started = time.perf_counter()
            try:
                decided = await thread.call(self.control.schedule)
            except Exception:  # a bug must not stop scheduling for good
                _log.exception("scheduling pass failed")
                decided = 0
            PASSES.inc()
            PASS_SECONDS.observe(time.perf_counter() - started)
            if decided:
                DECISIONS.inc(decided)
            if self._relay is not None:
                self._relay.notify()
            await thread.call(self._gauges)
            if decided:
                continue  # what it started or stopped may let more happen at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)

    def _gauges(self) -> None:
        counts: dict[str, int] = dict.fromkeys(("pending", "scheduled", "running", "stopping"), 0)
        for job in self.control.jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
        for state, n in counts.items():
            JOBS.labels(state).set(n)
        nodes: dict[str, int] = dict.fromkeys(("ready", "degraded", "lost"), 0)
        for node in self.control.nodes.values():
            nodes[node.state] = nodes.get(node.state, 0) + 1
        for state, n in nodes.items():
            NODES.labels(state).set(n)

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        o = s.scheduler
        await asyncio.to_thread(migrate, self.engine)
        thread = ControlThread(self.control)
        await thread.call(self.control.recover)
        bus = await Bus.connect(s.nats, name="gantry-scheduler", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = self._relay = OutboxRelay(self.engine, outbox, publisher, poll_s=0.5)
        policy = Policy.from_file(o.policy_file) if o.policy_file else default_policy()
        authorizer = Authorizer(policy)
        sink = EventDecisionSink(background, source=SOURCE)
        api = SchedulerApi(thread, authorizer, self.kick)
        api.attach(asyncio.get_running_loop())
        kube = None
        if o.backend == "kubernetes":
            from gantry.scheduler.backend import attach_kubernetes

            loop = asyncio.get_running_loop()

            def on_control(fn: Callable[[], None]) -> object:
                future = thread.submit(fn)
                loop.call_soon_threadsafe(self.kick)
                return future

            kube = await thread.call(attach_kubernetes, self.control, o.kubernetes, on_control)
        events = SchedulerEvents(
            bus, thread, publisher, verifier=self.keyring.trust(), kick=self.kick
        )
        interceptor = AuthInterceptor(
            caller_verifier(self.keyring, policy.roles, revocations.revocations),
            authorizer,
            METHOD_RULES,
            sink,
            SERVICE_NAME,
        )
        server = grpc.aio.server(interceptors=[interceptor])
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(api, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{o.grpc_host}:{o.grpc_port}", s.tls)
        await server.start()
        probes = HealthServer()
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))
        self.metrics_port = probes.start(o.metrics_port, o.grpc_host).port
        tasks = [
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(events.run(), name="events"),
            asyncio.create_task(self._loop(thread), name="schedule"),
        ]
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        _log.info(
            "scheduler service ready",
            grpc=f"{o.grpc_host}:{self.grpc_port}",
            metrics=self.metrics_port,
            database=self.engine.url.render_as_string(hide_password=True),
            backend=o.backend,
        )
        await self._stopping.wait()

        _log.info("scheduler service stopping")
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        events.stop()
        await tasks[1]
        await server.stop(grace=5)
        await tasks[2]
        relay.stop()
        await tasks[0]
        await background.drain()
        await revocations.stop()
        await bus.close()
        if kube is not None:
            for part in kube:
                part.close()
        thread.shutdown()
        probes.stop()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("scheduler service stopped")

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, SERVICE_NAME)

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        write_run_file(
            self.settings.data_dir,
            SERVICE_NAME,
            host=self.settings.scheduler.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )


async def serve(settings: SchedulerSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(SchedulerService(settings))


__all__ = ["SERVICE_NAME", "SchedulerService", "serve"]
