"""The Open Inference Protocol's tensor codec: REST JSON, Triton's binary extension and gRPC.

Pure functions between the wire forms and :mod:`gantry.serving.protocol`'s types:

* :func:`split_rest_body` + :func:`decode_rest_request` read a REST ``/infer`` body: a JSON
  document, optionally followed by binary tensor data (Triton's binary tensor data extension:
  the JSON part's length is in the ``Inference-Header-Content-Length`` HTTP header, and each
  input with ``parameters.binary_data_size`` takes that many bytes, in input order).
* :func:`encode_rest_response` writes the answer, outputs asked for with
  ``parameters.binary_data`` (or the request's ``binary_data_output``) as binary after the JSON.
* :func:`decode_grpc_request` / :func:`encode_grpc_response` do the same for
  ``ModelInferRequest`` (typed ``contents`` or ``raw_input_contents``) and
  ``ModelInferResponse`` (always ``raw_output_contents``, as Triton answers).

Raw tensor data is little-endian, row-major; a raw ``BYTES`` tensor is its elements, each
preceded by its length as a 4-byte little-endian unsigned integer. Every malformed request
raises :class:`~gantry.serving.errors.BadRequest` with a message that says what was wrong and
what to send instead. Arrays handed on are writable, native-order copies of the right dtype
(:data:`~gantry.serving.protocol.DATATYPES`; ``BYTES`` = object arrays of ``bytes``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from gantry.protos.inference import grpc_service_pb2 as pb
from gantry.serving.errors import BadRequest, ModelFailed
from gantry.serving.protocol import (
    DATATYPES,
    GenerateRequest,
    InferRequest,
    InferResponse,
    Parameter,
    RequestedOutput,
    Tensor,
)

#: Most elements one tensor may have (a guard against absurd shapes; body limits come first).
MAX_ELEMENTS = 1 << 32
#: Most dimensions one tensor may have.
MAX_RANK = 32

_VALID = ", ".join(DATATYPES)
_U32 = struct.Struct("<I")
_INT64_MAX = (1 << 63) - 1
#: Little-endian wire dtype of each fixed-size datatype.
_WIRE: dict[str, np.dtype[Any]] = {
    name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items() if name != "BYTES"
}
#: Value range of each integer datatype.
_INT_RANGE: dict[str, tuple[int, int]] = {
    "UINT8": (0, (1 << 8) - 1),
    "UINT16": (0, (1 << 16) - 1),
    "UINT32": (0, (1 << 32) - 1),
    "UINT64": (0, (1 << 64) - 1),
    "INT8": (-(1 << 7), (1 << 7) - 1),
    "INT16": (-(1 << 15), (1 << 15) - 1),
    "INT32": (-(1 << 31), (1 << 31) - 1),
    "INT64": (-(1 << 63), (1 << 63) - 1),
}
_INTS = set(_INT_RANGE)
#: Largest finite value of each floating-point datatype.
_FLOAT_MAX = {
    "FP16": float(np.finfo(np.float16).max),
    "FP32": float(np.finfo(np.float32).max),
    "FP64": float(np.finfo(np.float64).max),
}
#: gRPC ``InferTensorContents`` field of each datatype (FP16 has none: raw only).
_CONTENTS_FIELD = {
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
_ALL_CONTENTS_FIELDS = tuple(dict.fromkeys(_CONTENTS_FIELD.values()))
_UNSUPPORTED_PARAMETERS = {
    "shared_memory_region": "the shared memory extension is not supported; send the data "
    "in the request",
    "classification": "the classification extension is not supported; ask for the raw output",
}


# --- shapes, parameters, BYTES framing ---------------------------------------------------------


def element_count(shape: Sequence[int]) -> int:
    """The number of elements a shape holds."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def _check_shape(raw: object, where: str) -> tuple[int, ...]:
    """A request tensor's shape: a list of non-negative integers of sane total size."""
    if not isinstance(raw, list | tuple):
        raise BadRequest(
            f"{where}: 'shape' must be a list of non-negative integers, got {_kind(raw)}"
        )
    if len(raw) > MAX_RANK:
        raise BadRequest(f"{where}: shape has {len(raw)} dimensions; at most {MAX_RANK} allowed")
    bound = 1
    for dim in raw:
        if type(dim) is not int:
            raise BadRequest(f"{where}: shape {list(raw)} has {dim!r}; dimensions must be integers")
        if dim < 0:
            raise BadRequest(
                f"{where}: shape {list(raw)} has a negative dimension; a request gives the "
                "actual size of every dimension (-1 appears only in model metadata)"
            )
        bound *= max(dim, 1)
        if bound > MAX_ELEMENTS:
            raise BadRequest(
                f"{where}: shape {list(raw)} holds more than {MAX_ELEMENTS} elements; "
                "split the request into smaller ones"
            )
    return tuple(raw)


