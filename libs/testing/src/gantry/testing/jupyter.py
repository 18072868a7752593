"""A Jupyter server spoken to as a notebook client would: its REST API and a kernel's
websocket, with a token (tests of dev sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect


async def close_websocket(ws: WebSocketClientConnection) -> None:
    """Close ``ws`` and wait for the closing handshake, so its socket is closed before the
    event loop is (or it leaks, and a later test fails on the ResourceWarning)."""
    ws.close()
    with contextlib.suppress(Exception):
        while await asyncio.wait_for(ws.read_message(), 5) is not None:
            pass


class JupyterClient:
    """One server at ``url`` (``http://host:port``), every request with ``token`` (none when
    it is empty: what an anonymous caller gets)."""

    def __init__(self, url: str, token: str) -> None:
        if not url.startswith("http://"):
            raise ValueError(f"{url!r} is not an http:// URL")
        self.url = url.rstrip("/")
        self.token = token

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """``(status, JSON body)`` of one REST API request (an HTTP error is a status)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 - the scheme is checked in __init__
            f"{self.url}{path}", data, method=method
        )
        if self.token:
            req.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as response:  # noqa: S310 - checked
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, None

    def ready(self, timeout_s: float = 5.0) -> None:
        """Wait until ``/api/status`` answers 200 (AssertionError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.request("GET", "/api/status")[0] == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{self.url} never answered"
            time.sleep(0.2)

    def execute(self, kernel_id: str, code: str, timeout_s: float = 60.0) -> str:
        """Run ``code`` in the kernel; the text of its result."""
        return asyncio.run(self.execute_async(kernel_id, code, timeout_s))

    async def execute_async(self, kernel_id: str, code: str, timeout_s: float = 60.0) -> str:
        """Run ``code`` over the kernel's websocket; the text of its ``execute_result``
        (AssertionError with the traceback when it raised, or when it gave no result)."""
        url = f"{self.url.replace('http://', 'ws://', 1)}/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"token {self.token}"})
        )
        msg_id = uuid.uuid4().hex
        ws.write_message(
            json.dumps(
                {
                    "header": {"msg_id": msg_id, "msg_type": "execute_request",
                               "username": "test", "session": uuid.uuid4().hex,
                               "version": "5.3", "date": ""},
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": False,
                                "user_expressions": {}, "allow_stdin": False},
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )  # fmt: skip
        result = None
        try:
            while True:
                raw = await asyncio.wait_for(ws.read_message(), timeout_s)
                assert isinstance(raw, str), "the kernel's channel closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "execute_result":
                    result = msg["content"]["data"]["text/plain"]
                if msg["msg_type"] == "error":
                    raise AssertionError("\n".join(msg["content"]["traceback"]))
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    assert result is not None, f"{code!r} gave no result"
                    return str(result)
        finally:
            await close_websocket(ws)


__all__ = ["JupyterClient", "close_websocket"]
