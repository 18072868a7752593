"""A small in-memory :class:`~gantry.serving.protocol.InferenceBackend` for the front-end tests.

Models:

* ``double`` (versions 1 and 2): input ``INPUT0`` FP32 ``[-1, 4]`` -> ``OUTPUT0`` = 2 x input,
  and ``OUTPUT1`` = the row sums (FP32 ``[-1]``).
* ``echo``: answers every input as an output of the same name, datatype and data.
* ``broken``: infer raises ModelFailed; ``busy``: Overloaded (retry after 2.5 s);
  ``loading``: not ready (infer raises ModelNotReady); ``crash``: infer raises RuntimeError.
* ``gpt``: generative; answers the prompt's words back, one piece per word, at most
  ``max_tokens``; ``gpt-broken`` fails after the first piece.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from gantry.serving.errors import (
    BadRequest,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
)
from gantry.serving.protocol import (
    Caller,
    GenerateChunk,
    GenerateRequest,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Tensor,
    TensorSpec,
)

VERSIONS = {
    "double": ("1", "2"),
    "echo": ("1",),
    "broken": ("1",),
    "busy": ("1",),
    "loading": ("1",),
    "crash": ("1",),
    "gpt": ("3",),
    "gpt-broken": ("1",),
}


@dataclass
class FakeBackend:
    """Records every call's request and caller; flags switch liveness and readiness."""

    is_live: bool = True
    is_ready: bool = True
    requests: list[InferRequest] = field(default_factory=list)
    generated: list[GenerateRequest] = field(default_factory=list)
    callers: list[Caller] = field(default_factory=list)

    def _version(self, name: str, version: str) -> str:
        versions = VERSIONS.get(name)
        if versions is None:
            raise ModelNotFound(f"no model {name!r}", hint="GET /v2 lists nothing; ask an admin")
        if version and version not in versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return version or versions[-1]

    def live(self) -> bool:
        return self.is_live

    def ready(self) -> bool:
        return self.is_ready

    def model_ready(self, name: str, version: str, caller: Caller) -> bool:
        self.callers.append(caller)
        self._version(name, version)
        return name != "loading"

    def model_metadata(self, name: str, version: str, caller: Caller) -> ModelMetadata:
        self.callers.append(caller)
        self._version(name, version)
        if name == "double":
            inputs = (TensorSpec("INPUT0", "FP32", (-1, 4)),)
            outputs = (TensorSpec("OUTPUT0", "FP32", (-1, 4)), TensorSpec("OUTPUT1", "FP32", (-1,)))
        elif name.startswith("gpt"):
            inputs = (TensorSpec("text_input", "BYTES", (1,)),)
            outputs = (TensorSpec("text_output", "BYTES", (1,)),)
        else:
            inputs = outputs = ()
        return ModelMetadata(name, VERSIONS[name], "pytorch", inputs, outputs)

    async def infer(self, request: InferRequest, caller: Caller) -> InferResponse:
        self.requests.append(request)
        self.callers.append(caller)
        version = self._version(request.model, request.version)
        name = request.model
        if name == "broken":
            raise ModelFailed("model 'broken' raised ValueError: boom")
        if name == "busy":
            raise Overloaded("model 'busy' has a full queue", retry_after_s=2.5)
        if name == "loading":
            raise ModelNotReady("model 'loading' is still loading; retry in a minute")
        if name == "crash":
            raise RuntimeError("unexpected")
        if name.startswith("gpt"):
            raise BadRequest(f"model {name!r} is generative; use generate")
        if name == "echo":
            outputs = request.inputs
        else:
            by_name = {t.name: t for t in request.inputs}
            x = by_name.get("INPUT0")
            if x is None or x.datatype != "FP32" or len(x.shape) != 2 or x.shape[1] != 4:
                raise BadRequest("model 'double' needs input INPUT0, FP32 [-1, 4]")
            doubled = x.data * 2
            sums = x.data.sum(axis=1).astype(np.float32)
            outputs = (
                Tensor("OUTPUT0", "FP32", x.shape, doubled),
                Tensor("OUTPUT1", "FP32", (x.shape[0],), sums),
            )
        return InferResponse(model=name, version=version, id=request.id, outputs=outputs)

    def generate(self, request: GenerateRequest, caller: Caller) -> AsyncIterator[GenerateChunk]:
        self.generated.append(request)
        self.callers.append(caller)
        return self._pieces(request)

    async def _pieces(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        version = self._version(request.model, request.version)
        if not request.model.startswith("gpt"):
            raise BadRequest(f"model {request.model!r} is not generative")
        words = request.text_input.split()[: request.max_tokens]
        for i, word in enumerate(words):
            if request.model == "gpt-broken" and i == 1:
                raise ModelFailed("model 'gpt-broken' raised RuntimeError: CUDA error")
            yield GenerateChunk(
                model=request.model,
                version=version,
                text_output=word + " ",
                index=i,
                final=i == len(words) - 1,
                id=request.id,
            )

    def server_metadata(self) -> tuple[str, str, tuple[str, ...]]:
        return ("gantry-serving", "0.1.0", ("binary_tensor_data", "generate"))
