"""``gantry audit anomalies`` against a fake audit service on a free local port, found through
the data directory's run file like the real one.

The fake keeps three canned anomalies (a bulk read and a raw-view read of bob's, an unusual hour
of ana's), filters them the way the service does, and resolves them; ``deny`` makes it refuse
every call the way the service's RBAC refuses a caller who is not an auditor. ``serve_fake``
keeps every request, so tests can check what the CLI sent, and that a refused dismissal sent
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gantry.protos.v1 import audit_pb2 as pb
from gantry.protos.v1 import audit_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "auditor-token"
T0 = 1_767_232_800_000  # 2026-01-01 02:00:00 UTC
BULK = "7c0f5a0e-1b9e-4c1a-9d55-2b8f3c4d5e6f"
RAW = "7c0f5a0e-99aa-4bbb-8ccc-0d1e2f3a4b5c"  # shares its first 8 characters with BULK
HOUR = "e1d2c3b4-a596-4877-8899-aabbccddeeff"


def _anomalies() -> list[pb.Anomaly]:
    """Newest first, like the service."""
    return [
        pb.Anomaly(
            anomaly_id=HOUR, kind="unusual_hour", principal="ana", state="acknowledged",
            severity=3.0, reason="ana was active at 03:00 (UTC); 0.4% of its past activity",
            evidence_json=json.dumps({"hour": 3, "share": 0.004, "usual_hours": [9, 10, 11]}),
            event_ids=["01a3"], time_ms=T0 + 7_200_000, updated_ms=T0 + 9_000_000,
            by="carol", note="on call that night",
        ),
        pb.Anomaly(
            anomaly_id=RAW, kind="raw_view_read", principal="bob", state="raised",
            severity=1.0, reason="bob read the raw view of patients; 0.0% of its reads were raw",
            evidence_json=json.dumps({"dataset": "patients", "reads": 40, "raw_share": 0.0}),
            event_ids=["01a2"], time_ms=T0 + 3_600_000,
        ),
        pb.Anomaly(
            anomaly_id=BULK, kind="bulk_read", principal="bob", state="raised", severity=2.5,
            reason="bob read 125,000 rows of customers in 10 minutes; 2.5 times his usual most",
            evidence_json=json.dumps({"dataset": "customers", "rows": 125000, "usual_max": 50000}),
            event_ids=["01a0-aaaa", "01a1-bbbb"], time_ms=T0,
        ),
    ]  # fmt: skip


@dataclass
class FakeAudit(pb_grpc.AuditServiceServicer):
    """Canned anomalies, filtered and resolved like the service; ``deny`` refuses every call."""

    anomalies: list[pb.Anomaly] = field(default_factory=_anomalies)
    deny: bool = False

    def _check(self, action: str, context: Any) -> None:
        if self.deny:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"'bob' may not {action} anomaly: no role grants it",
            )

    def ListAnomalies(self, request: Any, context: Any) -> pb.ListAnomaliesResponse:
        self._check("list", context)
        found = [
            a
            for a in self.anomalies
            if request.state in ("", a.state)
            and request.principal in ("", a.principal)
            and request.kind in ("", a.kind)
            and (not request.since_ms or a.time_ms >= request.since_ms)
            and (not request.until_ms or a.time_ms < request.until_ms)
        ]
        return pb.ListAnomaliesResponse(anomalies=found[: request.limit or 100])

    def ResolveAnomaly(self, request: Any, context: Any) -> pb.Anomaly:
        self._check("resolve", context)
        if request.state == "dismissed" and not request.note.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "say why the anomaly is dismissed")
        for a in self.anomalies:
            if a.anomaly_id == request.anomaly_id:
                if a.state == request.state:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"anomaly {a.anomaly_id} is already {a.state}",
                    )
                a.state, a.note, a.by, a.updated_ms = request.state, request.note, "carol", T0
                return a
        context.abort(grpc.StatusCode.NOT_FOUND, f"anomaly {request.anomaly_id!r} not found")
        raise AssertionError("unreachable")


#: ``gantry ARGS`` -> its exit status, stdout and stderr (conftest's ``CliResult``).
Gantry = Callable[..., Any]


@pytest.fixture
def fake(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeAudit(), pb_grpc.add_AuditServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def gantry(fake: Any, gantry_cli: Any) -> Gantry:
    """Run ``gantry ARGS`` against the fake; no traceback may reach the user."""
    return gantry_cli(TOKEN, audit=fake)


# ---------------------------------------------------------------------- list


def test_list_shows_a_row_per_anomaly_newest_first(gantry: Gantry, fake: Any) -> None:
    r = gantry("audit", "anomalies", "list")
    assert r.code == 0, r.err
    assert "3 anomalies" in r.out
    bulk = r.cells("2026-01-01 02:00:00")
    assert bulk[1:5] == ["bulk_read", "bob", "raised", "2.50"]
    assert bulk[5].startswith("bob read 125,000 rows of customers")
    assert bulk[6] == BULK  # the whole id, as ack and dismiss take it
    assert r.cells("2026-01-01 04:00:00")[1:4] == ["unusual_hour", "ana", "acknowledged"]
    rows = [line for line in r.out.splitlines() if line.startswith("│ 2026")]
    assert [row.split("│")[2].strip() for row in rows] == [
        "unusual_hour", "raw_view_read", "bulk_read",
    ]  # fmt: skip
    sent = fake.last(pb.ListAnomaliesRequest)
    assert (sent.state, sent.principal, sent.kind, sent.since_ms, sent.until_ms) == (
        "", "", "", 0, 0,
    )  # fmt: skip
    assert sent.limit == 101  # one more than shown, to tell whether there are more
    assert r.err == ""


def test_list_passes_the_filters_to_the_server(gantry: Gantry, fake: Any) -> None:
    r = gantry(
        "audit", "anomalies", "list", "--state", "raised", "--principal", "bob",
        "--kind", "bulk_read", "--since", "2026-01-01T01:00:00Z",
        "--until", "2026-01-01T03:00:00", "--limit", "5",
    )  # fmt: skip
    assert r.code == 0, r.err
    sent = fake.last(pb.ListAnomaliesRequest)
    assert (sent.state, sent.principal, sent.kind) == ("raised", "bob", "bulk_read")
    assert (sent.since_ms, sent.until_ms, sent.limit) == (T0 - 3_600_000, T0 + 3_600_000, 6)
    assert "1 anomaly" in r.out and BULK in r.out and RAW not in r.out


def test_list_as_json_keeps_every_field_and_says_when_there_are_more(
    gantry: Gantry, fake: Any
) -> None:
    r = gantry("audit", "anomalies", "list", "--principal", "bob", "--limit", "1", "--json")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == 1
    raw = json.loads(lines[0])
    assert raw["anomaly_id"] == RAW and raw["kind"] == "raw_view_read"
    assert raw["evidence"] == {"dataset": "patients", "reads": 40, "raw_share": 0.0}
    assert (raw["time"], raw["updated"], raw["event_ids"]) == (
        "2026-01-01T03:00:00.000Z", None, ["01a2"],
    )  # fmt: skip
    assert "showing the newest 1" in r.err and "--limit" in r.err


def test_list_refuses_bad_options_before_calling(gantry: Gantry, fake: Any) -> None:
    r = gantry("audit", "anomalies", "list", "--state", "open")
    assert r.code == 2 and "open" in r.err
    r = gantry("audit", "anomalies", "list", "--since", "yesterday")
    assert r.code == 2 and "gantry: error: invalid time 'yesterday'" in r.err
    r = gantry("audit", "anomalies", "list", "--limit", "5000")
    assert r.code == 2
    assert fake.requests == []


# ---------------------------------------------------------------------- show


def test_show_prints_every_field_the_evidence_and_the_events(gantry: Gantry, fake: Any) -> None:
    r = gantry("audit", "anomalies", "show", BULK)
    assert r.code == 0, r.err
    assert r.out.splitlines()[0] == f"anomaly {BULK}: raised"
    fields = r.fields()
    assert (fields["kind"], fields["principal"]) == ("bulk_read", "bob")
    assert fields["severity"].startswith("2.50")
    assert fields["time (UTC)"] == "2026-01-01 02:00:00"
    assert fields["reason"].startswith("bob read 125,000 rows")
    assert fields["evidence"] == "{"  # pretty-printed, one key a line
    assert '"rows": 125000' in r.out and '"usual_max": 50000' in r.out
    assert fields["events"] == "01a0-aaaa" and "01a1-bbbb" in r.out
    assert "by" not in fields and "note" not in fields  # not resolved yet
    assert fake.last(pb.ListAnomaliesRequest).limit == 1000  # no Get call: picked from a list

    resolved = gantry("audit", "anomalies", "show", HOUR).fields()
    assert (resolved["by"], resolved["note"]) == ("carol", "on call that night")
    assert resolved["updated (UTC)"] == "2026-01-01 04:30:00"

    data = json.loads(gantry("audit", "anomalies", "show", BULK, "--json").out)
    assert data["evidence"]["rows"] == 125000 and data["event_ids"] == ["01a0-aaaa", "01a1-bbbb"]


def test_show_takes_a_unique_prefix_and_says_clearly_when_not_found(gantry: Gantry) -> None:
    assert gantry("audit", "anomalies", "show", "e1d2").out.startswith(f"anomaly {HOUR}:")
    r = gantry("audit", "anomalies", "show", "7c0f5a0e")
    assert r.code == 2 and "gantry: error: '7c0f5a0e' is the start of 2 anomaly ids" in r.err
    r = gantry("audit", "anomalies", "show", "nope")
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines()[0] == "gantry: error: anomaly 'nope' not found"
    assert "newest 1000" in r.err


# ---------------------------------------------------------------------- ack, dismiss


def test_ack_sends_acknowledged_with_the_note(gantry: Gantry, fake: Any) -> None:
    r = gantry("audit", "anomalies", "ack", BULK, "--note", "asked bob")
    assert r.code == 0, r.err
    sent = fake.last(pb.ResolveAnomalyRequest)
    assert (sent.anomaly_id, sent.state, sent.note) == (BULK, "acknowledged", "asked bob")
    assert r.out.splitlines() == [
        f"acknowledged anomaly {BULK}: bulk_read by bob",
        "  note: asked bob",
    ]

    r = gantry("audit", "anomalies", "ack", RAW)  # the note is optional
    assert r.code == 0, r.err
    sent = fake.last(pb.ResolveAnomalyRequest)
    assert (sent.anomaly_id, sent.state, sent.note) == (RAW, "acknowledged", "")

    again = gantry("audit", "anomalies", "ack", RAW)
    assert again.code == 2
    assert again.err.strip() == f"gantry: error: anomaly {RAW} is already acknowledged"


def test_dismiss_without_a_note_is_refused_before_calling(gantry: Gantry, fake: Any) -> None:
    for args in ((), ("--note", "  ")):
        r = gantry("audit", "anomalies", "dismiss", BULK, *args)
        assert r.code == 2 and r.out == ""
        assert r.err.splitlines()[0] == (
            "gantry: error: say why the anomaly is dismissed: give --note TEXT"
        )
    assert fake.requests == []

    r = gantry("audit", "anomalies", "dismiss", BULK, "--note", "a planned backfill")
    assert r.code == 0, r.err
    sent = fake.last(pb.ResolveAnomalyRequest)
    assert (sent.state, sent.note) == ("dismissed", "a planned backfill")
    assert r.out.splitlines()[0] == f"dismissed anomaly {BULK}: bulk_read by bob"


def test_a_refusal_by_the_server_is_one_line(gantry: Gantry, fake: Any) -> None:
    fake.service.deny = True
    for args in (("list",), ("show", BULK), ("ack", BULK), ("dismiss", BULK, "--note", "x")):
        r = gantry("audit", "anomalies", *args)
        assert r.code == 2 and r.out == ""
        action = "list" if args[0] in ("list", "show") else "resolve"
        assert r.err.splitlines() == [
            f"gantry: error: 'bob' may not {action} anomaly: no role grants it"
        ]


def test_an_unknown_token_is_one_line(fake: Any, gantry_cli: Any) -> None:
    r = gantry_cli("not-a-token", audit=fake)("audit", "anomalies", "list")
    assert r.code == 2 and r.err.splitlines() == ["gantry: error: unknown token"]
