"""Dev sessions over the in-process platform: the document, the job it becomes, and the states
a session goes through (running, preempted, culled, resumed)."""

from __future__ import annotations

import textwrap

import pytest

from gantry.core import Conflict, InvalidInput
from gantry.workflows.devsessions import parse_session, token_hash
from gantry.workflows.platform import Owner
from gantry.workflows.sessions import Sessions

from .conftest import Rig

SESSION = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: DevSession
    metadata: {name: ana-scratch}
    spec:
      resources: {gpuMilli: 250, cpus: 1, memory: 2Gi}
      data: [{dataset: churn, version: "v1"}]
      idleTimeout: 10m
      lifetime: 2h
    """
)
ANA = Owner("ana", ("ml-developer",))


def test_raw_data_and_impossible_timeouts_are_refused() -> None:
    with pytest.raises(InvalidInput, match="reads de-identified data only"):
        parse_session(SESSION.replace('version: "v1"}', 'version: "v1", view: raw}'))
    with pytest.raises(InvalidInput, match="could never be culled"):
        parse_session(SESSION.replace("idleTimeout: 10m", "idleTimeout: 3h"))


def test_a_session_runs_is_preempted_culled_and_resumed(rig: Rig) -> None:
    sessions = Sessions(rig.controller.engine, rig.platform, rig.clock)
    view = sessions.start(SESSION, owner=ANA)
    assert view.state == "starting" and view.job_id
    doc = rig.platform.jobs[view.job_id]["doc"]
    assert doc["metadata"]["priority"] == "low"  # training preempts it
    assert doc["spec"]["data"] == [{"dataset": "churn", "version": "v1", "view": "deidentified"}]
    args = doc["spec"]["entrypoint"]["args"]
    assert args[args.index("--token-sha256") + 1] == token_hash(view.token)
    assert view.token not in str(doc)  # the node never sees the token itself
    rig.platform.jobs[view.job_id]["rendezvous"] = "10.0.0.5:21234"
    sessions.tick()
    running = sessions.get("ana-scratch")
    assert running.state == "running" and running.url == "http://10.0.0.5:21234/"
    rig.platform.jobs[view.job_id]["state"] = "pending"  # preempted, requeued
    sessions.tick()
    assert sessions.get("ana-scratch").state == "waiting"
    rig.platform.finish(view.job_id, metrics={"session_culled": 1.0, "session_active_s": 60.0})
    sessions.tick()
    culled = sessions.get("ana-scratch")
    assert culled.state == "culled" and culled.active_s == 60.0
    with pytest.raises(Conflict):
        sessions.stop("ana-scratch", "")
    again = sessions.resume("ana-scratch")
    assert again.generation == 2 and again.token != view.token
    assert again.job_id != view.job_id
    assert [g.how for g in again.history] == ["culled", ""]


def test_a_session_is_running_only_once_its_server_answers(rig: Rig) -> None:
    sessions = Sessions(rig.controller.engine, rig.platform, rig.clock)
    view = sessions.start(SESSION, owner=ANA)
    rig.platform.jobs[view.job_id]["rendezvous"] = "10.0.0.5:21234"
    rig.platform.silent.add("10.0.0.5:21234")  # the job runs, its server is still starting
    sessions.tick()
    starting = sessions.get("ana-scratch")
    assert (starting.state, starting.reason, starting.url) == (
        "starting",
        "its server is starting",
        "",
    )
    rig.platform.silent.clear()
    sessions.tick()
    assert sessions.get("ana-scratch").url == "http://10.0.0.5:21234/"


def test_the_token_is_sealed_at_rest_and_bound_to_its_session(rig: Rig) -> None:
    import sqlalchemy as sa

    from gantry.workflows import store
    from gantry.workflows.sealing import SealBroken, Sealer

    key = bytes(range(32))
    sessions = Sessions(rig.controller.engine, rig.platform, rig.clock, sealer=Sealer(key))
    view = sessions.start(SESSION, owner=ANA)
    with rig.controller.engine.connect() as conn:
        stored = conn.execute(sa.select(store.sessions.c.token)).scalar_one()
    assert stored.startswith("v1:") and view.token not in stored
    # the same key opens it (a restarted service); another key does not, and nothing breaks
    assert Sessions(rig.controller.engine, rig.platform, sealer=Sealer(key)).get(
        "ana-scratch"
    ).token == (view.token)
    other = Sessions(rig.controller.engine, rig.platform, sealer=Sealer(bytes(32)))
    assert other.get("ana-scratch").token == ""
    assert [v.name for v in other.list()] == ["ana-scratch"]
    # a sealed token moved to another session's row does not open there
    sealer = Sealer(key)
    with pytest.raises(SealBroken, match="does not open"):
        sealer.open(stored, bound_to="someone-else")
