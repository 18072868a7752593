"""Dev sessions in the workflows SDK, against a fake WorkflowService on a free local port.

The fake answers in the protocol's shapes with one canned session, ``ana-scratch`` (a Jupyter
server on a quarter of a GPU, reading ``churn`` de-identified), now in its second generation
after the first was culled; ``GetDevSession`` can be scripted to move on from poll to poll, or
to be unreachable for a while. ``serve_fake`` keeps every request, so tests can check what went
over the wire and that bad arguments were refused before anything was sent.
"""

from __future__ import annotations

import dataclasses
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gantry.client import workflows as workflows_module
from gantry.client._session_records import SESSION_DONE, SESSION_STATES
from gantry.client.errors import RemoteNotFound
from gantry.client.workflows import (
    SessionGenerationInfo,
    SessionInfo,
    SessionWaitTimeout,
    WaitTimeout,
    WorkflowsClient,
)
from gantry.core import AlreadyExists, Conflict, InvalidInput, Unavailable
from gantry.protos.v1 import workflows_pb2 as pb
from gantry.protos.v1 import workflows_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)

TOKEN = "dev-token"
SCRATCH = textwrap.dedent(
    """
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
)
T0 = 1_767_232_800_000
CULLED = pb.SessionGeneration(
    number=1, job_id="j-11", started_ms=T0, ended_ms=T0 + 3_600_000, how="culled", active_s=1200.0
)


def session_pb(state: str = "running", **changes: Any) -> pb.DevSession:
    """ana-scratch in its second generation (the first was culled), in ``state``."""
    running = state == "running"
    ended = state in SESSION_DONE
    current = pb.SessionGeneration(
        number=2, job_id="j-12", started_ms=T0 + 7_200_000,
        ended_ms=T0 + 9_000_000 if ended else 0, how=state if ended else "", active_s=300.0,
    )  # fmt: skip
    s = pb.DevSession(
        name="ana-scratch", owner="dev", state=state, spec_yaml=SCRATCH, interface="jupyter",
        reason={"running": "the server is up", "starting": "waiting for a place"}.get(state, ""),
        url="http://10.0.0.7:8888/" if running else "", token="tok-2", generation=2,
        job_id="j-12", endpoint="10.0.0.7:8888" if running else "", active_s=1500.0,
        history=[CULLED, current], created_ms=T0, started_ms=T0 + 7_200_000,
        ended_ms=T0 + 9_000_000 if ended else 0, idle_timeout_s=1800.0, lifetime_s=28800.0,
        gpus=0.25, dataset="churn",
    )  # fmt: skip
    for key, value in changes.items():
        if key == "history":
            s.ClearField("history")
            s.history.extend(value)
        else:
            setattr(s, key, value)
    return s


@dataclass
class FakeSessions(pb_grpc.WorkflowServiceServicer):
    """Canned sessions; ``GetDevSession`` of ana-scratch answers from ``script`` (one per
    poll, the last one repeated); polls in ``down`` answer UNAVAILABLE."""

    script: list[pb.DevSession] = field(default_factory=lambda: [session_pb()])
    down: set[int] = field(default_factory=set)
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def StartDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if "interface: notebook" in request.spec_yaml:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "dev session 'ana-scratch' is invalid: spec.interface: Input should be "
                "'jupyter' or 'shell'",
            )
        if "name: taken" in request.spec_yaml:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "dev session taken already exists")
        if request.dry_run:
            return session_pb(
                "starting", generation=0, job_id="", token="", history=[], created_ms=0
            )
        return session_pb("starting", generation=1, job_id="", history=[], token="tok-1")

    def GetDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if request.name != "ana-scratch":
            context.abort(grpc.StatusCode.NOT_FOUND, f"dev session {request.name!r} not found")
        with self.lock:
            poll, self.polls = self.polls, self.polls + 1
        if poll in self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return self.script[min(poll, len(self.script) - 1)]

    def ListDevSessions(self, request: Any, context: Any) -> pb.ListDevSessionsResponse:
        theirs = session_pb("waiting", name="bob-notebook", owner="bob", token="")
        every = [session_pb(), theirs]
        return pb.ListDevSessionsResponse(
            sessions=[s for s in every if request.state in ("", s.state)]
        )

    def StopDevSession(self, request: Any, context: Any) -> pb.DevSession:
        if request.name == "old-scratch":
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "dev session old-scratch is already culled"
            )
        return session_pb("stopped", reason=request.reason or "stopped by dev")

    def ResumeDevSession(self, request: Any, context: Any) -> pb.DevSession:
        return session_pb(
            "starting", generation=3, job_id="", token="tok-3",
            reason="resumed (generation 3); waiting for a place",
        )  # fmt: skip


@pytest.fixture
def workflows(serve_fake: Any) -> Any:
    """The fake on a free local port (a ``Served``: the fake and the requests it got)."""
    return serve_fake(FakeSessions(), pb_grpc.add_WorkflowServiceServicer_to_server, token=TOKEN)


@pytest.fixture
def client(workflows: Any) -> Iterator[WorkflowsClient]:
    with WorkflowsClient(workflows.address, TOKEN, timeout_s=10) as c:
        yield c


# ---------------------------------------------------------------------- records


def test_a_session_arrives_as_a_plain_record_with_its_history() -> None:
    s = SessionInfo.from_pb(session_pb())
    assert (s.name, s.owner, s.state, s.reason, s.interface) == (
        "ana-scratch", "dev", "running", "the server is up", "jupyter",
    )  # fmt: skip
    assert (s.url, s.endpoint, s.token) == ("http://10.0.0.7:8888/", "10.0.0.7:8888", "tok-2")
    assert (s.generation, s.job_id, s.active_s, s.spec_yaml) == (2, "j-12", 1500.0, SCRATCH)
    assert (s.created_ms, s.started_ms, s.ended_ms) == (T0, T0 + 7_200_000, 0)
    assert (s.idle_timeout_s, s.lifetime_s, s.gpus, s.dataset) == (1800.0, 28800.0, 0.25, "churn")
    assert s.running and not s.done
    assert isinstance(s.history, tuple)
    assert s.history[0] == SessionGenerationInfo(
        number=1, job_id="j-11", started_ms=T0, ended_ms=T0 + 3_600_000, how="culled",
        active_s=1200.0,
    )  # fmt: skip
    assert s.history[0].duration_ms == 3_600_000
    assert (s.history[1].how, s.history[1].duration_ms) == ("", None)  # still running
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.state = "stopped"  # type: ignore[misc]
    # a session nobody can reach: no URL, no endpoint, no history yet
    bare = SessionInfo.from_pb(pb.DevSession(name="x", state="starting"))
    assert (bare.url, bare.endpoint, bare.token, bare.history) == ("", "", "", ())


@pytest.mark.parametrize("state", SESSION_STATES)
def test_done_and_running_follow_the_state(state: str) -> None:
    s = SessionInfo.from_pb(session_pb(state))
    assert s.running is (state == "running")
    assert s.done is (state in ("culled", "expired", "stopped", "failed"))


def test_the_split_module_still_exports_every_name() -> None:
    # what gantry.client.workflows exported before dev sessions came, and what they added
    before = {
        "EXPERIMENT_DONE", "EXPERIMENT_STATES", "RUN_DONE", "RUN_STATES", "STEP_DONE",
        "STEP_KINDS", "STEP_STATES", "TRIAL_ACTIVE", "TRIAL_STATES", "ArtifactInfo",
        "ExperimentInfo", "ExperimentWaitTimeout", "ParameterInfo", "PipelineInfo",
        "PipelineStepInfo", "RunInfo", "RunWaitTimeout", "ScheduleInfo", "StartRunResult",
        "StepAttemptInfo", "StepRunInfo", "SubmitPipelineResult", "TrialInfo", "WorkflowsClient",
    }  # fmt: skip
    added = {
        "SESSION_ACTIVE", "SESSION_DONE", "SESSION_STATES", "SessionGenerationInfo",
        "SessionInfo", "SessionWaitTimeout", "WaitTimeout",
    }  # fmt: skip
    assert set(workflows_module.__all__) == before | added
    for name in workflows_module.__all__:
        assert getattr(workflows_module, name) is not None
    assert workflows_module.SESSION_STATES == SESSION_STATES
    for timeout in ("RunWaitTimeout", "ExperimentWaitTimeout", "SessionWaitTimeout"):
        assert issubclass(getattr(workflows_module, timeout), WaitTimeout)


# ---------------------------------------------------------------------- calls


def test_start_sends_the_document_and_returns_the_token(
    workflows: Any, client: WorkflowsClient
) -> None:
    started = client.start_session(SCRATCH)
    sent = workflows.last(pb.StartDevSessionRequest)
    assert (sent.spec_yaml, sent.dry_run) == (SCRATCH, False)
    assert isinstance(started, SessionInfo)
    assert (started.state, started.generation, started.token) == ("starting", 1, "tok-1")
    assert not started.running and not started.done

    checked = client.start_session(SCRATCH, dry_run=True)
    assert workflows.last(pb.StartDevSessionRequest).dry_run
    assert (checked.generation, checked.token, checked.history) == (0, "", ())


def test_get_list_stop_and_resume_send_their_arguments(
    workflows: Any, client: WorkflowsClient
) -> None:
    assert client.session("ana-scratch").url == "http://10.0.0.7:8888/"
    assert workflows.last(pb.DevSessionRequest).name == "ana-scratch"

    every = client.sessions()
    assert [(s.name, s.owner, s.token) for s in every] == [
        ("ana-scratch", "dev", "tok-2"),
        ("bob-notebook", "bob", ""),  # not the caller's: no token
    ]
    assert workflows.last(pb.ListDevSessionsRequest).state == ""
    assert [s.name for s in client.sessions(state="waiting")] == ["bob-notebook"]
    assert workflows.last(pb.ListDevSessionsRequest).state == "waiting"

    stopped = client.stop_session("ana-scratch", "going home")
    sent = workflows.last(pb.DevSessionRequest)
    assert (sent.name, sent.reason) == ("ana-scratch", "going home")
    assert (stopped.state, stopped.reason, stopped.done, stopped.url) == (
        "stopped", "going home", True, "",
    )  # fmt: skip
    assert stopped.history[-1].how == "stopped"

    resumed = client.resume_session("ana-scratch")
    sent = workflows.last(pb.DevSessionRequest)
    assert (sent.name, sent.reason) == ("ana-scratch", "")
    assert (resumed.state, resumed.generation, resumed.token) == ("starting", 3, "tok-3")


def test_bad_arguments_are_refused_before_any_call(workflows: Any, client: WorkflowsClient) -> None:
    with pytest.raises(InvalidInput, match="the dev session document is empty"):
        client.start_session(" \n")
    with pytest.raises(InvalidInput, match="unknown dev session state 'done'") as info:
        client.sessions(state="done")
    assert info.value.hint == "one of starting, running, waiting, culled, expired, stopped, failed"
    for call in (client.session, client.stop_session, client.resume_session):
        with pytest.raises(InvalidInput, match="a dev session name is needed"):
            call(" ")
    with pytest.raises(InvalidInput, match="got the string 'running'") as info:
        client.wait_session("ana-scratch", states="running")
    assert info.value.hint == "pass states=('running',)"
    with pytest.raises(InvalidInput, match=r"unknown dev session state\(s\) \['up'\]"):
        client.wait_session("ana-scratch", states=("running", "up"))
    with pytest.raises(InvalidInput, match="states is empty"):
        client.wait_session("ana-scratch", states=())
    with pytest.raises(InvalidInput, match="timeout_s must be more than 0"):
        client.wait_session("ana-scratch", timeout_s=0)
    with pytest.raises(InvalidInput, match="poll_s must be more than 0"):
        client.wait_session("ana-scratch", poll_s=0)
    assert workflows.requests == []


def test_server_errors_become_typed_errors_with_the_message(client: WorkflowsClient) -> None:
    with pytest.raises(InvalidInput, match=r"spec\.interface: Input should be 'jupyter' or"):
        client.start_session(SCRATCH.replace("interface: jupyter", "interface: notebook"))
    with pytest.raises(AlreadyExists, match="dev session taken already exists"):
        client.start_session(SCRATCH.replace("name: ana-scratch", "name: taken"))
    with pytest.raises(RemoteNotFound, match="dev session 'nope' not found"):
        client.session("nope")
    with pytest.raises(Conflict, match="already culled"):
        client.stop_session("old-scratch")


# ---------------------------------------------------------------------- wait


def test_wait_polls_until_the_session_runs_and_reports_each_change(
    workflows: Any, client: WorkflowsClient
) -> None:
    starting = session_pb("starting", generation=1, history=[], job_id="", token="tok-1")
    placed = session_pb("starting", generation=1, history=[], job_id="j-12", token="tok-1")
    workflows.service.script = [starting, starting, placed, session_pb(), session_pb("stopped")]
    workflows.service.down = {1}  # the service restarts between two polls: the wait goes on
    seen: list[SessionInfo] = []
    running = client.wait_session("ana-scratch", poll_s=0.01, on_change=seen.append)
    assert running.running and running.url == "http://10.0.0.7:8888/"
    assert workflows.service.polls == 4  # it stopped at the first running answer
    assert [(s.state, s.job_id) for s in seen] == [
        ("starting", ""),
        ("starting", "j-12"),
        ("running", "j-12"),
    ]


def test_wait_stops_when_the_session_ends_instead(workflows: Any, client: WorkflowsClient) -> None:
    failed = session_pb("failed", reason="its job failed: image not found")
    workflows.service.script = [session_pb("starting"), failed, session_pb()]
    ended = client.wait_session("ana-scratch", timeout_s=10, poll_s=0.01)
    assert (ended.state, ended.done, ended.running) == ("failed", True, False)
    assert ended.reason == "its job failed: image not found" and workflows.service.polls == 2


def test_wait_for_other_states(workflows: Any, client: WorkflowsClient) -> None:
    busier = session_pb(active_s=1600.0)  # only its activity moved: no news
    workflows.service.script = [session_pb(), busier, session_pb("waiting"), session_pb()]
    seen: list[SessionInfo] = []
    found = client.wait_session(
        "ana-scratch", states=["waiting"], timeout_s=10, poll_s=0.01, on_change=seen.append
    )
    assert found.state == "waiting" and workflows.service.polls == 3
    assert [(s.state, s.active_s) for s in seen] == [("running", 1500.0), ("waiting", 1500.0)]


def test_wait_gives_up_after_the_timeout_with_the_session_as_last_seen(
    workflows: Any, client: WorkflowsClient
) -> None:
    workflows.service.script = [session_pb("waiting", reason="preempted by job j-90")]
    with pytest.raises(SessionWaitTimeout) as info:
        client.wait_session("ana-scratch", timeout_s=0.2, poll_s=0.05)
    error = info.value
    assert isinstance(error, Unavailable) and isinstance(error, WaitTimeout)
    assert error.message == (
        "dev session ana-scratch is still waiting (preempted by job j-90) after 0.2s, not running"
    )
    assert error.hint == "look at it with 'gantry sessions get ana-scratch', or wait longer"
    assert (error.last.state, error.timeout_s, error.states) == ("waiting", 0.2, ("running",))
    assert workflows.service.polls >= 3
    with pytest.raises(RemoteNotFound, match="dev session 'other' not found"):
        client.wait_session("other", timeout_s=1)
