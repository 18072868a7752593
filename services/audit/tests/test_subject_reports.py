"""Data-subject reports: governance's findings (a fake finder here), each link proven by its
audit event, signed; checked offline by the client's checker, which catches every alteration."""

from __future__ import annotations

import base64
import copy
import json
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gantry.audit.ledger import Ledger
from gantry.audit.store import Store, connect, migrate, outbox
from gantry.audit.subject_reports import SubjectReports, cited_events
from gantry.client.subject_report import check_subject_report
from gantry.core import InvalidInput
from gantry.events import EventEnvelope
from gantry.protos.v1 import governance_pb2 as gpb
from gantry.security import SigningKey, TrustStore
from gantry.security.documents import sign_document

pytestmark = pytest.mark.timeout(60)

EMAIL = "customer42@example.com"
V1, V2 = "a" * 64, "b" * 64


def _event(kind: str, data: dict[str, Any], actor: str = "svc-governance") -> EventEnvelope:
    return EventEnvelope(type=kind, source="test/governance", actor=actor, data=data)


class Finder:
    """What governance would answer: two versions, two jobs, two models."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []

    def find(self, identifier: str, *, subject: str, roles: Sequence[str]) -> gpb.SubjectFindings:
        self.asked.append((identifier, subject, tuple(roles)))
        if identifier != EMAIL:
            return gpb.SubjectFindings(subject_ref="other", datasets_searched=["churn"])
        i = self.ids
        return gpb.SubjectFindings(
            subject_ref="ref42",
            versions=[
                gpb.SubjectVersion(
                    dataset="churn", version=V1, rows=1, columns=["email"], event_id=i["v1"]
                ),
                gpb.SubjectVersion(
                    dataset="churn",
                    version=V2,
                    rows=1,
                    columns=["email"],
                    event_id=i["v2"],
                    is_head=True,
                ),
            ],
            links=[
                gpb.SubjectLink(
                    from_kind="dataset_version",
                    from_id=f"churn@{V1}",
                    to_kind="job",
                    to_id="job-1",
                    event_id=i["read1"],
                    event_type="gantry.data.accessed",
                ),
                gpb.SubjectLink(
                    from_kind="dataset_version",
                    from_id=f"churn@{V2}",
                    to_kind="job",
                    to_id="job-2",
                    event_id=i["read2"],
                    event_type="gantry.data.accessed",
                ),
                gpb.SubjectLink(
                    from_kind="job",
                    from_id="job-1",
                    to_kind="model_version",
                    to_id="churn:1",
                    event_id=i["model1"],
                    event_type="gantry.model.registered",
                ),
                gpb.SubjectLink(
                    from_kind="job",
                    from_id="job-2",
                    to_kind="model_version",
                    to_id="churn:2",
                    event_id=i["model2"],
                    event_type="gantry.model.registered",
                ),
            ],
            jobs=["job-1", "job-2"],
            models=["churn:1", "churn:2"],
            datasets_searched=["churn"],
        )


def _events() -> dict[str, EventEnvelope]:
    def commit(v: str) -> EventEnvelope:
        return _event(
            "gantry.data.version.committed", {"dataset": "churn", "version": v, "rows": 10}
        )

    def read(v: str, job: str) -> EventEnvelope:
        return _event(
            "gantry.data.accessed", {"dataset": "churn", "version": v, "job_id": job, "rows": 10}
        )

    def model(n: int, job: str, v: str) -> EventEnvelope:
        return _event(
            "gantry.model.registered",
            {
                "name": "churn",
                "version": n,
                "digest": "d" * 64,
                "bytes": 10,
                "job_id": job,
                "trained_on": [{"dataset": "churn", "version": v}],
            },
        )

    return {
        "v1": commit(V1),
        "v2": commit(V2),
        "read1": read(V1, "job-1"),
        "read2": read(V2, "job-2"),
        "model1": model(1, "job-1", V1),
        "model2": model(2, "job-2", V2),
    }


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
        migrate(self.engine)
        self.signer = SigningKey.generate(kid="svc-audit")
        self.trust = TrustStore({self.signer.kid: self.signer.public_key_bytes()})
        self.ledger = Ledger(
            Store(self.engine), seal_key=secrets.token_bytes(32), signer=self.signer
        )
        self.ledger.open()
        self.events = _events()
        noise = [_event("gantry.job.state", {"n": n}, actor="scheduler") for n in range(50)]
        batch = noise[:20] + list(self.events.values()) + noise[20:]
        self.ledger.append([(e, e.canonical_bytes()) for e in batch])
        self.finder = Finder({k: e.id for k, e in self.events.items()})
        self.reports = SubjectReports(self.ledger, self.finder, self.signer)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.engine.dispose()


def _report(env: Env) -> dict[str, Any]:
    return env.reports.report(EMAIL, reason="DSAR-1", subject="carol", roles=["auditor"]).document


def test_a_report_proves_every_link_and_verifies_offline(env: Env) -> None:
    doc = _report(env)
    assert env.finder.asked == [(EMAIL, "carol", ("auditor",))]
    f = doc["findings"]
    assert [v["version"] for v in f["versions"]] == [V1, V2]
    assert f["jobs"] == ["job-1", "job-2"] and f["models"] == ["churn:1", "churn:2"]
    assert set(doc["proofs"]) == {e.id for e in env.events.values()} == set(cited_events(f))
    assert doc["unproven"] == {}
    assert doc["tree_head"]["tree_size"] == env.ledger.size  # a checkpoint was signed for it
    check = check_subject_report(doc, env.trust)
    assert check.ok, check.problems
    assert check.proven == 6 and check.tree_size == env.ledger.size


def test_the_request_is_audited_without_the_identifier(env: Env) -> None:
    doc = _report(env)
    with env.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox)).all()
    queried = [r for r in rows if b"gantry.audit.queried" in bytes(r.payload)]
    assert queried, "the subject report was not recorded"
    payload = bytes(queried[-1].payload)
    assert b"ref42" in payload and doc["report_id"].encode() in payload
    assert EMAIL.encode() not in b"".join(bytes(r.payload) for r in rows)


def test_an_unknown_subject_gives_an_empty_signed_report(env: Env) -> None:
    doc = env.reports.report(
        "nobody@example.com", reason="DSAR-2", subject="carol", roles=["auditor"]
    ).document
    assert doc["findings"]["versions"] == [] and doc["proofs"] == {}
    assert check_subject_report(doc, env.trust).ok


def test_an_event_not_yet_logged_is_listed_as_unproven(env: Env) -> None:
    env.finder.ids["model2"] = "0" * 32
    doc = _report(env)
    assert doc["unproven"] == {"0" * 32: "not in the audit log yet (still on its way)"}
    check = check_subject_report(doc, env.trust)
    assert check.ok and check.unproven == ["0" * 32] and check.proven == 5


def _resign(env: Env, doc: dict[str, Any]) -> dict[str, Any]:
    return sign_document(doc, env.signer, kind="gantry.subject-report")


def test_every_alteration_is_caught(env: Env) -> None:
    doc = _report(env)
    altered = copy.deepcopy(doc)
    altered["findings"]["models"] = ["churn:1"]  # hide a model
    assert (
        "does not match its signed digest" in check_subject_report(altered, env.trust).problems[0]
    )

    # even re-signed by the right key, a proof that points at another event fails
    swapped = copy.deepcopy(doc)
    read1, read2 = env.events["read1"].id, env.events["read2"].id
    swapped["findings"]["links"][0]["event_id"] = read2
    swapped["proofs"].pop(read1)
    problems = check_subject_report(_resign(env, swapped), env.trust).problems
    assert any("does not record job job-1 reading churn@" in p for p in problems), problems

    bad_proof = copy.deepcopy(doc)
    bad_proof["proofs"][read1]["path"][0] = "00" * 32
    problems = check_subject_report(_resign(env, bad_proof), env.trust).problems
    assert any("inclusion proof" in p for p in problems), problems

    bad_bytes = copy.deepcopy(doc)
    event = json.loads(base64.b64decode(bad_bytes["proofs"][read1]["event"]))
    event["data"]["job_id"] = "job-9"
    bad_bytes["proofs"][read1]["event"] = base64.b64encode(json.dumps(event).encode()).decode()
    problems = check_subject_report(_resign(env, bad_bytes), env.trust).problems
    assert any("do not match their leaf hash" in p for p in problems), problems

    stranger = SigningKey.generate(kid="svc-audit")
    forged = sign_document(doc, stranger, kind="gantry.subject-report")
    assert check_subject_report(forged, env.trust).problems


def test_bad_requests_are_refused_clearly(env: Env) -> None:
    with pytest.raises(InvalidInput, match="needs a reason"):
        env.reports.report(EMAIL, reason=" ", subject="carol", roles=["auditor"])
    with pytest.raises(InvalidInput, match="no identifier"):
        env.reports.report("  ", reason="x", subject="carol", roles=["auditor"])
    assert env.finder.asked == []


def test_the_cli_checks_a_saved_report_offline(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gantry.client import cli
    from gantry.security.keys import write_public_key

    data_dir = tmp_path / "data"
    write_public_key(data_dir / "keys" / "trusted", env.signer)
    monkeypatch.setenv("GANTRY_DATA_DIR", str(data_dir))
    monkeypatch.setenv("COLUMNS", "200")
    doc = _report(env)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(doc))
    doc["findings"]["jobs"] = ["job-1"]
    bad.write_text(json.dumps(doc))
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["audit", "subject", "verify", str(good)])
    assert ok.exit_code == 0, ok.output
    assert "report verified: signature ok, 6 audit event(s) proven" in ok.output
    assert "churn:1, churn:2" in ok.output
    refused = runner.invoke(cli.app, ["audit", "subject", "verify", str(bad)])
    assert refused.exit_code == 1
    assert "NOT VERIFIED" in refused.output
