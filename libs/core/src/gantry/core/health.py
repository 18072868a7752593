"""The HTTP health server of a Gantry process: ``/metrics``, ``/healthz`` and ``/readyz``.

One small threaded HTTP server (stdlib ``ThreadingHTTPServer`` in a daemon thread, as
``prometheus_client.start_http_server`` runs) answers, without authentication:

- ``GET /metrics``: the process's registry in the format the scraper asks for (Prometheus text,
  or OpenMetrics), ``?name[]=...`` selecting series, as ``prometheus_client`` serves it;
- ``GET /healthz``: ``200 ok`` while the process runs (liveness);
- ``GET /readyz``: ``200 ready`` when every readiness check passes, else ``503`` with the
  failing checks named, e.g. ``not ready: nats disconnected`` (readiness);
- anything else: ``404``.

A readiness check is a callable returning ``(ok, detail)``. The server calls it from its own
threads on every probe, so a check must be cheap and must not block: it reads a flag or a
connection's state, it never makes a call. :class:`ReadyFlag` is such a check for a state the
application sets itself ("the gRPC server is serving"); :func:`connected` wraps a connection's
``is_connected``-style predicate::

    health = HealthServer(registry=registry)
    grpc_ready = health.flag("grpc", down="not serving")
    health.add_check("nats", connected(lambda: bus.nc.is_connected))
    health.start(port=9031, host="0.0.0.0")
    ...
    grpc_ready.set()       # after server.start()
    grpc_ready.clear("stopping")
    health.stop()
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gantry.core.errors import ConfigError, Conflict
from gantry.core.logging import get_logger

_log = get_logger("gantry.core.health")

#: A readiness check: ``(ok, detail)``; ``detail`` says what is wrong when ``ok`` is false.
Check = Callable[[], tuple[bool, str]]

_TEXT = "text/plain; charset=utf-8"


class ReadyFlag:
    """A readiness check the application raises and lowers itself (ready while set).

    Setting and reading are single attribute assignments, safe across threads.
    """

    def __init__(self, down: str = "not started") -> None:
        self._state: tuple[bool, str] = (False, down)

    def set(self, detail: str = "ok") -> None:
        """Mark the component ready."""
        self._state = (True, detail)

    def clear(self, down: str = "stopping") -> None:
        """Mark the component not ready; ``down`` is what ``/readyz`` reports."""
        self._state = (False, down)

    @property
    def is_set(self) -> bool:
        """Whether the component is ready."""
        return self._state[0]

    def __call__(self) -> tuple[bool, str]:
        return self._state


def connected(is_connected: Callable[[], bool]) -> Check:
    """A check that passes while ``is_connected()`` is true: ``connected`` / ``disconnected``.

    ``is_connected`` must only read state (e.g. ``lambda: bus.nc.is_connected``).
    """

    def check() -> tuple[bool, str]:
        ok = bool(is_connected())
        return ok, "connected" if ok else "disconnected"

    return check


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP for one process.

    ``registry`` is the Prometheus registry ``/metrics`` exports (default: the process-wide
    one). Checks may be added before or after :meth:`start`; they are reported in the order
    they were added. The server lives until :meth:`stop` (or the process ends: its thread is
    a daemon).
    """

    def __init__(self, *, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- checks ---------------------------------------------------------------------------

    def add_check(self, name: str, check: Check) -> None:
        """Make ``/readyz`` depend on ``check`` (replacing an earlier check of that name)."""
        with self._lock:
            self._checks[name] = check

    def flag(self, name: str, *, down: str = "not started") -> ReadyFlag:
        """A new :class:`ReadyFlag` registered as check ``name``, not ready until set."""
        flag = ReadyFlag(down)
        self.add_check(name, flag)
        return flag

    def readiness(self) -> tuple[bool, list[str]]:
        """``(ready, problems)``: each problem is ``"<check> <detail>"`` of a failing check.

        A check that raises counts as failing; it never breaks the probe.
        """
        with self._lock:
            checks = list(self._checks.items())
        problems = []
        for name, check in checks:
            try:
                ok, detail = check()
            except Exception as exc:  # a buggy check must not take the endpoint down
                ok, detail = False, f"check failed: {type(exc).__name__}: {exc}"
            if not ok:
                problems.append(f"{name} {detail}".strip())
        return not problems, problems

    # -- the server ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on (once started)."""
        if self._server is None:
            raise Conflict("the health server is not started", hint="call start() first")
        return int(self._server.server_address[1])

    def start(self, port: int = 0, host: str = "127.0.0.1") -> HealthServer:
        """Listen on ``host``:``port`` (0 = any free port) and serve from a daemon thread;
        :class:`ConfigError` when the address cannot be bound (e.g. the port is taken)."""
        if self._server is not None:
            raise Conflict("the health server is already started", hint="call stop() first")
        try:
            server = _Server((host, port), _Handler, family=_family(host, port))
        except OSError as exc:
            raise ConfigError(
                f"the health and metrics server cannot listen on {host}:{port}: "
                f"{exc.strerror or exc}",
                hint="choose a free port for the process's metrics/health port (0 = any free "
                "one) or another host",
            ) from None
        server.health = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name=f"gantry-health-{self.port}", daemon=True
        )
        self._thread.start()
        _log.debug("health server listening", host=host, port=self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (a no-op when not started)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(5)


def _family(host: str, port: int) -> socket.AddressFamily:
    """IPv6 for an IPv6 host, else IPv4 (as ``prometheus_client.start_http_server`` picks)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    return socket.AddressFamily(infos[0][0]) if infos else socket.AF_INET


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: HealthServer

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        family: socket.AddressFamily,
    ) -> None:
        self.address_family = family
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    _ROUTES: ClassVar[dict[str, str]] = {
        "/metrics": "_metrics",
        "/healthz": "_healthz",
        "/readyz": "_readyz",
    }

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        route = self._ROUTES.get(urlsplit(self.path).path)
        if route is None:
            status, content_type, payload = HTTPStatus.NOT_FOUND, _TEXT, b"not found\n"
        else:
            status, content_type, payload = getattr(self, route)()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def _metrics(self) -> tuple[HTTPStatus, str, bytes]:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        registry = self.server.health.registry
        names = parse_qs(urlsplit(self.path).query).get("name[]")
        if names:
            return HTTPStatus.OK, content_type, encoder(registry.restricted_registry(names))
        return HTTPStatus.OK, content_type, encoder(registry)

    def _healthz(self) -> tuple[HTTPStatus, str, bytes]:
        return HTTPStatus.OK, _TEXT, b"ok\n"

    def _readyz(self) -> tuple[HTTPStatus, str, bytes]:
        ready, problems = self.server.health.readiness()
        if ready:
            return HTTPStatus.OK, _TEXT, b"ready\n"
        text = "not ready: " + "; ".join(problems) + "\n"
        return HTTPStatus.SERVICE_UNAVAILABLE, _TEXT, text.encode()

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log: say nothing."""


__all__ = ["Check", "HealthServer", "ReadyFlag", "connected"]
