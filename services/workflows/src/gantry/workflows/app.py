"""Wiring (the top layer): settings → database → NATS → intake, controller loop, gRPC API.

One :class:`WorkflowService` is one process (run one replica: the controller is the only
writer of its runs). ``run()`` serves until SIGTERM/SIGINT (or :meth:`WorkflowService.stop`),
then shuts down in order: NOT_SERVING, stop the consumers, stop the loop after the run in
hand, stop gRPC (calls in flight get a grace period), flush the outbox, close NATS and the
database. Nothing is lost by stopping at any point: every run lives in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.core import Clock, SystemClock, get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, service_address, write_run_file
from gantry.events import BackgroundPublisher, Bus, OutboxRelay, Publisher
from gantry.protos.v1 import workflows_pb2_grpc
from gantry.security import AuthInterceptor, Authorizer, Policy, default_policy
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import Keyring
from gantry.security.tls import add_port, nats_tls
from gantry.security.tokens import ServiceToken
from gantry.workflows import store
from gantry.workflows.api import METHOD_RULES, SERVICE, SERVICE_NAME, WorkflowApi
from gantry.workflows.controller import Controller
from gantry.workflows.erasures import ErasureRuns
from gantry.workflows.experimenter import Experimenter
from gantry.workflows.intake import Intake
from gantry.workflows.metrics import registry_for
from gantry.workflows.platform import Platform, ServicePlatform
from gantry.workflows.registry import Registry
from gantry.workflows.sealing import KEY_NAME, Sealer
from gantry.workflows.sessions import Sessions
from gantry.workflows.settings import WorkflowSettings

_log = get_logger("gantry.workflows")


class WorkflowService:
    """The workflows service process."""

    def __init__(
        self,
        settings: WorkflowSettings,
        *,
        clock: Clock | None = None,
        platform: Platform | None = None,
    ) -> None:
        self.settings = settings
        o = settings.workflows
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.engine = store.connect(settings.database_url)
        self.clock = clock or SystemClock()
        self.token = ServiceToken(
            SERVICE_NAME,
            functools.partial(self.keyring.service_key, SERVICE_NAME),
            configured=o.token.get_secret_value(),
        )
        self.platform = platform or ServicePlatform(
            lambda: service_address(
                settings.data_dir,
                "scheduler",
                configured=o.scheduler_addr,
                setting="GANTRY_WORKFLOWS__SCHEDULER_ADDR",
            ),
            lambda: service_address(
                settings.data_dir,
                "serving",
                configured=o.serving_addr,
                setting="GANTRY_WORKFLOWS__SERVING_ADDR",
            ),
            self.token.get,
            timeout_s=o.call_timeout_s,
            deploy_timeout_s=o.deploy_timeout_s,
            tls=settings.tls,
        )
        self.registry = Registry(self.engine, self.clock)
        self.controller = Controller(
            self.engine,
            self.registry,
            self.platform,
            self.clock,
            resync_s=o.resync_s,
            poll_s=o.poll_s,
        )
        self.experimenter = Experimenter(
            self.engine, self.platform, settings.study_database_url, self.clock
        )
        self.controller.experimenter = self.experimenter
        self.erasures = ErasureRuns(self.engine, self.registry, self.controller)
        self.sessions = Sessions(
            self.engine, self.platform, self.clock, sealer=Sealer(self.keyring.secret(KEY_NAME))
        )
        self.registry_metrics, self.counters = registry_for(self.engine)
        self.grpc_port = 0
        self.metrics_port = 0
        self.intake: Intake | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    def wake(self) -> None:
        """Run the loop now (tests driving a manual clock)."""
        self._wake.set()

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        o = s.workflows
        await asyncio.to_thread(store.migrate, self.engine)
        bus = await Bus.connect(s.nats, name="gantry-workflows", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = OutboxRelay(self.engine, store.outbox, publisher, poll_s=0.5)
        self.controller.on_change = relay.notify
        self.experimenter.on_change = relay.notify
        self.sessions.on_change = relay.notify
        intake = self.intake = Intake(
            bus,
            self.controller,
            self.experimenter,
            self.erasures,
            publisher,
            verifier=self.keyring.trust(),
            ack_wait_s=o.ack_wait_s,
            wake=self._wake,
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
        workflows_pb2_grpc.add_WorkflowServiceServicer_to_server(
            WorkflowApi(
                self.registry, self.controller, self.experimenter, authorizer, sink, self.sessions
            ),
            server,
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{o.grpc_host}:{o.grpc_port}", s.tls)
        await server.start()
        probes = HealthServer(registry=self.registry_metrics)
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))
        self.metrics_port = probes.start(o.metrics_port, o.grpc_host).port
        tasks = [
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(intake.run(), name="intake"),
            asyncio.create_task(self._loop(), name="loop"),
        ]
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        active = await asyncio.to_thread(store_active, self.engine)
        _log.info(
            "workflows ready",
            grpc=f"{o.grpc_host}:{self.grpc_port}",
            metrics=self.metrics_port,
            database=self.engine.url.render_as_string(hide_password=True),
            active_runs=active,
        )
        await self._stopping.wait()

        _log.info("workflows stopping")
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        intake.stop()
        await tasks[1]
        tasks[2].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[2]
        await server.stop(grace=5)
        probes.stop()
        relay.stop()
        await tasks[0]
        await background.drain()
        await revocations.stop()
        await bus.close()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("workflows stopped")

    async def _loop(self) -> None:
        """Advance runs, fire schedules, follow experiments and dev sessions every ``tick_s``
        (sooner when an event wakes it)."""
        tick = self.settings.workflows.tick_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=tick)
            self._wake.clear()
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self.controller.tick)
                await asyncio.to_thread(self.experimenter.tick)
                await asyncio.to_thread(self.sessions.tick)
            except Exception:  # a bug in one tick must not stop the next
                self.counters.tick_failures.inc()
                _log.exception("workflows tick failed")
            self.counters.ticks.observe(time.perf_counter() - started)

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, SERVICE_NAME)

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        o = self.settings.workflows
        write_run_file(
            self.settings.data_dir,
            SERVICE_NAME,
            host=o.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )


def store_active(engine: object) -> int:
    import sqlalchemy as sa

    assert isinstance(engine, sa.Engine)
    with engine.connect() as conn:
        return len(store.run_ids(conn, ("running", "queued")))


async def serve(settings: WorkflowSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(WorkflowService(settings))


__all__ = ["WorkflowService", "serve"]
