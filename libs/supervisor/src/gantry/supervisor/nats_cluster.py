"""A JetStream cluster of nats-servers on one machine: on loopback ports, or one server per
network namespace (as separate hosts).

Every server fsyncs each write (``sync_interval: always``) and carries the per-service users
(gantry.events.nats_auth), so a platform on it runs as on a cluster: streams with three
replicas survive losing one server.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import nats
import nats.errors

from gantry.core import InvalidInput, Unavailable
from gantry.events.nats_auth import password_of, render_auth_conf
from gantry.events.topology import ADMIN_USER
from gantry.supervisor.nats_server import ClusterSpec, NatsServer


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class NatsCluster:
    """``len(hosts)`` servers in one JetStream cluster named ``name``.

    ``hosts`` are the addresses the servers listen on (loopback: all ``127.0.0.1`` with
    different ports; namespaces: each its own address in ``netns``). ``credentials`` are the
    users' passwords (:func:`gantry.events.nats_auth.ensure_credentials`).
    """

    def __init__(
        self,
        root: Path,
        credentials: Mapping[str, str],
        *,
        hosts: Sequence[str] = ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
        netns: Sequence[str | None] | None = None,
        client_port: int | None = None,
        route_port: int | None = None,
        name: str = "gantry",
    ) -> None:
        if len(hosts) < 3:
            raise InvalidInput("a JetStream cluster needs at least three servers")
        namespaces = list(netns) if netns is not None else [None] * len(hosts)
        if len(namespaces) != len(hosts):
            raise InvalidInput("give one network namespace per host (or none)")
        same_host = len(set(hosts)) == 1
        ports = free_ports(2 * len(hosts)) if same_host else []
        clients = ports[: len(hosts)] if same_host else [client_port or 4222] * len(hosts)
        routes_at = ports[len(hosts) :] if same_host else [route_port or 6222] * len(hosts)
        routes = [f"nats://{h}:{p}" for h, p in zip(hosts, routes_at, strict=True)]
        self.credentials = dict(credentials)
        self.servers = [
            NatsServer(
                Path(root) / f"n{i + 1}",
                host=host,
                port=clients[i],
                name=f"{name}-{i + 1}",
                auth_conf=render_auth_conf(),
                env=self.credentials,
                sync_always=True,
                cluster=ClusterSpec(
                    name=name,
                    port=routes_at[i],
                    routes=[r for j, r in enumerate(routes) if j != i],
                ),
                netns=namespaces[i],
            )
            for i, host in enumerate(hosts)
        ]

    @property
    def url(self) -> str:
        """Every server's client URL, comma separated."""
        return ",".join(s.url for s in self.servers)

    def start(self, timeout_s: float = 30.0) -> NatsCluster:
        """Start every server and wait until JetStream answers (a meta leader is elected)."""
        for server in self.servers:
            server.start(timeout_s)
        self.wait_jetstream(timeout_s)
        return self

    def wait_jetstream(self, timeout_s: float = 30.0) -> None:
        """Wait until the cluster's JetStream answers an account-info request."""
        password = password_of(self.credentials, ADMIN_USER)
        servers = [
            s.url.replace("nats://", f"nats://{ADMIN_USER}:{password}@", 1)
            for s in self.servers
            if s.running
        ]

        async def ready() -> bool:
            nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=1)
            try:
                await nc.jetstream(timeout=2).account_info()
                return True
            except (nats.errors.Error, TimeoutError):
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if asyncio.run(ready()):
                    return
            except (OSError, nats.errors.Error, TimeoutError):
                pass
            time.sleep(0.25)
        raise Unavailable(f"the NATS cluster's JetStream did not come up in {timeout_s}s")

    def stop(self) -> None:
        """Stop every server."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["NatsCluster", "free_ports"]
