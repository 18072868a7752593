"""Wiring (the top layer): settings → database → NATS → intake, gRPC API, metrics.

One :class:`ProfilerService` is one process. ``run()`` serves until SIGTERM/SIGINT (or
:meth:`ProfilerService.stop`), then shuts down in order: NOT_SERVING, stop the consumers after
the batches in hand, stop gRPC (calls in flight get a grace period), flush the outbox, close
NATS and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.core import get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, write_run_file
from gantry.events import BackgroundPublisher, Bus, OutboxRelay, Publisher
from gantry.profiler import store
from gantry.profiler.api import METHOD_RULES, SERVICE, SERVICE_NAME, ProfilerApi
from gantry.profiler.intake import Intake
from gantry.profiler.metrics import registry_for
from gantry.profiler.profiles import Profiles
from gantry.profiler.recording import Recorder
from gantry.profiler.settings import ProfilerSettings
from gantry.profiler.traces import Traces
from gantry.protos.v1 import profiler_pb2_grpc
from gantry.security import AuthInterceptor, Authorizer, Policy, default_policy
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import Keyring
from gantry.security.tls import add_port, nats_tls
from gantry.storage import open_store

_TICK_S = 0.5
_log = get_logger("gantry.profiler")


class ProfilerService:
    """The profiler service process."""

    def __init__(self, settings: ProfilerSettings) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.engine = store.connect(settings.database_url)
        o = settings.profiler
        self.recorder = Recorder(
            self.engine,
            Profiles(
                o.detection.config(),
                o.nodes.config(),
                min_interval_s=o.min_window_interval_s,
                max_jobs=o.max_jobs,
            ),
        )
        self.grpc_port = 0
        self.metrics_port = 0
        self.intake: Intake | None = None
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    def steps_handled(self) -> int:
        """Step-window events taken so far (acknowledged), for benchmarks and tests."""
        return self.intake.runners[0].handled if self.intake is not None else 0

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        o = s.profiler
        await asyncio.to_thread(store.migrate, self.engine)
        restored = await asyncio.to_thread(self.recorder.restore)
        objects = await asyncio.to_thread(open_store, s.storage, data_dir=s.data_dir)
        bus = await Bus.connect(s.nats, name="gantry-profiler", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = OutboxRelay(self.engine, store.outbox, publisher, poll_s=0.5)
        self.recorder.on_change = relay.notify
        registry, counters = registry_for(self.recorder)
        intake = self.intake = Intake(
            bus,
            self.recorder,
            publisher,
            counters,
            verifier=self.keyring.trust(),
            ack_wait_s=o.ack_wait_s,
            unknown_job_retry_s=o.unknown_job_retry_s,
        )
        policy = Policy.from_file(o.policy_file) if o.policy_file else default_policy()
        authorizer = Authorizer(policy)
        sink = EventDecisionSink(background, source=store.SOURCE)
        interceptor = AuthInterceptor(
            caller_verifier(self.keyring, policy.roles, revocations.revocations),
            authorizer,
            METHOD_RULES,
            sink,
            SERVICE_NAME,
        )
        server = grpc.aio.server(interceptors=[interceptor])
        traces = Traces(
            self.recorder, objects, max_bytes=o.max_trace_bytes, expire_s=o.trace_expire_s
        )
        profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(
            ProfilerApi(self.recorder, traces, authorizer, sink), server
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{o.grpc_host}:{o.grpc_port}", s.tls)
        await server.start()
        probes = HealthServer(registry=registry)
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))
        self.metrics_port = probes.start(o.metrics_port, o.grpc_host).port
        tasks = [
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(intake.run(), name="intake"),
            asyncio.create_task(self._ticks(intake), name="ticks"),
            asyncio.create_task(self._compaction(), name="compaction"),
        ]
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        _log.info(
            "profiler ready",
            grpc=f"{o.grpc_host}:{self.grpc_port}",
            metrics=self.metrics_port,
            database=self.engine.url.render_as_string(hide_password=True),
            running_jobs=restored,
        )
        await self._stopping.wait()

        _log.info("profiler stopping")
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        intake.stop()
        await tasks[1]
        for task in tasks[2:]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await server.stop(grace=5)
        relay.stop()
        await tasks[0]
        await background.drain()
        await revocations.stop()
        await bus.close()
        probes.stop()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("profiler stopped")

    async def _ticks(self, intake: Intake) -> None:
        """Analyse windows the rate limit held; recover nodes whose probation ended."""
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                applied = await asyncio.to_thread(self.recorder.tick)
                intake.count(applied)
            except Exception:  # a bug in one tick must not stop the next
                _log.exception("profiler tick failed")

    async def _compaction(self) -> None:
        o = self.settings.profiler
        while True:
            await asyncio.sleep(o.compact_every_s)
            try:
                folded, deleted = await asyncio.to_thread(
                    store.compact,
                    self.engine,
                    now_ms=self.recorder.clock(),
                    raw_s=o.raw_retention_s,
                    keep_s=o.rollup_retention_s,
                )
                if folded or deleted:
                    _log.info("old profiles rolled up", folded=folded, deleted=deleted)
            except Exception:
                _log.exception("compaction failed")

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, SERVICE_NAME)

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        o = self.settings.profiler
        write_run_file(
            self.settings.data_dir,
            SERVICE_NAME,
            host=o.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )


async def serve(settings: ProfilerSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(ProfilerService(settings))


__all__ = ["ProfilerService", "serve"]
