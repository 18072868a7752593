"""The inference protocol's requests and responses, independent of REST and gRPC.

The front ends (:mod:`gantry.serving.rest`, :mod:`gantry.serving.grpc_inference`) decode what
arrives into an :class:`InferRequest` of numpy arrays and encode the :class:`InferResponse`
back; everything behind them (routing, batching, the model runtime) sees only these types.
The datatypes are the Open Inference Protocol's (``FP32``, ``INT64``, ``BYTES``, ...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gantry.serving.errors import NotAuthenticated

#: Open Inference Protocol datatype -> numpy dtype (BYTES: numpy object arrays of bytes).
DATATYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

#: The header (REST) or metadata key (gRPC) whose value keeps a caller on one version.
ROUTE_KEY = "x-gantry-route-key"

#: Parameter values the protocol allows.
Parameter = bool | int | float | str


@dataclass(frozen=True)
class Tensor:
    """A named tensor: its protocol datatype, shape and data (``data.shape == shape``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Mapping[str, Parameter] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestedOutput:
    """An output the caller asked for; ``binary`` asks for raw bytes (REST binary extension)."""

    name: str
    binary: bool = False
    parameters: Mapping[str, Parameter] = field(default_factory=dict)


@dataclass(frozen=True)
class InferRequest:
    """One inference request, decoded and checked for form (not yet against a model)."""

    model: str
    version: str = ""  #: "" = let the deployment's traffic split choose
    id: str = ""
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[RequestedOutput, ...] = ()  #: () = every output
    parameters: Mapping[str, Parameter] = field(default_factory=dict)


@dataclass(frozen=True)
class InferResponse:
    """The answer: which version computed it, and the outputs."""

    model: str
    version: str
    id: str = ""
    outputs: tuple[Tensor, ...] = ()
    parameters: Mapping[str, Parameter] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as its metadata describes it (-1 = any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    """What ``GET /v2/models/{name}`` answers."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Caller:
    """Who calls, as the front end saw it: the bearer token (None = anonymous) and the value
    that keeps a caller on one version when the deployment routes stickily."""

    token: str | None = None
    sticky_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    protocol: str = "rest"  #: rest | grpc (a metrics label)

    @classmethod
    def from_headers(cls, headers: dict[str, str], *, protocol: str, what: str) -> Caller:
        """The caller from lower-cased headers (REST) or metadata (gRPC): ``authorization``
        (``Bearer <token>``; anything else raises NotAuthenticated naming ``what``) becomes the
        token and leaves ``headers``; ``x-gantry-route-key`` is the sticky key."""
        authorization = headers.pop("authorization", None)
        token = None
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token or " " in token:
                raise NotAuthenticated(
                    f"the {what} must be 'Bearer <token>'",
                    hint=f"send a Gantry access token, or no {what} at all",
                )
        return cls(token=token, sticky_key=headers.get(ROUTE_KEY), headers=headers,
                   protocol=protocol)  # fmt: skip


@dataclass(frozen=True)
class GenerateRequest:
    """Triton's generate extension: text in, text (or a stream of pieces) out."""

    model: str
    version: str = ""
    text_input: str = ""
    max_tokens: int = 64
    temperature: float = 0.0  #: 0 = greedy
    seed: int | None = None
    id: str = ""


@dataclass(frozen=True)
class GenerateChunk:
    """One streamed piece of generated text; ``final`` on the last one."""

    model: str
    version: str
    text_output: str
    index: int
    final: bool = False
    id: str = ""


class InferenceBackend(Protocol):
    """What the REST and gRPC front ends call. Raises :class:`~gantry.serving.errors.
    InferenceError` subclasses for everything a caller can get wrong."""

    def live(self) -> bool:
        """The server process is up."""
        ...

    def ready(self) -> bool:
        """Every deployment has a version that can answer."""
        ...

    def model_ready(self, name: str, version: str, caller: Caller) -> bool:
        """Whether ``name`` (``version``, "" = any) can answer; ModelNotFound if unknown."""
        ...

    def model_metadata(self, name: str, version: str, caller: Caller) -> ModelMetadata:
        """The model's metadata; ModelNotFound if unknown."""
        ...

    async def infer(self, request: InferRequest, caller: Caller) -> InferResponse:
        """Route, batch and run one request."""
        ...

    def generate(self, request: GenerateRequest, caller: Caller) -> AsyncIterator[GenerateChunk]:
        """Stream generated text piece by piece (BadRequest for a non-generative model)."""
        ...

    def server_metadata(self) -> tuple[str, str, tuple[str, ...]]:
        """(name, version, extensions)."""
        ...


__all__ = [
    "DATATYPES",
    "ROUTE_KEY",
    "Caller",
    "GenerateChunk",
    "GenerateRequest",
    "InferRequest",
    "InferResponse",
    "InferenceBackend",
    "ModelMetadata",
    "Parameter",
    "RequestedOutput",
    "Tensor",
    "TensorSpec",
]
