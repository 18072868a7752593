"""The demo's last chapter: the compliance officer's view.

1. ``dev-engineer`` (an ml-developer, who may only read de-identified data) tries again and
   again to read ``customers`` raw — a deliberately suspicious read. Every try is refused and
   audited, and the audit service's behaviour model raises a ``denial_storm`` anomaly with its
   reason; the compliance officer (``demo-auditor``) acknowledges it.
2. A data subject asks what Gantry holds about them (GDPR art. 15): the officer's report for
   ``customer200042@example.com`` names every dataset version holding that e-mail (matched through
   the keyed hashes of the de-identified view, never in clear), the jobs that read them and the
   models they produced, each proven by an audit entry with its inclusion proof; the signed
   report is checked here, offline, against the audit service's key.
3. A compliance report of the demo's whole run (access per dataset, denials, anomalies and
   their resolution, key rotations, deployments) is generated, signed over a tree head of the
   log, verified by the service (signatures, consistency with today's log, figures recomputed)
   and downloaded as PDF and CSV.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gantry.client.admin import create_token, keyring
from gantry.client.audit import AuditClient
from gantry.client.demo_data import DATASET, DEVELOPER
from gantry.client.errors import RemotePermissionDenied
from gantry.client.governance import GovernanceClient
from gantry.client.subject_report import check_subject_report
from gantry.core import IntegrityError, Unavailable
from gantry.security.keys import TrustStore

AUDITOR = "demo-auditor"
SUBJECT = "customer200042@example.com"
#: Raw reads the developer tries; the default storm is 8 denials within 5 minutes.
TRIES = 9
WAIT_S = 30.0


@dataclass
class ComplianceSummary:
    """What the compliance chapter showed."""

    anomaly_reason: str = ""
    subject_versions: int = 0
    subject_jobs: list[str] = field(default_factory=list)
    subject_models: list[str] = field(default_factory=list)
    subject_proven: int = 0
    subject_report: Path | None = None
    report_id: str = ""
    report_tree_size: int = 0
    report_verified: bool = False
    report_files: list[Path] = field(default_factory=list)


def audit_key(data_dir: Path) -> TrustStore:
    """The audit service's public key alone: reports and tree heads are signed with it."""
    raw = keyring(data_dir).trust().public_key_bytes("svc-audit")
    if raw is None:
        raise Unavailable("the audit service's public key is not in the key directory yet")
    return TrustStore({"svc-audit": raw})


def _until(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise Unavailable(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.3)


def compliance_story(
    governance_addr: str,
    audit_addr: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    version: str,
    since_ms: int,
) -> ComplianceSummary:
    """Run the chapter against a running platform; raise on any surprise."""
    summary = ComplianceSummary()
    developer = create_token(data_dir, DEVELOPER, ["ml-developer"], dt.timedelta(hours=1))
    auditor = create_token(data_dir, AUDITOR, ["auditor"], dt.timedelta(hours=1))
    with (
        step(f"{DEVELOPER} tried to read {DATASET!r} raw {TRIES} times: refused each time"),
        GovernanceClient(governance_addr, developer) as dev,
    ):
        for _ in range(TRIES):
            try:
                dev.read(DATASET, version, view="raw", purpose="looking for e-mails")
            except RemotePermissionDenied:
                continue
            raise IntegrityError("an ml-developer was allowed to read raw personal data")
    with AuditClient(audit_addr, auditor) as audit:
        with step("the audit service raised a denial-storm anomaly; the officer acknowledged it"):
            found = _until(
                f"a denial_storm anomaly for {DEVELOPER}",
                lambda: audit.anomalies(principal=DEVELOPER, kind="denial_storm", limit=5),
            )
            anomaly = found[0]
            summary.anomaly_reason = anomaly.reason
            audit.resolve_anomaly(
                anomaly.anomaly_id, "acknowledged", note="spoke to dev-engineer; access reviewed"
            )
        console.print(f"[bold red]anomaly:[/] {escape(anomaly.reason)}")
        with step(f"data-subject report for {SUBJECT}: versions, jobs, models, each proven"):
            trust = audit_key(data_dir)

            def complete() -> Any:
                doc = audit.subject_report(SUBJECT, reason="DSAR-demo: access request")
                f = doc["findings"]
                return doc if f["jobs"] and f["models"] and not doc["unproven"] else None

            doc = _until("the subject's jobs and models to be in the audit log", complete)
            check = check_subject_report(doc, trust)
            if not check.ok:
                raise IntegrityError(f"the subject report did not verify: {check.problems}")
            findings = doc["findings"]
            summary.subject_versions = len(findings["versions"])
            summary.subject_jobs = list(findings["jobs"])
            summary.subject_models = list(findings["models"])
            summary.subject_proven = check.proven
            path = data_dir / "subject-report.json"
            path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
            summary.subject_report = path
        console.print(subject_table(doc))
        with step("compliance report of this run generated, signed, verified and downloaded"):
            now_ms = int(time.time() * 1000)
            report = audit.generate_report("custom", since_ms=since_ms, until_ms=now_ms)
            result = audit.verify_report(report_id=report.report_id)
            if not result.ok:
                raise IntegrityError(f"the compliance report did not verify: {result.problems}")
            summary.report_id = report.report_id
            summary.report_tree_size = report.tree_head.tree_size
            summary.report_verified = True
            folder = data_dir / "reports"
            folder.mkdir(exist_ok=True)
            for fmt in ("pdf", "csv"):
                out = folder / f"compliance-{report.report_id[:8]}.{fmt}"
                out.write_bytes(audit.download_report(report.report_id, fmt))
                summary.report_files.append(out)
        console.print(report_table(report))
    return summary


def subject_table(doc: dict[str, Any]) -> Table:
    """What the subject report found, one row per link, with whether it is proven."""
    f = doc["findings"]
    proofs = doc.get("proofs", {})
    table = Table(title=f"data-subject report: {len(f['versions'])} version(s), proven links")
    for col in ("from", "to", "audit event", "proven"):
        table.add_column(col, overflow="fold")
    for v in f["versions"]:
        table.add_row(
            escape(f"{v['dataset']}@{v['version'][:12]}"),
            f"{v['rows']} row(s) in {escape(', '.join(v['columns']))}",
            "gantry.data.version.committed",
            "yes" if v["event_id"] in proofs else "no",
        )
    for link in f["links"]:
        table.add_row(
            escape(link["from_id"][:40]),
            escape(f"{link['to_kind']} {link['to_id']}"),
            escape(link["event_type"]),
            "yes" if link["event_id"] in proofs else "no",
        )
    return table


def report_table(report: Any) -> Table:
    """The headline figures of a compliance report."""
    summary = json.loads(report.summary_json) if report.summary_json else {}
    table = Table(title=f"compliance report {report.report_id[:8]} (signed, verified)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in sorted(summary.items()):
        table.add_row(escape(str(key)), escape(str(value)))
    table.add_row("tree size", f"{report.tree_head.tree_size:,}")
    return table


__all__ = ["ComplianceSummary", "compliance_story", "report_table", "subject_table"]
