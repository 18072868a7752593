"""The inference backend: what the REST and gRPC front ends call (see
:class:`~gantry.serving.protocol.InferenceBackend`).

A request is authorised (:class:`~gantry.serving.gate.Gate`), routed to a version (the one it
names, else by the deployment's weights, sticky by the deployment's header when it has one),
checked against that version's inputs, queued on its batcher and answered; its latency and
outcome feed the Prometheus metrics and the version's analysis window (the canary checks).
A shadow version gets a copy of the mirrored share in the background; its answer is thrown
away and never delays the caller. Generation runs one batched model call per token, so
concurrent streams share batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from importlib import metadata as importlib_metadata
from typing import Any

import numpy as np

from gantry.core import get_logger
from gantry.serving import metrics
from gantry.serving.errors import BadRequest, InferenceError, ModelNotFound, ModelNotReady
from gantry.serving.fleet import DeploymentRuntime, VersionRuntime
from gantry.serving.gate import Gate
from gantry.serving.protocol import (
    Caller,
    GenerateChunk,
    GenerateRequest,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Tensor,
)
from gantry.serving.rollout import Rollouts

SERVER_NAME = "gantry-serving"
EXTENSIONS = ("binary_tensor_data", "generate", "model_stream_infer")
#: Most tokens one generate call may ask for.
MAX_TOKENS = 2048
#: Shadow copies in flight at most; beyond it a copy is skipped (never queued without bound).
MAX_SHADOW_IN_FLIGHT = 64
_log = get_logger("gantry.serving")


def _package_version() -> str:
    try:
        return importlib_metadata.version("gantry-serving")
    except importlib_metadata.PackageNotFoundError:  # running from a source tree
        return "0"


class Backend:
    """Answers inference calls for every deployment of :class:`Rollouts`."""

    def __init__(self, rollouts: Rollouts, gate: Gate) -> None:
        self.rollouts = rollouts
        self.gate = gate
        self._version = _package_version()
        self._shadow_tasks: set[asyncio.Task[None]] = set()

    # -- health and metadata -----------------------------------------------------------------

    def live(self) -> bool:
        """The process answers."""
        return True

    def ready(self) -> bool:
        """Every deployment has a version that answers."""
        return all(
            any(v.ready for v in d.versions.values()) for d in self.rollouts.deployments.values()
        )

    def server_metadata(self) -> tuple[str, str, tuple[str, ...]]:
        """(name, version, extensions)."""
        return SERVER_NAME, self._version, EXTENSIONS

    def model_ready(self, name: str, version: str, caller: Caller) -> bool:
        """Whether the model (or that version) answers now."""
        running = self._deployment(name, caller, "infer", "ModelReady")
        if version:
            number = _number(version)
            runtime = running.versions.get(number)
            if runtime is None or runtime.state == "draining":
                running.version(number)  # raises ModelNotFound with the versions held
            return runtime is not None and runtime.ready
        return not running.router.empty

    def model_metadata(self, name: str, version: str, caller: Caller) -> ModelMetadata:
        """The model's inputs and outputs, from the version named or the stable one."""
        running = self._deployment(name, caller, "infer", "ModelMetadata")
        d = running.deployment
        if version:
            runtime = running.version(_number(version))
        else:
            candidates = [running.versions.get(d.stable_version()), *running.versions.values()]
            found = next((v for v in candidates if v is not None and v.ready), None)
            if found is None:
                raise ModelNotReady(
                    f"model {name!r} has no version loaded yet",
                    hint=f"retry when GET /v2/models/{name}/ready answers 200",
                )
            runtime = found
        model = runtime.model
        assert model is not None  # ready
        versions = tuple(str(s.version) for s in d.slots if s.role != "shadow")
        return ModelMetadata(d.name, versions, model.platform, model.inputs, model.outputs)

    # -- inference ---------------------------------------------------------------------------

    async def infer(self, request: InferRequest, caller: Caller) -> InferResponse:
        """Route, batch and run one request."""
        started = time.perf_counter()
        running = self._deployment(request.model, caller, "infer", "ModelInfer")
        runtime, shadow = self._route(running, request.version, caller)
        if shadow is not None:
            self._mirror(running, shadow, request, caller)
        return await self._run(running, runtime, request, caller, started)

    async def _run(
        self,
        running: DeploymentRuntime,
        runtime: VersionRuntime,
        request: InferRequest,
        caller: Caller,
        started: float,
    ) -> InferResponse:
        name, version = running.deployment.name, str(runtime.version)
        code: int | str = 200
        failed = False
        try:
            model = runtime.model
            batcher = runtime.batcher
            if model is None or batcher is None:
                raise ModelNotReady(f"model {name!r} version {version} is {runtime.state}")
            inputs = _ordered_inputs(request, model.inputs, name)
            timeout = _timeout(request)
            outputs = await batcher.submit(inputs, timeout_s=timeout)
            return InferResponse(
                model=name,
                version=version,
                id=request.id,
                outputs=_select_outputs(request, model.outputs, outputs, name),
            )
        except InferenceError as exc:
            code = exc.http_status
            failed = exc.http_status >= 500
            raise
        except asyncio.CancelledError:
            code = 499  # the caller went away
            raise
        except Exception:  # not the caller's mistake: a server-side failure (500)
            code, failed = 500, True
            raise
        finally:
            elapsed = time.perf_counter() - started
            if code != 499:
                runtime.record(elapsed, failed=failed)
            metrics.observe_request(name, version, _protocol(caller), code, elapsed)

    def _mirror(
        self,
        running: DeploymentRuntime,
        version: int,
        request: InferRequest,
        caller: Caller,
    ) -> None:
        runtime = running.versions.get(version)
        if runtime is None or not runtime.ready or len(self._shadow_tasks) >= MAX_SHADOW_IN_FLIGHT:
            return

        async def shadow() -> None:
            try:
                await self._run(running, runtime, request, caller, time.perf_counter())
            except InferenceError:
                pass  # counted in its metrics and window; the caller never sees it
            except Exception:  # a shadow must never hurt the service
                _log.exception("shadow request failed", deployment=running.deployment.name)

        task = asyncio.create_task(shadow())
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    # -- generation --------------------------------------------------------------------------

    def generate(self, request: GenerateRequest, caller: Caller) -> AsyncIterator[GenerateChunk]:
        """Check the call now (errors raise here), then stream the generated text."""
        running = self._deployment(request.model, caller, "infer", "Generate")
        runtime, _ = self._route(running, request.version, caller)
        model = runtime.model
        if model is None or model.generation is None:
            raise BadRequest(
                f"model {request.model!r} is not a generative model",
                hint="use /infer; generate works with models registered with a 'generation' "
                "signature (e.g. the example character transformer)",
            )
        if not 1 <= request.max_tokens <= MAX_TOKENS:
            raise BadRequest(f"max_tokens {request.max_tokens} must be 1..{MAX_TOKENS}")
        if not 0 <= request.temperature <= 10:
            raise BadRequest(f"temperature {request.temperature} must be 0..10 (0 = greedy)")
        generation = model.generation
        ids = generation.encode(request.text_input)
        return self._stream(running, runtime, request, caller, ids, generation)

    async def _stream(
        self,
        running: DeploymentRuntime,
        runtime: VersionRuntime,
        request: GenerateRequest,
        caller: Caller,
        ids: list[int],
        generation: Any,
    ) -> AsyncIterator[GenerateChunk]:
        rng = np.random.default_rng(request.seed)
        name, version = running.deployment.name, str(runtime.version)
        for index in range(request.max_tokens):
            window, position = generation.window(ids)
            started = time.perf_counter()
            batcher = runtime.batcher
            if batcher is None:
                raise ModelNotReady(f"model {name!r} version {version} was removed")
            try:
                (logits,) = await batcher.submit([window])
            except InferenceError as exc:
                runtime.record(time.perf_counter() - started, failed=exc.http_status >= 500)
                raise
            runtime.record(time.perf_counter() - started, failed=False)
            token = generation.sample(np.asarray(logits[0, position]), request.temperature, rng)
            ids.append(token)
            yield GenerateChunk(
                model=name,
                version=version,
                text_output=generation.decode([token]),
                index=index,
                final=index == request.max_tokens - 1,
                id=request.id,
            )

    # -- helpers -----------------------------------------------------------------------------

    def _deployment(self, name: str, caller: Caller, action: str, method: str) -> DeploymentRuntime:
        running = self.rollouts.deployments.get(name)
        if running is None:
            names = ", ".join(sorted(self.rollouts.deployments)) or "none"
            raise ModelNotFound(
                f"no model named {name!r} is deployed here (deployed: {names})",
                hint="check the name, or deploy it with `gantry serve deploy --model M`",
            )
        self.gate.check(
            caller.token,
            name,
            action,
            anonymous_ok=running.deployment.spec.anonymous,
            method=method,
        )
        return running

    def _route(
        self, running: DeploymentRuntime, version: str, caller: Caller
    ) -> tuple[VersionRuntime, int | None]:
        if version:
            return running.version(_number(version)), None
        if running.router.empty:
            raise ModelNotReady(
                f"model {running.deployment.name!r} has no version ready to answer",
                hint=f"retry when GET /v2/models/{running.deployment.name}/ready answers 200",
            )
        header = running.deployment.spec.sticky_header
        key = caller.headers.get(header) if header else None
        if key is None and header:
            key = caller.sticky_key
        route = running.router.route(key)
        return running.version(route.version), route.shadow


