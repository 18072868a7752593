"""Wiring (the top layer): settings → database → NATS → ledger, ingest, gRPC API, metrics.

One :class:`AuditService` is one process. ``run()`` serves until SIGTERM/SIGINT (or
:meth:`AuditService.stop`), then shuts down in order: report NOT_SERVING, stop taking events
and finish the batches in hand, sign a last checkpoint, stop gRPC (calls in flight get a grace
period), then flush the outbox and the queued decisions, and close NATS and the database.
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
from prometheus_client import Gauge

from gantry.audit.anomalies import AnomalyWatch
from gantry.audit.api import METHOD_RULES, SERVICE, AuditApi
from gantry.audit.archive import Archiver
from gantry.audit.ingest import Ingestor
from gantry.audit.ledger import SOURCE, Ledger
from gantry.audit.reports import Reports
from gantry.audit.retention import Retention
from gantry.audit.settings import AuditSettings
from gantry.audit.store import Store, connect, migrate, outbox
from gantry.audit.subject_reports import GovernanceSubjects, SubjectReports
from gantry.audit.token_revocations import TokenRevocations
from gantry.core import GantryError, get_logger
from gantry.core.entrypoint import run_until_signalled
from gantry.core.health import HealthServer, connected
from gantry.core.runfile import run_file, service_address, write_run_file
from gantry.events import (
    BackgroundPublisher,
    Bus,
    Outbox,
    OutboxRelay,
    Publisher,
    SignaturePool,
)
from gantry.protos.v1 import audit_pb2_grpc
from gantry.security import AuthInterceptor, Authorizer, Policy, default_policy
from gantry.security.callers import caller_verifier, watch_revocations
from gantry.security.decisions import EventDecisionSink
from gantry.security.keyring import DirectoryTrustStore, Keyring
from gantry.security.tls import add_port, nats_tls
from gantry.security.tokens import ServiceToken
from gantry.storage import open_store

_log = get_logger("gantry.audit")

LOG_SIZE = Gauge("gantry_audit_log_size", "Events in the audit log")
CHECKPOINT_SIZE = Gauge("gantry_audit_checkpoint_size", "Tree size of the latest signed head")


class AuditService:
    """The audit service process."""

    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.keyring = Keyring(settings.keys_dir)
        self.key = self.keyring.service_key("audit")
        self.trust = self.keyring.trust()
        self.engine = connect(settings.database_url)
        self.objects = open_store(settings.storage, data_dir=settings.data_dir)
        self.ledger = Ledger(
            Store(self.engine),
            seal_key=self.keyring.secret("audit-seal"),
            signer=self.key,
            checkpoint_every_events=settings.audit.checkpoint_every_events,
            objects=self.objects,
        )
        r = settings.audit.retention
        self.retention = Retention(self.ledger)
        self.archiver = Archiver(
            self.ledger, level=r.segment_level, archive_after_days=r.archive_after_days
        )
        self.anomalies = AnomalyWatch(self.engine, Outbox(outbox), settings.audit.anomaly)
        o = settings.audit
        self.token = ServiceToken(
            "audit",
            functools.partial(self.keyring.service_key, "audit"),
            configured=o.token.get_secret_value(),
        )
        self.subjects = SubjectReports(
            self.ledger,
            GovernanceSubjects(
                lambda: service_address(
                    settings.data_dir,
                    "governance",
                    configured=o.governance_addr,
                    setting="GANTRY_AUDIT__GOVERNANCE_ADDR",
                ),
                self.token.get,
                timeout_s=o.call_timeout_s,
                tls=settings.tls,
            ),
            self.key,
        )
        self.reports = Reports(
            self.engine,
            self.ledger.store,
            self.objects,
            self.key,
            self.ledger.tree_head,
            self.ledger.events,
            o.reports,
        )
        self.grpc_port = 0
        self.metrics_port = 0
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    async def run(self) -> None:
        """Start everything, serve until stopped, shut down cleanly."""
        s = self.settings
        migrate(self.engine)
        await asyncio.to_thread(self.ledger.open)
        LOG_SIZE.set(self.ledger.size)
        CHECKPOINT_SIZE.set(self.ledger.last_checkpoint_size)
        if s.audit.anomaly.enabled:
            await asyncio.to_thread(self.anomalies.prime)
        bus = await Bus.connect(s.nats, name="gantry-audit", tls=nats_tls(s.tls))
        await bus.ensure_streams()
        revocations = await watch_revocations(bus)
        publisher = Publisher(bus, signer=self.key, max_event_bytes=s.audit.max_event_bytes)
        background = BackgroundPublisher(publisher)
        background.start()
        relay = OutboxRelay(self.engine, outbox, publisher)
        self.anomalies.on_change = relay.notify
        pool = (
            SignaturePool(
                functools.partial(DirectoryTrustStore, self.keyring.trusted_dir),
                workers=s.audit.signature_workers,
            )
            if s.audit.require_signed_events and s.audit.signature_workers
            else None
        )
        ingestor = Ingestor(
            bus,
            self.ledger,
            publisher,
            verifier=self.trust if s.audit.require_signed_events else None,
            signature_pool=pool,
            batch_size=s.audit.batch_size,
            ack_wait_s=s.audit.ack_wait_s,
            max_event_bytes=s.audit.max_event_bytes,
            own_kid=self.key.kid,
            watch=self.anomalies,
        )
        policy = Policy.from_file(s.audit.policy_file) if s.audit.policy_file else default_policy()
        verifier = caller_verifier(self.keyring, policy.roles, revocations.revocations)
        interceptor = AuthInterceptor(
            verifier,
            Authorizer(policy),
            METHOD_RULES,
            EventDecisionSink(background, source=SOURCE),
            "audit",
        )
        server = grpc.aio.server(interceptors=[interceptor])
        audit_pb2_grpc.add_AuditServiceServicer_to_server(
            AuditApi(
                self.ledger,
                self.keyring.tree_head_trust(),
                on_query=relay.notify,
                anomalies=self.anomalies,
                subjects=self.subjects,
                reports=self.reports,
                retention=self.retention,
                archiver=self.archiver,
                tokens=TokenRevocations(bus, publisher, verifier),
            ),
            server,
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            [SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.grpc_port = add_port(server, f"{s.audit.grpc_host}:{s.audit.grpc_port}", s.tls)
        await server.start()
        probes = HealthServer()
        grpc_ready = probes.flag("grpc", down="not serving")
        probes.add_check("nats", connected(lambda: bus.nc.is_connected))
        self.metrics_port = probes.start(s.audit.metrics_port, s.audit.grpc_host).port
        self._tasks = [
            asyncio.create_task(ingestor.run(), name="ingest"),
            asyncio.create_task(relay.run(), name="outbox"),
            asyncio.create_task(self._checkpoints(ingestor, relay), name="checkpoints"),
            asyncio.create_task(self._scheduled_reports(relay), name="reports"),
            asyncio.create_task(self._upkeep(relay), name="retention"),
        ]
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        grpc_ready.set()
        self._write_run_file()
        _log.info(
            "audit service ready",
            grpc=f"{s.audit.grpc_host}:{self.grpc_port}",
            metrics=self.metrics_port,
            log_size=self.ledger.size,
            database=self.engine.url.render_as_string(hide_password=True),
        )
        await self._stopping.wait()

        _log.info("audit service stopping")
        for name in ("", SERVICE):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grpc_ready.clear()
        ingestor.stop()
        await self._tasks[0]
        for task in self._tasks[2:]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self.ledger.checkpoint)
        await server.stop(grace=5)
        relay.stop()
        await self._tasks[1]
        await background.drain()
        if pool is not None:
            await asyncio.to_thread(pool.close)
        await revocations.stop()
        await bus.close()
        probes.stop()
        self.engine.dispose()
        self._run_file().unlink(missing_ok=True)
        _log.info("audit service stopped", log_size=self.ledger.size)

    async def _checkpoints(self, ingestor: Ingestor, relay: OutboxRelay) -> None:
        every_s = self.settings.audit.checkpoint_every_s
        last = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ingestor.new_events.wait(), timeout=min(every_s, 1.0))
            ingestor.new_events.clear()
            LOG_SIZE.set(self.ledger.size)
            if self.ledger.checkpoint_due(elapsed_s=time.monotonic() - last, every_s=every_s):
                head = await asyncio.to_thread(self.ledger.checkpoint)
                last = time.monotonic()
                if head is not None:
                    CHECKPOINT_SIZE.set(head.tree_size)
                    relay.notify()

    async def _scheduled_reports(self, relay: OutboxRelay) -> None:
        """Make the daily, weekly and monthly reports as their periods end."""
        every_s = self.settings.audit.reports.check_every_s
        while True:
            made = await asyncio.to_thread(self.reports.generate_due)
            if made:
                relay.notify()
                _log.info("scheduled reports made", reports=[r.report_id for r in made])
            await asyncio.sleep(every_s)

    async def _upkeep(self, relay: OutboxRelay) -> None:
        """Archive due segments and purge expired events, every ``retention.every_s``."""
        r = self.settings.audit.retention
        if not r.auto:
            return
        while True:
            await asyncio.sleep(r.every_s)
            try:
                archived = await asyncio.to_thread(self.archiver.archive, "svc-audit")
                purged = await asyncio.to_thread(self.retention.purge, "svc-audit")
            except GantryError as exc:
                _log.warning("archival or purge failed; retried later", error=str(exc))
                continue
            if archived.events or purged.events:
                relay.notify()
                _log.info("upkeep", archived=archived.events, purged=purged.events)

    def _run_file(self) -> Path:
        return run_file(self.settings.data_dir, "audit")

    def _write_run_file(self) -> None:
        """Tell the supervisor and the CLI where this process listens."""
        write_run_file(
            self.settings.data_dir,
            "audit",
            host=self.settings.audit.grpc_host,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
        )


async def serve(settings: AuditSettings) -> None:
    """Run the service until SIGTERM or SIGINT."""
    await run_until_signalled(AuditService(settings))


__all__ = ["AuditService", "serve"]
