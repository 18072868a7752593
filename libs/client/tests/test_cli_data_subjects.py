"""``gantry data subject find | erase | erasures`` against a fake governance service.

The fake knows one person, ``ann@example.com``, in two versions of ``customers`` read by job-1,
which made ``churn:3``; it erases her by answering with a new version, and refuses every call
when ``deny`` is set, the way the service's RBAC refuses a caller who is not an auditor.
``serve_fake`` keeps every request, so the tests check what the CLI sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "auditor-token"
T0 = 1_767_232_800_000  # 2026-01-01 02:00:00 UTC
ANN = "ann@example.com"
V1, V2, V3 = "a1" * 32, "b2" * 32, "c3" * 32
REF = "5f0c" * 8


def _version(version: str, *, rows: int = 1, head: bool = False, **kw: Any) -> pb.SubjectVersion:
    return pb.SubjectVersion(
        dataset="customers", version=version, rows=rows, columns=["email"],
        created_ms=T0, author="sam", event_id=f"ev-{version[:2]}", is_head=head, **kw,
    )  # fmt: skip


@dataclass
class FakeSubjects(pb_grpc.GovernanceServiceServicer):
    """One known person; erasures kept newest first."""

    erasures: list[pb.Erasure] = field(default_factory=list)
    deny: bool = False

    def _check(self, action: str, context: Any) -> None:
        if self.deny:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"'dev' may not {action} subject: no role grants it",
            )

    def FindSubject(self, request: Any, context: Any) -> pb.SubjectFindings:
        self._check("query", context)
        found = pb.SubjectFindings(
            subject_ref="0" * 32,
            datasets_searched=["customers"],
            datasets_not_searchable=["images"],
            searched_ms=T0,
        )
        if request.identifier != ANN:
            return found
        found.MergeFrom(pb.SubjectFindings(
            subject_ref=REF,
            versions=[_version(V1), _version(V2, rows=2, head=True)],
            links=[
                pb.SubjectLink(
                    from_kind="dataset_version", from_id=f"customers@{V1}", to_kind="job",
                    to_id="job-1", time_ms=T0, event_id="ev-read",
                    event_type="gantry.data.accessed",
                ),
                pb.SubjectLink(
                    from_kind="job", from_id="job-1", to_kind="model_version", to_id="churn:3",
                    time_ms=T0 + 1000, event_id="ev-reg", event_type="gantry.model.registered",
                ),
            ],
            jobs=["job-1"], models=["churn:3"], erasures=self.erasures,
        ))  # fmt: skip
        return found

    def EraseSubject(self, request: Any, context: Any) -> pb.Erasure:
        self._check("erase", context)
        if not request.reason.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an erasure needs a reason")
        new = _version("" if request.dry_run else V3, rows=0, head=not request.dry_run)
        erasure = pb.Erasure(
            erasure_id="" if request.dry_run else f"er-{len(self.erasures) + 1}",
            subject_ref=REF, requested_by="alice", requested_ms=T0, reason=request.reason,
            new_versions=[new], rows_removed=[2], models_to_retrain=["churn:3"],
            event_id="" if request.dry_run else "ev-erased",
        )  # fmt: skip
        if not request.dry_run:
            self.erasures.insert(0, erasure)
        return erasure

    def ListErasures(self, request: Any, context: Any) -> pb.ListErasuresResponse:
        self._check("list", context)
        return pb.ListErasuresResponse(erasures=self.erasures[: request.limit or 50])


Gantry = Callable[..., Any]


@pytest.fixture
def fake(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeSubjects(), pb_grpc.add_GovernanceServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def gantry(fake: Any, gantry_cli: Any) -> Gantry:
    """Run ``gantry ARGS`` against the fake; no traceback may reach the user."""
    return gantry_cli(TOKEN, governance=fake)


def test_find_prints_versions_links_and_what_was_searched(gantry: Gantry, fake: Any) -> None:
    r = gantry("data", "subject", "find", f" {ANN} ")
    assert r.code == 0, r.err
    assert fake.last(pb.FindSubjectRequest).identifier == ANN  # sent without the whitespace
    lines = r.out.splitlines()
    assert lines[0] == (
        f"subject {REF}: 2 versions of 1 dataset, read by 1 job, 1 model version made from them"
    )
    assert lines[1] == "searched: customers; not searchable (files, or no pii columns): images"
    assert r.cells("customers")[1:4] == [V1[:12], "1", "email"]
    assert f"{V2[:12]} (head)" in r.out
    assert "ev-read" in r.out and "gantry.model.registered ev-reg" in r.out
    assert "churn:3" in r.out and ANN not in r.out


def test_find_as_json_and_a_stranger(gantry: Gantry) -> None:
    r = gantry("data", "subject", "find", ANN, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [v["version"] for v in doc["versions"]] == [V1, V2]
    assert doc["links"][0]["event_type"] == "gantry.data.accessed"
    assert (doc["jobs"], doc["models"], doc["subject_ref"]) == (["job-1"], ["churn:3"], REF)
    nobody = gantry("data", "subject", "find", "bob@example.com")
    assert nobody.code == 0 and "0 versions of 0 datasets" in nobody.out


def test_erase_dry_run_then_for_real_then_list(gantry: Gantry, fake: Any) -> None:
    plan = gantry("data", "subject", "erase", ANN, "--reason", "DSR-7", "--dry-run")
    assert plan.code == 0, plan.err
    sent = fake.last(pb.EraseSubjectRequest)
    assert (sent.identifier, sent.reason, sent.dry_run) == (ANN, "DSR-7", True)
    assert plan.out.splitlines() == [
        f"dry run of subject {REF}: would remove 2 rows from 1 dataset",
        "  customers: a new version without 2 rows",
        "models to retrain: churn:3",
        "nothing was changed (dry run)",
    ]
    assert fake.service.erasures == []

    done = gantry("data", "subject", "erase", ANN, "--reason", "DSR-7", "--json")
    assert done.code == 0, done.err
    erasure = json.loads(done.out)
    assert (erasure["erasure_id"], erasure["event_id"]) == ("er-1", "ev-erased")
    assert erasure["new_versions"][0]["version"] == V3
    assert fake.last(pb.EraseSubjectRequest).dry_run is False

    listed = gantry("data", "subject", "erasures")
    assert listed.code == 0, listed.err
    assert listed.cells("er-1")[2:] == ["alice", "DSR-7", f"customers@{V3[:12]}", "2", "churn:3"]
    as_json = gantry("data", "subject", "erasures", "--limit", "5", "--json")
    assert [e["erasure_id"] for e in json.loads(as_json.out)] == ["er-1"]
    assert fake.last(pb.ListErasuresRequest).limit == 5


def test_refusals_are_errors_not_tracebacks(gantry: Gantry, fake: Any) -> None:
    missing = gantry("data", "subject", "erase", ANN)
    assert missing.code == 2 and "--reason" in missing.err
    blank = gantry("data", "subject", "erase", ANN, "--reason", "  ")
    assert blank.code == 2 and "gantry: error: an erasure needs a reason" in blank.err
    empty = gantry("data", "subject", "find", " ")
    assert empty.code == 2 and "no identifier given" in empty.err
    assert not any(isinstance(r, pb.EraseSubjectRequest) for r in fake.requests)

    fake.service.deny = True
    for args in (("find", ANN), ("erase", ANN, "--reason", "x"), ("erasures",)):
        r = gantry("data", "subject", *args)
        assert r.code == 2 and "gantry: error:" in r.err and "may not" in r.err, args
