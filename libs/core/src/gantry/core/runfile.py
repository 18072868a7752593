"""Run files: where a running service says it listens (``<data_dir>/run/<service>.json``).

The supervisor waits for a service's run file to know it is ready; the CLI reads it to find
the service's address. A service writes it (atomically) once serving and removes it when it
stops, so a stale address is never left behind after a clean shutdown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from gantry.core.errors import Unavailable


def run_file(data_dir: Path, service: str) -> Path:
    """The run file of ``service`` under ``data_dir``."""
    return data_dir / "run" / f"{service}.json"


def write_run_file(
    data_dir: Path,
    service: str,
    *,
    host: str = "127.0.0.1",
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Atomically record this process's pid, gRPC address and metrics URL (each when it has
    one) and ``extra`` addresses (e.g. a REST endpoint, ``http``); return the path."""
    path = run_file(data_dir, service)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    info: dict[str, object] = {"service": service, "pid": os.getpid()}
    if grpc_port is not None:
        info["grpc"] = f"{host}:{grpc_port}"
    if metrics_port is not None:
        info["metrics"] = f"http://{host}:{metrics_port}/metrics"
    tmp.write_text(json.dumps({**info, **(extra or {})}))
    os.replace(tmp, path)
    return path


def run_info(data_dir: Path, service: str, key: str) -> str | None:
    """One address a running ``service`` recorded (``grpc``, ``metrics``, ``http``...), or
    None without a usable file."""
    try:
        return str(json.loads(run_file(data_dir, service).read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def grpc_address(data_dir: Path, service: str) -> str | None:
    """The gRPC ``host:port`` a running ``service`` recorded, or None without a usable file."""
    return run_info(data_dir, service, "grpc")


def service_address(data_dir: Path, service: str, *, configured: str, setting: str) -> str:
    """The gRPC ``host:port`` of ``service``: ``configured`` when given, else the address a
    service running on this platform recorded; :class:`Unavailable` naming the environment
    variable ``setting`` when there is neither."""
    if configured:
        return configured
    found = grpc_address(data_dir, service)
    if found is None:
        raise Unavailable(
            f"no {service} address: {setting} is unset and {run_file(data_dir, service)} does "
            "not exist",
            hint=f"start the {service} service, or set {setting}",
        )
    return found


__all__ = ["grpc_address", "run_file", "run_info", "service_address", "write_run_file"]
