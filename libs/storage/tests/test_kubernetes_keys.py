"""KubernetesSecretKeys through the real ``kubernetes`` client against a small local stand-in for
the Secrets API, and MountedSecretKeys over a directory laid out like a mounted Secret."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gantry.core import ConfigError
from gantry.storage import (
    KeyManager,
    KeyRingChanged,
    KubernetesSecretKeys,
    MemoryBackend,
    MountedSecretKeys,
    ObjectStore,
    ReadOnlyKeySource,
)

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/?]+))?(?:\?.*)?$")


class SecretsApi(ThreadingHTTPServer):
    """Just enough of the Kubernetes API: GET, POST and PUT of v1 Secrets, with
    resourceVersion checks (409 on a stale PUT, 409 on a POST of an existing Secret)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.refuse_with: int | None = None
        self._version = 100
        self.lock = threading.Lock()

    def next_version(self) -> str:
        self._version += 1
        return str(self._version)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def data(self, namespace: str, name: str) -> dict[str, bytes]:
        secret = self.secrets[(namespace, name)]
        return {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}


class _Handler(BaseHTTPRequestHandler):
    server: SecretsApi

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _status(self, code: int, reason: str) -> None:
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": reason, "code": code})  # fmt: skip

    def _handle(self, method: str) -> None:
        server = self.server
        server.requests.append((method, self.path))
        match = _PATH.match(self.path)
        if match is None:
            return self._status(404, "NotFound")
        if server.refuse_with is not None:
            return self._status(server.refuse_with, "Forbidden")
        namespace, name = match.groups()
        body: dict[str, Any] = {}
        if method in ("POST", "PUT"):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            if method == "GET":
                if (namespace, name) not in server.secrets:
                    return self._status(404, "NotFound")
                return self._reply(200, server.secrets[(namespace, name)])
            key = (namespace, name or body["metadata"]["name"])
            if method == "POST":
                if key in server.secrets:
                    return self._status(409, "AlreadyExists")
            elif key not in server.secrets:
                return self._status(404, "NotFound")
            elif (
                body["metadata"].get("resourceVersion")
                != (server.secrets[key]["metadata"]["resourceVersion"])
            ):
                return self._status(409, "Conflict")
            body["metadata"]["resourceVersion"] = server.next_version()
            server.secrets[key] = body
            return self._reply(201 if method == "POST" else 200, body)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")


@pytest.fixture
def api() -> Iterator[SecretsApi]:
    server = SecretsApi()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def api_client(api: SecretsApi) -> Iterator[Any]:
    from kubernetes import client

    api_client = client.ApiClient(client.Configuration(host=api.url))
    try:
        yield api_client
    finally:
        api_client.close()


def test_the_ring_is_created_in_a_secret_and_rotated_there(
    api: SecretsApi, api_client: Any
) -> None:
    source = KubernetesSecretKeys("gantry", "storage-kek", api_client=api_client)
    assert source.load() is None
    keys = KeyManager(source)
    assert ("POST", "/api/v1/namespaces/gantry/secrets") in api.requests
    data = api.data("gantry", "storage-kek")
    assert set(data) == {"kek-v1", "active", "ring.json"}
    assert len(data["kek-v1"]) == 32 and data["active"] == b"1"
    ring = json.loads(data["ring.json"])
    assert [sorted(k) for k in ring["keys"]] == [["created_ms", "state", "version", "wraps"]]
    labels = api.secrets[("gantry", "storage-kek")]["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/managed-by": "gantry"}

    store = ObjectStore(MemoryBackend(), keys, chunk_size=65536)
    store.put("obj", b"secret payload")
    keys.rotate()
    assert set(api.data("gantry", "storage-kek")) == {"kek-v1", "kek-v2", "active", "ring.json"}
    assert store.rewrap() == 1
    keys.retire(1)
    data = api.data("gantry", "storage-kek")
    assert set(data) == {"kek-v2", "active", "ring.json"} and data["active"] == b"2"

    # a second process reading the same Secret sees the same ring
    other = KeyManager(KubernetesSecretKeys("gantry", "storage-kek", api_client=api_client))
    assert [(v.version, v.state) for v in other.versions()] == [(1, "retired"), (2, "active")]
    assert ObjectStore(store.backend, other).get("obj") == b"secret payload"


