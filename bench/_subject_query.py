"""The data-subject query and report generation, end to end on the real audit and governance
services (part of ``bench/compliance.py``).

**Method.** A fresh data directory gets an audit log of ``events`` filler events written
straight into the audit database before the services start (a realistic mix of reads, RBAC
decisions and job events, spread over days 31..90 before now, sealed exactly as the service
seals them). The embedded platform then starts the audit and governance services on a
nats-server. A data steward creates a table dataset with an e-mail column (pii), uploads
``rows`` rows, commits a second version that appends one row, and rolls back alternately to
make ``versions`` dataset versions in all, each holding the subject; a developer registers two
models trained on the first two versions. Once the audit log holds every governance event and
a signed tree head covers them, an auditor asks the audit service for the subject's signed
report (``SubjectReport``: governance's keyed-hash search over every version, then an
inclusion proof for each of the ``versions + 2`` cited events in the full log); the median of
``repeats`` calls is ``subject_query_ms`` (wall clock at the client, gRPC included). The report
is checked offline. Then the auditor generates a compliance report (``GenerateReport``) of the
month holding half the filler events — figures computed, signed, rendered as JSON, CSV and PDF,
encrypted and stored: ``report_generation_s``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

DAY_MS = 86_400_000
SUBJECT = "person7@example.com"


def _filler_rows(first: int, count: int, total: int, now_ms: int, seal_key: bytes) -> list[Any]:
    """Rows ``first .. first+count`` of ``total`` sealed audit rows spread in time order over
    days 31..90 before ``now_ms``."""
    from gantry.audit.ledger import SEALED_COLUMNS, seal_of, sealed_columns
    from gantry.security.merkle import leaf_hash

    start = now_ms - 90 * DAY_MS
    span = 59 * DAY_MS
    n = total
    rows = []
    for seq in range(first, first + count):
        t = start + span * seq // n
        k = seq % 10
        actor = f"user{seq % 37}"
        event_id = hashlib.md5(seq.to_bytes(8, "big")).hexdigest()
        job = f"j{seq % 101}"
        if k < 7:
            kind, resource, action, decision = (
                "gantry.data.accessed",
                f"dataset/d{seq % 13}",
                "read",
                "allow",
            )
            data: dict[str, Any] = {"dataset": f"d{seq % 13}", "rows": 100 + k}
        elif k < 9:
            kind, resource, action = "gantry.authz.decision", f"job/{job}", "read"
            decision = "deny" if k == 8 else "allow"
            data = {
                "principal": actor, "action": action, "resource_kind": "job",
                "resource_name": job, "decision": decision,
            }  # fmt: skip
        else:
            kind, resource, action, decision = "gantry.job.state", f"job/{job}", "state", "allow"
            data = {"job_id": job, "state": "running"}
        when = dt.datetime.fromtimestamp(t / 1000, dt.UTC).isoformat().replace("+00:00", "Z")
        canonical = orjson.dumps(
            {"id": event_id, "type": kind, "source": "bench/filler", "actor": actor,
             "subject": resource, "time": when, "correlation_id": event_id,
             "schema_version": 1, "data": data},
            option=orjson.OPT_SORT_KEYS,
        )  # fmt: skip
        leaf = leaf_hash(canonical)
        row = {
            "seq": seq, "event_id": event_id, "type": kind, "source": "bench/filler",
            "actor": actor, "subject": resource, "resource": resource, "action": action,
            "decision": decision, "correlation_id": event_id, "time_ms": t,
            "canonical": canonical, "leaf_hash": leaf, "position": seq, "state": "live",
        }  # fmt: skip
        row["seal"] = seal_of(seal_key, seq, leaf, sealed_columns([row[c] for c in SEALED_COLUMNS]))
        rows.append(row)
    return rows


def _seed_audit_log(data_dir: Path, n: int, now_ms: int) -> None:
    from gantry.audit.store import Store, connect, migrate
    from gantry.security.bootstrap import init_data_dir
    from gantry.security.keyring import Keyring

    init_data_dir(data_dir)
    seal_key = Keyring(data_dir / "keys").secret("audit-seal")
    engine = connect(f"sqlite:///{data_dir / 'audit.db'}")
    migrate(engine)
    store = Store(engine)
    for start in range(0, n, 50_000):
        rows = _filler_rows(start, min(50_000, n - start), n, now_ms, seal_key)
        with engine.begin() as conn:
            store.insert(conn, rows)
    engine.dispose()


def _people(rows: int, start: int = 0) -> pa.Table:
    ids = range(start, start + rows)
    return pa.table(
        {
            "customer_id": pa.array(list(ids), pa.int64()),
            "email": [f"person{i}@example.com" for i in ids],
            "score": pa.array([float(i % 97) for i in ids], pa.float64()),
        }
    )


def _until(what: str, probe: Any, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure(*, events: int, rows: int, versions: int, repeats: int) -> dict[str, Any]:
    """Run the scenario; the figures."""
    from gantry.client.admin import create_token, keyring
    from gantry.client.audit import AuditClient
    from gantry.client.governance import GovernanceClient
    from gantry.client.specs import ColumnSpec
    from gantry.client.subject_report import check_subject_report
    from gantry.security.keys import TrustStore
    from gantry.supervisor.platform import Platform

    with tempfile.TemporaryDirectory(prefix="gantry-bench-subject-") as tmp:
        data_dir = Path(tmp)
        now_ms = int(time.time() * 1000)
        started = time.perf_counter()
        _seed_audit_log(data_dir, events, now_ms)
        seed_s = time.perf_counter() - started
        platform = Platform(
            data_dir,
            services=("audit", "governance"),
            service_env={"GANTRY_AUDIT__CHECKPOINT_EVERY_S": "0.5"},
            log_sink=lambda line: None,
        )
        platform.start(timeout_s=120)
        try:
            steward = create_token(data_dir, "sam", ["data-steward"], dt.timedelta(hours=1))
            developer = create_token(data_dir, "dev", ["ml-developer"], dt.timedelta(hours=1))
            auditor = create_token(data_dir, "carol", ["auditor"], dt.timedelta(hours=1))
            gov_addr, audit_addr = platform.address("governance"), platform.address("audit")
            with GovernanceClient(gov_addr, steward) as gov:
                gov.create_dataset(
                    "people",
                    columns=[
                        ColumnSpec("customer_id", "int64", "internal", nullable=False),
                        ColumnSpec("email", "string", "pii"),
                        ColumnSpec("score", "float64", "public"),
                    ],
                )
                v1 = gov.commit(
                    "people", [gov.upload_table("people", _people(rows)).upload_id], "v1"
                )
                up = gov.upload_table("people", _people(1, start=rows))
                v2 = gov.commit("people", [up.upload_id], "v2", append=True)
                for n in range(versions - 2):
                    gov.rollback("people", v1.id if n % 2 == 0 else v2.id, f"r{n}")
            with GovernanceClient(gov_addr, developer) as models:
                for v in (v1, v2):
                    models.register_model(
                        "people-model", b"weights" * 100, framework="pytorch",
                        trained_on=[("people", v.id)],
                    )  # fmt: skip
            raw = keyring(data_dir).trust().public_key_bytes("svc-audit")
            trust = TrustStore({"svc-audit": raw or b""})
            with AuditClient(audit_addr, auditor) as audit:

                def complete() -> Any:
                    doc = audit.subject_report(SUBJECT, reason="bench")
                    f = doc["findings"]
                    full = len(f["versions"]) == versions and len(f["models"]) == 2
                    return doc if full and not doc["unproven"] else None

                doc = _until("the governance events in the audit log", complete)
                check = check_subject_report(doc, trust)
                timings = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    audit.subject_report(SUBJECT, reason="bench")
                    timings.append(time.perf_counter() - t0)
                month_since = now_ms - 61 * DAY_MS
                t0 = time.perf_counter()
                report = audit.generate_report(
                    "custom", since_ms=month_since, until_ms=month_since + 30 * DAY_MS
                )
                report_s = time.perf_counter() - t0
                verified = audit.verify_report(report_id=report.report_id)
        finally:
            platform.stop()
    summary = orjson.loads(report.summary_json) if report.summary_json else {}
    return {
        "subject_query_ms": statistics.median(timings) * 1000,
        "subject_query_ms_max": max(timings) * 1000,
        "subject_audit_events": report.tree_head.tree_size,
        "subject_dataset_versions": len(doc["findings"]["versions"]),
        "subject_proofs": check.proven,
        "subject_report_verified": check.ok,
        "report_generation_s": report_s,
        "report_events": summary.get("events", 0),
        "report_verified": verified.ok,
        "subject_seed_s": seed_s,
    }


__all__ = ["measure"]
