"""Wiring (the top layer): settings → keys, database, object store → NATS → gRPC API, metrics.

One :class:`GovernanceService` is one process. ``run()`` serves until SIGTERM/SIGINT (or
:meth:`GovernanceService.stop`), then shuts down in order: report NOT_SERVING, stop the job
consumer, stop gRPC (calls in flight get a grace period), flush the outbox and the queued
decisions, close NATS and the database.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.core import get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, write_run_file
from gantry.events import BackgroundPublisher, Bus, OutboxRelay, Publisher
from gantry.governance.access import SERVICE_NAME, Access
from gantry.governance.api import METHOD_RULES, SERVICE, Domain, GovernanceApi
from gantry.governance.catalog import Catalog
from gantry.governance.changes import SOURCE
from gantry.governance.consumers import JobEvents
from gantry.governance.dataset_keys import DatasetKeys
from gantry.governance.erasures import Erasures
from gantry.governance.findings import SubjectFinder
from gantry.governance.grants import Grants
from gantry.governance.lineage import Lineage
from gantry.governance.maintenance import Maintenance
from gantry.governance.registry import Registry
from gantry.governance.settings import GovernanceSettings
from gantry.governance.store import connect, migrate, outbox
from gantry.governance.uploads import Uploads
from gantry.governance.views import Views
from gantry.protos.v1 import governance_pb2_grpc
from gantry.security import AuthInterceptor, Authorizer, Policy, default_policy
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import Keyring
from gantry.security.tls import add_port, nats_tls
from gantry.storage import open_store

_log = get_logger("gantry.governance")

#: The largest shard an upload may ask for (a shard must fit in a worker's memory at once).
MAX_SHARD_BYTES = 256 << 20
#: The key-ring secret that keys data-subject references (``keys/secrets/<name>.key``).
SUBJECT_SECRET = "governance-subjects"  # noqa: S105 -- a name, not a secret


class GovernanceService:
    """The data-governance service process."""

    def __init__(self, settings: GovernanceSettings) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key(SERVICE_NAME)
        self.engine = connect(settings.database_url)
        self.objects = open_store(settings.storage, data_dir=settings.data_dir)
        self.subject_secret = self.keyring.secret(SUBJECT_SECRET)
        self.grpc_port = 0
        self.metrics_port = 0
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    def domain(self, authorizer: Authorizer, sink: EventDecisionSink) -> Domain:
        """The domain objects over this process's database and object store."""
        g = self.settings.governance
        catalog = Catalog(self.engine, upload_ttl_s=g.upload_ttl_s)
        grants = Grants(catalog, default_ttl_s=g.grant_ttl_s, max_ttl_s=g.max_grant_ttl_s)
        registry = Registry(self.engine, self.objects)
        keys = DatasetKeys(self.objects)
        uploads = Uploads(catalog, self.objects, keys)
        finder = SubjectFinder(catalog, self.objects, keys, secret=self.subject_secret)
        return Domain(
            catalog=catalog,
            uploads=uploads,
            views=Views(catalog, self.objects, cache_bytes=g.view_cache_bytes, keys=keys),
            grants=grants,
            lineage=Lineage(self.engine),
            registry=registry,
            maintenance=Maintenance(
                self.engine,
                self.objects,
                registry,
                upload_ttl_s=g.upload_ttl_s,
                lock=threading.RLock(),
            ),
            access=Access(catalog, grants, authorizer, sink),
            subjects=finder,
            erasures=Erasures(catalog, uploads, finder, shard_bytes=MAX_SHARD_BYTES),
            shard_bytes=g.shard_bytes,
            max_shard_bytes=MAX_SHARD_BYTES,
        )

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        g = s.governance
        await asyncio.to_thread(migrate, self.engine)
        bus = await Bus.connect(s.nats, name="gantry-governance", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = OutboxRelay(self.engine, outbox, publisher)
        policy = Policy.from_file(g.policy_file) if g.policy_file else default_policy()
        authorizer = Authorizer(policy)
        sink = EventDecisionSink(background, source=SOURCE)
        domain = self.domain(authorizer, sink)
        jobs = JobEvents(bus, domain.grants, publisher, verifier=self.keyring.trust())
        interceptor = AuthInterceptor(
            caller_verifier(self.keyring, policy.roles, revocations.revocations),
            authorizer,
            METHOD_RULES,
            sink,
            SERVICE_NAME,
        )
        options = [
            ("grpc.max_receive_message_length", g.max_message_bytes),
            ("grpc.max_send_message_length", g.max_message_bytes),
        ]
        server = grpc.aio.server(interceptors=[interceptor], options=options)
        governance_pb2_grpc.add_GovernanceServiceServicer_to_server(GovernanceApi(domain), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{g.grpc_host}:{g.grpc_port}", s.tls)
        await server.start()
        probes = HealthServer()
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))
        self.metrics_port = probes.start(g.metrics_port, g.grpc_host).port
        tasks = [
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(jobs.run(), name="jobs"),
        ]
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        _log.info(
            "governance service ready",
            grpc=f"{g.grpc_host}:{self.grpc_port}",
            metrics=self.metrics_port,
            database=self.engine.url.render_as_string(hide_password=True),
            storage=s.storage.backend,
        )
        await self._stopping.wait()

        _log.info("governance service stopping")
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        jobs.stop()
        await tasks[1]
        await server.stop(grace=5)
        relay.stop()
        await tasks[0]
        await background.drain()
        await revocations.stop()
        await bus.close()
        probes.stop()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("governance service stopped")

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, SERVICE_NAME)

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        write_run_file(
            self.settings.data_dir,
            SERVICE_NAME,
            host=self.settings.governance.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )


async def serve(settings: GovernanceSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(GovernanceService(settings))


__all__ = ["MAX_SHARD_BYTES", "SUBJECT_SECRET", "GovernanceService", "serve"]
