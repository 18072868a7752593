"""The REST front end against the Open Inference Protocol: endpoints, status codes, error shape,
Triton's binary extension and generate extension (JSON and Server-Sent Events)."""

from __future__ import annotations

import gzip
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from gantry.serving.rest import create_app

from .fake_backend import FakeBackend

MAX_BODY = 64 * 1024


@pytest.fixture
async def client(fake_backend: FakeBackend) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(fake_backend, max_body_bytes=MAX_BODY)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serving") as http:
        yield http


def error_of(response: httpx.Response) -> str:
    """The message of an error answer, which must be exactly {"error": "..."}."""
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"], body
    assert isinstance(body["error"], str)
    assert "Traceback" not in body["error"]
    return body["error"]


# --- health and metadata ---------------------------------------------------------------------


async def test_server_metadata(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2")
    assert response.status_code == 200
    assert response.json() == {
        "name": "gantry-serving",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "generate"],
    }


async def test_health(client: httpx.AsyncClient, fake_backend: FakeBackend) -> None:
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).status_code == 200
    fake_backend.is_ready = False
    not_ready = await client.get("/v2/health/ready")
    assert not_ready.status_code == 400  # the spec: 4xx = false
    assert not_ready.json()["ready"] is False
    fake_backend.is_live = False
    assert (await client.get("/v2/health/live")).status_code == 400


async def test_model_metadata(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2/models/double")
    assert response.status_code == 200
    assert response.json() == {
        "name": "double",
        "versions": ["1", "2"],
        "platform": "pytorch",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1]},
        ],
    }
    assert (await client.get("/v2/models/double/versions/1")).status_code == 200
    missing = await client.get("/v2/models/nope")
    assert missing.status_code == 404
    assert error_of(missing).startswith("no model 'nope'")
    assert (await client.get("/v2/models/double/versions/9")).status_code == 404


async def test_model_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/models/double/ready")).status_code == 200
    assert (await client.get("/v2/models/double/versions/2/ready")).status_code == 200
    assert (await client.get("/v2/models/loading/ready")).status_code == 400
    assert (await client.get("/v2/models/nope/ready")).status_code == 404


# --- infer -----------------------------------------------------------------------------------

SPEC_REQUEST = {
    "id": "42",
    "inputs": [
        {
            "name": "INPUT0",
            "shape": [2, 4],
            "datatype": "FP32",
            "data": [[1, 2, 3, 4], [5, 6, 7, 8]],
        }
    ],
    "outputs": [{"name": "OUTPUT0"}],
}


async def test_infer_as_the_spec_shows(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/double/infer", json=SPEC_REQUEST)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": "double",
        "model_version": "2",
        "id": "42",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": [2, 4],
                "data": [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0],
            }
        ],
    }


async def test_infer_all_outputs_and_version(client: httpx.AsyncClient) -> None:
    request = {key: value for key, value in SPEC_REQUEST.items() if key != "outputs"}
    response = await client.post("/v2/models/double/versions/1/infer", json=request)
    assert response.status_code == 200
    body = response.json()
    assert body["model_version"] == "1"
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert body["outputs"][1]["data"] == [10.0, 26.0]