def _check_datatype(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise BadRequest(f"{where}: 'datatype' must be a string, one of {_VALID}")
    if raw not in DATATYPES:
        raise BadRequest(f"{where}: unknown datatype {raw!r}; valid datatypes: {_VALID}")
    return raw


def _kind(value: object) -> str:
    """How JSON calls the type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _json_parameters(raw: object, where: str) -> dict[str, Parameter]:
    """A JSON ``parameters`` object: values must be booleans, numbers or strings."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object, got {_kind(raw)}")
    for key, value in raw.items():
        if not isinstance(value, bool | int | float | str):
            raise BadRequest(
                f"{where}: parameter {key!r} is {_kind(value)}; parameter values must be "
                "booleans, numbers or strings"
            )
        if key in _UNSUPPORTED_PARAMETERS:
            raise BadRequest(f"{where}: parameter {key!r}: {_UNSUPPORTED_PARAMETERS[key]}")
    return raw


def grpc_parameters(
    params: Mapping[str, pb.InferParameter], where: str = "request"
) -> dict[str, Parameter]:
    """A gRPC ``map<string, InferParameter>`` as plain values (BadRequest if one is unset)."""
    out: dict[str, Parameter] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        if which is None:
            raise BadRequest(
                f"{where}: parameter {key!r} has no value; set one of bool_param, int64_param, "
                "uint64_param, double_param or string_param"
            )
        if key in _UNSUPPORTED_PARAMETERS:
            raise BadRequest(f"{where}: parameter {key!r}: {_UNSUPPORTED_PARAMETERS[key]}")
        value: Parameter = getattr(param, which)
        out[key] = value
    return out


def set_grpc_parameters(
    target: Any,  # a protobuf map<string, InferParameter>
    params: Mapping[str, Parameter],
) -> None:
    """Write plain parameter values into a gRPC ``map<string, InferParameter>``."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def serialize_bytes(data: np.ndarray) -> bytes:
    """A BYTES tensor in raw form: each element's 4-byte LE length, then its bytes."""
    parts: list[bytes] = []
    for value in data.flat:
        item = value.encode() if isinstance(value, str) else bytes(value)
        parts.append(_U32.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(raw: bytes | memoryview, count: int, where: str = "tensor") -> np.ndarray:
    """``count`` length-prefixed elements from raw BYTES data, as a 1-D object array."""
    out = np.empty(count, dtype=object)
    size = len(raw)
    offset = 0
    for i in range(count):
        if offset + 4 > size:
            raise BadRequest(
                f"{where}: BYTES data ends at element {i} of {count}; each element is a "
                "4-byte little-endian length followed by that many bytes"
            )
        (length,) = _U32.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise BadRequest(
                f"{where}: BYTES element {i} says it is {length} bytes long but only "
                f"{size - offset} bytes remain; each element is a 4-byte little-endian length "
                "followed by that many bytes"
            )
        out[i] = bytes(raw[offset : offset + length])
        offset += length
    if offset != size:
        raise BadRequest(
            f"{where}: {size - offset} bytes left over after the {count} BYTES elements the "
            "shape holds; send exactly one length-prefixed element per element of the shape"
        )
    return out


def _from_raw(
    raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], count: int, where: str
) -> np.ndarray:
    """A tensor from raw little-endian bytes (a writable, native-order copy)."""
    if datatype == "BYTES":
        return deserialize_bytes(raw, count, where).reshape(shape)
    wire = _WIRE[datatype]
    expected = count * wire.itemsize
    if len(raw) != expected:
        raise BadRequest(
            f"{where}: {len(raw)} bytes of data, but shape {list(shape)} of {datatype} needs "
            f"{expected} ({count} elements of {wire.itemsize} bytes)"
        )
    if datatype == "BOOL" and count and int(np.frombuffer(raw, dtype=np.uint8).max()) > 1:
        raise BadRequest(f"{where}: BOOL data must be bytes 0 or 1")
    return np.frombuffer(raw, dtype=wire).astype(DATATYPES[datatype]).reshape(shape)


