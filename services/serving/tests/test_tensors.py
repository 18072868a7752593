"""The tensor codec: REST JSON, Triton's binary extension and gRPC, both ways, and every refusal."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from gantry.protos.inference import grpc_service_pb2 as pb
from gantry.serving.errors import BadRequest
from gantry.serving.protocol import (
    DATATYPES,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from gantry.serving.tensors import (
    decode_generate_request,
    decode_grpc_request,
    decode_rest_request,
    deserialize_bytes,
    encode_grpc_response,
    encode_rest_response,
    grpc_parameters,
    serialize_bytes,
    split_rest_body,
)

#: One sample tensor (2 x 3) per datatype, values at the edges of each range.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [1, -1, 2]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1], [1, -1, 2]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [1, -1, 2]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [1, -1, 2]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0], [1, 2, 3]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [1, 2, 3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e308], [1, 2, 3]], dtype=np.float64),
    "BYTES": np.array([[b"a", b"", "\u00e9t\u00e9".encode()], [b"x", b"yy", b"zzz"]], dtype=object),
}


def json_data(data: np.ndarray) -> list[Any]:
    """A tensor's data as JSON would carry it (BYTES as strings)."""
    if data.dtype == object:
        return [item.decode() for item in data.reshape(-1)]
    return data.reshape(-1).tolist()