def test_a_stale_write_is_refused_by_resource_version(api: SecretsApi, api_client: Any) -> None:
    source = KubernetesSecretKeys("ns", "kek", api_client=api_client)
    KeyManager(source)
    state = source.load()
    assert state is not None and state.revision is not None
    source.save(state)
    with pytest.raises(KeyRingChanged, match="Kubernetes Secret ns/kek"):
        source.save(state)
    # a KeyManager with a stale view retries on a fresh load instead of losing a change
    a = KeyManager(source)
    b = KeyManager(KubernetesSecretKeys("ns", "kek", api_client=api_client))
    a.rotate()
    b.rotate()
    assert [v.state for v in KeyManager(source).versions()] == ["decrypt-only"] * 2 + ["active"]


def test_refused_access_says_which_permissions_are_needed(api: SecretsApi, api_client: Any) -> None:
    api.refuse_with = 403
    with pytest.raises(ConfigError) as err:
        KeyManager(KubernetesSecretKeys("ns", "kek", api_client=api_client))
    assert "HTTP 403" in str(err.value)
    assert "get, create and update" in str(err.value)


def test_a_mounted_secret_is_read_only_and_reads_the_same_layout(
    api: SecretsApi, api_client: Any, tmp_path: Path
) -> None:
    writer = KeyManager(KubernetesSecretKeys("ns", "kek", api_client=api_client))
    writer.rotate()
    store = ObjectStore(MemoryBackend(), writer, chunk_size=65536)
    store.put("obj", b"payload")
    mount = tmp_path / "mount"
    data_dir = mount / "..2026_01_01"  # kubelet's layout: files are links into a hidden dir
    data_dir.mkdir(parents=True)
    for name, content in api.data("ns", "kek").items():
        (data_dir / name).write_bytes(content)
        (mount / name).symlink_to(data_dir / name)
    source = KubernetesSecretKeys.from_mounted(mount)
    assert isinstance(source, MountedSecretKeys) and source.read_only
    reader = KeyManager(source)
    assert reader.active_version == 2
    assert ObjectStore(store.backend, reader).get("obj") == b"payload"
    with pytest.raises(ReadOnlyKeySource, match="read-only"):
        reader.rotate()
    with pytest.raises(ReadOnlyKeySource):
        reader.retire(1)
    assert ObjectStore(MemoryBackend(), reader).put("new", b"x").kek_version == 2


def test_a_hand_made_mounted_secret_accepts_hex_and_base64_keys(tmp_path: Path) -> None:
    (tmp_path / "kek-v1").write_text(bytes(range(32)).hex() + "\n")
    (tmp_path / "kek-v2").write_text(base64.b64encode(bytes(range(1, 33))).decode())
    (tmp_path / "active").write_text("1\n")
    keys = KeyManager(MountedSecretKeys(tmp_path))
    assert [(v.version, v.state) for v in keys.versions()] == [
        (1, "active"),
        (2, "decrypt-only"),
    ]
    version, wrapped = keys.wrap(b"k" * 32, b"aad")
    assert version == 1
    # an independent AES-GCM unwrap with the hex key proves which key was used
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert AESGCM(bytes(range(32))).decrypt(wrapped[:12], wrapped[12:], b"aad") == b"k" * 32
    (tmp_path / "kek-v3").write_text("not a key")
    with pytest.raises(ConfigError, match="kek-v3 is not a 32-byte key"):
        KeyManager(MountedSecretKeys(tmp_path))


def test_a_missing_mount_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no key ring is mounted"):
        KeyManager(MountedSecretKeys(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReadOnlyKeySource, match="create a key ring"):
        KeyManager(MountedSecretKeys(tmp_path / "empty"))
