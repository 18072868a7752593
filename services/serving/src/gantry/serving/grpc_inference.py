"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), for grpc.aio.

:class:`InferenceServicer` answers ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata and ModelInfer from the specification, and Triton's ModelStreamInfer: on one
bidirectional stream, a request whose input ``text_input`` is one BYTES element is a generate
request (``max_tokens``, ``temperature`` and ``seed`` from the request's parameters) answered
with one response per generated piece, output ``text_output`` (BYTES ``[1]``) and parameter
``triton_final_response`` (true on the last); any other request gets one inference response.
Requests on one stream are answered in order; a failed one answers ``error_message`` and the
stream stays open.

Errors abort the call with the :class:`~gantry.serving.errors.InferenceError`'s ``grpc_code``
and message (``Overloaded`` adds trailing metadata ``retry-after``, whole seconds). The caller
comes from the metadata: ``authorization`` (``Bearer <token>``) and ``x-gantry-route-key``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
import numpy as np

from gantry.core import get_logger
from gantry.protos.inference import grpc_service_pb2 as pb
from gantry.protos.inference import grpc_service_pb2_grpc as pb_grpc
from gantry.serving.errors import BadRequest, InferenceError, Overloaded
from gantry.serving.protocol import ROUTE_KEY as PROTOCOL_ROUTE_KEY
from gantry.serving.protocol import (
    Caller,
    GenerateChunk,
    GenerateRequest,
    InferenceBackend,
    InferRequest,
    InferResponse,
    Tensor,
)
from gantry.serving.tensors import (
    decode_generate_request,
    decode_grpc_request,
    encode_grpc_response,
)

#: Metadata key whose value keeps a caller on one version when routing is sticky.
ROUTE_KEY = PROTOCOL_ROUTE_KEY
#: The input that makes a stream request a generate request, and the output that answers it.
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
#: Response parameter marking the last response to a request (Triton's name).
FINAL_RESPONSE = "triton_final_response"

_log = get_logger("gantry.serving.grpc")


def caller_of(context: Any) -> Caller:
    """Who calls, from the call's metadata (NotAuthenticated for a malformed authorization)."""
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            headers[key.lower()] = value
    return Caller.from_headers(headers, protocol="grpc", what="authorization metadata")


async def _abort(context: Any, exc: Exception) -> NoReturn:
    """End the call with the status of ``exc`` (INTERNAL for an unexpected exception)."""
    if isinstance(exc, InferenceError):
        trailing: tuple[tuple[str, str], ...] = ()
        if isinstance(exc, Overloaded):
            seconds = exc.retry_after_s
            wait = max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1
            trailing = (("retry-after", str(wait)),)
        await context.abort(grpc.StatusCode[exc.grpc_code], str(exc), trailing_metadata=trailing)
    else:
        _log.exception("grpc_inference_failed", error_type=type(exc).__name__)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
    raise AssertionError("context.abort() returned")  # pragma: no cover


def _text_input(request: InferRequest) -> str | None:
    """The prompt of a generate request on the stream, or None for a plain inference."""
    for tensor in request.inputs:
        if tensor.name != TEXT_INPUT:
            continue
        if tensor.datatype != "BYTES" or tensor.data.size != 1:
            raise BadRequest(
                f"input {TEXT_INPUT!r} must be BYTES with one element (the prompt); got "
                f"{tensor.datatype} of shape {list(tensor.shape)}"
            )
        value = tensor.data.reshape(-1)[0]
        try:
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            raise BadRequest(f"input {TEXT_INPUT!r} must be UTF-8 text") from None
    return None


def _chunk_response(chunk: GenerateChunk, request: GenerateRequest) -> pb.ModelStreamInferResponse:
    text = np.empty(1, dtype=object)
    text[0] = chunk.text_output.encode("utf-8")
    response = InferResponse(
        model=chunk.model,
        version=chunk.version,
        id=chunk.id or request.id,
        outputs=(Tensor(TEXT_OUTPUT, "BYTES", (1,), text),),
        parameters={FINAL_RESPONSE: chunk.final},
    )
    return pb.ModelStreamInferResponse(
        infer_response=encode_grpc_response(response, InferRequest(model=request.model))
    )


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over an :class:`InferenceBackend` (grpc.aio)."""

    def __init__(self, backend: InferenceBackend) -> None:
        self.backend = backend

    async def ServerLive(  # noqa: N802
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        """Whether the server is live."""
        try:
            live = self.backend.live()
        except Exception as exc:
            await _abort(context, exc)
        return pb.ServerLiveResponse(live=live)

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        """Whether every deployment can answer."""
        try:
            ready = self.backend.ready()
        except Exception as exc:
            await _abort(context, exc)
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        """Whether the model (version) can answer; NOT_FOUND if unknown."""
        try:
            ready = self.backend.model_ready(request.name, request.version, caller_of(context))
        except Exception as exc:
            await _abort(context, exc)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        """The server's name, version and extensions."""
        try:
            name, version, extensions = self.backend.server_metadata()
        except Exception as exc:
            await _abort(context, exc)
        return pb.ServerMetadataResponse(name=name, version=version, extensions=extensions)

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        """The model's versions, platform, inputs and outputs."""
        try:
            meta = self.backend.model_metadata(request.name, request.version, caller_of(context))
        except Exception as exc:
            await _abort(context, exc)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        """Run one inference."""
        try:
            caller = caller_of(context)
            infer_request = decode_grpc_request(request)
            response = await self.backend.infer(infer_request, caller)
            return encode_grpc_response(response, infer_request)
        except Exception as exc:
            await _abort(context, exc)

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answer each request on the stream, in order; errors go into ``error_message``."""
        try:
            caller = caller_of(context)
        except Exception as exc:
            await _abort(context, exc)
        async for message in request_iterator:
            try:
                request = decode_grpc_request(message)
                text = _text_input(request)
                if text is None:
                    response = await self.backend.infer(request, caller)
                    out = encode_grpc_response(response, request)
                    out.parameters[FINAL_RESPONSE].bool_param = True
                    yield pb.ModelStreamInferResponse(infer_response=out)
                else:
                    async for reply in self._generate(request, text, caller):
                        yield reply
            except InferenceError as exc:
                yield pb.ModelStreamInferResponse(error_message=str(exc))
            except Exception as exc:
                _log.exception("grpc_stream_request_failed", error_type=type(exc).__name__)
                yield pb.ModelStreamInferResponse(
                    error_message=f"internal error: {type(exc).__name__}"
                )

    async def _generate(
        self, request: InferRequest, text: str, caller: Caller
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        generate = decode_generate_request(
            model=request.model,
            version=request.version,
            text_input=text,
            parameters=request.parameters,
            request_id=request.id,
        )
        iterator = self.backend.generate(generate, caller)
        final = False
        try:
            async for chunk in iterator:
                final = chunk.final
                yield _chunk_response(chunk, generate)
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()
        if not final:  # the backend ended without marking a piece final: say so, empty
            empty = pb.ModelInferResponse(
                model_name=request.model, model_version=request.version, id=request.id
            )
            empty.parameters[FINAL_RESPONSE].bool_param = True
            yield pb.ModelStreamInferResponse(infer_response=empty)


def add_to_server(servicer: InferenceServicer, server: Any) -> None:
    """Register ``servicer`` on a ``grpc.aio.Server`` (or ``grpc.Server``)."""
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


__all__ = [
    "FINAL_RESPONSE",
    "ROUTE_KEY",
    "TEXT_INPUT",
    "TEXT_OUTPUT",
    "InferenceServicer",
    "add_to_server",
    "caller_of",
]
