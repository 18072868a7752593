"""The health server over real HTTP: liveness, readiness with named checks, metrics, 404."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from gantry.core import ConfigError, Conflict
from gantry.core.health import HealthServer, ReadyFlag, connected

pytestmark = pytest.mark.timeout(30)


def get(port: int, path: str, *, method: str = "GET") -> tuple[int, str, str]:
    """``(status, content type, body)`` of one request."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("gantry_test_things", "Things counted", registry=registry).inc(3)
    return registry


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[HealthServer]:
    health = HealthServer(registry=registry).start(port=0)
    yield health
    health.stop()


def test_healthz_answers_while_the_process_runs(server: HealthServer) -> None:
    assert get(server.port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    assert get(server.port, "/healthz", method="HEAD")[0] == 200


def test_readyz_names_the_failing_checks_until_they_pass(server: HealthServer) -> None:
    assert get(server.port, "/readyz")[0] == 200  # nothing to wait for
    grpc_up = server.flag("grpc", down="not serving")
    nats = {"up": False}
    server.add_check("nats", connected(lambda: nats["up"]))

    status, _, body = get(server.port, "/readyz")
    assert (status, body) == (503, "not ready: grpc not serving; nats disconnected\n")
    grpc_up.set()
    assert get(server.port, "/readyz")[1:] == (
        "text/plain; charset=utf-8",
        "not ready: nats disconnected\n",
    )
    nats["up"] = True
    assert get(server.port, "/readyz") == (200, "text/plain; charset=utf-8", "ready\n")
    grpc_up.clear()
    assert get(server.port, "/readyz")[2] == "not ready: grpc stopping\n"


def test_a_check_that_raises_fails_readiness_only(server: HealthServer) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    server.add_check("db", broken)
    status, _, body = get(server.port, "/readyz")
    assert status == 503 and body == "not ready: db check failed: RuntimeError: boom\n"
    assert get(server.port, "/healthz")[0] == 200


def test_metrics_are_the_registry_in_prometheus_text(server: HealthServer) -> None:
    status, content_type, body = get(server.port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert "gantry_test_things_total 3.0" in body
    _, _, only = get(server.port, "/metrics?name[]=gantry_test_things_created")
    assert "\ngantry_test_things_created " in only and "\ngantry_test_things_total " not in only


def test_other_paths_are_not_found(server: HealthServer) -> None:
    assert get(server.port, "/")[0] == 404
    assert get(server.port, "/metricsx")[0] == 404


def test_probes_in_parallel_while_checks_change(server: HealthServer) -> None:
    flag = server.flag("grpc")
    answers: list[int] = []

    def probe() -> None:
        for _ in range(20):
            answers.append(get(server.port, "/readyz")[0])

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        flag.set()
        flag.clear()
    for t in threads:
        t.join()
    assert len(answers) == 80 and set(answers) <= {200, 503}


def test_start_and_stop() -> None:
    health = HealthServer()
    with pytest.raises(Conflict):
        _ = health.port
    health.stop()  # not started: nothing to do
    health.start()
    try:
        with pytest.raises(Conflict):
            health.start()
        assert get(health.port, "/metrics")[0] == 200  # the default registry
    finally:
        health.stop()
    flag = ReadyFlag()
    assert flag() == (False, "not started") and not flag.is_set


def test_a_taken_port_is_a_config_error(server: HealthServer) -> None:
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        HealthServer().start(port=server.port)
