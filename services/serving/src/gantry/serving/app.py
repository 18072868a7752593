"""Wiring (the top layer): settings → keys, database → NATS → rollouts → REST, gRPC, metrics.

One :class:`ServingService` is one process. It serves the Open Inference Protocol over REST
(uvicorn) and gRPC (``inference.GRPCInferenceService``, beside the management API
``gantry.serving.v1.ServingService``) and Prometheus metrics. ``run()`` serves until
SIGTERM/SIGINT (or :meth:`ServingService.stop`), then shuts down in order: NOT_SERVING, the
REST and gRPC servers (calls in flight get a grace period), the deployments (queued requests
finish), the outbox, NATS and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
from pathlib import Path

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.core import get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, write_run_file
from gantry.events import BackgroundPublisher, Bus, OutboxRelay, Publisher
from gantry.protos.inference import grpc_service_pb2
from gantry.protos.v1 import serving_pb2_grpc
from gantry.security import (
    PUBLIC_METHOD_PREFIXES,
    AuthInterceptor,
    Authorizer,
    Policy,
    default_policy,
)
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import Keyring
from gantry.security.tls import add_port, nats_tls
from gantry.serving import store
from gantry.serving.api import METHOD_RULES, SERVICE, ServingApi
from gantry.serving.artifact import Artifact
from gantry.serving.backend import Backend
from gantry.serving.batcher import BatchingConfig
from gantry.serving.consumers import ModelEvents
from gantry.serving.gate import SERVICE_NAME, Gate
from gantry.serving.grpc_inference import InferenceServicer, add_to_server
from gantry.serving.registry import RegistryLink
from gantry.serving.rest import create_app
from gantry.serving.rollout import Rollouts
from gantry.serving.settings import ServingSettings

INFERENCE_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
#: How often due canary checks are looked for (each deployment has its own interval).
_ANALYSIS_TICK_S = 0.25
_log = get_logger("gantry.serving")


class ServingService:
    """The serving service process."""

    def __init__(self, settings: ServingSettings) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.engine = store.connect(settings.database_url)
        self.registry = RegistryLink(settings, self.keyring)
        self.grpc_port = 0
        self.http_port = 0
        self.metrics_port = 0
        self.rollouts: Rollouts | None = None
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    def fetch(self, model: str, version: int) -> Artifact:
        """A registered version's verified bytes as an :class:`Artifact`."""
        fetched = self.registry.fetch(model, version)
        return Artifact(
            name=fetched.info.name,
            version=fetched.info.version,
            data=fetched.data,
            format=fetched.format,
            signature=fetched.signature,
        )

    async def _every(self, interval_s: float, work: str) -> None:
        rollouts = self.rollouts
        assert rollouts is not None
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=interval_s)
            if self._stopping.is_set():
                return
            try:
                if work == "analyse":
                    await rollouts.analyse()
                else:
                    await rollouts.autoscale()
            except Exception:  # a bug in one pass must not stop the next
                _log.exception("periodic work failed", work=work)

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        o = s.serving
        threads = o.torch_threads or max(1, (os.cpu_count() or 1) // o.max_instances)
        await asyncio.to_thread(store.migrate, self.engine)
        bus = await Bus.connect(s.nats, name="gantry-serving", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = OutboxRelay(self.engine, store.outbox, publisher, poll_s=0.5)
        policy = Policy.from_file(o.policy_file) if o.policy_file else default_policy()
        authorizer = Authorizer(policy)
        sink = EventDecisionSink(background, source=store.SOURCE)
        verifier = caller_verifier(self.keyring, policy.roles, revocations.revocations)
        rollouts = self.rollouts = Rollouts(
            self.engine,
            self.fetch,
            batching=BatchingConfig(
                max_batch_size=o.max_batch_size,
                max_queue_delay_us=o.max_queue_delay_us,
                queue_capacity=o.queue_capacity,
                timeout_s=o.request_timeout_s,
            ),
            min_instances=o.min_instances,
            max_instances=max(o.min_instances, o.max_instances),
            default_interval_s=o.canary_interval_s,
            drain_timeout_s=o.drain_timeout_s,
            notify=relay.notify,
            torch_threads=threads,
        )
        backend = Backend(rollouts, Gate(verifier, authorizer, sink,
                                         allow_anonymous=o.allow_anonymous))  # fmt: skip
        # gRPC: inference (authorised per deployment by the gate) and management
        interceptor = AuthInterceptor(
            verifier,
            authorizer,
            METHOD_RULES,
            sink,
            SERVICE_NAME,
            public_methods=PUBLIC_METHOD_PREFIXES | {f"/{INFERENCE_SERVICE}/"},
        )
        limit = o.max_request_bytes
        server = grpc.aio.server(
            interceptors=[interceptor],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
        )
        add_to_server(InferenceServicer(backend), server)
        serving_pb2_grpc.add_ServingServiceServicer_to_server(
            ServingApi(rollouts, authorizer, sink), server
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, INFERENCE_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{o.grpc_host}:{o.grpc_port}", s.tls)
        await server.start()
        # REST: uvicorn on a socket bound here (so port 0 works and the port is known)
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only for
        # such sockets, and without it small responses wait ~40 ms for the client's delayed ACK
        sock = socket.socket(
            socket.AF_INET6 if ":" in o.http_host else socket.AF_INET,
            socket.SOCK_STREAM,
            socket.IPPROTO_TCP,
        )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((o.http_host, o.http_port))
        self.http_port = sock.getsockname()[1]
        rest = uvicorn.Server(
            uvicorn.Config(
                create_app(backend, max_body_bytes=limit),
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
        )
        rest_task = asyncio.create_task(rest.serve(sockets=[sock]), name="rest")
        probes = HealthServer()
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))

        def models_loaded() -> tuple[bool, str]:
            # Ready to take traffic only once every deployment has a version that answers:
            # after a restart the models load in the background for a while.
            # (A deployment whose versions all failed does not hold the others back.)
            try:
                loading = [
                    name
                    for name, d in list(rollouts.deployments.items())
                    if not any(v.ready for v in list(d.versions.values()))
                    and any(v.state == "loading" for v in list(d.versions.values()))
                ]
            except RuntimeError:  # the deployments changed while being read: ask again
                return False, "deployments changing"
            if loading:
                return False, f"loading the model of {', '.join(sorted(loading))}"
            return True, "models loaded"

        probes.add_check("models", models_loaded)
        self.metrics_port = probes.start(o.metrics_port, o.grpc_host).port
        await rollouts.restore()
        gc.collect()
        gc.freeze()  # what start-up made lives as long as the process: keep it out of collections
        models = ModelEvents(bus, rollouts, self.engine, publisher, verifier=self.keyring.trust())
        tasks = [
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(models.run(), name="models"),
            asyncio.create_task(self._every(_ANALYSIS_TICK_S, "analyse"), name="canary"),
            asyncio.create_task(self._every(o.autoscale_interval_s, "scale"), name="autoscale"),
        ]
        while not rest.started and not rest_task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        if rest_task.done():
            rest_task.result()  # raises what stopped it
        for name in ("", SERVICE, INFERENCE_SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        _log.info(
            "serving service ready",
            grpc=f"{o.grpc_host}:{self.grpc_port}",
            http=f"http://{o.http_host}:{self.http_port}",
            metrics=self.metrics_port,
            database=self.engine.url.render_as_string(hide_password=True),
            deployments=len(rollouts.deployments),
            torch_threads=threads,
        )
        await self._stopping.wait()

        _log.info("serving service stopping")
        for name in ("", SERVICE, INFERENCE_SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        models.stop()
        rest.should_exit = True
        await server.stop(grace=5)
        await rest_task
        for task in tasks[1:]:
            await task
        await rollouts.close()
        relay.stop()
        await tasks[0]
        await background.drain()
        await revocations.stop()
        await bus.close()
        probes.stop()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("serving service stopped")

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, SERVICE_NAME)

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        o = self.settings.serving
        write_run_file(
            self.settings.data_dir,
            SERVICE_NAME,
            host=o.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            extra={"http": f"http://{o.http_host}:{self.http_port}"},
        )


async def serve(settings: ServingSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(ServingService(settings))


__all__ = ["INFERENCE_SERVICE", "ServingService", "serve"]
