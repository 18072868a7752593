"""The harness itself: a real nats-server per test on a free port, never 4222."""

from __future__ import annotations

import socket

import pytest

from gantry.core import Unavailable
from gantry.supervisor import NatsServer


def test_nats_fixture_is_a_real_jetstream_server_on_a_free_port(nats_server: NatsServer) -> None:
    assert nats_server.running
    assert nats_server.port not in (0, 4222)
    with socket.create_connection(("127.0.0.1", nats_server.port), timeout=2) as conn:
        hello = conn.recv(4096)
    assert hello.startswith(b"INFO ")
    assert b'"jetstream":true' in hello


def test_restart_keeps_the_port(nats_server: NatsServer) -> None:
    port = nats_server.port
    nats_server.restart()
    assert nats_server.running
    assert nats_server.port == port


def test_a_server_that_cannot_start_says_why(tmp_path: pytest.TempPathFactory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Unavailable, match="nats-server"):
            NatsServer(tmp_path / "n", port=port).start(timeout_s=10)  # type: ignore[operator]
