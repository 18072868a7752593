"""The gRPC front end (``inference.GRPCInferenceService``) on a real grpc.aio server: typed and raw
contents, status codes, caller metadata, and Triton's ModelStreamInfer with a generative model."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from gantry.protos.inference import grpc_service_pb2 as pb
from gantry.protos.inference import grpc_service_pb2_grpc as pb_grpc
from gantry.serving.grpc_inference import InferenceServicer, add_to_server
from gantry.serving.tensors import deserialize_bytes, grpc_parameters

from .fake_backend import FakeBackend


@pytest.fixture
async def stub(fake_backend: FakeBackend) -> AsyncIterator[Any]:
    server = grpc.aio.server()
    add_to_server(InferenceServicer(fake_backend), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.GRPCInferenceServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


def double_request(model: str = "double", *, raw: bool = False) -> pb.ModelInferRequest:
    x = np.arange(8, dtype=np.float32)
    msg = pb.ModelInferRequest(model_name=model, id="r1")
    tensor = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 4])
    if raw:
        msg.raw_input_contents.append(x.astype("<f4").tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.tolist())
    return msg


def output(response: pb.ModelInferResponse, name: str) -> np.ndarray:
    for i, out in enumerate(response.outputs):
        if out.name == name:
            raw = response.raw_output_contents[i]
            if out.datatype == "BYTES":
                return deserialize_bytes(raw, int(np.prod(out.shape))).reshape(tuple(out.shape))
            return np.frombuffer(raw, "<f4").reshape(tuple(out.shape))
    raise AssertionError(f"no output {name}")


async def test_health_and_server_metadata(stub: Any, fake_backend: FakeBackend) -> None:
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    fake_backend.is_ready = False
    assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready
    meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert (meta.name, meta.version) == ("gantry-serving", "0.1.0")
    assert list(meta.extensions) == ["binary_tensor_data", "generate"]


async def test_model_ready_and_metadata(stub: Any) -> None:
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="double"))).ready
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="double", version="1"))).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="loading"))).ready
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelReady(pb.ModelReadyRequest(name="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="double"))
    assert (meta.name, list(meta.versions), meta.platform) == ("double", ["1", "2"], "pytorch")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "FP32", [-1, 4])
    ]
    assert [t.name for t in meta.outputs] == ["OUTPUT0", "OUTPUT1"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelMetadata(pb.ModelMetadataRequest(name="double", version="7"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "model 'double' has no version '7'" in (err.value.details() or "")


@pytest.mark.parametrize("raw", [False, True])
async def test_model_infer(stub: Any, raw: bool) -> None:
    response = await stub.ModelInfer(double_request(raw=raw))
    assert (response.model_name, response.model_version, response.id) == ("double", "2", "r1")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2
    np.testing.assert_array_equal(
        output(response, "OUTPUT0"), np.arange(8, dtype=np.float32).reshape(2, 4) * 2
    )
    np.testing.assert_array_equal(output(response, "OUTPUT1"), [6.0, 22.0])


async def test_model_infer_requested_output_and_version(stub: Any) -> None:
    request = double_request(raw=True)
    request.model_version = "1"
    request.outputs.add(name="OUTPUT1")
    response = await stub.ModelInfer(request)
    assert response.model_version == "1"
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(output(response, "OUTPUT1"), [6.0, 22.0])


async def test_model_infer_every_datatype_raw(stub: Any) -> None:
    request = pb.ModelInferRequest(model_name="echo")
    datatypes = {
        "BOOL": np.array([True, False], dtype="?"),
        "UINT8": np.array([1, 255], dtype="u1"),
        "UINT64": np.array([1, 2**64 - 1], dtype="<u8"),
        "INT16": np.array([-3, 3], dtype="<i2"),
        "INT64": np.array([-(2**63), 5], dtype="<i8"),
        "FP16": np.array([0.5, -2], dtype="<f2"),
        "FP64": np.array([0.1, 1e300], dtype="<f8"),
    }
    for name, data in datatypes.items():
        request.inputs.add(name=name, datatype=name, shape=[2])
        request.raw_input_contents.append(data.tobytes())
    response = await stub.ModelInfer(request)
    assert [o.datatype for o in response.outputs] == list(datatypes)
    assert list(response.raw_output_contents) == [d.tobytes() for d in datatypes.values()]


@pytest.mark.parametrize(
    ("model", "code", "message"),
    [
        ("broken", grpc.StatusCode.INTERNAL, "model 'broken' raised ValueError: boom"),
        ("loading", grpc.StatusCode.UNAVAILABLE, "model 'loading' is still loading"),
        ("crash", grpc.StatusCode.INTERNAL, "internal error: RuntimeError"),
        ("nope", grpc.StatusCode.NOT_FOUND, "no model 'nope'"),
    ],
)
async def test_model_infer_errors(
    stub: Any, model: str, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(double_request(model))
    assert err.value.code() == code
    assert (err.value.details() or "").startswith(message)


async def test_overloaded_gives_retry_after(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(double_request("busy"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert err.value.details() == "model 'busy' has a full queue"
    assert ("retry-after", "3") in tuple(err.value.trailing_metadata() or ())


async def test_bad_requests_are_invalid_argument(stub: Any) -> None:
    mixed = double_request(raw=False)
    mixed.raw_input_contents.append(b"\0" * 32)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(mixed)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no input may have contents" in (err.value.details() or "")

    fp16 = pb.ModelInferRequest(model_name="echo")
    fp16.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(fp16)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "FP16 has no typed contents field; send it in raw_input_contents" in (
        err.value.details() or ""
    )


async def test_caller_from_metadata(stub: Any, fake_backend: FakeBackend) -> None:
    await stub.ModelInfer(
        double_request(),
        metadata=(("authorization", "Bearer tok-9"), ("x-gantry-route-key", "k1")),
    )
    caller = fake_backend.callers[-1]
    assert (caller.token, caller.sticky_key) == ("tok-9", "k1")
    assert "authorization" not in caller.headers
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(double_request(), metadata=(("authorization", "Basic abc"),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelReady(
            pb.ModelReadyRequest(name="double"), metadata=(("authorization", "Bearer"),)
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


# --- ModelStreamInfer ------------------------------------------------------------------------


def generate_request(
    prompt: str, *, model: str = "gpt", raw: bool = True, **parameters: Any
) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model, id="g1")
    tensor = msg.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    if raw:
        data = prompt.encode()
        msg.raw_input_contents.append(struct.pack("<I", len(data)) + data)
    else:
        tensor.contents.bytes_contents.append(prompt.encode())
    for key, value in parameters.items():
        if isinstance(value, float):
            msg.parameters[key].double_param = value
        else:
            msg.parameters[key].int64_param = value
    return msg


def text_and_final(reply: pb.ModelStreamInferResponse) -> tuple[str, bool]:
    assert reply.error_message == ""
    response = reply.infer_response
    params = grpc_parameters(response.parameters)
    text = output(response, "text_output").reshape(-1)[0].decode()
    return text, bool(params["triton_final_response"])


async def test_stream_generate(stub: Any, fake_backend: FakeBackend) -> None:
    call = stub.ModelStreamInfer()
    await call.write(generate_request("a b c d", max_tokens=3, temperature=0.25, seed=11))
    replies = [await call.read() for _ in range(3)]
    assert [text_and_final(r) for r in replies] == [("a ", False), ("b ", False), ("c ", True)]
    first = replies[0].infer_response
    assert (first.model_name, first.model_version, first.id) == ("gpt", "3", "g1")
    assert [(o.name, o.datatype, list(o.shape)) for o in first.outputs] == [
        ("text_output", "BYTES", [1])
    ]
    request = fake_backend.generated[-1]
    assert (request.text_input, request.max_tokens, request.temperature, request.seed) == (
        "a b c d",
        3,
        0.25,
        11,
    )

    # on the same stream: typed contents, then a plain inference
    await call.write(generate_request("x", raw=False))
    assert text_and_final(await call.read()) == ("x ", True)
    await call.write(double_request())
    plain = await call.read()
    assert plain.error_message == ""
    assert [o.name for o in plain.infer_response.outputs] == ["OUTPUT0", "OUTPUT1"]
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_stream_errors_keep_the_stream_open(stub: Any) -> None:
    call = stub.ModelStreamInfer()
    await call.write(double_request("nope"))
    assert (await call.read()).error_message.startswith("no model 'nope'")
    await call.write(double_request("crash"))
    assert (await call.read()).error_message == "internal error: RuntimeError"
    await call.write(generate_request("a b c", model="gpt-broken"))
    assert text_and_final(await call.read()) == ("a ", False)
    assert (await call.read()).error_message == "model 'gpt-broken' raised RuntimeError: CUDA error"
    await call.write(generate_request("x", max_tokens=0))
    assert "parameter 'max_tokens' must be a positive integer" in (await call.read()).error_message
    bad = pb.ModelInferRequest(model_name="gpt")
    bad.inputs.add(name="text_input", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    await call.write(bad)
    assert "input 'text_input' must be BYTES with one element" in (await call.read()).error_message
    await call.write(generate_request("still here"))
    assert text_and_final(await call.read()) == ("still ", False)
    assert text_and_final(await call.read()) == ("here ", True)
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK


async def test_stream_unauthenticated(stub: Any) -> None:
    call = stub.ModelStreamInfer(metadata=(("authorization", "nope"),))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