def raw(data: np.ndarray, datatype: str) -> bytes:
    """Raw little-endian bytes of a tensor, as tritonclient sends them."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in data.reshape(-1))
    return data.astype(DATATYPES[datatype].newbyteorder("<")).tobytes()


def rest(doc: Any, binary: bytes = b"") -> InferRequest:
    return decode_rest_request(doc, model="m", version="", binary=binary)


def one_input(**fields: Any) -> dict[str, Any]:
    tensor = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}
    tensor.update(fields)
    return {"inputs": [tensor]}


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert a.tolist() == b.tolist()


def echo(request: InferRequest) -> InferResponse:
    return InferResponse(model="m", version="1", id=request.id, outputs=request.inputs)


# --- REST, JSON ------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"] + ["FP16"])
def test_rest_json_round_trip_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    doc = {
        "id": "req-1",
        "inputs": [{"name": "x", "shape": [2, 3], "datatype": datatype, "data": json_data(sample)}],
    }
    request = rest(orjson.loads(orjson.dumps(doc)))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    assert_same(tensor.data, sample.astype(DATATYPES[datatype]))
    assert tensor.data.flags.writeable

    body, header_length = encode_rest_response(echo(request), request)
    assert header_length is None
    answer = orjson.loads(body)
    assert answer["model_name"] == "m"
    assert answer["model_version"] == "1"
    assert answer["id"] == "req-1"
    (out,) = answer["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("x", datatype, [2, 3])
    if datatype in ("FP16", "FP32"):  # printed at their own precision
        np.testing.assert_array_equal(np.array(out["data"], dtype=sample.dtype), sample.ravel())
    else:
        assert out["data"] == json_data(sample)


def test_rest_nested_data_is_row_major() -> None:
    nested = rest(one_input(shape=[2, 2], data=[[1, 2], [3, 4]]))
    flat = rest(one_input(shape=[2, 2], data=[1, 2, 3, 4]))
    assert_same(nested.inputs[0].data, flat.inputs[0].data)
    assert nested.inputs[0].data.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    deep = rest(one_input(shape=[2, 1, 2], data=[[[1, 2]], [[3, 4]]]))
    assert deep.inputs[0].data.reshape(-1).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_rest_spec_example() -> None:
    """The Open Inference Protocol's own inference request example."""
    doc = {
        "id": "42",
        "inputs": [
            {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
            {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [True, False, True]},
        ],
        "outputs": [{"name": "output0"}],
    }
    request = rest(doc)
    assert request.id == "42"
    assert [t.name for t in request.inputs] == ["input0", "input1"]
    assert request.outputs == (RequestedOutput("output0"),)
    assert request.inputs[0].data.dtype == np.uint32


def test_rest_empty_tensor_and_parameters() -> None:
    request = rest(
        {
            "parameters": {"priority": 1, "tag": "a", "ratio": 0.5, "flag": True},
            "inputs": [
                {
                    "name": "x",
                    "shape": [0, 3],
                    "datatype": "INT32",
                    "data": [],
                    "parameters": {"p": "q"},
                }
            ],
        }
    )
    assert request.parameters == {"priority": 1, "tag": "a", "ratio": 0.5, "flag": True}
    (tensor,) = request.inputs
    assert tensor.data.shape == (0, 3)
    assert tensor.data.dtype == np.int32
    assert tensor.parameters == {"p": "q"}


def test_rest_outputs_select_and_order() -> None:
    request = rest(
        {
            "inputs": [
                {"name": "a", "shape": [1], "datatype": "INT32", "data": [1]},
                {"name": "b", "shape": [1], "datatype": "INT32", "data": [2]},
            ],
            "outputs": [{"name": "b", "parameters": {"x": 1}}],
        }
    )
    assert request.outputs == (RequestedOutput("b", False, {"x": 1}),)
    answer = orjson.loads(encode_rest_response(echo(request), request)[0])
    assert [o["name"] for o in answer["outputs"]] == ["b"]

    missing = InferRequest(model="m", outputs=(RequestedOutput("nope"),))
    with pytest.raises(BadRequest, match=r"no output 'nope'; its outputs: a, b"):
        encode_rest_response(echo(request), missing)


def test_rest_output_parameters_and_response_parameters() -> None:
    response = InferResponse(
        model="m",
        version="2",
        outputs=(Tensor("y", "INT8", (1,), np.array([3], dtype=np.int8), {"unit": "cm"}),),
        parameters={"took_ms": 3},
    )
    answer = orjson.loads(encode_rest_response(response, InferRequest(model="m"))[0])
    assert "id" not in answer
    assert answer["parameters"] == {"took_ms": 3}
    assert answer["outputs"] == [
        {"name": "y", "datatype": "INT8", "shape": [1], "data": [3], "parameters": {"unit": "cm"}}
    ]


def test_rest_non_utf8_bytes_output_needs_binary() -> None:
    response = InferResponse(
        model="m", version="1", outputs=(Tensor("y", "BYTES", (1,), np.array([b"\xff"], object)),)
    )
    with pytest.raises(BadRequest, match=r"not UTF-8.*\"binary_data\": true"):
        encode_rest_response(response, InferRequest(model="m"))
    binary = InferRequest(model="m", outputs=(RequestedOutput("y", binary=True),))
    body, length = encode_rest_response(response, binary)
    assert length is not None
    assert body[length:] == b"\x01\x00\x00\x00\xff"


# --- REST, binary extension ------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_rest_binary_round_trip_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    data = raw(sample, datatype)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 3],
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(data)},
                },
                {"name": "j", "shape": [1], "datatype": "INT32", "data": [5]},
            ],
            "outputs": [
                {"name": "x", "parameters": {"binary_data": True}},
                {"name": "j", "parameters": {"binary_data": False}},
            ],
        }
    )
    doc, binary = split_rest_body(header + data, str(len(header)))
    request = rest(doc, binary)
    x, j = request.inputs
    assert_same(x.data, sample.astype(DATATYPES[datatype]))
    assert x.parameters == {}  # binary_data_size is transport, not a model parameter
    assert x.data.flags.writeable
    assert j.data.tolist() == [5]
    assert request.outputs == (RequestedOutput("x", True), RequestedOutput("j", False))

    body, length = encode_rest_response(echo(request), request)
    assert length is not None
    answer = orjson.loads(body[:length])
    out_x, out_j = answer["outputs"]
    assert out_x["parameters"] == {"binary_data_size": len(data)}
    assert "data" not in out_x
    assert out_j["data"] == [5]
    assert body[length:] == data


def test_rest_binary_data_output_for_all_outputs() -> None:
    doc = one_input(parameters=None)
    doc["parameters"] = {"binary_data_output": True}
    request = rest(doc)
    body, length = encode_rest_response(echo(request), request)
    assert length is not None
    out = orjson.loads(body[:length])["outputs"][0]
    assert out["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(body[length:], "<f4").tolist() == [1.0, 2.0]
    # an output's own binary_data wins over binary_data_output
    doc["outputs"] = [{"name": "x", "parameters": {"binary_data": False}}]
    request = rest(doc)
    body, length = encode_rest_response(echo(request), request)
    assert length is None
    assert orjson.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


def test_rest_zero_size_binary_input() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [0],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 0},
                }
            ]
        }
    )
    doc, binary = split_rest_body(header, str(len(header)))
    assert rest(doc, binary).inputs[0].data.shape == (0,)


def binary_doc(datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "x",
                "shape": shape,
                "datatype": datatype,
                "parameters": {"binary_data_size": size},
            }
        ]
    }


