"""The embedded platform: NATS plus the services as child processes (never port 4222)."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gantry.core import Conflict, NotFound, Unavailable
from gantry.supervisor.platform import Platform

pytestmark = pytest.mark.timeout(90)


class Lines(list[str]):
    """A log sink that keeps every line."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def text(self) -> str:
        return "\n".join(self)


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def free_port() -> Iterator[int]:
    """A port with something listening on it (a stand-in for somebody else's server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_platform_runs_audit_kills_restarts_and_stops_cleanly(tmp_path: Path) -> None:
    logs = Lines()
    data = tmp_path / "data"
    platform = Platform(data, nats_port=0, log_sink=logs)
    with platform:
        # admin init ran first: keys and a private admin token exist
        assert (data / "keys" / "issuer.pem").exists()
        assert stat.S_IMODE((data / "admin.token").stat().st_mode) == 0o600
        assert json.loads((data / "run" / "nats.json").read_text())["url"] == platform.nats_url
        assert platform.nats_port != 4222
        address = platform.address("audit")
        assert serving(address)
        info = platform.service_info("audit")
        assert info["pid"] == platform.pid("audit")
        # one merged log stream, each line prefixed with its service
        assert any(line.startswith("audit | ") and "audit service ready" in line for line in logs)

        first_pid = platform.pid("audit")
        assert first_pid is not None
        platform.kill_service("audit")
        assert platform.pid("audit") is None and not alive(first_pid)
        assert not (data / "run" / "audit.json").exists()  # no stale address for clients
        assert platform.wait() == "audit"  # wait() returns when a child dies

        platform.restart_service("audit")
        second_pid = platform.pid("audit")
        assert second_pid is not None and second_pid != first_pid
        assert serving(platform.address("audit"))

        with pytest.raises(NotFound):
            platform.address("billing")
        pids = platform.pids()
        assert set(pids) == {
            "audit",
            "governance",
            "scheduler",
            "serving",
            "profiler",
            "workflows",
            "nats",
        }
    assert platform.wait() is None  # stopped
    assert not [name for name, pid in pids.items() if alive(pid)]
    assert not (data / "run" / "nats.json").exists()
    assert not (data / "run" / "audit.json").exists()
    assert "did not stop in time" not in logs.text()  # SIGTERM was enough
    assert "audit service stopped" in logs.text()


def test_a_taken_port_falls_back_to_a_free_one(tmp_path: Path, free_port: int) -> None:
    logs = Lines()
    with Platform(tmp_path, nats_port=free_port, services=(), log_sink=logs) as platform:
        assert platform.nats_port not in (free_port, 0)
        assert platform.nats_url.endswith(f":{platform.nats_port}")
    assert f"port {free_port} is taken (another NATS server?); using a free port" in logs.text()


def test_a_service_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    logs = Lines()
    platform = Platform(tmp_path, nats_port=0, services=("nosuchservice",), log_sink=logs)
    with pytest.raises(Unavailable, match="nosuchservice exited with code 1") as caught:
        platform.start(timeout_s=30)
    assert "No module named gantry.nosuchservice" in caught.value.message
    assert platform.pids() == {}  # NATS was stopped again too


def test_two_platforms_never_share_a_data_dir(tmp_path: Path) -> None:
    with Platform(tmp_path, nats_port=0, services=(), log_sink=Lines()):
        with pytest.raises(Conflict, match="already running"):
            Platform(tmp_path, nats_port=0, services=(), log_sink=Lines()).start()
    with Platform(tmp_path, nats_port=0, services=(), log_sink=Lines()) as again:
        assert again.nats_port > 0


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    from gantry.core import InvalidInput

    with pytest.raises(InvalidInput, match="port"):
        Platform(tmp_path, nats_port=70000)
    with pytest.raises(InvalidInput, match="invalid service name"):
        Platform(tmp_path, services=("../evil",))
    with pytest.raises(Unavailable, match="not started"):
        _ = Platform(tmp_path).nats_url