def _to_raw(data: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(data)
    return data.astype(_WIRE[datatype], copy=False).tobytes()


# --- JSON tensor data -----------------------------------------------------------------------


def _flatten(data: list[Any]) -> list[Any]:
    """Nested lists in row-major order as one flat list (flat data is returned as is)."""
    if not any(type(item) is list for item in data):
        return data
    out: list[Any] = []
    stack: list[Iterator[Any]] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _bad_element(flat: list[Any], allowed: tuple[type, ...], datatype: str, where: str) -> None:
    for i, value in enumerate(flat):
        if type(value) not in allowed:
            need = {
                "BOOL": "true or false",
                "BYTES": "strings (or send the tensor as binary data)",
            }.get(datatype, "integers" if datatype in _INTS else "numbers")
            raise BadRequest(
                f"{where}: element {i} is {_kind(value)} ({value!r}); {datatype} data must "
                f"be {need}"
            )


def _out_of_range(flat: list[Any], datatype: str, where: str, lo: float, hi: float) -> BadRequest:
    for i, value in enumerate(flat):
        if not lo <= value <= hi:
            return BadRequest(
                f"{where}: element {i} ({value!r}) is out of range for {datatype} [{lo}, {hi}]"
            )
    return BadRequest(f"{where}: data is out of range for {datatype}")  # pragma: no cover


def _from_json_data(
    data: object, datatype: str, shape: tuple[int, ...], count: int, where: str
) -> np.ndarray:
    """A tensor from JSON ``data`` (flat or nested lists, row-major)."""
    if not isinstance(data, list):
        raise BadRequest(
            f"{where}: 'data' must be a list (flat or nested, row-major), got {_kind(data)}"
        )
    flat = _flatten(data)
    if len(flat) != count:
        raise BadRequest(
            f"{where}: 'data' has {len(flat)} elements but shape {list(shape)} holds {count}; "
            "send exactly one value per element"
        )
    types = set(map(type, flat))
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        if types - {str}:
            _bad_element(flat, (str,), datatype, where)
        out = np.empty(count, dtype=object)
        out[:] = [item.encode() for item in flat]
        return out.reshape(shape)
    if datatype == "BOOL":
        if types - {bool}:
            _bad_element(flat, (bool,), datatype, where)
        return np.array(flat, dtype=np.bool_).reshape(shape)
    if datatype in _INTS:
        if types - {int}:
            _bad_element(flat, (int,), datatype, where)
        lo, hi = _INT_RANGE[datatype]
        try:
            wide = np.array(flat, dtype=np.uint64 if datatype == "UINT64" else np.int64)
        except OverflowError:
            raise _out_of_range(flat, datatype, where, lo, hi) from None
        if count and (int(wide.min()) < lo or int(wide.max()) > hi):
            raise _out_of_range(flat, datatype, where, lo, hi)
        return wide.astype(dtype).reshape(shape)
    # FP16, FP32, FP64
    if types - {int, float}:
        _bad_element(flat, (int, float), datatype, where)
    limit = _FLOAT_MAX[datatype]
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError:
        raise _out_of_range(flat, datatype, where, -limit, limit) from None
    if count and datatype != "FP64" and float(np.abs(wide).max()) > limit:
        raise _out_of_range(flat, datatype, where, -limit, limit)
    return wide.astype(dtype).reshape(shape)


# --- REST -----------------------------------------------------------------------------------


def split_rest_body(body: bytes, header_length: str | None) -> tuple[object, memoryview]:
    """Parse a REST body into (JSON document, binary part).

    ``header_length`` is the ``Inference-Header-Content-Length`` HTTP header (None = the whole
    body is JSON).
    """
    view = memoryview(body)
    if header_length is None:
        json_part, binary = view, view[len(view) :]
    else:
        try:
            length = int(header_length)
        except ValueError:
            length = -1
        if not 0 <= length <= len(body):
            raise BadRequest(
                f"Inference-Header-Content-Length is {header_length!r}; it must be the length "
                f"in bytes of the JSON part of the body (0 to {len(body)})"
            )
        json_part, binary = view[:length], view[length:]
    try:
        return orjson.loads(json_part), binary
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


def decode_rest_request(
    doc: object, *, model: str, version: str = "", binary: bytes | memoryview = b""
) -> InferRequest:
    """An :class:`InferRequest` from a parsed REST inference body and its binary part.

    ``binary`` is what follows the JSON (:func:`split_rest_body`). Transport parameters are
    taken out: an input's ``binary_data_size`` and an output's ``binary_data`` (which becomes
    :attr:`RequestedOutput.binary`); the request's ``binary_data_output`` stays in
    :attr:`InferRequest.parameters`, where :func:`encode_rest_response` reads it.
    """
    if not isinstance(doc, dict):
        raise BadRequest(f"the request body must be a JSON object with 'inputs', got {_kind(doc)}")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string, got {_kind(request_id)}")
    parameters = _json_parameters(doc.get("parameters"), "request")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadRequest("request parameter 'binary_data_output' must be true or false")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise BadRequest(
            "the request needs 'inputs': a list of tensors, each "
            '{"name": ..., "shape": [...], "datatype": ..., "data": [...]}'
            + ("" if raw_inputs is None else f"; got {_kind(raw_inputs)}")
        )
    offset = 0
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_inputs):
        tensor, offset = _rest_input(raw, i, seen, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise BadRequest(
            f"the body has {len(binary)} bytes of binary data after the JSON, but the inputs' "
            f"binary_data_size add up to {offset}; check Inference-Header-Content-Length and "
            "each binary input's binary_data_size"
        )
    outputs = _rest_outputs(doc.get("outputs"), binary_output)
    return InferRequest(
        model=model,
        version=version,
        id=request_id,
        inputs=tuple(inputs),
        outputs=outputs,
        parameters=parameters,
    )


def _rest_input(
    raw: object, index: int, seen: set[str], binary: bytes | memoryview, offset: int
) -> tuple[Tensor, int]:
    if not isinstance(raw, dict):
        raise BadRequest(f"inputs[{index}] must be an object, got {_kind(raw)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{index}] needs a 'name' (a non-empty string)")
    where = f"input {name!r}"
    if name in seen:
        raise BadRequest(f"{where} appears twice; give each input once")
    seen.add(name)
    for key in ("shape", "datatype"):
        if key not in raw:
            raise BadRequest(f"{where} needs '{key}'")
    datatype = _check_datatype(raw["datatype"], where)
    shape = _check_shape(raw["shape"], where)
    count = element_count(shape)
    parameters = dict(_json_parameters(raw.get("parameters"), where))
    size = parameters.pop("binary_data_size", None)
    if size is None:
        if "data" not in raw:
            raise BadRequest(
                f"{where} needs 'data' (or parameters.binary_data_size with the data as "
                "binary after the JSON)"
            )
        data = _from_json_data(raw["data"], datatype, shape, count, where)
        return Tensor(name, datatype, shape, data, parameters), offset
    if type(size) is not int or size < 0:
        raise BadRequest(f"{where}: binary_data_size must be a non-negative integer")
    if "data" in raw:
        raise BadRequest(f"{where} has both 'data' and binary_data_size; send one of them")
    if offset + size > len(binary):
        raise BadRequest(
            f"{where}: binary_data_size is {size} but only {len(binary) - offset} bytes of "
            "binary data remain after the JSON; send Inference-Header-Content-Length with the "
            "JSON's length and the inputs' binary data after it, in input order"
        )
    data = _from_raw(binary[offset : offset + size], datatype, shape, count, where)
    return Tensor(name, datatype, shape, data, parameters), offset + size


def _rest_outputs(raw: object, binary_default: bool) -> tuple[RequestedOutput, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest(f"'outputs' must be a list of {{\"name\": ...}}, got {_kind(raw)}")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"outputs[{i}] must be an object, got {_kind(item)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"outputs[{i}] needs a 'name' (a non-empty string)")
        if name in seen:
            raise BadRequest(f"output {name!r} is asked for twice; ask for each output once")
        seen.add(name)
        parameters = dict(_json_parameters(item.get("parameters"), f"output {name!r}"))
        flag = parameters.pop("binary_data", binary_default)
        if not isinstance(flag, bool):
            raise BadRequest(f"output {name!r}: parameter 'binary_data' must be true or false")
        outputs.append(RequestedOutput(name, flag, parameters))
    return tuple(outputs)


def _selected(response: InferResponse, request: InferRequest) -> list[tuple[Tensor, bool]]:
    """The outputs to send, each with whether it goes as binary (REST)."""
    if not request.outputs:
        default = request.parameters.get("binary_data_output") is True
        return [(tensor, default) for tensor in response.outputs]
    by_name = {tensor.name: tensor for tensor in response.outputs}
    selected: list[tuple[Tensor, bool]] = []
    for wanted in request.outputs:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            have = ", ".join(sorted(by_name)) or "none"
            raise BadRequest(
                f"the model has no output {wanted.name!r}; its outputs: {have}",
            )
        selected.append((tensor, wanted.binary))
    return selected


def _output_array(tensor: Tensor) -> np.ndarray:
    dtype = DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise ModelFailed(
            f"the model answered output {tensor.name!r} with unknown datatype {tensor.datatype!r}"
        )
    return np.ascontiguousarray(np.asarray(tensor.data, dtype=dtype))


def _json_bytes(data: np.ndarray, name: str) -> list[str]:
    try:
        return [
            item if isinstance(item, str) else bytes(item).decode("utf-8") for item in data.flat
        ]
    except UnicodeDecodeError:
        raise BadRequest(
            f"output {name!r} holds bytes that are not UTF-8 text, which JSON cannot carry; "
            'ask for it with parameters {"binary_data": true}'
        ) from None


def encode_rest_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, int | None]:
    """The REST body of a response and, when outputs go as binary, the JSON part's length.

    The length (None when there is no binary part) goes into the
    ``Inference-Header-Content-Length`` response header.
    """
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor, binary in _selected(response, request):
        data = _output_array(tensor)
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        parameters: dict[str, Parameter] = dict(tensor.parameters)
        if binary:
            blob = _to_raw(data, tensor.datatype)
            parameters["binary_data_size"] = len(blob)
            blobs.append(blob)
        elif tensor.datatype == "BYTES":
            entry["data"] = _json_bytes(data, tensor.name)
        else:
            entry["data"] = data.reshape(-1)
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    request_id = response.id or request.id
    if request_id:
        doc["id"] = request_id
    if response.parameters:
        doc["parameters"] = dict(response.parameters)
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


# --- gRPC -----------------------------------------------------------------------------------


def decode_grpc_request(msg: pb.ModelInferRequest) -> InferRequest:
    """An :class:`InferRequest` from a gRPC ``ModelInferRequest``."""
    raw_contents = msg.raw_input_contents
    if raw_contents and len(raw_contents) != len(msg.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw_contents)} entries for {len(msg.inputs)} inputs; "
            "give one entry per input, in the order of inputs"
        )
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, item in enumerate(msg.inputs):
        name = item.name
        if not name:
            raise BadRequest(f"inputs[{i}] needs a name")
        where = f"input {name!r}"
        if name in seen:
            raise BadRequest(f"{where} appears twice; give each input once")
        seen.add(name)
        datatype = _check_datatype(item.datatype, where)
        shape = _check_shape(list(item.shape), where)
        count = element_count(shape)
        parameters = grpc_parameters(item.parameters, where)
        if raw_contents:
            if item.HasField("contents"):
                raise BadRequest(
                    f"{where} has contents, but the request uses raw_input_contents; when "
                    "raw_input_contents is given no input may have contents (send every input "
                    "raw, or none)"
                )
            data = _from_raw(raw_contents[i], datatype, shape, count, where)
        else:
            data = _from_contents(item.contents, datatype, shape, count, where)
        inputs.append(Tensor(name, datatype, shape, data, parameters))
    outputs: list[RequestedOutput] = []
    wanted: set[str] = set()
    for i, out in enumerate(msg.outputs):
        if not out.name:
            raise BadRequest(f"outputs[{i}] needs a name")
        if out.name in wanted:
            raise BadRequest(f"output {out.name!r} is asked for twice; ask for each output once")
        wanted.add(out.name)
        outputs.append(
            RequestedOutput(
                out.name, parameters=grpc_parameters(out.parameters, f"output {out.name!r}")
            )
        )
    return InferRequest(
        model=msg.model_name,
        version=msg.model_version,
        id=msg.id,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        parameters=grpc_parameters(msg.parameters),
    )


