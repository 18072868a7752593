"""The HTTP probes of a Gantry process (``gantry.core.health``) as a test asks them."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request


def http_get(port: int, path: str, *, host: str = "127.0.0.1", timeout_s: float = 5.0) -> str:
    """``"<status> <body>"`` of ``GET http://host:port/path``, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout_s) as reply:
            return f"{reply.status} {reply.read().decode()}"
    except urllib.error.HTTPError as exc:
        with exc:
            return f"{exc.code} {exc.read().decode()}"


async def readyz(port: int, *, host: str = "127.0.0.1") -> str:
    """``"<status> <body>"`` of the process's ``/readyz`` (``"200 ready\\n"`` when ready),
    asked from a thread so that a server in this event loop can answer."""
    return await asyncio.to_thread(http_get, port, "/readyz", host=host)


__all__ = ["http_get", "readyz"]
