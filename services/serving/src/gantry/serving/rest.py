"""The Open Inference Protocol over REST (KServe v2 / Triton HTTP), and Triton's generate extension.

Endpoints (``[/versions/{version}]`` = with or without a version)::

    GET  /v2                                                  server metadata
    GET  /v2/health/live, /v2/health/ready                    200 = yes, 400 = no
    GET  /v2/models/{name}[/versions/{version}]               model metadata
    GET  /v2/models/{name}[/versions/{version}]/ready         200 = yes, 400 = no
    POST /v2/models/{name}[/versions/{version}]/infer         inference (+ binary extension)
    POST /v2/models/{name}[/versions/{version}]/generate      text in, text out
    POST /v2/models/{name}[/versions/{version}]/generate_stream   Server-Sent Events

Every error answers ``{"error": "<message>"}`` with the error's HTTP status (unknown paths and
methods included); ``Overloaded`` adds ``Retry-After``. The infer path reads the body itself
(size limit, Triton's binary tensor data extension, gzip/deflate) and uses orjson, not pydantic.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gantry.core import get_logger
from gantry.serving.errors import (
    BadRequest,
    InferenceError,
    Overloaded,
    PayloadTooLarge,
)
from gantry.serving.protocol import (
    ROUTE_KEY,
    Caller,
    GenerateChunk,
    GenerateRequest,
    InferenceBackend,
    ModelMetadata,
)
from gantry.serving.tensors import (
    decode_generate_request,
    decode_rest_request,
    encode_rest_response,
    split_rest_body,
)

#: Request and response header with the length of the JSON part of a binary-extension body.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: Request header whose value keeps a caller on one version when routing is sticky.
ROUTE_KEY_HEADER = ROUTE_KEY

_log = get_logger("gantry.serving.rest")
_JSON = "application/json"
Endpoint = Callable[[Request], Awaitable[Response]]


def error_response(exc: InferenceError) -> Response:
    """``{"error": message}`` with the error's status (and ``Retry-After`` when overloaded)."""
    headers = None
    if isinstance(exc, Overloaded):
        headers = {"Retry-After": str(retry_after_seconds(exc))}
    return _json({"error": str(exc)}, exc.http_status, headers)


def retry_after_seconds(exc: Overloaded) -> int:
    """Whole seconds to wait before retrying (at least 1)."""
    seconds = exc.retry_after_s
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers=headers, media_type=_JSON)


