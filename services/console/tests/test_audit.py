"""The audit section: search with every filter, export, access report, integrity (proofs checked
in the console), anomalies, data-subject reports, compliance reports — by role, with refusals
and bad input, over stand-ins returning the audit API's real messages."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gantry.client.audit import Filter
from gantry.client.errors import RemoteNotFound
from gantry.client.subject_report import KIND as SUBJECT_KIND
from gantry.console.pages.audit import Search, parse_time, tabs_for
from gantry.console.viewer import Viewer
from gantry.core import Conflict, InvalidInput
from gantry.protos.v1 import audit_pb2 as pb
from gantry.security import Authorizer
from gantry.security.documents import sign_document
from gantry.security.keyring import Keyring
from gantry.security.keys import SigningKey
from gantry.security.merkle import MerkleTree, leaf_hash
from gantry.security.policy import Policy
from gantry.security.treehead import TreeHead
from gantry.testing.console import ORIGIN, Closing, FakeApis

Console = tuple[TestClient, FakeApis, Callable[..., str]]
T0 = 1_796_000_000_000


def _event(i: int, **extra: Any) -> bytes:
    body = {"id": f"ev-{i}", "type": "gantry.authz.decision", "actor": "alice", **extra}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Log:
    """A small signed Merkle log: events, their tree, a head signed by the audit key."""

    def __init__(self, key: SigningKey, events: list[bytes]) -> None:
        self.events = events
        self.tree = MerkleTree.from_leaf_hashes(leaf_hash(e) for e in events)
        self.head = TreeHead(len(events), self.tree.root(), T0 + 5000).signed(key)

    def head_pb(self, head: TreeHead | None = None) -> pb.SignedTreeHead:
        h = head or self.head
        return pb.SignedTreeHead(
            tree_size=h.tree_size,
            root_hash=h.root_hash,
            timestamp_ms=h.timestamp_ms,
            key_id=h.key_id,
            signature=h.signature,
        )

    def proof(self, index: int) -> pb.InclusionProofResponse:
        return pb.InclusionProofResponse(
            index=index,
            path=self.tree.inclusion_proof(index),
            leaf_hash=leaf_hash(self.events[index]),
            event_json=self.events[index],
            tree_head=self.head_pb(),
        )

    def head_json(self) -> dict[str, Any]:
        return {
            "tree_size": self.head.tree_size,
            "root_hash": self.head.root_hash.hex(),
            "timestamp_ms": self.head.timestamp_ms,
            "key_id": self.head.key_id,
            "signature": base64.b64encode(self.head.signature).decode(),
        }


def _record(i: int, **kw: Any) -> pb.AuditRecord:
    fields: dict[str, Any] = {
        "index": i,
        "event_id": f"ev-{i}",
        "type": "gantry.authz.decision",
        "actor": "alice",
        "resource": "dataset/customers",
        "action": "read",
        "decision": "allow",
        "correlation_id": f"corr-{i:08d}",
        "time_ms": T0 + i,
        "state": "live",
    }
    fields.update(kw)
    return pb.AuditRecord(**fields)


class Audit:
    """Stands in for AuditClient: records every call, answers with real messages."""

    def __init__(self, log: Log | None = None) -> None:
        self.log = log
        self.calls: list[tuple[str, Any]] = []
        self.proof_override: pb.InclusionProofResponse | None = None
        self.doc: dict[str, Any] = {}
        self.anomaly_list = [
            pb.Anomaly(
                anomaly_id="an-1",
                kind="denial_storm",
                principal="dev-engineer",
                state="raised",
                severity=1.5,
                reason="dev-engineer was denied 12 times within 3 s",
                evidence_json='{"denials": 12, "seconds": 3.0}',
                event_ids=[f"ev-{i}" for i in range(8)],
                time_ms=T0,
            ),
            pb.Anomaly(
                anomaly_id="an-2",
                kind="bulk_read",
                principal="bob",
                state="dismissed",
                severity=2.0,
                reason="bob read 10x his usual rows",
                time_ms=T0 - 10,
                by="carol",
                note="quarterly export, approved",
                updated_ms=T0 + 10,
            ),
        ]

    # -- log
    def page(self, flt: Filter, *, page_size: int, page_token: str) -> pb.QueryResponse:
        self.calls.append(("page", (flt, page_size, page_token)))
        if page_token == "bad":
            raise InvalidInput("bad page token 'bad'", hint="pass the next_page_token")
        return pb.QueryResponse(
            records=[_record(3), _record(4, decision="deny", actor="dev-engineer")],
            next_page_token="s4",
        )

    def export(self, flt: Filter, *, fmt: str) -> Iterator[bytes]:
        self.calls.append(("export", (flt, fmt)))
        yield b"index,event_id\n"
        yield b"3,ev-3\n"

    def access_report(self, resource: str, since_ms: int, until_ms: int) -> Any:
        self.calls.append(("access_report", (resource, since_ms, until_ms)))
        return pb.AccessReportResponse(
            resource=resource,
            total=107,
            rows=[
                pb.AccessReportRow(
                    actor="alice", action="read", allowed=94, denied=6, first_ms=T0, last_ms=T0
                ),
                pb.AccessReportRow(actor="bob", action="read", allowed=7, first_ms=T0, last_ms=T0),
            ],
        )

    def checkpoint(self) -> TreeHead:
        self.calls.append(("checkpoint", None))
        if self.log is None:
            raise RemoteNotFound("no checkpoint yet")
        return self.log.head

    def inclusion_proof(
        self, *, index: int | None = None, event_id: str | None = None
    ) -> pb.InclusionProofResponse:
        self.calls.append(("inclusion_proof", (index, event_id)))
        if self.proof_override is not None:
            return self.proof_override
        assert self.log is not None
        if event_id is not None:
            index = int(event_id.split("-")[1])
        assert index is not None
        if index >= len(self.log.events):
            raise RemoteNotFound(f"no entry {index} in the signed log")
        return self.log.proof(index)

    def verify(self) -> pb.VerifyResponse:
        self.calls.append(("verify", None))
        assert self.log is not None
        return pb.VerifyResponse(
            ok=True,
            events_checked=len(self.log.events),
            checkpoints_checked=2,
            first_bad_index=-1,
            latest=self.log.head_pb(),
        )

    # -- anomalies
    def anomalies(self, **kw: Any) -> list[pb.Anomaly]:
        self.calls.append(("anomalies", kw))
        return [a for a in self.anomaly_list if not kw.get("state") or a.state == kw["state"]]

    def resolve_anomaly(self, anomaly_id: str, state: str, note: str = "") -> pb.Anomaly:
        self.calls.append(("resolve_anomaly", (anomaly_id, state, note)))
        if anomaly_id == "an-2":
            raise Conflict("anomaly an-2 is already dismissed")
        return pb.Anomaly(anomaly_id=anomaly_id, state=state, note=note)

    # -- compliance
    def subject_report(self, identifier: str, *, reason: str) -> dict[str, Any]:
        self.calls.append(("subject_report", (identifier, reason)))
        return self.doc

    def reports(self, *, period: str = "", limit: int = 50) -> list[pb.ComplianceReport]:
        self.calls.append(("reports", (period, limit)))
        assert self.log is not None
        return [
            pb.ComplianceReport(
                report_id="rep-0001-aaaa",
                period="daily",
                since_ms=T0 - 86_400_000,
                until_ms=T0,
                created_ms=T0 + 1,
                tree_head=self.log.head_pb(),
                digest="ab" * 32,
                key_id="svc-audit",
                formats=["json", "csv", "pdf"],
                summary_json='{"events": 1622, "reads_denied": 110, "anomalies": 1}',
            )
        ]

    def download_report(self, report_id: str, fmt: str = "pdf") -> bytes:
        self.calls.append(("download_report", (report_id, fmt)))
        return b"%PDF-1.3 fake" if fmt == "pdf" else b"a,b\n1,2\n"

    def verify_report(self, *, report_id: str = "", report_json: bytes = b"") -> Any:
        self.calls.append(("verify_report", report_id))
        assert self.log is not None
        return pb.VerifyReportResponse(
            ok=False,
            signature_ok=True,
            consistent=True,
            figures_match=False,
            problems=["denials: the report says 120, the log gives 121"],
            tree_head=self.log.head_pb(),
        )

    def generate_report(self, period: str, *, since_ms: int = 0, until_ms: int = 0) -> Any:
        self.calls.append(("generate_report", (period, since_ms, until_ms)))
        return pb.ComplianceReport(report_id="rep-new", period=period)


@pytest.fixture
def audit_key(data_dir: Path) -> SigningKey:
    """The audit service's key, published in the data dir's trusted keys (as the service does)."""
    return Keyring(data_dir / "keys").service_key("audit")


@pytest.fixture
def audit(console: Console, audit_key: SigningKey) -> Audit:
    stand_in = Audit(Log(audit_key, [_event(i) for i in range(7)]))
    console[1].factories["audit"] = lambda viewer: Closing(stand_in)
    return stand_in


def _viewer(policy_yaml: str, *roles: str) -> Viewer:
    authorizer = Authorizer(Policy.from_yaml(policy_yaml))
    return Viewer("v", roles, "t", dt.datetime.now(dt.UTC), authorizer)


# ----------------------------------------------------------------------------- tabs and input


def test_tabs_show_only_what_the_role_may_open() -> None:
    policy = """
