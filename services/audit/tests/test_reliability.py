"""The audit service under failure: a SIGKILL mid-stream, a NATS restart, and poisoned events."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import sqlalchemy as sa

from gantry.audit.app import AuditService
from gantry.audit.ingest import Ingestor
from gantry.audit.ledger import Ledger
from gantry.audit.settings import AuditSettings
from gantry.audit.store import Store, connect, migrate
from gantry.audit.store import events as events_table
from gantry.client.audit import AuditClient
from gantry.core import NatsSettings
from gantry.events import (
    DEAD_REASON_HEADER,
    DEFAULT_MAX_EVENT_BYTES,
    SIGNATURE_HEADER,
    Bus,
    Emitter,
    EventEnvelope,
    Publisher,
)
from gantry.events.signing import signature_header
from gantry.security import SigningKey, TokenIssuer
from gantry.security.keyring import Keyring
from gantry.supervisor import NatsServer

from .conftest import Running, audit_settings, running, wait_for

DEAD_LETTERS = "gantry.deadletter.audit"


# -- helpers ---------------------------------------------------------------------------------


def ids_in_log(engine: sa.Engine, ids: list[str]) -> tuple[int, int]:
    """(rows, distinct event ids) among ``ids`` in the log."""
    c = events_table.c
    found = 0
    distinct: set[str] = set()
    with engine.connect() as conn:
        for start_ in range(0, len(ids), 500):
            chunk = ids[start_ : start_ + 500]
            got = conn.execute(sa.select(c.event_id).where(c.event_id.in_(chunk))).scalars().all()
            found += len(got)
            distinct.update(got)
    return found, len(distinct)


async def emit_in_chunks(
    url: str, key: SigningKey, evs: list[EventEnvelope], progress: list[int], chunk: int = 200
) -> None:
    """Publish ``evs`` (pipelined within each chunk), counting the acked ones in ``progress``."""
    async with await Emitter.connect(
        url, source="producer", actor="svc-producer", signer=key
    ) as em:
        for i in range(0, len(evs), chunk):
            await em.emit_many(evs[i : i + chunk])
            progress[0] += len(evs[i : i + chunk])


async def dead_letters(url: str, want: int, timeout: float) -> dict[bytes, Any]:
    """Dead-lettered messages by payload (at most ``want``, waiting up to ``timeout``)."""
    got: dict[bytes, Any] = {}
    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().pull_subscribe(DEAD_LETTERS, stream="DEADLETTER")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(got) < want:
                    with contextlib.suppress(nats.errors.TimeoutError):
                        for msg in await sub.fetch(want, timeout=0.5):
                            got[bytes(msg.data)] = msg
    finally:
        await nc.close()
    return got


def build_reads(n: int, *, actor: str = "svc-producer") -> list[EventEnvelope]:
    return [
        EventEnvelope(
            type="gantry.data.accessed",
            source="producer",
            actor=actor,
            data={"dataset": "customers", "rows": i},
        )
        for i in range(n)
    ]


# -- SIGKILL of the service process while events stream in -----------------------------------


class ServiceProcess:
    """``python -m gantry.audit`` as a child process, logging to a file."""

    def __init__(self, data_dir: Path, env: dict[str, str], log: Path) -> None:
        self.data_dir = data_dir
        self.env = env
        self.log_path = log
        self._log = log.open("ab")
        # its own process group, so that whatever it spawned can be found and cleaned up
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gantry.audit"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def run_file(self) -> Path:
        return self.data_dir / "run" / "audit.json"

    async def ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for this process's run file (the previous process's may still be there)."""
        async with asyncio.timeout(timeout):
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"audit exited with {self.proc.returncode}: {self.log_path.read_text()}"
                    )
                with contextlib.suppress(FileNotFoundError, ValueError):
                    info: dict[str, Any] = json.loads(self.run_file.read_text())
                    if info["pid"] == self.proc.pid:
                        return info
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout):
            while self.proc.poll() is None:
                await asyncio.sleep(0.05)
        return self.proc.returncode

    def left_behind(self) -> list[int]:
        """Live processes (not zombies) of this one's process group, itself excluded."""
        return [pid for pid in live_in_group(self.proc.pid) if pid != self.proc.pid]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):  # e.g. orphaned worker processes
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def live_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            state, pgrp = fields[0], int(fields[2])
            if pgrp == pgid and state not in ("Z", "X"):
                found.append(int(stat.parent.name))
    return found