async def test_infer_binary_extension(client: httpx.AsyncClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [2, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1", "parameters": {"binary_data": False}},
            ],
        }
    )
    response = await client.post(
        "/v2/models/double/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:length])
    out0, out1 = doc["outputs"]
    assert out0["parameters"] == {"binary_data_size": 32}
    assert "data" not in out0
    assert out1["data"] == [6.0, 22.0]
    np.testing.assert_array_equal(
        np.frombuffer(response.content[length:], "<f4").reshape(2, 4), x * 2
    )


async def test_infer_binary_bytes_tensor(client: httpx.AsyncClient) -> None:
    words = [b"hello", b"", b"w\xc3\xb6rld"]
    blob = b"".join(struct.pack("<I", len(w)) + w for w in words)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    response = await client.post(
        "/v2/models/echo/infer",
        content=header + blob,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200
    length = int(response.headers["inference-header-content-length"])
    assert response.content[length:] == blob


async def test_infer_gzip_body(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v2/models/double/infer",
        content=gzip.compress(orjson.dumps(SPEC_REQUEST)),
        headers={"Content-Encoding": "gzip"},
    )
    assert response.status_code == 200
    unsupported = await client.post(
        "/v2/models/double/infer", content=b"{}", headers={"Content-Encoding": "br"}
    )
    assert unsupported.status_code == 400
    assert "Content-Encoding 'br' is not supported" in error_of(unsupported)
    broken = await client.post(
        "/v2/models/double/infer", content=b"not gzip", headers={"Content-Encoding": "gzip"}
    )
    assert broken.status_code == 400
    assert "not valid gzip data" in error_of(broken)


@pytest.mark.parametrize(
    ("model", "status", "message"),
    [
        ("broken", 500, "model 'broken' raised ValueError: boom"),
        ("loading", 503, "model 'loading' is still loading; retry in a minute"),
        ("crash", 500, "internal error: RuntimeError"),
        ("nope", 404, "no model 'nope'"),
    ],
)
async def test_infer_errors(
    client: httpx.AsyncClient, model: str, status: int, message: str
) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
    response = await client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == status
    assert error_of(response).startswith(message)
    assert "retry-after" not in response.headers


async def test_overloaded_says_when_to_retry(client: httpx.AsyncClient) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
    response = await client.post("/v2/models/busy/infer", json=body)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"  # 2.5 s, rounded up to whole seconds
    assert error_of(response) == "model 'busy' has a full queue"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "the request body is not valid JSON"),
        (b"[1, 2]", "the request body must be a JSON object with 'inputs', got a list"),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP8", "data": [1]}]}',
            "input 'INPUT0': unknown datatype 'FP8'; valid datatypes: BOOL, UINT8",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1]}]}',
            "input 'INPUT0': 'data' has 1 elements but shape [1, 4] holds 4",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT8", "data": [999]}]}',
            "element 0 (999) is out of range for INT8",
        ),
        (b"", "the request body is not valid JSON"),
    ],
)
async def test_infer_bad_requests(client: httpx.AsyncClient, content: bytes, message: str) -> None:
    response = await client.post("/v2/models/double/infer", content=content)
    assert response.status_code == 400
    assert message in error_of(response)


async def test_binary_header_length_refused(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v2/models/double/infer",
        content=b"{}",
        headers={"Inference-Header-Content-Length": "10"},
    )
    assert response.status_code == 400
    assert "Inference-Header-Content-Length is '10'" in error_of(response)