version: 1
roles:
  reader:
    rules:
      - actions: [query]
        resources: [audit_log]
  officer:
    rules:
      - actions: [query, prove]
        resources: [audit_log]
      - actions: [list]
        resources: [anomaly, report]
"""
    assert [t.key for t in tabs_for(_viewer(policy, "reader"))] == ["search"]
    officer = [t.key for t in tabs_for(_viewer(policy, "officer"))]
    assert officer == ["search", "integrity", "anomalies", "reports"]


def test_the_auditor_sees_every_tab_and_others_no_audit_section(
    console: Console, audit: Audit
) -> None:
    client, apis, login = console
    login("carol", "auditor")
    body = client.get("/audit").text
    for key in ("search", "access", "integrity", "anomalies", "subjects", "reports"):
        assert f'data-tab="{key}"' in body
    login("dev", "ml-developer")
    assert 'data-section="audit"' not in client.get("/me").text


def test_times_and_filters_are_read_as_the_api_wants_them() -> None:
    now = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
    assert parse_time("1h", "from", now=now) == int(now.timestamp() * 1000) - 3_600_000
    assert parse_time("2026-01-31T12:00", "from") == int(now.timestamp() * 1000)
    assert parse_time("2026-01-31T13:00+01:00", "from") == int(now.timestamp() * 1000)
    assert parse_time("", "from") == 0
    with pytest.raises(InvalidInput, match="from: 'noon' is not a time"):
        parse_time("noon", "from")
    form = Search.from_query({"type": "a.b, c.d", "actor": "x y", "decision": "deny"})
    flt = form.to_filter()
    assert flt.types == ("a.b", "c.d") and flt.actors == ("x", "y") and flt.decision == "deny"


# ----------------------------------------------------------------------------- search, export


def test_search_sends_every_filter_and_pages_with_tokens(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get(
        "/audit",
        params={
            "type": "gantry.authz.decision,gantry.data.accessed",
            "actor": "alice, dev-engineer",
            "resource": "dataset/customers",
            "action": "read",
            "decision": "deny",
            "correlation_id": "corr-1",
            "since": "2026-11-01T00:00:00Z",
            "until": "2026-12-01T00:00:00Z",
            "page_size": "50",
            "page": "s2",
        },
    )
    assert reply.status_code == 200
    flt, size, token = audit.calls[-1][1]
    assert flt == Filter(
        actors=("alice", "dev-engineer"),
        types=("gantry.authz.decision", "gantry.data.accessed"),
        resource="dataset/customers",
        action="read",
        decision="deny",
        correlation_id="corr-1",
        since_ms=int(dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp() * 1000),
        until_ms=int(dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp() * 1000),
    )
    assert (size, token) == (50, "s2")
    body = reply.text
    assert 'data-index="3"' in body and 'data-event-id="ev-4"' in body
    assert 'href="/audit/integrity?index=3"' in body  # each row leads to its proof
    assert 'data-testid="page-next"' in body and "page=s4" in body
    next_link = body.split('data-testid="page-next"')[0].rsplit("<a href=", 1)[1]
    assert "decision=deny" in next_link and "page_size=50" in next_link
    assert 'data-testid="export-csv"' in body
    export_link = body.split('data-testid="export-csv"')[0].rsplit("<a href=", 1)[1]
    assert "page=" not in export_link and "decision=deny" in export_link


def test_bad_search_input_is_a_400_with_the_form_and_no_call(
    console: Console, audit: Audit
) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    for params, says in (
        ({"since": "yesterday"}, "is not a time"),
        ({"since": "1h", "until": "2h"}, "the window is empty"),
        ({"decision": "maybe"}, "outcome must be allow or deny"),
        ({"page_size": "7"}, "rows per page"),
    ):
        reply = client.get("/audit", params=params)
        assert reply.status_code == 400, params
        assert says in reply.text and 'data-testid="audit-search"' in reply.text
    assert audit.calls == []
    reply = client.get("/audit", params={"page": "bad"})  # the service refuses the token
    assert reply.status_code == 400 and "bad page token" in reply.text


def test_export_streams_a_csv_download_of_the_same_filters(console: Console, audit: Audit) -> None:
    client, apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/export.csv", params={"actor": "alice", "decision": "allow"})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/csv")
    assert reply.headers["content-disposition"].startswith('attachment; filename="audit-')
    assert reply.content == b"index,event_id\n3,ev-3\n"
    flt, fmt = audit.calls[-1][1]
    assert fmt == "csv" and flt.actors == ("alice",) and flt.decision == "allow"
    assert client.get("/audit/export.xml").status_code == 400
    apis.calls.clear()
    login("dev", "ml-developer")
    reply = client.get("/audit/export.csv")
    assert reply.status_code == 403 and apis.calls == []  # refused before the service is asked


# ----------------------------------------------------------------------------- access report


def test_access_report_table_and_chart(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    empty = client.get("/audit/access")
    assert empty.status_code == 200 and audit.calls == []  # the form only
    reply = client.get(
        "/audit/access", params={"resource": "dataset/customers", "since": "2026-11-01"}
    )
    assert reply.status_code == 200
    resource, since_ms, until_ms = audit.calls[-1][1]
    assert resource == "dataset/customers" and since_ms > 0 and until_ms == 0
    assert 'data-actor="alice"' in reply.text and 'data-denied="6"' in reply.text
    assert "<svg" in reply.text and "107" in reply.text
    bad = client.get("/audit/access", params={"resource": "x", "until": "soon"})
    assert bad.status_code == 400 and "is not a time" in bad.text


# ----------------------------------------------------------------------------- integrity


def test_integrity_shows_the_signed_head_checked_here(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/integrity")
    assert reply.status_code == 200
    assert audit.log is not None
    assert audit.log.head.root_hash.hex() in reply.text
    assert 'data-testid="head-signature" data-ok="true"' in reply.text
    assert 'data-testid="verify-button"' in reply.text


def test_an_inclusion_proof_is_verified_in_the_console(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/integrity", params={"index": "5"})
    assert reply.status_code == 200
    assert 'data-testid="proof-result" data-ok="true"' in reply.text
    assert "Verified ✓" in reply.text and "ev-5" in reply.text
    assert audit.log is not None
    for sibling in audit.log.tree.inclusion_proof(5):
        assert sibling.hex() in reply.text  # the audit path is shown
    by_id = client.get("/audit/integrity", params={"event_id": "ev-2"})
    assert 'data-ok="true"' in by_id.text and audit.calls[-1] == ("inclusion_proof", (None, "ev-2"))


def test_a_forged_proof_is_not_verified(
    console: Console, audit: Audit, audit_key: SigningKey
) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    assert audit.log is not None
    altered = audit.log.proof(5)
    altered.event_json = _event(5, actor="mallory")  # different bytes, same leaf hash claimed
    audit.proof_override = altered
    reply = client.get("/audit/integrity", params={"index": "5"})
    assert 'data-testid="proof-result" data-ok="false"' in reply.text
    assert "NOT verified" in reply.text and "hash to" in reply.text
    # a head signed by some other key: the console trusts only the audit service's key
    other = Log(SigningKey.generate("svc-audit"), audit.log.events)
    audit.proof_override = other.proof(1)
    reply = client.get("/audit/integrity", params={"index": "1"})
    assert 'data-ok="false"' in reply.text and "invalid signature" in reply.text
    # the server proving another entry than the one asked for
    audit.proof_override = audit.log.proof(2)
    reply = client.get("/audit/integrity", params={"index": "3"})
    assert "asked for entry 3, the server proved entry 2" in reply.text


def test_proof_errors_and_bad_input_show_inline(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/integrity", params={"index": "99"})
    assert reply.status_code == 200 and "no entry 99" in reply.text
    assert 'data-testid="tree-head"' in reply.text  # the rest of the page is there
    bad = client.get("/audit/integrity", params={"index": "-1"})
    assert bad.status_code == 400 and "is not an index" in bad.text
    audit.log = None
    reply = client.get("/audit/integrity")
    assert reply.status_code == 200 and 'data-testid="no-head"' in reply.text


def test_verify_the_whole_log(console: Console, audit: Audit) -> None:
    client, apis, login = console
    login("carol", "auditor")
    frag = client.post("/audit/verify", headers={"origin": ORIGIN, "hx-request": "true"})
    assert frag.status_code == 200 and "<html" not in frag.text
    assert 'data-testid="verify-result" data-ok="true"' in frag.text
    assert "signature checked here ✓" in frag.text
    full = client.post("/audit/verify", headers={"origin": ORIGIN})
    assert full.status_code == 200 and "<html" in full.text and "Verified ✓" in full.text
    assert client.post("/audit/verify").status_code == 403  # not from a console page
    apis.calls.clear()
    login("dev", "ml-developer")
    assert client.post("/audit/verify", headers={"origin": ORIGIN}).status_code == 403
    assert apis.calls == []


# ----------------------------------------------------------------------------- anomalies


def test_anomalies_are_listed_with_actions_for_those_who_may(
    console: Console, audit: Audit
) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/anomalies")
    assert reply.status_code == 200
    assert 'data-anomaly="an-1"' in reply.text and 'data-state="raised"' in reply.text
    assert "denials=12" in reply.text and "and 3 more" in reply.text
    assert "quarterly export, approved" in reply.text
    raised_row = reply.text.split('data-anomaly="an-1"')[1].split("</tr>")[0]
    assert (
        'data-testid="anomaly-ack"' in raised_row and 'data-testid="anomaly-dismiss"' in raised_row
    )
    dismissed_row = reply.text.split('data-anomaly="an-2"')[1].split("</tr>")[0]
    assert "anomaly-resolve" not in dismissed_row  # nothing left to do
    filtered = client.get("/audit/anomalies", params={"state": "raised", "kind": "denial_storm"})
    assert audit.calls[-1][1]["state"] == "raised" and audit.calls[-1][1]["kind"] == "denial_storm"
    assert 'data-anomaly="an-2"' not in filtered.text
    assert client.get("/audit/anomalies", params={"state": "open"}).status_code == 400


def test_resolving_an_anomaly(console: Console, audit: Audit) -> None:
    client, apis, login = console
    login("carol", "auditor")
    reply = client.post(
        "/audit/anomalies/an-1",
        data={
            "state": "acknowledged",
            "note": " looking into it ",
            "back": "/audit/anomalies?state=raised",
        },
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/audit/anomalies?state=raised"
    assert audit.calls[-1] == ("resolve_anomaly", ("an-1", "acknowledged", "looking into it"))
    reply = client.post(
        "/audit/anomalies/an-1",
        data={"state": "acknowledged", "back": "https://evil.example/"},
        headers={"origin": ORIGIN},
    )
    assert reply.headers["location"] == "/audit/anomalies"
    audit.calls.clear()
    no_note = client.post(
        "/audit/anomalies/an-1", data={"state": "dismissed"}, headers={"origin": ORIGIN}
    )
    assert no_note.status_code == 400 and "say why" in no_note.text
    wrong = client.post(
        "/audit/anomalies/an-1", data={"state": "raised"}, headers={"origin": ORIGIN}
    )
    assert wrong.status_code == 400
    assert audit.calls == []
    conflict = client.post(
        "/audit/anomalies/an-2",
        data={"state": "dismissed", "note": "x"},
        headers={"origin": ORIGIN},
    )
    assert conflict.status_code == 409 and "already dismissed" in conflict.text
    apis.calls.clear()
    login("dev", "ml-developer")
    refused = client.post(
        "/audit/anomalies/an-1", data={"state": "acknowledged"}, headers={"origin": ORIGIN}
    )
    assert refused.status_code == 403 and apis.calls == []


# ----------------------------------------------------------------------------- data subjects


def _subject_doc(key: SigningKey) -> tuple[Log, dict[str, Any]]:
    version = "ab" * 32
    events = [
        _event(0),
        json.dumps(
            {
                "id": "ev-1",
                "type": "gantry.data.version.committed",
                "data": {"dataset": "churn", "version": version},
            }
        ).encode(),
        json.dumps(
            {
                "id": "ev-2",
                "type": "gantry.data.accessed",
                "data": {"dataset": "churn", "version": version, "job_id": "j-1"},
            }
        ).encode(),
    ]
    log = Log(key, events)

    def proof(i: int) -> dict[str, Any]:
        return {
            "index": i,
            "leaf_hash": leaf_hash(events[i]).hex(),
            "event": base64.b64encode(events[i]).decode(),
            "path": [p.hex() for p in log.tree.inclusion_proof(i)],
        }

    findings = {
        "subject_ref": "f00d" * 8,
        "versions": [
            {
                "dataset": "churn",
                "version": version,
                "rows": 1,
                "columns": ["email"],
                "created_ms": T0,
                "author": "sam",
                "event_id": "ev-1",
                "is_head": True,
                "erasure_id": "",
            }
        ],
        "links": [
            {
                "from_kind": "dataset_version",
                "from_id": f"churn@{version}",
                "to_kind": "job",
                "to_id": "j-1",
                "time_ms": T0,
                "event_id": "ev-2",
                "event_type": "gantry.data.accessed",
            }
        ],
        "jobs": ["j-1"],
        "models": ["churn-classifier:1"],
        "datasets_searched": ["churn", "customers"],
        "datasets_not_searchable": ["images"],
        "erasures": [],
        "searched_ms": T0,
    }
    doc = sign_document(
        {
            "report_id": "rep-subject-1",
            "created_ms": T0,
            "requested_by": "carol",
            "reason": "DSAR-1",
            "identifier": "someone@example.com",
            "findings": findings,
            "proofs": {"ev-1": proof(1), "ev-2": proof(2)},
            "unproven": {},
            "tree_head": log.head_json(),
        },
        key,
        kind=SUBJECT_KIND,
    )
    return log, doc


def test_a_subject_report_is_asked_by_post_and_its_proofs_checked(
    console: Console, audit: Audit, audit_key: SigningKey
) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    _log, audit.doc = _subject_doc(audit_key)
    form = client.get("/audit/subjects")
    assert form.status_code == 200 and 'method="post" action="/audit/subjects"' in form.text
    assert audit.calls == []
    reply = client.post(
        "/audit/subjects",
        data={"identifier": " someone@example.com ", "reason": "DSAR-1"},
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 200
    assert audit.calls[-1] == ("subject_report", ("someone@example.com", "DSAR-1"))
    assert 'data-testid="subject-check" data-ok="true"' in reply.text
    assert "2 audit events are proven" in reply.text
    assert 'data-dataset="churn"' in reply.text and "churn-classifier:1" in reply.text
    assert "images" in reply.text  # not searchable, said so
    download = client.post(
        "/audit/subjects",
        data={"identifier": "someone@example.com", "reason": "DSAR-1", "download": "json"},
        headers={"origin": ORIGIN},
    )
    assert download.headers["content-type"] == "application/json"
    assert download.headers["content-disposition"] == (
        'attachment; filename="subject-report-rep-subj.json"'
    )
    assert json.loads(download.content) == audit.doc


def test_an_altered_subject_report_is_not_verified(
    console: Console, audit: Audit, audit_key: SigningKey
) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    _log, doc = _subject_doc(audit_key)
    doc["findings"]["models"] = []  # hide a model after signing
    audit.doc = doc
    reply = client.post(
        "/audit/subjects",
        data={"identifier": "someone@example.com", "reason": "DSAR-1"},
        headers={"origin": ORIGIN},
    )
    assert 'data-testid="subject-check" data-ok="false"' in reply.text
    assert "does not match its signed digest" in reply.text


def test_subject_report_input_and_refusals(console: Console, audit: Audit) -> None:
    client, apis, login = console
    login("carol", "auditor")
    for data, says in (
        ({"identifier": "", "reason": "x"}, "give the data subject"),
        ({"identifier": "a@b.c", "reason": " "}, "say why the report is asked"),
    ):
        reply = client.post("/audit/subjects", data=data, headers={"origin": ORIGIN})
        assert reply.status_code == 400 and says in reply.text
    assert audit.calls == []
    # the identifier never goes into a URL: a GET with one is not a report
    assert client.get("/audit/subjects", params={"identifier": "a@b.c"}).status_code == 200
    assert audit.calls == []
    apis.calls.clear()
    login("dev", "ml-developer")
    reply = client.post(
        "/audit/subjects", data={"identifier": "a@b.c", "reason": "x"}, headers={"origin": ORIGIN}
    )
    assert reply.status_code == 403 and apis.calls == []


# ----------------------------------------------------------------------------- reports


def test_reports_are_listed_and_downloaded_with_their_type(console: Console, audit: Audit) -> None:
    client, _apis, login = console
    login("carol", "auditor")
    reply = client.get("/audit/reports")
    assert reply.status_code == 200
    assert 'data-report="rep-0001-aaaa"' in reply.text and "1,622" in reply.text
    assert "head signed ✓" in reply.text
    for fmt in ("pdf", "csv", "json"):
        assert f'href="/audit/reports/rep-0001-aaaa/download.{fmt}"' in reply.text
    pdf = client.get("/audit/reports/rep-0001-aaaa/download.pdf")
    assert pdf.status_code == 200 and pdf.headers["content-type"] == "application/pdf"
    assert pdf.headers["content-disposition"] == 'attachment; filename="report-rep-0001.pdf"'
    assert pdf.content == b"%PDF-1.3 fake"
    csv = client.get("/audit/reports/rep-0001-aaaa/download.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert client.get("/audit/reports/rep-0001-aaaa/download.exe").status_code == 400
    assert client.get("/audit/reports", params={"period": "hourly"}).status_code == 400


def test_verifying_and_generating_reports(console: Console, audit: Audit) -> None:
    client, apis, login = console
    login("carol", "auditor")
    frag = client.post(
        "/audit/reports/rep-0001-aaaa/verify", headers={"origin": ORIGIN, "hx-request": "true"}
    )
    assert frag.status_code == 200 and 'data-ok="false"' in frag.text
    assert "figures DIFFER" in frag.text and "121" in frag.text
    made = client.post("/audit/reports", data={"period": "weekly"}, headers={"origin": ORIGIN})
    assert made.status_code == 303 and audit.calls[-1] == ("generate_report", ("weekly", 0, 0))
    custom = client.post(
        "/audit/reports", data={"period": "custom", "since": "7d"}, headers={"origin": ORIGIN}
    )
    assert custom.status_code == 303
    _period, since_ms, until_ms = audit.calls[-1][1]
    assert 0 < since_ms < until_ms
    audit.calls.clear()
    for data in ({"period": "custom"}, {"period": "daily", "since": "1d"}, {"period": "x"}):
        assert (
            client.post("/audit/reports", data=data, headers={"origin": ORIGIN}).status_code == 400
        )
    assert audit.calls == []
    apis.calls.clear()
    login("dev", "ml-developer")
    assert (
        client.post(
            "/audit/reports", data={"period": "daily"}, headers={"origin": ORIGIN}
        ).status_code
        == 403
    )
    assert client.get("/audit/reports/rep-0001-aaaa/download.pdf").status_code == 403
    assert apis.calls == []
