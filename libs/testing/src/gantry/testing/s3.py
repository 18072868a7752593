"""S3 endpoints for tests: moto's S3 server on a free port, or MinIO in Docker.

The moto server runs as a subprocess (not a thread), so it holds its own memory and the
process under test measures only its own; readiness is read from the server's own log line.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_READY = re.compile(rb"Running on http://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class S3Endpoint:
    """How to reach a test S3 server: ``endpoint`` is ``host:port``, plain HTTP by default."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    secure: bool = False

    @property
    def url(self) -> str:
        """``http://host:port`` (or https)."""
        return ("https://" if self.secure else "http://") + self.endpoint


@contextmanager
def moto_s3_server(*, timeout_s: float = 30.0) -> Iterator[S3Endpoint]:
    """Start moto's S3 server on a free port, yield its endpoint, stop it afterwards.

    moto accepts any credentials; buckets are in memory and vanish with the server.
    """
    with tempfile.TemporaryDirectory(prefix="gantry-moto-") as tmp:
        log_path = Path(tmp) / "moto.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            port = _wait_for_port(proc, log_path, timeout_s)
            yield S3Endpoint(f"127.0.0.1:{port}", "testing", "testing")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for_port(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = _READY.search(log_path.read_bytes())
        if match:
            port = int(match.group(1))
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return port
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    output = log_path.read_bytes().decode(errors="replace")[-2000:]
    raise RuntimeError(f"moto S3 server did not start within {timeout_s}s; its output:\n{output}")


def docker_unreachable_reason() -> str | None:
    """Why no Docker engine can be used (for a skip message), or ``None`` when one answers.

    Checks ``DOCKER_HOST`` (default ``unix:///var/run/docker.sock``) with a raw ``/_ping``,
    so a missing engine costs no timeouts and leaves no open sockets behind.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    hint = "start a Docker engine or point DOCKER_HOST at one"
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(3)
                sock.connect(host[len("unix://") :])
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                status = sock.recv(64).split(b"\r\n", 1)[0]
            if b" 200" not in status:
                return f"the Docker engine at {host} answered /_ping with {status!r}"
        elif host.startswith(("tcp://", "http://", "https://")):
            address, _, port = host.split("://", 1)[1].rstrip("/").rpartition(":")
            with socket.create_connection((address, int(port)), timeout=3):
                pass
    except (OSError, ValueError) as exc:
        return f"no Docker engine reachable at {host} ({exc}); {hint}"
    try:
        import testcontainers.community.minio  # noqa: F401
    except ImportError:
        return "testcontainers is not installed (pip install 'testcontainers[minio]')"
    return None


@contextmanager
def minio_server() -> Iterator[S3Endpoint]:
    """Start MinIO in a container through testcontainers and yield its endpoint.

    Needs a Docker engine; call :func:`docker_unreachable_reason` first to skip cleanly.
    """
    from testcontainers.community.minio import MinioContainer

    with MinioContainer() as container:
        config = container.get_config()
        yield S3Endpoint(config["endpoint"], config["access_key"], config["secret_key"])


__all__ = ["S3Endpoint", "docker_unreachable_reason", "minio_server", "moto_s3_server"]