def service_env(data_dir: Path, nats_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    return env | {
        "GANTRY_DATA_DIR": str(data_dir),
        "GANTRY_NATS__URL": nats_url,
        "GANTRY_NATS__RECONNECT_WAIT_S": "0.1",
        "GANTRY_AUDIT__GRPC_PORT": "0",
        "GANTRY_AUDIT__METRICS_PORT": "0",
        "GANTRY_AUDIT__CHECKPOINT_EVERY_EVENTS": "500",
        "GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.5",
        # events fetched but not acked when the service died come back after this
        "GANTRY_AUDIT__ACK_WAIT_S": "5",
        "GANTRY_LOG_JSON": "false",
    }


def count_reads(db: Path) -> int:
    """Logged ``gantry.data.accessed`` events, read through a read-only connection."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    except sqlite3.OperationalError:  # not created yet
        return 0
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM audit_events WHERE type = 'gantry.data.accessed'"
            ).fetchone()[0]
        )
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0
    finally:
        conn.close()


@pytest.fixture
def service_procs() -> Iterator[list[ServiceProcess]]:
    procs: list[ServiceProcess] = []
    yield procs
    for p in procs:
        p.close()


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path, nats_server: NatsServer, service_procs: list[ServiceProcess]
) -> None:
    total = 10_000
    data = tmp_path / "data"
    keyring = Keyring(data / "keys")
    issuer = TokenIssuer(keyring.issuer(create=True))
    producer = keyring.service_key("producer")
    env = service_env(data, nats_server.url)
    db = data / "audit.db"
    first = ServiceProcess(data, env, tmp_path / "audit.log")
    service_procs.append(first)
    await first.ready()

    evs = build_reads(total)
    progress = [0]
    publishing = asyncio.create_task(emit_in_chunks(nats_server.url, producer, evs, progress, 500))
    try:
        logged = 0
        async with asyncio.timeout(60):
            while logged < 2_000:
                await asyncio.sleep(0.02)
                logged = await asyncio.to_thread(count_reads, db)
        first.kill()
        assert 2_000 <= logged <= 8_000, f"killed too late: {logged} events were logged"
        killed_at = await asyncio.to_thread(count_reads, db)
        assert killed_at < total

        second = ServiceProcess(data, env, tmp_path / "audit.log")
        service_procs.append(second)
        info = await second.ready()
        await asyncio.wait_for(publishing, 60)
        assert progress[0] == total
        # events the killed process had fetched but not acked come back after the ack wait (30 s)
        async with asyncio.timeout(75):
            while await asyncio.to_thread(count_reads, db) < total:
                await asyncio.sleep(0.2)
    finally:
        publishing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publishing

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        rows, distinct = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT event_id) FROM audit_events "
            "WHERE type = 'gantry.data.accessed'"
        ).fetchone()
        logged_ids = {r[0] for r in conn.execute("SELECT event_id FROM audit_events")}
        seqs = [r[0] for r in conn.execute("SELECT seq FROM audit_events ORDER BY seq")]
    conn.close()
    assert rows == distinct == total
    assert {e.id for e in evs} <= logged_ids
    assert seqs == list(range(total))  # nothing else was logged, nothing twice

    token = issuer.issue("carol", ["auditor"], dt.timedelta(minutes=5))
    with AuditClient(info["grpc"], token) as client:
        report = await asyncio.to_thread(client.verify)
    assert report.ok, list(report.problems)
    assert report.events_checked >= total

    assert await second.terminate() == 0
    offline = AuditService(AuditSettings(data_dir=data))
    try:
        final = await asyncio.to_thread(offline.ledger.verify, offline.trust)
    finally:
        offline.engine.dispose()
    # (the Verify call itself was audited: its decision and query events came after)
    assert final.ok and final.events_checked >= len(seqs)
    # the graceful stop signed a last head over everything
    assert final.latest is not None and final.latest.tree_size == final.events_checked


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.timeout(60)
async def test_a_killed_service_leaves_no_processes_behind(
    tmp_path: Path, nats_server: NatsServer, service_procs: list[ServiceProcess]
) -> None:
    data = tmp_path / "data"
    keyring = Keyring(data / "keys")
    keyring.issuer(create=True)
    producer = keyring.service_key("producer")
    env = service_env(data, nats_server.url)
    proc = ServiceProcess(data, env, tmp_path / "audit.log")
    service_procs.append(proc)
    await proc.ready()
    evs = build_reads(5)
    await emit_in_chunks(nats_server.url, producer, evs, [0])
    async with asyncio.timeout(20):  # checked (by the signature workers) and logged
        while await asyncio.to_thread(count_reads, data / "audit.db") < len(evs):
            await asyncio.sleep(0.05)
    proc.kill()
    deadline = time.monotonic() + 5
    while proc.left_behind() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert proc.left_behind() == [], "processes of the killed service are still running"


# -- NATS restarts while events are published ------------------------------------------------


async def test_nats_restart_mid_stream_loses_and_duplicates_nothing(
    audit: Running, nats_server: NatsServer
) -> None:
    total = 2_000
    key = audit.keyring.service_key("producer")
    evs = build_reads(total)
    progress = [0]
    publishing = asyncio.create_task(emit_in_chunks(nats_server.url, key, evs, progress, 100))
    try:
        await wait_for(lambda: progress[0] >= 500, timeout=30)
        assert progress[0] < total, "publishing finished before the restart"
        assert audit.service.ledger.size < total
        t0 = time.monotonic()
        await asyncio.to_thread(nats_server.restart)
        assert time.monotonic() - t0 < 15
        await asyncio.wait_for(publishing, 60)
    finally:
        publishing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publishing
    assert progress[0] == total
    engine = audit.service.ledger.store.engine
    ids = [e.id for e in evs]
    async with asyncio.timeout(60):
        while (await asyncio.to_thread(ids_in_log, engine, ids))[0] < total:
            await asyncio.sleep(0.2)
    assert await asyncio.to_thread(ids_in_log, engine, ids) == (total, total)
    with engine.connect() as conn:
        per_id = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(events_table.c.event_id)))
        ).one()
    assert per_id[0] == per_id[1] == audit.service.ledger.size == total
    report = await asyncio.to_thread(audit.service.ledger.verify, audit.keyring.tree_head_trust())
    assert report.ok, report.problems


# -- poisoned events go to the dead-letter subject, the consumer keeps going ------------------


@pytest.fixture
async def small_audit(
    tmp_path: Path, nats_url: str, database_url: str | None
) -> AsyncIterator[Running]:
    """The audit service with a 2 KiB event size limit."""
    settings = audit_settings(tmp_path / "data", nats_url, database_url)
    settings.audit = settings.audit.model_copy(update={"max_event_bytes": 2048})
    async with running(settings) as r:
        yield r


def envelope(type_: str, **data: Any) -> EventEnvelope:
    return EventEnvelope(type=type_, source="producer", actor="svc-producer", data=data)


@pytest.mark.timeout(60)
async def test_poisoned_events_are_dead_lettered_with_a_reason(small_audit: Running) -> None:
    audit = small_audit
    trusted = audit.keyring.service_key("producer")
    stranger = SigningKey.generate(kid="svc-producer")  # right kid, wrong key
    unknown = SigningKey.generate(kid="svc-nobody")

    def signed(payload: bytes, key: SigningKey = trusted) -> dict[str, str]:
        return {SIGNATURE_HEADER: signature_header(key, payload)}

    bad_ids: list[str] = []

    def ev_bytes(ev: EventEnvelope) -> bytes:
        bad_ids.append(ev.id)
        return ev.canonical_bytes()

    good_shape = ev_bytes(envelope("gantry.data.accessed", dataset="customers", rows=1))
    tampered = good_shape.replace(b'"rows":1', b'"rows":2')
    huge = ev_bytes(envelope("gantry.data.accessed", dataset="customers", purpose="x" * 4000))
    cases: list[tuple[str, bytes, dict[str, str], str]] = [
        ("gantry.data.accessed", b"{not json", signed(b"{not json"), "malformed event envelope"),
        (
            "gantry.data.accessed",
            b'{"type":"gantry.data.accessed"}',
            {},
            "malformed event envelope",
        ),
        (
            "gantry.data.frobbed",
            (p := ev_bytes(envelope("gantry.data.frobbed", dataset="customers"))),
            signed(p),
            "unknown event type gantry.data.frobbed",
        ),
        (
            "gantry.data.accessed",
            (p := ev_bytes(envelope("gantry.data.accessed", rows=-1))),
            signed(p),
            "data.dataset",
        ),
        (
            "gantry.job.started",
            (p := ev_bytes(envelope("gantry.data.accessed", dataset="customers"))),
            signed(p),
            "does not match its subject",
        ),
        ("gantry.data.accessed", huge, signed(huge), "exceeds the maximum of 2048 bytes"),
        ("gantry.data.accessed", good_shape, signed(good_shape, stranger), "bad event signature"),
        ("gantry.data.accessed", tampered, signed(good_shape), "bad event signature"),
        (
            "ext.crm.exported",
            (p := ev_bytes(envelope("ext.crm.exported", what="contacts"))),
            signed(p, unknown),
            "unknown key id 'svc-nobody'",
        ),
        (
            "gantry.data.accessed",
            (p := ev_bytes(envelope("gantry.data.accessed", dataset="customers", rows=3))),
            {},
            "not signed",
        ),
    ]
    assert len({payload for _, payload, _, _ in cases}) == len(cases)

    nc = await nats.connect(audit.settings.nats.url)
    try:
        js = nc.jetstream()
        for subject, payload, headers, _ in cases:
            await js.publish(subject, payload, headers=headers or None)
        # a good event after the poisoned ones is still logged: the consumer kept going
        good = envelope("gantry.data.accessed", dataset="customers", rows=7)
        good_bytes = good.canonical_bytes()
        await js.publish("gantry.data.accessed", good_bytes, headers=signed(good_bytes))
    finally:
        await nc.close()
    ledger = audit.service.ledger
    await wait_for(lambda: ledger.size >= 1)
    got = await dead_letters(audit.settings.nats.url, len(cases), timeout=20)

    for subject, payload, _, needle in cases:
        msg = got.get(payload)
        assert msg is not None, f"not dead-lettered: {payload[:60]!r}"
        headers = msg.headers or {}
        assert needle in headers.get(DEAD_REASON_HEADER, ""), (needle, headers)
        assert headers["Gantry-Original-Subject"] == subject
        assert headers["Gantry-Consumer"] == "audit"
    assert len(got) == len(cases)

    assert ledger.size == 1
    row = ledger.store.row(index=0)
    assert row is not None and row.event_id == good.id and bytes(row.canonical) == good_bytes
    for event_id in bad_ids:
        assert ledger.store.row(event_id=event_id) is None


@pytest.mark.timeout(60)
async def test_an_event_that_cannot_be_canonicalised_does_not_stop_ingest(
    tmp_path: Path, nats_url: str
) -> None:
    keyring = Keyring(tmp_path / "keys")
    producer = keyring.service_key("producer")
    engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
    migrate(engine)
    ledger = Ledger(Store(engine), seal_key=os.urandom(32), signer=SigningKey.generate())
    bus = await Bus.connect(NatsSettings(url=nats_url, reconnect_wait_s=0.1), name="test")
    await bus.ensure_streams()
    ingestor = Ingestor(
        bus,
        ledger,
        Publisher(bus),
        verifier=keyring.trust(),
        batch_size=100,
        max_event_bytes=DEFAULT_MAX_EVENT_BYTES,
        streams=("EXTERNAL",),
    )
    task = asyncio.create_task(ingestor.run())
    blank = EventEnvelope(type="ext.crm.exported", source="producer", actor="svc-producer")
    huge_int = blank.canonical_bytes().replace(b'"data":{}', b'"data":{"n":' + b"9" * 30 + b"}")
    good = EventEnvelope(
        type="ext.crm.exported", source="producer", actor="svc-producer", data={"n": 1}
    )
    crashed: BaseException | None = None
    try:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            for payload in (huge_int, good.canonical_bytes()):
                await js.publish(
                    "ext.crm.exported",
                    payload,
                    headers={SIGNATURE_HEADER: signature_header(producer, payload)},
                )
        finally:
            await nc.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while ledger.size < 1 and not task.done():
                    await asyncio.sleep(0.05)
        if task.done() and not task.cancelled():
            crashed = task.exception()
        got = await dead_letters(nats_url, 1, timeout=0 if crashed else 5)
    finally:
        ingestor.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await bus.close()
        engine.dispose()
    assert crashed is None, f"the ingest task died: {crashed!r}"
    assert ledger.size == 1
    assert DEAD_REASON_HEADER in (got[huge_int].headers or {})


@pytest.mark.timeout(60)
async def test_ids_and_types_the_database_cannot_hold_are_refused_at_once(
    audit: Running,
) -> None:
    """Same outcome on SQLite and PostgreSQL (VARCHAR(64) ids, VARCHAR(128) types)."""
    key = audit.keyring.service_key("producer")
    template = EventEnvelope(type="ext.crm.exported", source="producer", actor="svc-producer")
    raw = template.canonical_bytes()
    long_type = f"ext.{'y' * 70}.{'z' * 70}"
    cases = {
        "long id": ("ext.crm.exported", raw.replace(template.id.encode(), b"x" * 100), "id"),
        "non-uuid id": ("ext.crm.exported", raw.replace(template.id.encode(), b"42"), "id"),
        "long type": (long_type, raw.replace(b"ext.crm.exported", long_type.encode()), "type"),
    }
    marker = EventEnvelope(type="ext.crm.exported", source="producer", actor="svc-producer")
    nc = await nats.connect(audit.settings.nats.url)
    try:
        js = nc.jetstream()
        for subject, payload, _ in [*cases.values(), (marker.type, marker.canonical_bytes(), "")]:
            headers = {SIGNATURE_HEADER: signature_header(key, payload)}
            await js.publish(subject, payload, headers=headers)
    finally:
        await nc.close()
    store = audit.service.ledger.store
    await wait_for(lambda: store.row(event_id=marker.id) is not None)
    got = await dead_letters(audit.settings.nats.url, len(cases), timeout=5)
    for name, (_, payload, field) in cases.items():
        assert payload in got, f"{name} was not dead-lettered"
        reason = (got[payload].headers or {})[DEAD_REASON_HEADER]
        assert reason.startswith(f"malformed event envelope: {field}:"), (name, reason)
    assert audit.service.ledger.size == 1