def _from_contents(
    contents: pb.InferTensorContents,
    datatype: str,
    shape: tuple[int, ...],
    count: int,
    where: str,
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(
            f"{where}: {datatype} has no typed contents field; send it in raw_input_contents "
            "(little-endian)"
        )
    for other in _ALL_CONTENTS_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise BadRequest(
                f"{where} is {datatype}, whose data goes in contents.{field}; got contents.{other}"
            )
    values = getattr(contents, field)
    if len(values) != count:
        raise BadRequest(
            f"{where}: contents.{field} has {len(values)} elements but shape {list(shape)} "
            f"holds {count}; send exactly one value per element"
        )
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    if datatype in ("INT8", "INT16", "UINT8", "UINT16"):
        wide = np.fromiter(values, dtype=np.int64, count=count)
        lo, hi = _INT_RANGE[datatype]
        if count and (int(wide.min()) < lo or int(wide.max()) > hi):
            raise _out_of_range(list(values), datatype, where, lo, hi)
        return wide.astype(dtype).reshape(shape)
    return np.fromiter(values, dtype=dtype, count=count).reshape(shape)


def encode_grpc_response(response: InferResponse, request: InferRequest) -> pb.ModelInferResponse:
    """A gRPC ``ModelInferResponse``, every output's data in ``raw_output_contents``."""
    msg = pb.ModelInferResponse(
        model_name=response.model,
        model_version=response.version,
        id=response.id or request.id,
    )
    set_grpc_parameters(msg.parameters, response.parameters)
    raw: list[bytes] = []
    for tensor, _ in _selected(response, request):
        data = _output_array(tensor)
        out = msg.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        set_grpc_parameters(out.parameters, tensor.parameters)
        raw.append(_to_raw(data, tensor.datatype))
    msg.raw_output_contents.extend(raw)
    return msg


# --- generate -------------------------------------------------------------------------------


def decode_generate_request(
    *,
    model: str,
    version: str,
    text_input: object,
    parameters: Mapping[str, object],
    request_id: object = "",
) -> GenerateRequest:
    """A :class:`GenerateRequest` from the generate extension's fields, checked.

    ``parameters`` may carry ``max_tokens`` (a positive integer), ``temperature`` (a number,
    0 = greedy) and ``seed`` (an integer); other parameters are ignored.
    """
    if not isinstance(text_input, str):
        raise BadRequest(f"'text_input' must be a string (the prompt), got {_kind(text_input)}")
    if not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string, got {_kind(request_id)}")
    defaults = GenerateRequest(model=model)
    max_tokens = parameters.get("max_tokens", defaults.max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"parameter 'max_tokens' must be a positive integer, got {max_tokens!r}")
    temperature = parameters.get("temperature", defaults.temperature)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature < math.inf
    ):
        raise BadRequest(
            f"parameter 'temperature' must be a number >= 0 (0 = greedy), got {temperature!r}"
        )
    seed = parameters.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"parameter 'seed' must be an integer, got {seed!r}")
    return GenerateRequest(
        model=model,
        version=version,
        text_input=text_input,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        id=request_id,
    )


__all__ = [
    "MAX_ELEMENTS",
    "MAX_RANK",
    "decode_generate_request",
    "decode_grpc_request",
    "decode_rest_request",
    "deserialize_bytes",
    "element_count",
    "encode_grpc_response",
    "encode_rest_response",
    "grpc_parameters",
    "serialize_bytes",
    "set_grpc_parameters",
    "split_rest_body",
]