def _number(version: str) -> int:
    try:
        number = int(version)
    except ValueError:
        number = 0
    if number < 1:
        raise BadRequest(
            f"model version {version!r} is not a version number",
            hint="versions are 1, 2, 3, ... as the registry numbers them",
        )
    return number


def _protocol(caller: Caller) -> metrics.Protocol:
    return "grpc" if caller.protocol == "grpc" else "rest"


def _timeout(request: InferRequest) -> float | None:
    value = request.parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadRequest(
            f"parameter timeout {value!r} must be a positive number of microseconds",
            hint='e.g. "parameters": {"timeout": 500000} for half a second',
        )
    return float(value) / 1e6


def _ordered_inputs(request: InferRequest, specs: Any, name: str) -> list[np.ndarray]:
    """The request's input arrays in the model's order; BadRequest when they don't fit."""
    given = {t.name: t for t in request.inputs}
    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in given]
    unknown = [n for n in given if n not in expected]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing input(s) {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown input(s) {', '.join(unknown)}")
        raise BadRequest(
            f"model {name!r}: {'; '.join(parts)}",
            hint=f"it takes {', '.join(f'{s.name} ({s.datatype} {list(s.shape)})' for s in specs)}"
            f"; GET /v2/models/{name} shows its metadata",
        )
    arrays = []
    for spec in specs:
        tensor: Tensor = given[spec.name]
        if tensor.datatype != spec.datatype:
            raise BadRequest(
                f"model {name!r}: input {spec.name} is {tensor.datatype}, the model takes "
                f"{spec.datatype}",
                hint=f"send {spec.name} with datatype {spec.datatype}",
            )
        # checked here, not by the model in the batcher (where it would be a 500 ModelFailed)
        shape = tuple(np.shape(tensor.data))
        if len(shape) != len(spec.shape) or any(
            want >= 0 and got != want for want, got in zip(spec.shape[1:], shape[1:], strict=False)
        ):
            raise BadRequest(
                f"model {name!r}: input {spec.name} has shape {list(shape)}, the model takes "
                f"{list(spec.shape)} (-1 = any size, the first is the batch)",
                hint=f"send {spec.name} with shape {list(spec.shape)}",
            )
        arrays.append(tensor.data)
    return arrays


def _select_outputs(
    request: InferRequest, specs: Any, arrays: list[np.ndarray], name: str
) -> tuple[Tensor, ...]:
    tensors = {
        spec.name: Tensor(spec.name, spec.datatype, tuple(int(d) for d in array.shape), array)
        for spec, array in zip(specs, arrays, strict=False)
    }
    if not request.outputs:
        return tuple(tensors.values())
    chosen = []
    for wanted in request.outputs:
        tensor = tensors.get(wanted.name)
        if tensor is None:
            raise BadRequest(
                f"model {name!r} has no output {wanted.name!r}",
                hint=f"its outputs: {', '.join(tensors)}",
            )
        chosen.append(
            Tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data, wanted.parameters)
        )
    return tuple(chosen)


__all__ = ["EXTENSIONS", "MAX_TOKENS", "SERVER_NAME", "Backend"]
