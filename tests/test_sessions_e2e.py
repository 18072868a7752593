"""A dev session on the whole embedded platform (NATS, every service, two node agents; the
``platform`` and ``version`` fixtures of ``tests/conftest.py``): a developer starts a Jupyter
session reading ``churn``, runs cells through the Jupyter API with the session's token (the
data it reads is the de-identified view), leaves it alone until it is culled, resumes it to
find its files back under a new token, and stops it."""

from __future__ import annotations

import contextlib
import datetime as dt
import textwrap
import time

import pytest

from gantry.client.admin import create_token
from gantry.client.scheduler import SchedulerClient
from gantry.client.workflows import SessionInfo, WorkflowsClient
from gantry.core import GantryError
from gantry.sched.spec import PRIORITY_CLASSES
from gantry.supervisor.platform import Platform
from gantry.testing.jupyter import JupyterClient

# whole-platform tests: generous bounds (the suite runs two files side by side)
pytestmark = pytest.mark.timeout(300)

DEVELOPER = "dana-dev"
NAME = "dana-scratch"
SESSION = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: DevSession
    metadata: {{name: dana-scratch}}
    spec:
      interface: jupyter
      resources: {{cpus: 0.5, memory: 1Gi}}
      data: [{{dataset: churn, version: "{version}"}}]
      idleTimeout: 8s
      lifetime: 10m
    """
)
#: What a cell reads of churn: the grant's view, whether the sensitive column was dropped,
#: whether every e-mail address (pii) was hashed, and the rows.
READ_DATA = textwrap.dedent(
    """
    from gantry.training.session import data
    ctx = data()
    table = ctx.table("churn")
    emails = table.column("email").to_pylist()
    (ctx.data[0].view, "income" in table.column_names, any("@" in e for e in emails),
     table.num_rows)
    """
)


def _token(platform: Platform, who: str, roles: list[str]) -> str:
    return create_token(platform.data_dir, who, roles, dt.timedelta(hours=1))


def _jupyter(info: SessionInfo, token: str = "") -> JupyterClient:
    """The session's Jupyter server, spoken to as a notebook client would, with its token."""
    assert info.url and info.token, info
    return JupyterClient(info.url, token or info.token)


def test_a_session_runs_cells_is_culled_when_idle_and_resumes_with_its_files(
    platform: Platform, version: str
) -> None:
    token = _token(platform, DEVELOPER, ["ml-developer"])
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        try:
            first, second = _use_cull_resume_and_stop(wf, version)
        finally:  # a failure must not leave a session holding a node for the next tests
            with contextlib.suppress(GantryError):
                if not wf.session(NAME).done:
                    wf.stop_session(NAME, reason="the test failed")

    with SchedulerClient(platform.address("scheduler"), token) as sched:
        job1, job2 = sched.get(first.job_id), sched.get(second.job_id)
        assert job1.state == "succeeded" and job1.metrics["session_culled"] == 1.0
        assert {job1.owner, job2.owner} == {DEVELOPER}  # as the developer, not the service
        assert {job1.priority, job2.priority} == {PRIORITY_CLASSES["low"]}  # training preempts
        deadline = time.monotonic() + 30
        while not (job2 := sched.get(second.job_id)).terminal:
            assert time.monotonic() < deadline, job2
            time.sleep(0.2)
        assert job2.state == "cancelled"


def _use_cull_resume_and_stop(wf: WorkflowsClient, version: str) -> tuple[SessionInfo, SessionInfo]:
    """The session's two generations, the culled one and the stopped one."""
    started = wf.start_session(SESSION.format(version=version))
    assert started.owner == DEVELOPER and started.generation == 1 and started.token
    first = wf.wait_session(NAME, timeout_s=120, poll_s=0.2)
    assert first.state == "running", first.reason
    assert first.token == started.token

    jupyter = _jupyter(first)
    jupyter.ready()
    status, kernel = jupyter.request("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, status
    assert jupyter.execute(kernel["id"], "2 + 3") == "5"
    assert jupyter.execute(kernel["id"], "open('notes.txt', 'w').write('kept')") == "4"
    assert jupyter.execute(kernel["id"], READ_DATA) == "('deidentified', False, False, 3000)"

    # nobody touches it now: idle for 8 s, it is culled and its job ends
    culled = wf.wait_session(NAME, states=("culled",), timeout_s=90, poll_s=0.3)
    assert culled.state == "culled", culled
    assert [(g.number, g.job_id, g.how) for g in culled.history] == [(1, first.job_id, "culled")]
    assert culled.active_s >= 8.0
    assert culled.url == "" and culled.done

    resumed = wf.resume_session(NAME)
    assert resumed.generation == 2 and resumed.token and resumed.token != first.token
    second = wf.wait_session(NAME, timeout_s=120, poll_s=0.2)
    assert second.state == "running", second.reason
    assert second.job_id != first.job_id

    again = _jupyter(second)
    again.ready()
    status, notes = again.request("GET", "/api/contents/notes.txt")
    assert (status, notes["content"]) == (200, "kept")  # generation 1's file is back
    stale = _jupyter(second, first.token)  # generation 1's token opens nothing now
    assert stale.request("GET", "/api/contents/notes.txt")[0] == 403

    stopped = wf.stop_session(NAME, reason="done for today")
    assert stopped.state == "stopped" and stopped.done
    assert [g.how for g in stopped.history] == ["culled", "stopped"]

    return first, second
