"""``python -m gantry.training.session``, run as the node agent runs it: a real process with the
agent's environment (a job directory, an output directory, a local encrypted object store)
spoken to over HTTP and the kernel websocket. It admits only the token whose hash it was
given, runs code in a kernel, ends by itself when idle or at its lifetime, and on SIGTERM; its
files survive every end; a save it must refuse, or one that fails, keeps the previous one."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from gantry.core import InvalidInput
from gantry.storage import ObjectStore, StorageSettings, open_store
from gantry.testing.jupyter import JupyterClient, close_websocket
from gantry.training.outputs import read_metrics
from gantry.training.session import (
    FilesTooLarge,
    SessionOptions,
    data,
    files_key,
    parse_args,
    restore_files,
    save_files,
)

TOKEN = secrets.token_urlsafe(24)
TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
NAME = "ada-scratch"
READY_TIMEOUT_S = 40.0


class Session:
    """One session worker process, and the requests a client sends it."""

    def __init__(self, root: Path, *args: str, port: int | None = None) -> None:
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GANTRY_", "JUPYTER_", "JPY_"))
            and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
        }
        env = inherited | {
            "GANTRY_DATA_DIR": str(root / "data"),
            "GANTRY_JOB_ID": "job-session",
            "GANTRY_ATTEMPT": "1",
            "GANTRY_CHECKPOINT_DIR": str(root / "job"),
            "GANTRY_OUTPUT_DIR": str(root / "output"),
            "GANTRY_LOG_JSON": "false",
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": "1",
        }
        if port is not None:
            env["MASTER_PORT"] = str(port)
        self.output = root / "output"
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.port = 0
        self._log = (root / "session.log").open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gantry.training.session", "--name", NAME,
             "--token-sha256", TOKEN_SHA256, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_S):
            self.process.kill()
            raise AssertionError(f"no ready line; stdout: {self.lines}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if " ready on port " in line:
                self.port = int(line.split(" ready on port ")[1].split()[0])
                self._ready.set()

    def request(
        self, method: str, path: str, *, token: str | None = TOKEN, body: Any = None
    ) -> tuple[int, Any]:
        """``(status, JSON body)`` of one API request, with the token in the header."""
        return JupyterClient(f"http://127.0.0.1:{self.port}", token or "").request(
            method, path, body
        )

    def wait(self, timeout: float = 30.0) -> int:
        code = self.process.wait(timeout)
        self._close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._close()

    def _close(self) -> None:
        self._reader.join(10)  # it has taken the last lines
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Session] = []

    def run(*args: str, port: int | None = None) -> Session:
        session = Session(tmp_path, *args, port=port)
        started.append(session)
        return session

    yield run
    for session in started:
        session.kill()


def store_for(root: Path) -> ObjectStore:
    return open_store(StorageSettings(), data_dir=root / "data")


async def execute(port: int, kernel_id: str, code: str) -> str:
    """Run ``code`` in the kernel over its websocket; the text of its execute_result."""
    return await JupyterClient(f"http://127.0.0.1:{port}", TOKEN).execute_async(kernel_id, code)


def test_a_session_admits_its_token_runs_code_ends_idle_and_keeps_its_files(
    start: Any, tmp_path: Path
) -> None:
    session = start("--idle-timeout", "3")
    assert session.lines[-1] == f"session {NAME} ready on port {session.port} (jupyter)"
    for token in (None, "wrong", TOKEN_SHA256):  # the hash itself is no token
        assert session.request("GET", "/api/kernels", token=token)[0] == 403
    query = f"/api/contents?token={TOKEN[:-1]}"
    assert session.request("GET", query, token=None)[0] == 403
    assert session.request("GET", f"/api/contents?token={TOKEN}", token=None)[0] == 200
    assert session.request("GET", "/login", token=None)[0] != 200  # no password login page

    status, kernel = session.request("POST", "/api/kernels", body={"name": "python3"})
    assert status == 201
    code = "open('notes.txt', 'w').write('kept'); 6 * 7"
    assert asyncio.run(execute(session.port, kernel["id"], code)) == "42"

    assert session.wait() == 0  # idle for 3 s: culled, by itself
    metrics = read_metrics(session.output)
    assert metrics["session_culled"] == 1.0
    assert metrics["session_expired"] == 0.0
    assert metrics["session_files_saved"] == 1.0
    assert metrics["session_files_bytes"] == 4.0
    assert metrics["session_active_s"] >= 3.0
    assert session.lines[-1].startswith(f"session {NAME} ended after ")
    assert "idle for 3 s; files saved (4 bytes)" in session.lines[-1]
    log = "\n".join(session.lines) + (tmp_path / "session.log").read_text()
    assert TOKEN not in log

    # the next attempt (a requeue, or the session resumed later) finds the file
    again = start("--idle-timeout", "60")
    assert f"session {NAME}: files restored" in again.lines
    status, notes = again.request("GET", "/api/contents/notes.txt")
    assert (status, notes["content"]) == (200, "kept")
    put = {"type": "file", "format": "text", "content": "more"}
    assert again.request("PUT", "/api/contents/later.txt", body=put)[0] == 201

    again.process.send_signal(signal.SIGTERM)  # a preemption: save, then exit 0
    assert again.wait() == 0
    metrics = read_metrics(again.output)
    assert (metrics["session_culled"], metrics["session_expired"]) == (0.0, 0.0)
    assert metrics["session_files_saved"] == 1.0
    assert "stopped by a signal (preemption or cancel)" in again.lines[-1]
    with (
        store_for(tmp_path).open(files_key(NAME)) as reader,
        tarfile.open(fileobj=reader, mode="r|gz") as archive,
    ):
        assert sorted(m.name for m in archive) == ["later.txt", "notes.txt"]


def test_a_shell_session_has_terminals_but_no_kernels_and_ends_at_its_lifetime(
    start: Any, tmp_path: Path
) -> None:
    with socket.socket() as probe:  # the port the scheduler allocated for the attempt
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    session = start("--kind", "shell", "--lifetime", "4", "--idle-timeout", "60", port=port)
    assert session.port == port
    assert session.lines[-1].endswith("(shell)")
    assert session.request("GET", "/api/kernels")[0] == 404
    assert session.request("POST", "/api/terminals", token=None)[0] == 403
    status, terminal = session.request("POST", "/api/terminals")
    assert status == 200

    async def open_terminal(headers: dict[str, str]) -> None:
        url = f"ws://127.0.0.1:{port}/terminals/websocket/{terminal['name']}"
        ws = await websocket_connect(HTTPRequest(url, headers=headers))
        await close_websocket(ws)

    with pytest.raises(HTTPClientError, match="403"):
        asyncio.run(open_terminal({}))
    asyncio.run(open_terminal({"Authorization": f"token {TOKEN}"}))

    assert session.wait() == 0
    metrics = read_metrics(session.output)
    assert (metrics["session_expired"], metrics["session_culled"]) == (1.0, 0.0)
    assert 3.5 < metrics["session_active_s"] < 10
    assert "lifetime of 4 s reached" in session.lines[-1]


def test_too_many_bytes_are_refused_and_the_previous_save_is_kept(tmp_path: Path) -> None:
    store, work = store_for(tmp_path), tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("v1")
    assert save_files(store, NAME, work, max_bytes=100) == 2

    (work / "big.bin").write_bytes(b"x" * 200)
    with pytest.raises(FilesTooLarge) as refused:
        save_files(store, NAME, work, max_bytes=100)
    assert (refused.value.size, refused.value.limit) == (202, 100)
    assert "202 bytes, more than --max-files-bytes 100" in str(refused.value)

    assert restore_files(store, NAME, work)
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_a_failed_upload_keeps_the_previous_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, work = store_for(tmp_path), tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("v1")
    save_files(store, NAME, work, max_bytes=100)
    (work / "notes.txt").write_text("v2")

    def unreachable(name: str, pieces: Any) -> None:
        for _ in pieces:  # the upload dies half-way
            raise OSError("connection reset by the object store")

    monkeypatch.setattr(store.backend, "put_stream", unreachable)
    with pytest.raises(OSError, match="connection reset"):
        save_files(store, NAME, work, max_bytes=100)
    monkeypatch.undo()

    assert restore_files(store, NAME, work)
    assert (work / "notes.txt").read_text() == "v1"
    assert not restore_files(store, "someone-else", tmp_path / "fresh")
    assert list((tmp_path / "fresh").iterdir()) == []


def test_the_command_line_is_checked() -> None:
    options = parse_args(["--name", NAME, "--token-sha256", TOKEN_SHA256.upper()])
    assert options == SessionOptions(NAME, TOKEN_SHA256)
    assert (options.kind, options.max_files_bytes) == ("jupyter", 1 << 30)
    with pytest.raises(InvalidInput, match="64 hexadecimal digits"):
        parse_args(["--name", NAME, f"--token-sha256={TOKEN}"])
    with pytest.raises(InvalidInput, match="is not a name"):
        parse_args(["--name", "../etc", "--token-sha256", TOKEN_SHA256])
    with pytest.raises(InvalidInput, match="must be positive"):
        parse_args(["--name", NAME, "--token-sha256", TOKEN_SHA256, "--idle-timeout", "0"])


def test_data_in_a_notebook_is_the_session_jobs_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {
        "entrypoint": {"module": "gantry.training.session", "args": ["--name", NAME]},
        "data": [{"dataset": "churn", "version": "63bbc8a0fad4", "view": "deidentified"}],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "scratch", "job_id": "job-session", "spec": spec}))
    monkeypatch.setenv("GANTRY_JOB_SPEC", str(path))
    monkeypatch.setenv("GANTRY_JOB_ID", "job-session")

    ctx = data()

    assert ctx.env.job_id == "job-session"
    assert [(d.dataset, d.version, d.view) for d in ctx.data] == [
        ("churn", "63bbc8a0fad4", "deidentified")
    ]
    with pytest.raises(InvalidInput, match="does not read dataset 'sales'"):
        ctx.table("sales")
