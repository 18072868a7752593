"""``gantry sessions`` against a fake workflows service on a free local port, found through the
data directory's run file like the real one.

The fake answers with one canned session of the caller's, ``ana-scratch`` (a Jupyter server on
a quarter of a GPU, its first generation culled, the second running), and one of bob's that
the caller sees without its token; ``GetDevSession`` can be scripted to move on from poll to
poll. ``serve_fake`` keeps every request, so tests can check what the CLI sent, and that bad
input was refused before anything was sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.client.cli import _sessions
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
SCRATCH = """\
apiVersion: gantry/v1
kind: DevSession
metadata: {name: ana-scratch}
spec:
  interface: jupyter
  resources: {gpuMilli: 250, cpus: 2, memory: 4Gi}
  data: [{dataset: churn, version: 9fe92b}]
  idleTimeout: 30m
  lifetime: 8h
"""
T0 = 1_767_232_800_000  # 2026-01-01 02:00:00 UTC
URL = "http://10.0.0.7:8888/"
REASONS = {
    "starting": "waiting for a place",
    "running": "the server is up",
    "waiting": "preempted by job j-90; its files are saved",
    "culled": "idle for 30m",
    "failed": "its job failed: image gantry/session not found",
    "stopped": "stopped by dev",
}


def _session(state: str = "running", generation: int = 2, **extra: Any) -> pb.DevSession:
    """ana-scratch in ``generation`` (every earlier one culled after an hour), in ``state``."""
    ended = state in ("culled", "expired", "stopped", "failed")
    history = [
        pb.SessionGeneration(
            number=n, job_id=f"j-1{n}", started_ms=T0 + (n - 1) * 7_200_000,
            ended_ms=T0 + (n - 1) * 7_200_000 + 3_600_000, how="culled", active_s=600.0 * n,
        )
        for n in range(1, generation)
    ]  # fmt: skip
    if generation:
        history.append(
            pb.SessionGeneration(
                number=generation, job_id=f"j-1{generation}",
                started_ms=T0 + (generation - 1) * 7_200_000,
                ended_ms=T0 + generation * 7_200_000 if ended else 0,
                how=state if ended else "", active_s=300.0,
            )
        )  # fmt: skip
    fields: dict[str, Any] = {
        "name": "ana-scratch", "owner": "dev", "state": state, "reason": REASONS[state],
        "spec_yaml": SCRATCH, "interface": "jupyter", "url": URL if state == "running" else "",
        "token": f"tok-{generation}" if generation else "", "generation": generation,
        "job_id": f"j-1{generation}" if generation else "", "active_s": 1500.0,
        "endpoint": "10.0.0.7:8888" if state == "running" else "", "history": history,
        "created_ms": T0, "started_ms": T0 + (generation - 1) * 7_200_000 if generation else 0,
        "ended_ms": T0 + generation * 7_200_000 if ended else 0,
        "idle_timeout_s": 1800.0, "lifetime_s": 28800.0, "gpus": 0.25, "dataset": "churn",
    }  # fmt: skip
    return pb.DevSession(**{**fields, **extra})


BOBS = _session("waiting", 1, name="bob-notebook", owner="bob", token="", gpus=1.0, dataset="")


@dataclass
class FakeSessions(pb_grpc.WorkflowServiceServicer):
    """Canned answers; ``GetDevSession`` of ana-scratch answers from ``script``, one per poll."""

    script: list[pb.DevSession] = field(default_factory=lambda: [_session()])
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def StartDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if "gpuMilli: 2500" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "dev session 'ana-scratch' is invalid: spec.resources.gpuMilli: a slice is at "
                "most 1000 — ask for whole GPUs with gpus — fix these and start it again; see "
                "docs/workflows.md",
            )
        if request.dry_run:
            return _session("starting", 0, created_ms=0)
        return _session("starting", 1)

    def GetDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if request.name == "bob-notebook":
            return BOBS
        if request.name != "ana-scratch":
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"dev session {request.name!r} not found — list sessions with "
                "`gantry sessions list`",
            )
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        return self.script[min(poll, len(self.script) - 1)]

    def ListDevSessions(self, request: Any, context: Any) -> pb.ListDevSessionsResponse:
        every = [_session(), BOBS]
        return pb.ListDevSessionsResponse(
            sessions=[s for s in every if request.state in ("", s.state)]
        )

    def StopDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if request.name == "old-scratch":
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "dev session old-scratch is already culled"
            )
        return _session("stopped", reason=request.reason or REASONS["stopped"])

    def ResumeDevSession(self, request: Any, context: Any) -> pb.DevSession:
        return _session("starting", 3, reason="resumed (generation 3); waiting for a place")


#: ``gantry ARGS`` -> its exit status, stdout and stderr (conftest's ``CliResult``).
Gantry = Callable[..., Any]


@pytest.fixture
def fake(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeSessions(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def gantry(fake: Any, gantry_cli: Any, monkeypatch: pytest.MonkeyPatch) -> Gantry:
    """Run ``gantry ARGS`` against the fake; no traceback may reach the user."""
    monkeypatch.setattr(_sessions, "POLL_S", 0.01)
    return gantry_cli(TOKEN, workflows=fake)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "scratch.yaml"
    path.write_text(SCRATCH)
    return path


# ---------------------------------------------------------------------- start


def test_start_waits_until_it_runs_then_prints_the_url_and_the_token(
    gantry: Gantry, fake: Any, spec: Path
) -> None:
    fake.service.script = [_session("starting", 1), _session("running", 1)]
    r = gantry("sessions", "start", spec)
    assert r.code == 0, r.err
    sent = fake.last(pb.StartDevSessionRequest)
    assert (sent.spec_yaml, sent.dry_run) == (SCRATCH, False)
    assert fake.service.polls == 2
    lines = r.out.splitlines()
    assert lines[0] == "started dev session ana-scratch: starting (waiting for a place)"
    assert lines[1:3] == ["dev session ana-scratch: running", "  the server is up"]
    fields = r.fields()
    assert fields["url"] == URL
    assert fields["token"] == f"tok-1  ({_sessions.LOGIN_NOTE})"
    assert "login token" in _sessions.LOGIN_NOTE and "only you" in _sessions.LOGIN_NOTE
    assert (fields["GPUs"], fields["idle timeout"], fields["lifetime"]) == (
        "0.25 (a slice)", "30m", "8h",
    )  # fmt: skip
    assert fields["data"] == "churn (de-identified)"
    events = [line.split("  ", 1)[1] for line in r.err.splitlines()]  # after the time stamp
    assert events == ["dev session ana-scratch: running (the server is up)"]


def test_start_without_waiting_and_as_a_dry_run(gantry: Gantry, fake: Any, spec: Path) -> None:
    r = gantry("sessions", "start", spec, "--no-wait")
    assert r.code == 0, r.err
    assert fake.service.polls == 0
    assert r.out.splitlines()[0] == (
        "started dev session ana-scratch: starting (waiting for a place)"
    )
    assert "dev session ana-scratch: starting" not in r.out.splitlines()  # said once
    assert "url" not in r.fields() and r.fields()["token"].startswith("tok-1  (")
    assert r.out.splitlines()[-1] == "follow it with 'gantry sessions get ana-scratch'"

    r = gantry("sessions", "start", spec, "--dry-run")
    assert r.code == 0, r.err
    assert fake.last(pb.StartDevSessionRequest).dry_run and fake.service.polls == 0
    assert r.out.splitlines()[0] == (
        "dry run: dev session ana-scratch is valid; nothing was started"
    )
    fields = r.fields()
    assert "token" not in fields and "generation" not in fields
    assert (fields["interface"], fields["GPUs"]) == ("jupyter", "0.25 (a slice)")

    data = json.loads(gantry("sessions", "start", spec, "--no-wait", "--json").out)
    assert (data["name"], data["token"], data["generation"]) == ("ana-scratch", "tok-1", 1)


def test_start_wait_exits_1_when_the_session_fails_or_takes_too_long(
    gantry: Gantry, fake: Any, spec: Path
) -> None:
    fake.service.script = [_session("starting", 1), _session("failed", 1)]
    r = gantry("sessions", "start", spec)
    assert r.code == 1
    assert "dev session ana-scratch: failed" in r.out
    assert "its job failed: image gantry/session not found" in r.out
    assert r.out.splitlines()[-1] == "resume it with 'gantry sessions resume ana-scratch'"
    assert "token" not in r.fields()  # an ended session's token opens nothing

    fake.service.script, fake.service.polls = [_session("starting", 1)], 0
    r = gantry("sessions", "start", spec, "--timeout", "0.2", "--json")
    assert r.code == 1
    assert json.loads(r.out)["state"] == "starting"  # stdout: the session as last seen
    assert "dev session ana-scratch is still starting after 0.2s; it goes on" in r.err
    assert fake.service.polls >= 3


def test_start_reports_bad_files_and_bad_documents_cleanly(
    gantry: Gantry, fake: Any, tmp_path: Path
) -> None:
    r = gantry("sessions", "start", tmp_path / "nope.yaml")
    assert r.code == 2
    assert r.err.splitlines() == [
        f"gantry: error: no dev session file {tmp_path / 'nope.yaml'}",
        "gantry: hint: give the path of a DevSession YAML file",
    ]
    (tmp_path / "empty.yaml").write_text("\n")
    r = gantry("sessions", "start", tmp_path / "empty.yaml")
    assert r.code == 2 and "gantry: error: the dev session document is empty" in r.err
    assert fake.requests == []  # none of these reached the service

    bad = tmp_path / "bad.yaml"
    bad.write_text(SCRATCH.replace("gpuMilli: 250", "gpuMilli: 2500"))
    r = gantry("sessions", "start", bad)
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [
        "gantry: error: dev session 'ana-scratch' is invalid: spec.resources.gpuMilli: a slice "
        "is at most 1000 — ask for whole GPUs with gpus — fix these and start it again; see "
        "docs/workflows.md"
    ]


# ---------------------------------------------------------------------- get, list


def test_get_shows_where_it_runs_what_it_uses_and_every_generation(gantry: Gantry) -> None:
    r = gantry("sessions", "get", "ana-scratch")
    assert r.code == 0, r.err
    assert r.out.splitlines()[:2] == ["dev session ana-scratch: running", "  the server is up"]
    fields = r.fields()
    assert fields["url"] == URL and fields["token"].startswith("tok-2  (the login token")
    assert (fields["interface"], fields["owner"], fields["GPUs"]) == (
        "jupyter", "dev", "0.25 (a slice)",
    )  # fmt: skip
    assert (fields["idle timeout"], fields["lifetime"]) == ("30m", "8h")
    assert (fields["active"], fields["generation"], fields["job"]) == (
        "1500 seconds", "2", "j-12",
    )  # fmt: skip
    assert fields["started (UTC)"] == "2026-01-01 04:00:00" and "ended (UTC)" not in fields
    assert "2 generations" in r.out
    assert r.cells("1") == [
        "1", "j-11", "2026-01-01 02:00:00", "2026-01-01 03:00:00", "1h 00m", "culled", "600",
    ]  # fmt: skip
    assert r.cells("2") == ["2", "j-12", "2026-01-01 04:00:00", "", "", "running", "300"]

    data = json.loads(gantry("sessions", "get", "ana-scratch", "--json").out)
    assert [g["how"] for g in data["history"]] == ["culled", ""]


def test_get_shows_no_token_of_someone_elses_session(gantry: Gantry) -> None:
    r = gantry("sessions", "get", "bob-notebook")
    assert r.code == 0, r.err
    assert r.out.splitlines()[:2] == [
        "dev session bob-notebook: waiting",
        "  preempted by job j-90; its files are saved",
    ]
    fields = r.fields()
    assert "token" not in fields and "url" not in fields and "tok-" not in r.out
    assert (fields["owner"], fields["GPUs"]) == ("bob", "1")


def test_get_of_an_unknown_session_says_so(gantry: Gantry) -> None:
    r = gantry("sessions", "get", "nope")
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == (
        "gantry: error: dev session 'nope' not found — list sessions with `gantry sessions list`"
    )


def test_list_shows_each_session(gantry: Gantry, fake: Any) -> None:
    r = gantry("sessions", "list")
    assert r.code == 0, r.err
    assert fake.last(pb.ListDevSessionsRequest).state == ""
    assert "2 dev sessions" in r.out
    assert r.cells("ana-scratch") == [
        "ana-scratch", "running", "dev", "jupyter", "0.25", "2", "1500", "2026-01-01 02:00:00",
        URL, "the server is up",
    ]  # fmt: skip
    assert r.cells("bob-notebook")[:3] == ["bob-notebook", "waiting", "bob"]
    assert "tok-" not in r.out  # a list shows no token

    r = gantry("sessions", "list", "--state", "waiting")
    assert r.code == 0 and fake.last(pb.ListDevSessionsRequest).state == "waiting"
    assert "1 dev session waiting" in r.out and "ana-scratch" not in r.out
    data = json.loads(gantry("sessions", "list", "--json").out)
    assert [(s["name"], s["token"]) for s in data] == [
        ("ana-scratch", "tok-2"),
        ("bob-notebook", ""),
    ]

    before = len(fake.requests)
    r = gantry("sessions", "list", "--state", "idle")
    assert r.code == 2 and "gantry: error: unknown dev session state 'idle'" in r.err
    assert "one of starting, running, waiting, culled, expired, stopped, failed" in r.err
    assert len(fake.requests) == before


# ---------------------------------------------------------------------- stop, resume


def test_stop_says_it_stopped_and_how_to_resume(gantry: Gantry, fake: Any) -> None:
    r = gantry("sessions", "stop", "ana-scratch", "--reason", "going home")
    assert r.code == 0, r.err
    sent = fake.last(pb.DevSessionRequest)
    assert (sent.name, sent.reason) == ("ana-scratch", "going home")
    assert r.out.splitlines() == [
        "dev session ana-scratch: stopped: going home",
        "its files are saved; resume it with 'gantry sessions resume ana-scratch'",
    ]
    r = gantry("sessions", "stop", "old-scratch")
    assert r.code == 2
    assert r.err.strip() == "gantry: error: dev session old-scratch is already culled"


def test_resume_starts_the_next_generation_and_can_wait_for_it(gantry: Gantry, fake: Any) -> None:
    r = gantry("sessions", "resume", "ana-scratch")
    assert r.code == 0, r.err
    assert fake.last(pb.DevSessionRequest).name == "ana-scratch" and fake.service.polls == 0
    assert r.out.splitlines()[0] == "resumed dev session ana-scratch (generation 3): starting"
    assert r.out.splitlines()[-1] == "follow it with 'gantry sessions get ana-scratch'"

    fake.service.script = [_session("starting", 3), _session("running", 3)]
    r = gantry("sessions", "resume", "ana-scratch", "--wait")
    assert r.code == 0, r.err
    fields = r.fields()
    assert fields["url"] == URL and fields["token"].startswith("tok-3  (the login token")
    assert fields["generation"] == "3" and "3 generations" not in r.out  # no history in start


def test_help_lists_the_commands(gantry: Gantry) -> None:
    r = gantry("sessions", "--help")
    assert r.code == 0
    for command in ("start", "list", "get", "stop", "resume"):
        assert f" {command} " in r.out
