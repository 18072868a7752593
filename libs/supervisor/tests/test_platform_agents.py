"""The platform runs the scheduler and local node agents; agents register their nodes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from gantry.core import InvalidInput, NotFound, Unavailable
from gantry.protos.v1 import scheduler_pb2 as pb
from gantry.protos.v1 import scheduler_pb2_grpc as pb_grpc
from gantry.supervisor.platform import DEFAULT_SERVICES, LocalAgent, Platform, local_agents

pytestmark = pytest.mark.timeout(90)

T = TypeVar("T")


class Lines(list[str]):
    """A log sink that keeps every line."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def text(self) -> str:
        return "\n".join(self)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 20) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def list_nodes(platform: Platform) -> dict[str, pb.Node]:
    token = (platform.data_dir / "admin.token").read_text().strip()
    with grpc.insecure_channel(platform.address("scheduler")) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        reply = stub.ListNodes(
            pb.ListNodesRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5
        )
    return {n.name: n for n in reply.nodes}


def test_the_scheduler_runs_and_a_local_agent_registers_its_node(tmp_path: Path) -> None:
    logs = Lines()
    agent = LocalAgent(
        node="n1", pool="onprem", gpus=2, gpu_model="H100", cpus=4, memory="8Gi", heartbeat_s=0.5
    )
    platform = Platform(tmp_path / "data", nats_port=0, agents=[agent], log_sink=logs)
    assert (
        platform.services
        == DEFAULT_SERVICES
        == ("audit", "governance", "scheduler", "serving", "profiler", "workflows")
    )
    with platform:
        assert platform.service_info("scheduler")["pid"] == platform.pid("scheduler")
        assert platform.service_info("agent-n1") == {
            "pid": platform.pid("agent-n1"),
            "node": "n1",
            "pool": "onprem",
        }
        with pytest.raises(InvalidInput, match="no gRPC API"):
            platform.address("agent-n1")

        def registered() -> pb.Node | None:
            node = list_nodes(platform).get("n1")
            return node if node is not None and node.state == "ready" else None

        node = eventually("n1 in ListNodes", registered)
        assert node.pool == "onprem"
        assert [g.model for g in node.gpus] == ["H100", "H100"]
        assert node.cpu_milli == 4000 and node.memory_mib == 8192
        assert any(line.startswith("agent-n1 | ") for line in logs)

        # an agent is a supervised child like the services: wait() sees it die, and it restarts
        first = platform.pid("agent-n1")
        assert first is not None
        platform.kill_service("agent-n1")
        assert platform.wait() == "agent-n1"
        platform.restart_service("agent-n1")
        second = platform.pid("agent-n1")
        assert second is not None and second != first
        pids = platform.pids()
        assert set(pids) == {
            "audit",
            "governance",
            "scheduler",
            "serving",
            "profiler",
            "workflows",
            "agent-n1",
            "nats",
        }
        with pytest.raises(NotFound, match="agent-n1"):
            platform.pid("agent-n2")
    assert not [name for name, pid in pids.items() if alive(pid)]
    assert "did not stop in time" not in logs.text()
    assert "node agent stopped" in logs.text()


def test_an_agent_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    logs = Lines()
    bad = LocalAgent(node="n1", memory="lots")  # the agent refuses the flag and exits 2
    platform = Platform(tmp_path, nats_port=0, services=(), agents=[bad], log_sink=logs)
    with pytest.raises(Unavailable, match="agent agent-n1 exited with code 2") as caught:
        platform.start(timeout_s=30)
    assert "lots" in str(caught.value)
    assert platform.pids() == {}


def test_local_agents_are_named_after_the_host_or_numbered_and_share_the_machine() -> None:
    (one,) = local_agents(1)
    assert one.node and one.gpus is None and one.cpus is None  # the whole machine, detected
    two = local_agents(2, gpus=4)
    assert [a.node for a in two] == ["local-1", "local-2"]
    assert all(a.gpus == 4 and a.cpus and a.memory for a in two)
    assert [a.gpus for a in local_agents(3)] == [0, 0, 0]  # never two claims on one GPU
    assert local_agents(0) == []
    assert "--gpus" not in one.argv() and "--cpus" not in one.argv()
    argv = two[0].argv()
    assert argv[1:7] == ["-m", "gantry.training_agent", "--node", "local-1", "--pool", "default"]
    flags = dict(zip(argv[7::2], argv[8::2], strict=True))
    assert flags["--gpus"] == "4" and flags["--gpu-model"] == "A100"
    assert float(flags["--cpus"]) * 2 <= (os.cpu_count() or 1)


def test_bad_agents_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="invalid node name"):
        LocalAgent(node="../n1")
    with pytest.raises(InvalidInput, match="invalid pool name"):
        LocalAgent(node="n1", pool="")
    with pytest.raises(InvalidInput, match="-1 GPUs"):
        LocalAgent(node="n1", gpus=-1)
    with pytest.raises(InvalidInput, match="listed twice"):
        Platform(tmp_path, agents=[LocalAgent(node="n1"), LocalAgent(node="n1")])
    with pytest.raises(InvalidInput, match="cannot run -1"):
        local_agents(-1)