def _guarded(handler: Endpoint) -> Endpoint:
    """The endpoint, answering its errors in the protocol's error shape."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except InferenceError as exc:
            return error_response(exc)
        except Exception as exc:
            _log.exception(
                "rest_endpoint_failed", path=request.url.path, error_type=type(exc).__name__
            )
            return _json({"error": f"internal error: {type(exc).__name__}"}, 500)

    return endpoint


def caller_of(request: Request) -> Caller:
    """Who calls: the bearer token, the sticky routing key and the (lower-cased) headers.

    The ``authorization`` header itself is left out of :attr:`Caller.headers` (its token is in
    :attr:`Caller.token`). A malformed ``Authorization`` header raises NotAuthenticated.
    """
    headers = {key.lower(): value for key, value in request.headers.items()}
    return Caller.from_headers(headers, protocol="rest", what="Authorization header")


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    return str(params["name"]), str(params.get("version", ""))


def _metadata_doc(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs
        ],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs
        ],
    }


def _chunk_doc(chunk: GenerateChunk) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_name": chunk.model,
        "model_version": chunk.version,
        "text_output": chunk.text_output,
        "index": chunk.index,
        "final": chunk.final,
    }
    if chunk.id:
        doc["id"] = chunk.id
    return doc


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def _aclose(iterator: AsyncIterator[GenerateChunk]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


class _Handlers:
    """The endpoints, over one backend."""

    def __init__(self, backend: InferenceBackend, max_body_bytes: int) -> None:
        self.backend = backend
        self.max_body_bytes = max_body_bytes

    async def read_body(self, request: Request) -> bytes:
        """The request body (decompressed), at most ``max_body_bytes``."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise BadRequest(f"Content-Length is {declared!r}; it must be a byte count")
            if int(declared) > limit:
                raise self._too_large(int(declared))
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise self._too_large(size)
            chunks.append(chunk)
        body = b"".join(chunks)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding not in ("gzip", "deflate"):
            raise BadRequest(
                f"Content-Encoding {encoding!r} is not supported; send the body uncompressed, "
                "gzip or deflate"
            )
        inflater = zlib.decompressobj(wbits=47)  # 32 + 15: zlib or gzip header, detected
        try:
            inflated = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise BadRequest(f"the body is not valid {encoding} data: {exc}") from None
        if len(inflated) > limit:
            raise self._too_large(len(inflated), inflated=True)
        if not inflater.eof:
            raise BadRequest(f"the {encoding} body is truncated")
        return inflated

    def _too_large(self, size: int, *, inflated: bool = False) -> PayloadTooLarge:
        what = "decompressed request body" if inflated else "request body"
        return PayloadTooLarge(
            f"the {what} is over {self.max_body_bytes} bytes"
            + ("" if inflated else f" ({size} bytes)"),
            hint="send smaller requests (fewer items per batch) or the tensors as binary data",
        )

    async def server_metadata(self, request: Request) -> Response:
        name, version, extensions = self.backend.server_metadata()
        return _json({"name": name, "version": version, "extensions": list(extensions)})

    async def live(self, request: Request) -> Response:
        if self.backend.live():
            return _json({"live": True})
        return _json({"live": False, "error": "the server is not live"}, 400)

    async def ready(self, request: Request) -> Response:
        if self.backend.ready():
            return _json({"ready": True})
        return _json({"ready": False, "error": "the server is not ready"}, 400)

    async def model_metadata(self, request: Request) -> Response:
        name, version = _model_path(request)
        meta = self.backend.model_metadata(name, version, caller_of(request))
        return _json(_metadata_doc(meta))

    async def model_ready(self, request: Request) -> Response:
        name, version = _model_path(request)
        if self.backend.model_ready(name, version, caller_of(request)):
            return _json({"name": name, "ready": True})
        return _json(
            {"name": name, "ready": False, "error": f"model {name!r} is not ready"},
            400,
        )

    async def infer(self, request: Request) -> Response:
        name, version = _model_path(request)
        caller = caller_of(request)
        body = await self.read_body(request)
        doc, binary = split_rest_body(body, request.headers.get(HEADER_LENGTH))
        infer_request = decode_rest_request(doc, model=name, version=version, binary=binary)
        response = await self.backend.infer(infer_request, caller)
        content, header_length = encode_rest_response(response, infer_request)
        if header_length is None:
            return Response(content, media_type=_JSON)
        return Response(
            content,
            headers={HEADER_LENGTH: str(header_length)},
            media_type="application/octet-stream",
        )

    async def _generate_request(self, request: Request) -> tuple[GenerateRequest, Caller]:
        name, version = _model_path(request)
        caller = caller_of(request)
        body = await self.read_body(request)
        doc, _ = split_rest_body(body, None)
        if not isinstance(doc, dict):
            raise BadRequest(
                'the request body must be a JSON object: {"text_input": "...", '
                '"parameters": {"max_tokens": ..., "temperature": ..., "seed": ...}}'
            )
        if "text_input" not in doc:
            raise BadRequest("the request needs 'text_input' (the prompt, a string)")
        parameters = doc.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequest("'parameters' must be an object")
        # Triton also takes the parameters at the top level; "parameters" wins.
        merged = {k: doc[k] for k in ("max_tokens", "temperature", "seed") if k in doc}
        merged.update(parameters)
        generate = decode_generate_request(
            model=name,
            version=version,
            text_input=doc["text_input"],
            parameters=merged,
            request_id=doc.get("id", ""),
        )
        return generate, caller

    async def generate(self, request: Request) -> Response:
        generate, caller = await self._generate_request(request)
        model, version, pieces = generate.model, generate.version, []
        iterator = self.backend.generate(generate, caller)
        try:
            async for chunk in iterator:
                model, version = chunk.model, chunk.version
                pieces.append(chunk.text_output)
        finally:
            await _aclose(iterator)
        doc: dict[str, Any] = {
            "model_name": model,
            "model_version": version,
            "text_output": "".join(pieces),
        }
        if generate.id:
            doc["id"] = generate.id
        return _json(doc)

    async def generate_stream(self, request: Request) -> Response:
        generate, caller = await self._generate_request(request)
        iterator = self.backend.generate(generate, caller)
        try:  # errors before the first piece still get a proper status code
            first: GenerateChunk | None = await anext(iterator)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await _aclose(iterator)
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                if first is None:
                    return
                yield _event(_chunk_doc(first))
                async for chunk in iterator:
                    yield _event(_chunk_doc(chunk))
            except InferenceError as exc:
                yield _event({"error": str(exc)})
            except Exception as exc:
                _log.exception("generate_stream_failed", error_type=type(exc).__name__)
                yield _event({"error": f"internal error: {type(exc).__name__}"})
            finally:
                await _aclose(iterator)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def routes(self) -> list[tuple[str, Endpoint, list[str]]]:
        """(path, endpoint, methods) of every endpoint."""
        routes: list[tuple[str, Endpoint, list[str]]] = [
            ("/v2", self.server_metadata, ["GET"]),
            ("/v2/health/live", self.live, ["GET"]),
            ("/v2/health/ready", self.ready, ["GET"]),
        ]
        for model in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            routes += [
                (model, self.model_metadata, ["GET"]),
                (model + "/ready", self.model_ready, ["GET"]),
                (model + "/infer", self.infer, ["POST"]),
                (model + "/generate", self.generate, ["POST"]),
                (model + "/generate_stream", self.generate_stream, ["POST"]),
            ]
        return routes


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths (404), wrong methods (405) and the like, in the protocol's error shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else None
    path = request.url.path
    if status == 404:
        message = f"no endpoint {path}; the inference API is under /v2 (GET /v2 describes it)"
    elif status == 405:
        allowed = (headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {path}; use {allowed}"
    else:
        message = str(exc.detail) if isinstance(exc, HTTPException) else "internal error"
    return _json({"error": message}, status, headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    return _json({"error": f"invalid request: {exc}"}, 400)


def create_app(backend: InferenceBackend, *, max_body_bytes: int) -> FastAPI:
    """The REST front end over ``backend``; bodies over ``max_body_bytes`` answer 413."""
    app = FastAPI(
        title="Gantry serving (Open Inference Protocol)",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    handlers = _Handlers(backend, max_body_bytes)
    for path, endpoint, methods in handlers.routes():
        app.add_route(path, _guarded(endpoint), methods=methods, include_in_schema=False)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    return app


__all__ = [
    "HEADER_LENGTH",
    "ROUTE_KEY_HEADER",
    "caller_of",
    "create_app",
    "error_response",
    "retry_after_seconds",
]