@pytest.mark.parametrize(
    ("doc", "binary", "message"),
    [
        (
            binary_doc("FP32", [2], 8),
            b"\0" * 4,
            "input 'x': binary_data_size is 8 but only 4 bytes of binary data remain",
        ),
        (
            binary_doc("FP32", [2], 4),
            b"\0" * 4,
            "input 'x': 4 bytes of data, but shape [2] of FP32 needs 8 (2 elements of 4 bytes)",
        ),
        (
            binary_doc("FP32", [1], 4),
            b"\0" * 6,
            "the body has 6 bytes of binary data after the JSON, but the inputs' "
            "binary_data_size add up to 4",
        ),
        (
            binary_doc("INT8", [1], 0),
            b"",
            "input 'x': 0 bytes of data, but shape [1] of INT8 needs 1",
        ),
        (binary_doc("FP32", [1], -1), b"", "binary_data_size must be a non-negative integer"),
        (binary_doc("FP32", [1], 1.5), b"", "binary_data_size must be a non-negative integer"),
        (binary_doc("BOOL", [2], 2), b"\x01\x02", "BOOL data must be bytes 0 or 1"),
        (
            binary_doc("BYTES", [2], 6),
            b"\x01\0\0\0a\x09",
            "BYTES data ends at element 1 of 2",
        ),
        (
            binary_doc("BYTES", [1], 6),
            b"\x05\0\0\0ab",
            "BYTES element 0 says it is 5 bytes long but only 2 bytes remain",
        ),
        (
            binary_doc("BYTES", [1], 7),
            b"\x01\0\0\0abc",
            "2 bytes left over after the 1 BYTES elements the shape holds",
        ),
    ],
)
def test_rest_binary_refusals(doc: dict[str, Any], binary: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        rest(doc, binary)


def test_rest_binary_and_data_together() -> None:
    doc = binary_doc("FP32", [1], 4)
    doc["inputs"][0]["data"] = [1.0]
    with pytest.raises(BadRequest, match="has both 'data' and binary_data_size"):
        rest(doc, b"\0" * 4)


@pytest.mark.parametrize(
    ("header_length", "message"),
    [
        ("abc", "Inference-Header-Content-Length is 'abc'"),
        ("-1", "Inference-Header-Content-Length is '-1'"),
        ("99", "it must be the length in bytes of the JSON part of the body (0 to 2)"),
    ],
)
def test_split_rest_body_bad_header_length(header_length: str, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        split_rest_body(b"{}", header_length)


def test_split_rest_body_bad_json() -> None:
    with pytest.raises(BadRequest, match="the request body is not valid JSON"):
        split_rest_body(b"{nope", None)
    with pytest.raises(BadRequest, match="not valid JSON"):
        split_rest_body(b'{"a": 1}xyz', "5")


# --- REST, refusals --------------------------------------------------------------------------

VALID = "valid datatypes: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "the request body must be a JSON object with 'inputs', got a list"),
        ({}, "the request needs 'inputs': a list of tensors"),
        ({"inputs": {}}, "the request needs 'inputs': a list of tensors, each"),
        ({"inputs": [1]}, "inputs[0] must be an object, got a number"),
        ({"inputs": [{"shape": [1]}]}, "inputs[0] needs a 'name' (a non-empty string)"),
        ({"id": 5, "inputs": []}, "'id' must be a string, got a number"),
        ({"parameters": [], "inputs": []}, "request: 'parameters' must be an object, got a list"),
        (
            {"parameters": {"a": [1]}, "inputs": []},
            "request: parameter 'a' is a list; parameter values must be booleans, numbers or "
            "strings",
        ),
        (
            {"parameters": {"binary_data_output": 1}, "inputs": []},
            "request parameter 'binary_data_output' must be true or false",
        ),
        (one_input(datatype="FP8"), f"input 'x': unknown datatype 'FP8'; {VALID}, FP32"),
        (one_input(datatype="BF16"), "unknown datatype 'BF16'"),
        (one_input(datatype=3), "input 'x': 'datatype' must be a string, one of BOOL"),
        (
            one_input(data=[1.0, 2.0, 3.0]),
            "input 'x': 'data' has 3 elements but shape [2] holds 2; send exactly one value",
        ),
        (
            one_input(shape=[2, 2], data=[[1, 2], [3]]),
            "'data' has 3 elements but shape [2, 2] holds 4",
        ),
        (one_input(shape=[-1]), "input 'x': shape [-1] has a negative dimension"),
        (one_input(shape=[1.5]), "input 'x': shape [1.5] has 1.5; dimensions must be integers"),
        (one_input(shape=[True]), "dimensions must be integers"),
        (one_input(shape="2"), "input 'x': 'shape' must be a list of non-negative integers"),
        (
            one_input(shape=[1 << 20, 1 << 20, 1 << 20]),
            "holds more than 4294967296 elements; split the request",
        ),
        (one_input(shape=[1] * 40), "shape has 40 dimensions; at most 32 allowed"),
        (one_input(data=5), "input 'x': 'data' must be a list (flat or nested, row-major)"),
        (
            one_input(data=[1.0, "a"]),
            "input 'x': element 1 is a string ('a'); FP32 data must be numbers",
        ),
        (one_input(data=[1.0, None]), "element 1 is null (None); FP32 data must be numbers"),
        (one_input(data=[True, 1.0]), "element 0 is a boolean (True); FP32 data must be"),
        (one_input(data=[1.0, 1e39]), "element 1 (1e+39) is out of range for FP32"),
        (
            one_input(datatype="FP16", data=[1.0, 70000]),
            "element 1 (70000) is out of range for FP16 [-65504.0, 65504.0]",
        ),
        (one_input(datatype="FP64", data=[1, 10**400]), "element 1 ("),
        (
            one_input(datatype="INT8", data=[1, 128]),
            "input 'x': element 1 (128) is out of range for INT8 [-128, 127]",
        ),
        (one_input(datatype="UINT8", data=[-1, 0]), "element 0 (-1) is out of range for UINT8"),
        (one_input(datatype="UINT16", data=[0, 65536]), "out of range for UINT16 [0, 65535]"),
        (one_input(datatype="INT32", data=[0, 2**31]), "out of range for INT32"),
        (one_input(datatype="INT64", data=[0, 2**63]), "element 1 (9223372036854775808) is out"),
        (one_input(datatype="UINT64", data=[0, -1]), "element 1 (-1) is out of range for UINT64"),
        (one_input(datatype="UINT64", data=[0, 2**64]), "out of range for UINT64"),
        (
            one_input(datatype="INT32", data=[1, 2.5]),
            "element 1 is a number (2.5); INT32 data must be integers",
        ),
        (one_input(datatype="INT32", data=[1, 2.0]), "INT32 data must be integers"),
        (one_input(datatype="INT32", data=[True, 2]), "element 0 is a boolean (True)"),
        (
            one_input(datatype="BOOL", data=[True, 1]),
            "element 1 is a number (1); BOOL data must be true or false",
        ),
        (
            one_input(datatype="BYTES", data=["a", 1]),
            "element 1 is a number (1); BYTES data must be strings (or send the tensor as binary",
        ),
        (one_input(data=None), "'data' must be a list (flat or nested, row-major), got null"),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]},
            "input 'x' needs 'data' (or parameters.binary_data_size",
        ),
        ({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]}, "input 'x' needs 'shape'"),
        ({"inputs": [{"name": "x", "shape": [1], "data": [1]}]}, "input 'x' needs 'datatype'"),
        (
            {"inputs": [one_input()["inputs"][0], one_input()["inputs"][0]]},
            "input 'x' appears twice; give each input once",
        ),
        (
            one_input(parameters={"shared_memory_region": "r"}),
            "input 'x': parameter 'shared_memory_region': the shared memory extension is not",
        ),
        ({**one_input(), "outputs": {}}, "'outputs' must be a list of {\"name\": ...}"),
        ({**one_input(), "outputs": ["y"]}, "outputs[0] must be an object, got a string"),
        ({**one_input(), "outputs": [{}]}, "outputs[0] needs a 'name'"),
        (
            {**one_input(), "outputs": [{"name": "y"}, {"name": "y"}]},
            "output 'y' is asked for twice",
        ),
        (
            {**one_input(), "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]},
            "output 'y': parameter 'binary_data' must be true or false",
        ),
        (
            {**one_input(), "outputs": [{"name": "y", "parameters": {"classification": 3}}]},
            "the classification extension is not supported",
        ),
    ],
)
def test_rest_refusals(doc: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        rest(doc)


def test_rest_deep_nesting_does_not_recurse() -> None:
    data: Any = [1.0]
    for _ in range(5000):
        data = [data]
    assert rest(one_input(shape=[1], data=data)).inputs[0].data.tolist() == [1.0]


# --- gRPC ------------------------------------------------------------------------------------

TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def grpc_input(datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    msg.inputs.add(
        name="x", datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents)
    )
    return msg


@pytest.mark.parametrize("datatype", list(TYPED_FIELD))
def test_grpc_typed_contents_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    msg = grpc_input(datatype, [2, 3], **{TYPED_FIELD[datatype]: sample.reshape(-1).tolist()})
    request = decode_grpc_request(msg)
    assert (request.model, request.version, request.id) == ("m", "2", "r")
    (tensor,) = request.inputs
    assert_same(tensor.data, sample.astype(DATATYPES[datatype]))


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_grpc_raw_round_trip_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    msg.raw_input_contents.append(raw(sample, datatype))
    request = decode_grpc_request(msg)
    (tensor,) = request.inputs
    assert_same(tensor.data, sample.astype(DATATYPES[datatype]))
    assert tensor.data.flags.writeable

    answer = encode_grpc_response(echo(request), request)
    assert (answer.model_name, answer.model_version) == ("m", "1")
    (out,) = answer.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("x", datatype, [2, 3])
    assert list(answer.raw_output_contents) == [raw(sample, datatype)]


def test_grpc_parameters_and_requested_outputs() -> None:
    msg = grpc_input("INT32", [1], int_contents=[4])
    msg.parameters["a"].bool_param = True
    msg.parameters["b"].int64_param = -3
    msg.parameters["c"].uint64_param = 2**64 - 1
    msg.parameters["d"].double_param = 0.5
    msg.parameters["e"].string_param = "s"
    msg.inputs[0].parameters["p"].string_param = "q"
    msg.outputs.add(name="x").parameters["o"].int64_param = 1
    request = decode_grpc_request(msg)
    assert request.parameters == {"a": True, "b": -3, "c": 2**64 - 1, "d": 0.5, "e": "s"}
    assert request.inputs[0].parameters == {"p": "q"}
    assert request.outputs == (RequestedOutput("x", False, {"o": 1}),)

    response = InferResponse(
        model="m",
        version="1",
        outputs=(Tensor("x", "INT32", (1,), np.array([4], np.int32), {"unit": "cm"}),),
        parameters=request.parameters,
    )
    answer = encode_grpc_response(response, request)
    assert answer.id == "r"  # the request's id when the backend gives none
    assert grpc_parameters(answer.parameters) == request.parameters
    assert grpc_parameters(answer.outputs[0].parameters) == {"unit": "cm"}


def test_grpc_response_only_requested_outputs() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    for name in ("a", "b"):
        msg.inputs.add(name=name, datatype="INT8", shape=[1])
        msg.raw_input_contents.append(b"\x01")
    msg.outputs.add(name="b")
    request = decode_grpc_request(msg)
    answer = encode_grpc_response(echo(request), request)
    assert [o.name for o in answer.outputs] == ["b"]
    assert len(answer.raw_output_contents) == 1


def raw_request(*inputs: tuple[str, list[int], bytes]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    for datatype, shape, data in inputs:
        msg.inputs.add(name=f"x{len(msg.inputs)}", datatype=datatype, shape=shape)
        msg.raw_input_contents.append(data)
    return msg


def mixed() -> pb.ModelInferRequest:
    msg = raw_request(("INT8", [1], b"\x01"))
    msg.inputs[0].contents.int_contents.append(1)
    return msg


def short_raw() -> pb.ModelInferRequest:
    msg = raw_request(("INT8", [1], b"\x01"))
    msg.inputs.add(name="y", datatype="INT8", shape=[1])
    return msg


def unset_parameter() -> pb.ModelInferRequest:
    msg = grpc_input("INT32", [1], int_contents=[1])
    msg.parameters["p"].Clear()
    return msg


def twice() -> pb.ModelInferRequest:
    msg = grpc_input("INT32", [1], int_contents=[1])
    msg.inputs.add(name="x", datatype="INT32", shape=[1], contents={"int_contents": [1]})
    return msg


def nameless() -> pb.ModelInferRequest:
    msg = grpc_input("INT32", [1], int_contents=[1])
    msg.inputs[0].name = ""
    return msg


def output_twice() -> pb.ModelInferRequest:
    msg = grpc_input("INT32", [1], int_contents=[1])
    msg.outputs.add(name="y")
    msg.outputs.add(name="y")
    return msg


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (
            mixed(),
            "input 'x0' has contents, but the request uses raw_input_contents; when "
            "raw_input_contents is given no input may have contents",
        ),
        (
            short_raw(),
            "raw_input_contents has 1 entries for 2 inputs; give one entry per input",
        ),
        (
            grpc_input("FP16", [1], fp32_contents=[1.0]),
            "input 'x': FP16 has no typed contents field; send it in raw_input_contents",
        ),
        (
            grpc_input("INT32", [2], fp32_contents=[1.0, 2.0]),
            "input 'x' is INT32, whose data goes in contents.int_contents; got "
            "contents.fp32_contents",
        ),
        (
            grpc_input("FP32", [3], fp32_contents=[1.0, 2.0]),
            "input 'x': contents.fp32_contents has 2 elements but shape [3] holds 3",
        ),
        (
            grpc_input("FP32", [1]),
            "input 'x': contents.fp32_contents has 0 elements but shape [1] holds 1",
        ),
        (
            grpc_input("INT8", [2], int_contents=[1, 300]),
            "input 'x': element 1 (300) is out of range for INT8 [-128, 127]",
        ),
        (
            grpc_input("UINT16", [1], uint_contents=[70000]),
            "element 0 (70000) is out of range for UINT16",
        ),
        (grpc_input("FP8", [1]), "input 'x': unknown datatype 'FP8'; valid datatypes: BOOL"),
        (grpc_input("INT32", [-1]), "input 'x': shape [-1] has a negative dimension"),
        (
            grpc_input("INT32", [1 << 40]),
            "holds more than 4294967296 elements",
        ),
        (raw_request(("INT32", [2], b"\0" * 4)), "input 'x0': 4 bytes of data, but shape [2]"),
        (raw_request(("BOOL", [1], b"\x07")), "BOOL data must be bytes 0 or 1"),
        (raw_request(("BYTES", [1], b"\x09\0\0\0a")), "BYTES element 0 says it is 9 bytes"),
        (
            unset_parameter(),
            "request: parameter 'p' has no value; set one of bool_param, int64_param",
        ),
        (twice(), "input 'x' appears twice"),
        (nameless(), "inputs[0] needs a name"),
        (output_twice(), "output 'y' is asked for twice"),
    ],
)
def test_grpc_refusals(msg: pb.ModelInferRequest, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_grpc_request(msg)


# --- BYTES framing and generate -------------------------------------------------------------


def test_bytes_framing_round_trip() -> None:
    data = np.empty(3, dtype=object)
    data[:] = [b"", b"abc", "\u00e9".encode()]
    framed = serialize_bytes(data)
    assert framed == b"\0\0\0\0" + b"\x03\0\0\0abc" + b"\x02\0\0\0\xc3\xa9"
    assert deserialize_bytes(framed, 3).tolist() == data.tolist()
    text = np.array(["hi"], dtype=object)  # str elements are sent as UTF-8
    assert serialize_bytes(text) == b"\x02\0\0\0hi"


def test_decode_generate_request() -> None:
    request = decode_generate_request(
        model="gpt",
        version="3",
        text_input="hello",
        parameters={"max_tokens": 5, "temperature": 0.7, "seed": 1, "stream": True},
        request_id="r",
    )
    assert (request.max_tokens, request.temperature, request.seed, request.id) == (5, 0.7, 1, "r")
    default = decode_generate_request(model="gpt", version="", text_input="", parameters={})
    assert (default.max_tokens, default.temperature, default.seed) == (64, 0.0, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"text_input": 3}, "'text_input' must be a string (the prompt), got a number"),
        ({"parameters": {"max_tokens": 0}}, "'max_tokens' must be a positive integer, got 0"),
        ({"parameters": {"max_tokens": True}}, "'max_tokens' must be a positive integer"),
        ({"parameters": {"max_tokens": 2.0}}, "'max_tokens' must be a positive integer"),
        ({"parameters": {"temperature": -1}}, "'temperature' must be a number >= 0"),
        ({"parameters": {"temperature": "hot"}}, "'temperature' must be a number >= 0"),
        ({"parameters": {"seed": 1.5}}, "'seed' must be an integer, got 1.5"),
        ({"request_id": 4}, "'id' must be a string"),
    ],
)
def test_decode_generate_request_refusals(fields: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"text_input": "hi", "parameters": {}, **fields}
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_generate_request(model="gpt", version="", **args)
