"""Benchmark: audit ingest through real NATS, access reports, proofs and RBAC decisions.

    python bench/audit_ingest.py --quick     # under a minute
    python bench/audit_ingest.py             # full size (1,000,000 stored events)

Figures (the LAST line printed is the JSON object, also written to
bench/results/audit_ingest.json):

- raw_publish_per_s: signed events published to JetStream and acked, no consumer.
- events_per_s_unsigned / ratio_vs_raw_unsigned: the same with the audit's event-signature
  check off (require_signed_events=false), to show what Ed25519 verification costs.
- events_per_s: the same number of events, already in the streams, appended durably into the
  audit log by a real audit service (durable pull consumers, SQLite WAL with full fsync, ack
  after commit); ratio_vs_raw = events_per_s / raw_publish_per_s, same run.
- access_report_p50_ms / _p99_ms: "who read dataset X between T1 and T2" over a log of
  1,000,000 (quick: 100,000) events across 100 datasets.
- inclusion_proof_p50_us: one RFC 6962 inclusion proof from the log's Merkle tree;
  inclusion_proof_with_row_p50_us adds fetching the event row from the database.
- rbac_decision_p50_us / _p99_us: gantry.security.Authorizer with 10,000 users and 1,000 roles;
  casbin_rbac_decision_p50_us: PyCasbin on the same policy, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit_result, median, percentile

from gantry.audit.app import AuditService
from gantry.audit.ledger import Ledger
from gantry.audit.settings import AuditOptions, AuditSettings
from gantry.audit.store import Store, connect, migrate
from gantry.core import NatsSettings, configure_logging
from gantry.events import Bus, EventEnvelope, Publisher
from gantry.security import Authorizer, Policy, SigningKey
from gantry.security.keyring import Keyring
from gantry.supervisor import NatsServer

DATASETS = [f"ds{i:03d}" for i in range(100)]


def make_events(n: int, *, start_ms: int, span_ms: int) -> list[EventEnvelope]:
    """``n`` dataset-read events spread over ``span_ms`` from ``start_ms``."""
    rnd = random.Random(7)
    base = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
    return [
        EventEnvelope(
            type="gantry.data.accessed",
            source="bench",
            actor=f"user{rnd.randrange(500)}",
            subject=f"dataset/{DATASETS[i % len(DATASETS)]}",
            time=base + dt.timedelta(milliseconds=rnd.randrange(span_ms)),
            data={
                "dataset": DATASETS[i % len(DATASETS)],
                "rows": rnd.randrange(1000),
                "decision": "deny" if rnd.random() < 0.05 else "allow",
            },
        )
        for i in range(n)
    ]


async def ingest(
    n: int, work: Path, *, signed: bool = True, profiler: Any = None
) -> dict[str, float]:
    """raw_publish_per_s and events_per_s for ``n`` events through a real nats-server."""
    server = NatsServer(work / "nats").start()
    try:
        keyring = Keyring(work / "data" / "keys")
        producer = keyring.service_key("bench")
        bus = await Bus.connect(NatsSettings(url=server.url), name="bench")
        await bus.ensure_streams()
        publisher = Publisher(bus, signer=producer)
        now = int(time.time() * 1000)
        # raw: publish to a stream nobody consumes (same envelope, same signature work)
        raw_events = [
            EventEnvelope(type="ext.bench.raw", source="bench", actor="bench", data=e.data)
            for e in make_events(n, start_ms=now, span_ms=60_000)
        ]
        t0 = time.perf_counter()
        await publisher.publish_many(raw_events, concurrency=512)
        raw_s = time.perf_counter() - t0
        await bus.js.purge_stream("EXTERNAL")
        events = make_events(n, start_ms=now, span_ms=60_000)
        await publisher.publish_many(events, concurrency=512)
        await bus.close()

        settings = AuditSettings(
            data_dir=work / "data",
            nats=NatsSettings(url=server.url),
            audit=AuditOptions(
                grpc_port=0, metrics_port=0, batch_size=1000, require_signed_events=signed
            ),
        )
        service = AuditService(settings)
        task = asyncio.create_task(service.run())
        while service.grpc_port == 0:
            await asyncio.sleep(0.01)
        if profiler is not None:
            profiler.enable()
        t0 = time.perf_counter()
        while service.ledger.size < n:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        ingest_s = time.perf_counter() - t0
        if profiler is not None:
            profiler.disable()
        service.stop()
        await task
    finally:
        server.stop()
    raw_rate = n / raw_s
    rate = n / ingest_s
    return {
        "events": n,
        "raw_publish_per_s": round(raw_rate),
        "events_per_s": round(rate),
        "ratio_vs_raw": round(rate / raw_rate, 3),
    }


def reports_and_proofs(n: int, work: Path, *, samples: int) -> dict[str, float]:
    """Access-report latency and inclusion-proof time over a log of ``n`` events."""
    engine = connect(f"sqlite:///{work / 'report.db'}")
    migrate(engine)
    ledger = Ledger(Store(engine), seal_key=os.urandom(32), signer=SigningKey.generate())
    span_ms = 30 * 86_400_000
    start_ms = int(time.time() * 1000) - span_ms
    chunk = 20_000
    t0 = time.perf_counter()
    for offset in range(0, n, chunk):
        batch = make_events(min(chunk, n - offset), start_ms=start_ms, span_ms=span_ms)
        ledger.append([(e, e.canonical_bytes()) for e in batch])
    load_s = time.perf_counter() - t0
    ledger.checkpoint()
    rnd = random.Random(1)
    report_ms = []
    for _ in range(samples):
        since = start_ms + rnd.randrange(span_ms // 2)
        until = since + rnd.randrange(86_400_000, span_ms // 2)
        t = time.perf_counter()
        rows = ledger.store.access_report(f"dataset/{rnd.choice(DATASETS)}", since, until)
        report_ms.append((time.perf_counter() - t) * 1000)
        assert rows, "the report must find reads"
    proof_us = []
    proof_row_us = []
    size = ledger.size
    for _ in range(2000):
        i = rnd.randrange(size)
        t = time.perf_counter_ns()
        ledger.tree.inclusion_proof(i, size)
        proof_us.append((time.perf_counter_ns() - t) / 1000)
    for _ in range(300):
        i = rnd.randrange(size)
        t = time.perf_counter_ns()
        ledger.inclusion(index=i)
        proof_row_us.append((time.perf_counter_ns() - t) / 1000)
    engine.dispose()
    return {
        "report_events": n,
        "report_load_events_per_s": round(n / load_s),
        "access_report_p50_ms": round(median(report_ms), 3),
        "access_report_p99_ms": round(percentile(report_ms, 99), 3),
        "inclusion_proof_p50_us": round(median(proof_us), 2),
        "inclusion_proof_with_row_p50_us": round(median(proof_row_us), 2),
    }


def rbac(users: int, roles: int, samples: int, casbin_samples: int) -> dict[str, float]:
    """Authorizer vs PyCasbin on one RBAC policy: users bound to roles, roles to grants."""
    import casbin

    rnd = random.Random(3)
    kinds = [f"kind{k}" for k in range(50)]
    actions = ["read", "list", "create", "update", "delete", "deploy"]
    role_rules: dict[str, list[tuple[str, str]]] = {}
    lines = ["version: 1", "roles:"]
    for r in range(roles):
        pairs = sorted({(rnd.choice(kinds), rnd.choice(actions)) for _ in range(5)})
        role_rules[f"role{r}"] = pairs
        lines.append(f"  role{r}:")
        lines.append("    rules:")
        for kind, action in pairs:
            lines.append(f"      - {{actions: [{action}], resources: [{kind}]}}")
    bindings = {f"user{u}": [f"role{rnd.randrange(roles)}" for _ in range(3)] for u in range(users)}
    lines.append("bindings:")
    for user, names in bindings.items():
        lines.append(f"  {user}: [{', '.join(names)}]")
    authorizer = Authorizer(Policy.from_yaml("\n".join(lines), source="bench"))

    model = casbin.Model()
    model.load_model_from_text(
        "[request_definition]\nr = sub, obj, act\n"
        "[policy_definition]\np = sub, obj, act\n"
        "[role_definition]\ng = _, _\n"
        "[policy_effect]\ne = some(where (p.eft == allow))\n"
        "[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n"
    )
    enforcer = casbin.Enforcer(model)
    enforcer.add_policies([[role, k, a] for role, pairs in role_rules.items() for k, a in pairs])
    enforcer.add_grouping_policies([[u, r] for u, names in bindings.items() for r in names])

    queries = [
        (f"user{rnd.randrange(users)}", rnd.choice(kinds), rnd.choice(actions))
        for _ in range(samples)
    ]
    ours_us = []
    decide = authorizer.decide
    clock = time.perf_counter_ns
    for user, kind, action in queries:
        t = clock()
        decide(user, (), action, kind)
        ours_us.append((clock() - t) / 1000)
    casbin_us = []
    disagree = 0
    for user, kind, action in queries[:casbin_samples]:
        t = clock()
        theirs = enforcer.enforce(user, kind, action)
        casbin_us.append((clock() - t) / 1000)
        disagree += theirs != decide(user, (), action, kind).allowed
    if disagree:
        raise SystemExit(
            f"the two RBAC engines disagree on {disagree} of {casbin_samples} requests"
        )
    p50, casbin_p50 = median(ours_us), median(casbin_us)
    return {
        "rbac_users": users,
        "rbac_roles": roles,
        "rbac_decision_p50_us": round(p50, 3),
        "rbac_decision_p99_us": round(percentile(ours_us, 99), 3),
        "casbin_rbac_decision_p50_us": round(casbin_p50, 3),
        "rbac_speedup_vs_casbin": round(casbin_p50 / p50, 1),
    }


def main() -> int:
    """Run every part and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    args = parser.parse_args()
    configure_logging("bench", level="WARNING")
    ingest_n = 10_000 if args.quick else 100_000
    report_n = 100_000 if args.quick else 1_000_000
    figures: dict[str, object] = {"benchmark": "audit_ingest", "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="gantry-bench-") as tmp:
        work = Path(tmp)
        print(f"ingest: {ingest_n} signed events through nats-server ...", flush=True)
        figures.update(asyncio.run(ingest(ingest_n, work / "signed")))
        print("ingest again with signature checks off (NATS credentials only) ...", flush=True)
        unsigned = asyncio.run(ingest(ingest_n, work / "unsigned", signed=False))
        figures["events_per_s_unsigned"] = unsigned["events_per_s"]
        figures["ratio_vs_raw_unsigned"] = unsigned["ratio_vs_raw"]
        print(f"access reports over {report_n} events ...", flush=True)
        figures.update(reports_and_proofs(report_n, work, samples=200 if args.quick else 500))
    print("rbac: 10,000 users, 1,000 roles vs PyCasbin ...", flush=True)
    figures.update(
        rbac(10_000, 1_000, 20_000 if args.quick else 100_000, 100 if args.quick else 300)
    )
    figures["targets_met"] = {
        "events_per_s>=10000": figures["events_per_s"] >= 10_000,  # type: ignore[operator]
        "ratio_vs_raw>=0.5": figures["ratio_vs_raw"] >= 0.5,  # type: ignore[operator]
        "access_report_p50_ms<=50": figures["access_report_p50_ms"] <= 50,  # type: ignore[operator]
        "rbac_p50_us<=10": figures["rbac_decision_p50_us"] <= 10,  # type: ignore[operator]
        "rbac_50x_casbin": figures["rbac_speedup_vs_casbin"] >= 50,  # type: ignore[operator]
    }
    emit_result("audit_ingest", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
