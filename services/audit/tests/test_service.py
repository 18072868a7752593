"""The audit service end to end against a real nats-server, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import pytest

from gantry.client.audit import Filter
from gantry.core import IntegrityError, InvalidInput, Unauthenticated
from gantry.events import Emitter
from gantry.testing.probes import http_get, readyz

from .conftest import Running, wait_for

pytestmark = pytest.mark.timeout(90)


async def emit_reads(audit: Running, n: int, *, dataset: str = "customers") -> list[str]:
    key = audit.keyring.service_key("feature-store")
    ids = []
    async with await Emitter.connect(
        audit.settings.nats.url, source="feature-store", actor="svc-fs", signer=key
    ) as em:
        events = [
            em.build(
                "gantry.data.accessed",
                {"dataset": dataset, "rows": i, "decision": "deny" if i % 10 == 0 else "allow"},
                actor=f"user{i % 3}",
            )
            for i in range(n)
        ]
        await em.emit_many(events)
        ids = [e.id for e in events]
    return ids


async def test_events_are_logged_once_and_queryable(audit: Running) -> None:
    ids = await emit_reads(audit, 250)
    await wait_for(lambda: audit.service.ledger.size >= 250)
    with audit.client() as client:
        records = await asyncio.to_thread(
            lambda: list(client.query(Filter(types=["gantry.data.accessed"]), page_size=40))
        )
        assert [r.event_id for r in records] == ids
        assert [r.index for r in records] == list(range(250))
        denied = await asyncio.to_thread(
            lambda: list(client.query(Filter(actors=["user0"], decision="deny")))
        )
        assert denied and all(r.actor == "user0" and r.decision == "deny" for r in denied)
        report = await asyncio.to_thread(client.access_report, "dataset/customers")
        assert report.total == 250
        by_actor = {row.actor: row for row in report.rows}
        assert set(by_actor) == {"user0", "user1", "user2"}
        assert sum(r.denied for r in report.rows) == 25
        assert by_actor["user0"].allowed + by_actor["user0"].denied == 84


async def test_exports_jsonl_and_csv(audit: Running) -> None:
    await emit_reads(audit, 30)
    await wait_for(lambda: audit.service.ledger.size >= 30)
    with audit.client() as client:
        reads = Filter(types=["gantry.data.accessed"])
        jsonl = b"".join(await asyncio.to_thread(lambda: list(client.export(reads, fmt="jsonl"))))
        lines = [json.loads(line) for line in jsonl.splitlines()]
        assert len(lines) == 30
        assert lines[0]["index"] == 0 and lines[0]["event"]["type"] == "gantry.data.accessed"
        raw = b"".join(await asyncio.to_thread(lambda: list(client.export(reads, fmt="csv"))))
        rows = list(csv.DictReader(io.StringIO(raw.decode())))
        assert rows[0]["type"] == "gantry.data.accessed" and rows[0]["index"] == "0"
        assert len(rows) == len(lines)


async def test_proofs_check_out_locally(audit: Running) -> None:
    ids = await emit_reads(audit, 120)
    await wait_for(lambda: audit.service.ledger.last_checkpoint_size >= 120)
    trust = audit.keyring.tree_head_trust()
    with audit.client() as client:
        index, raw, head = await asyncio.to_thread(
            lambda: client.prove_inclusion(trust, event_id=ids[77])
        )
        assert index == 77 and json.loads(raw)["id"] == ids[77]
        first = await asyncio.to_thread(client.checkpoint)
        assert first.tree_size >= 120
        await emit_reads(audit, 150, dataset="other")
        await wait_for(lambda: audit.service.ledger.last_checkpoint_size >= first.tree_size + 150)
        a, b = await asyncio.to_thread(lambda: client.prove_consistency(trust, first.tree_size))
        assert a == first and b.tree_size >= first.tree_size + 150
        forged = b.__class__(b.tree_size, b"\x00" * 32, b.timestamp_ms, b.key_id, b.signature)
        with pytest.raises(IntegrityError, match="invalid signature"):
            forged.check_signature(trust)
        report = await asyncio.to_thread(client.verify)
        assert report.ok and report.events_checked >= 120 and report.checkpoints_checked >= 1


async def test_only_auditors_and_admins_query_and_every_query_is_audited(audit: Running) -> None:
    await emit_reads(audit, 5)
    await wait_for(lambda: audit.service.ledger.size >= 5)
    with audit.client("dave", "ml-developer") as client:
        with pytest.raises(Exception, match="may not query audit_log"):
            await asyncio.to_thread(lambda: list(client.query()))
    with audit.client("root", "platform-admin") as client:
        assert await asyncio.to_thread(lambda: len(list(client.query()))) >= 5
    await wait_for(lambda: audit.service.ledger.size >= 8)  # 5 reads + 2 decisions + 1 query
    with audit.client("carol", "auditor") as client:
        decisions = await asyncio.to_thread(
            lambda: list(client.query(Filter(types=["gantry.authz.decision"])))
        )
        denied = [d for d in decisions if d.decision == "deny"]
        assert [(d.actor, d.action) for d in denied] == [("dave", "query")]
        await wait_for_query_logged(client)


async def wait_for_query_logged(client: object) -> None:
    async with asyncio.timeout(10):
        while True:
            found = await asyncio.to_thread(
                lambda: list(client.query(Filter(types=["gantry.audit.queried"])))  # type: ignore[attr-defined]
            )
            if any(r.actor == "root" for r in found):
                return
            await asyncio.sleep(0.1)


async def test_bad_tokens_are_refused_and_audited(audit: Running) -> None:
    from gantry.client.audit import AuditClient
    from gantry.security import SigningKey, TokenIssuer

    addr = f"127.0.0.1:{audit.service.grpc_port}"
    stranger = TokenIssuer(SigningKey.generate()).issue(
        "mallory", ["auditor"], __import__("datetime").timedelta(minutes=5)
    )
    for token, needle in [("garbage", "malformed"), (stranger, "unknown key id")]:
        with AuditClient(addr, token) as client, pytest.raises(Unauthenticated, match=needle):
            await asyncio.to_thread(lambda c=client: list(c.query()))
    with (
        AuditClient(addr, audit.token("eve", "no-such-role")) as client,
        pytest.raises(Unauthenticated, match="not defined"),
    ):
        await asyncio.to_thread(lambda: list(client.query()))
    await wait_for(lambda: audit.service.ledger.size >= 3)
    with audit.client() as client:
        decisions = await asyncio.to_thread(
            lambda: list(client.query(Filter(types=["gantry.authz.decision"], decision="deny")))
        )
        assert len(decisions) >= 3


async def test_bad_requests_get_clear_errors(audit: Running) -> None:
    with audit.client() as client:
        with pytest.raises(InvalidInput, match="decision must be"):
            await asyncio.to_thread(lambda: list(client.query(Filter(decision="perhaps"))))
        with pytest.raises(InvalidInput, match="bad page token"):
            await asyncio.to_thread(lambda: client.page(page_token="xyz"))
        with pytest.raises(InvalidInput, match="resource is required"):
            await asyncio.to_thread(lambda: client.access_report(""))


async def test_health_reflection_and_metrics_need_no_token(audit: Running) -> None:
    import urllib.request

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    addr = f"127.0.0.1:{audit.service.grpc_port}"

    def probe() -> tuple[int, list[str]]:
        with grpc.insecure_channel(addr) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="gantry.audit.v1.AuditService")
            )
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            (answer,) = list(stub.ServerReflectionInfo(iter([request])))
            return status.status, [s.name for s in answer.list_services_response.service]

    status, services = await asyncio.to_thread(probe)
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert "gantry.audit.v1.AuditService" in services
    assert await readyz(audit.service.metrics_port) == "200 ready\n"
    assert await asyncio.to_thread(http_get, audit.service.metrics_port, "/healthz") == "200 ok\n"
    await emit_reads(audit, 3)
    await wait_for(lambda: audit.service.ledger.size >= 3)
    url = f"http://127.0.0.1:{audit.service.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    line = next(x for x in body.splitlines() if x.startswith("gantry_audit_events_appended_total"))
    assert float(line.split()[-1]) >= 3