async def test_body_too_large(client: httpx.AsyncClient) -> None:
    big = b"x" * (MAX_BODY + 1)
    response = await client.post("/v2/models/double/infer", content=big)
    assert response.status_code == 413
    assert f"over {MAX_BODY} bytes" in error_of(response)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for _ in range(3):
            yield b"x" * (MAX_BODY // 2)

    streamed = await client.post("/v2/models/double/infer", content=chunks())
    assert streamed.status_code == 413
    bomb = await client.post(
        "/v2/models/double/infer",
        content=gzip.compress(b" " * (MAX_BODY * 4)),
        headers={"Content-Encoding": "gzip"},
    )
    assert bomb.status_code == 413
    assert "decompressed request body" in error_of(bomb)


async def test_unknown_paths_and_methods_use_the_error_shape(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v2/nothing/here")
    assert missing.status_code == 404
    assert "no endpoint /v2/nothing/here" in error_of(missing)
    wrong = await client.get("/v2/models/double/infer")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert error_of(wrong) == "GET is not allowed on /v2/models/double/infer; use POST"
    assert (await client.get("/docs")).status_code == 404
    assert (await client.get("/openapi.json")).status_code == 404


# --- caller ----------------------------------------------------------------------------------


async def test_caller_from_headers(client: httpx.AsyncClient, fake_backend: FakeBackend) -> None:
    response = await client.post(
        "/v2/models/double/infer",
        json=SPEC_REQUEST,
        headers={"Authorization": "Bearer tok-123", "X-Gantry-Route-Key": "user-7", "X-Trace": "t"},
    )
    assert response.status_code == 200
    caller = fake_backend.callers[-1]
    assert caller.token == "tok-123"
    assert caller.sticky_key == "user-7"
    assert caller.headers["x-trace"] == "t"
    assert "authorization" not in caller.headers

    await client.get("/v2/models/double")
    anonymous = fake_backend.callers[-1]
    assert anonymous.token is None
    assert anonymous.sticky_key is None


@pytest.mark.parametrize("authorization", ["Basic dXNlcg==", "Bearer", "Bearer a b", "tok"])
async def test_malformed_authorization(client: httpx.AsyncClient, authorization: str) -> None:
    response = await client.post(
        "/v2/models/double/infer", json=SPEC_REQUEST, headers={"Authorization": authorization}
    )
    assert response.status_code == 401
    assert "the Authorization header must be 'Bearer <token>'" in error_of(response)


# --- generate --------------------------------------------------------------------------------


async def test_generate(client: httpx.AsyncClient, fake_backend: FakeBackend) -> None:
    response = await client.post(
        "/v2/models/gpt/generate",
        json={
            "text_input": "the quick brown fox",
            "parameters": {"max_tokens": 3, "temperature": 0.5, "seed": 7},
        },
    )
    assert response.status_code == 200
    assert response.json() == {
        "model_name": "gpt",
        "model_version": "3",
        "text_output": "the quick brown ",
    }
    request = fake_backend.generated[-1]
    assert (request.max_tokens, request.temperature, request.seed) == (3, 0.5, 7)
    versioned = await client.post(
        "/v2/models/gpt/versions/3/generate", json={"text_input": "hi", "max_tokens": 1}
    )
    assert versioned.json()["text_output"] == "hi "
    assert fake_backend.generated[-1].version == "3"


@pytest.mark.parametrize(
    ("model", "body", "status", "message"),
    [
        ("double", {"text_input": "x"}, 400, "model 'double' is not generative"),
        ("nope", {"text_input": "x"}, 404, "no model 'nope'"),
        ("gpt", {}, 400, "the request needs 'text_input'"),
        ("gpt", [], 400, "the request body must be a JSON object"),
        ("gpt", {"text_input": "x", "parameters": 3}, 400, "'parameters' must be an object"),
        (
            "gpt",
            {"text_input": "x", "parameters": {"max_tokens": -1}},
            400,
            "parameter 'max_tokens' must be a positive integer",
        ),
        ("gpt-broken", {"text_input": "a b c"}, 500, "model 'gpt-broken' raised RuntimeError"),
    ],
)
async def test_generate_errors(
    client: httpx.AsyncClient, model: str, body: Any, status: int, message: str
) -> None:
    response = await client.post(f"/v2/models/{model}/generate", json=body)
    assert response.status_code == status
    assert error_of(response).startswith(message)


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The Server-Sent Events of a response, each `data: {json}` and a blank line."""
    text = response.text
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        out.append(orjson.loads(block.removeprefix("data: ")))
    return out


async def test_generate_stream(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v2/models/gpt/generate_stream",
        json={"text_input": "one two three", "parameters": {"max_tokens": 5}, "id": "s1"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events(response) == [
        {
            "model_name": "gpt",
            "model_version": "3",
            "text_output": f"{word} ",
            "index": i,
            "final": i == 2,
            "id": "s1",
        }
        for i, word in enumerate(["one", "two", "three"])
    ]


async def test_generate_stream_errors(client: httpx.AsyncClient) -> None:
    # before the first piece: a plain error answer with its status
    missing = await client.post("/v2/models/nope/generate_stream", json={"text_input": "x"})
    assert missing.status_code == 404
    assert error_of(missing).startswith("no model 'nope'")
    # after it: the stream ends with an error event
    broken = await client.post("/v2/models/gpt-broken/generate_stream", json={"text_input": "a b"})
    assert broken.status_code == 200
    first, last = events(broken)
    assert first["text_output"] == "a "
    assert last == {"error": "model 'gpt-broken' raised RuntimeError: CUDA error"}
