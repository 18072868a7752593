"""The official Triton clients against the front ends, over real sockets.

``tritonclient.http`` runs in this process against uvicorn; ``tritonclient.grpc`` runs in a child
process (:mod:`triton_grpc_probe`), because its protobuf messages clash with
``gantry.protos.inference`` in one process. Both servers run on one event loop in a background
thread, shared by the module's tests.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
import uvicorn
from tritonclient.utils import InferenceServerException

from gantry.serving.grpc_inference import InferenceServicer, add_to_server
from gantry.serving.rest import create_app

from .fake_backend import FakeBackend

PROBE = Path(__file__).with_name("triton_grpc_probe.py")


@dataclass
class Servers:
    """Where the servers listen, and the backend behind both."""

    http_port: int
    grpc_port: int
    backend: FakeBackend


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    backend = FakeBackend()
    started = threading.Event()
    ports: dict[str, Any] = {}

    async def serve() -> None:
        app = create_app(backend, max_body_bytes=1 << 20)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="off", ws="none", log_level="warning"
        )
        http = uvicorn.Server(config)
        grpc_server = grpc.aio.server()
        add_to_server(InferenceServicer(backend), grpc_server)
        ports["grpc"] = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        serving = asyncio.create_task(http.serve())
        while not http.started and not serving.done():
            await asyncio.sleep(0.01)
        ports["http"] = http.servers[0].sockets[0].getsockname()[1]
        stop = asyncio.Event()
        ports["stop"] = (asyncio.get_running_loop(), stop)
        started.set()
        await stop.wait()
        http.should_exit = True
        await serving
        await grpc_server.stop(None)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(20), "the servers did not start"
    try:
        yield Servers(ports["http"], ports["grpc"], backend)
    finally:
        loop, stop = ports["stop"]
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)


@pytest.fixture
def client(servers: Servers) -> Iterator[Any]:
    http = httpclient.InferenceServerClient(url=f"127.0.0.1:{servers.http_port}")
    try:
        yield http
    finally:
        http.close()


def test_http_health_and_metadata(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("double")
    assert client.is_model_ready("double", "1")
    assert not client.is_model_ready("loading")
    assert not client.is_model_ready("nope")
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "generate"]
    meta = client.get_model_metadata("double")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "404"
    assert err.value.message().startswith("no model 'nope'")


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer(client: Any, binary: bool) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary),
    ]
    result = client.infer("double", [inp], outputs=outputs, request_id="h-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x.sum(axis=1))
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        "double",
        "2",
        "h-1",
    )


def test_http_infer_all_outputs_binary_by_default(client: Any) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("double", [inp], model_version="1")  # binary_data_output: true
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_bytes_and_fp16(client: Any, binary: bool) -> None:
    words = np.array([[b"hello", b"w\xc3\xb6rld"]], dtype=object)
    half = np.array([0.5, -2.0, 65504.0], dtype=np.float16)
    text_in = httpclient.InferInput("text", [1, 2], "BYTES")
    text_in.set_data_from_numpy(words, binary_data=binary)
    half_in = httpclient.InferInput("half", [3], "FP16")
    half_in.set_data_from_numpy(half, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("text", binary_data=binary),
        httpclient.InferRequestedOutput("half", binary_data=binary),
    ]
    result = client.infer("echo", [text_in, half_in], outputs=outputs)
    text = result.as_numpy("text")
    assert text.shape == (1, 2)
    assert [w if isinstance(w, bytes) else w.encode() for w in text.reshape(-1)] == [
        b"hello",
        b"w\xc3\xb6rld",
    ]
    np.testing.assert_array_equal(result.as_numpy("half"), half)
    assert result.as_numpy("half").dtype == np.float16


@pytest.mark.parametrize(
    ("model", "status", "message"),
    [
        ("busy", "503", "model 'busy' has a full queue"),
        ("broken", "500", "model 'broken' raised ValueError: boom"),
        ("nope", "404", "no model 'nope'"),
    ],
)
def test_http_infer_errors(client: Any, model: str, status: str, message: str) -> None:
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, [inp])
    assert err.value.status() == status
    assert err.value.message().startswith(message)


def test_http_caller_headers(client: Any, servers: Servers) -> None:
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    client.infer(
        "double",
        [inp],
        headers={"Authorization": "Bearer t-1", "X-Gantry-Route-Key": "alice"},
    )
    caller = servers.backend.callers[-1]
    assert (caller.token, caller.sticky_key) == ("t-1", "alice")


def test_generate_stream_over_a_socket(servers: Servers) -> None:
    url = f"http://127.0.0.1:{servers.http_port}/v2/models/gpt/generate_stream"
    events = []
    with httpx.stream("POST", url, json={"text_input": "a b c"}, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events.extend(
            orjson.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        )
    assert [(e["text_output"], e["final"]) for e in events] == [
        ("a ", False),
        ("b ", False),
        ("c ", True),
    ]


def test_grpc_client(servers: Servers) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), f"127.0.0.1:{servers.grpc_port}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert report["live"] is True
    assert report["ready"] is True
    assert report["double_ready"] is True
    assert report["loading_ready"] is False
    assert report["server_metadata"]["name"] == "gantry-serving"
    assert report["metadata"]["name"] == "double"
    assert report["metadata"]["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}  # int64 as JSON strings
    ]
    assert report["infer"] == {
        "model_version": "1",
        "id": "g-1",
        "outputs": ["OUTPUT0"],
        "OUTPUT0": [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0, 12.0, 14.0]],
    }
    assert report["echo"] == {
        "text": ["hello", "", "w\u00f6rld"],
        "half": [0.5, -2.0, 65504.0],
        "half_dtype": "float16",
    }
    errors = report["errors"]
    assert errors["busy"]["status"] == "StatusCode.UNAVAILABLE"
    assert errors["busy"]["message"] == "model 'busy' has a full queue"
    assert errors["nope"]["status"] == "StatusCode.NOT_FOUND"
    assert errors["broken"]["status"] == "StatusCode.INTERNAL"
    assert report["stream"]["pieces"] == [
        {"text": "one ", "final": False, "id": "s-1"},
        {"text": "two ", "final": False, "id": "s-1"},
        {"text": "three ", "final": True, "id": "s-1"},
    ]
    assert report["stream"]["error"].startswith("no model 'nope'")
