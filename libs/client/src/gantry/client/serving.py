"""The serving SDK: deploy registered models, move traffic, run canaries; call the models.

::

    from gantry.client.serving import ServingClient

    with ServingClient("127.0.0.1:7034", token) as serving:
        serving.deploy("churn-classifier")                       # v-latest at 100%
        serving.deploy("churn-classifier", version=2, canary_percent=10)
        print(serving.get("churn-classifier").canary.phase)      # progressing
        out = serving.infer("churn-classifier", {"INPUT__0": features})

Management calls go to ``gantry.serving.v1.ServingService``; :meth:`ServingClient.infer` and
:meth:`ServingClient.generate` speak the Open Inference Protocol's gRPC service (any KServe v2
or Triton client works as well). Records are frozen dataclasses; failures raise Gantry's typed
errors (see :mod:`gantry.client.errors`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from gantry.client._rpc import ActAs, RpcClient
from gantry.core import InvalidInput, TlsSettings
from gantry.protos.inference import grpc_service_pb2 as ipb
from gantry.protos.inference import grpc_service_pb2_grpc as ipb_grpc
from gantry.protos.v1 import serving_pb2 as pb
from gantry.protos.v1 import serving_pb2_grpc as pb_grpc

_DATATYPES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64", np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
}  # fmt: skip
_NUMPY = {name: dtype for dtype, name in _DATATYPES.items()}


@dataclass(frozen=True)
class VersionInfo:
    """One version of a deployment: its weight, role, state and live figures."""

    version: int
    weight: int
    role: str
    state: str
    reason: str
    instances: int
    quantized: bool
    device: str
    requests: int
    errors: int
    p99_ms: float
    queued: int


@dataclass(frozen=True)
class CanaryInfo:
    """Where a canary rollout stands ("" phase: none ever ran)."""

    phase: str
    canary_version: int
    stable_version: int
    weight: int
    failed_checks: int
    last_check: str
    started_ms: int
    updated_ms: int


@dataclass(frozen=True)
class HistoryItem:
    """One change of a deployment."""

    at_ms: int
    action: str
    detail: str
    actor: str


@dataclass(frozen=True)
class DeploymentInfo:
    """A deployment: its versions, canary, settings and history."""

    name: str
    model: str
    versions: tuple[VersionInfo, ...]
    canary: CanaryInfo
    history: tuple[HistoryItem, ...]
    environment: str
    device: str
    quantize: bool
    anonymous: bool
    sticky_header: str
    shadow_percent: int
    settings: Mapping[str, Any]
    follow_percent: int = 0

    @classmethod
    def from_pb(cls, d: pb.Deployment) -> DeploymentInfo:
        """From the protocol message."""
        c = d.canary
        return cls(
            name=d.name,
            model=d.model,
            versions=tuple(
                VersionInfo(
                    v.version,
                    v.weight,
                    v.role,
                    v.state,
                    v.reason,
                    v.instances,
                    v.quantized,
                    v.device,
                    v.requests,
                    v.errors,
                    v.p99_ms,
                    v.queued,
                )
                for v in d.versions
            ),
            canary=CanaryInfo(
                c.phase,
                c.canary_version,
                c.stable_version,
                c.weight,
                c.failed_checks,
                c.last_check,
                c.started_ms,
                c.updated_ms,
            ),
            history=tuple(HistoryItem(h.at_ms, h.action, h.detail, h.actor) for h in d.history),
            environment=d.environment,
            device=d.device,
            quantize=d.quantize,
            anonymous=d.anonymous,
            sticky_header=d.sticky_header,
            shadow_percent=d.shadow_percent,
            follow_percent=d.auto_canary_percent,
            settings={
                "max_batch_size": d.batching.max_batch_size,
                "max_queue_delay_us": d.batching.max_queue_delay_us,
                "queue_capacity": d.batching.queue_capacity,
                "timeout_ms": d.batching.timeout_ms,
                "min_instances": d.scaling.min_instances,
                "max_instances": d.scaling.max_instances,
                "canary": {
                    "step_percent": d.canary_spec.step_percent,
                    "max_percent": d.canary_spec.max_percent,
                    "interval_s": d.canary_spec.interval_s,
                    "failure_threshold": d.canary_spec.failure_threshold,
                    "min_success_rate": d.canary_spec.min_success_rate,
                    "max_p99_ms": d.canary_spec.max_p99_ms,
                    "min_requests": d.canary_spec.min_requests,
                },
            },
        )

    def weights(self) -> dict[int, int]:
        """Routed versions and their weights."""
        return {v.version: v.weight for v in self.versions if v.role != "shadow"}


class ServingClient(RpcClient):
    """A synchronous client of the serving service, authenticated with a bearer token."""

    service = "serving"

    def __init__(
        self,
        address: str,
        token: str | None,
        *,
        timeout_s: float = 120.0,
        act_as: ActAs | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(
            address,
            token,
            timeout_s=timeout_s,
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
            act_as=act_as,
            tls=tls,
        )
        self._stub = pb_grpc.ServingServiceStub(self._channel)
        self._infer = ipb_grpc.GRPCInferenceServiceStub(self._channel)

    # -- management --------------------------------------------------------------------------

    def deploy(
        self,
        model: str,
        *,
        version: int = 0,
        name: str = "",
        canary_percent: int = 0,
        shadow_percent: int = 0,
        environment: str = "",
        device: str = "",
        quantize: bool = False,
        anonymous: bool = False,
        sticky_header: str = "",
        max_batch_size: int = 0,
        max_queue_delay_us: int | None = None,
        queue_capacity: int = 0,
        timeout_ms: int = 0,
        min_instances: int = 0,
        max_instances: int = 0,
        canary: Mapping[str, float] | None = None,
        follow_percent: int = 0,
    ) -> DeploymentInfo:
        """Deploy ``model`` ``version`` (0 = latest): a new deployment, a hot swap, a canary at
        ``canary_percent`` or a shadow mirroring ``shadow_percent``. ``canary`` sets the
        analysis (step_percent, max_percent, interval_s, failure_threshold, min_success_rate,
        max_p99_ms, min_requests). ``follow_percent`` > 0 makes the deployment follow its model:
        each newly registered version starts a canary at that weight (-1 stops following).
        Returns once the version is loaded and warm (or raises
        why it cannot be served; what served before keeps serving)."""
        request = pb.DeployRequest(
            name=name, model=model, version=version, canary_percent=canary_percent,
            shadow_percent=shadow_percent, quantize=quantize, device=device,
            anonymous=anonymous, environment=environment, sticky_header=sticky_header,
            auto_canary_percent=follow_percent,
        )  # fmt: skip
        if max_batch_size or queue_capacity or timeout_ms or max_queue_delay_us is not None:
            request.batching.CopyFrom(
                pb.BatchingSpec(
                    max_batch_size=max_batch_size,
                    max_queue_delay_us=-1 if max_queue_delay_us is None else max_queue_delay_us,
                    queue_capacity=queue_capacity,
                    timeout_ms=timeout_ms,
                )
            )
        if min_instances or max_instances:
            request.scaling.CopyFrom(
                pb.ScalingSpec(min_instances=min_instances, max_instances=max_instances)
            )
        if canary:
            known = set(pb.CanarySpec.DESCRIPTOR.fields_by_name)
            unknown = sorted(set(canary) - known)
            if unknown:
                raise InvalidInput(
                    f"unknown canary setting(s) {', '.join(unknown)}",
                    hint=f"known: {', '.join(sorted(known))}",
                )
            request.canary_spec.CopyFrom(pb.CanarySpec(**canary))  # type: ignore[arg-type]
        return DeploymentInfo.from_pb(self._call("Deploy", request))

    def set_traffic(
        self, name: str, weights: Mapping[int, int] | None = None, *, sticky_header: str = ""
    ) -> DeploymentInfo:
        """Split traffic by hand (``{1: 90, 2: 10}``) and/or set the sticky header ("-" off)."""
        request = pb.SetTrafficRequest(
            name=name, weights=dict(weights or {}), sticky_header=sticky_header
        )
        return DeploymentInfo.from_pb(self._call("SetTraffic", request))

    def promote(self, name: str) -> DeploymentInfo:
        """Promote the canary now."""
        return DeploymentInfo.from_pb(self._call("Promote", pb.NameRequest(name=name)))

    def rollback(self, name: str, reason: str = "") -> DeploymentInfo:
        """Roll the canary back now."""
        request = pb.NameRequest(name=name, reason=reason)
        return DeploymentInfo.from_pb(self._call("Rollback", request))

    def undeploy(self, name: str) -> DeploymentInfo:
        """Remove the deployment (its versions finish the requests they hold)."""
        return DeploymentInfo.from_pb(self._call("Undeploy", pb.NameRequest(name=name)))

    def get(self, name: str) -> DeploymentInfo:
        """A deployment with live figures."""
        return DeploymentInfo.from_pb(self._call("GetDeployment", pb.NameRequest(name=name)))

    def list(self) -> list[DeploymentInfo]:
        """Every deployment."""
        reply = self._call("ListDeployments", pb.ListDeploymentsRequest())
        return [DeploymentInfo.from_pb(d) for d in reply.deployments]

    # -- inference ---------------------------------------------------------------------------

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str = "",
        route_key: str | None = None,
    ) -> tuple[str, dict[str, np.ndarray]]:
        """Run one inference over the Open Inference Protocol (gRPC, raw tensors); the version
        that answered and the outputs by name."""
        request = ipb.ModelInferRequest(model_name=name, model_version=version)
        for input_name, array in inputs.items():
            data = np.ascontiguousarray(array)
            datatype = _DATATYPES.get(data.dtype)
            if datatype is None:
                raise InvalidInput(
                    f"input {input_name} has dtype {data.dtype}, which the protocol lacks",
                    hint="use a numeric numpy dtype, e.g. float32 or int64",
                )
            tensor = request.inputs.add(name=input_name, datatype=datatype)
            tensor.shape.extend(data.shape)
            request.raw_input_contents.append(data.astype(data.dtype.newbyteorder("<")).tobytes())
        metadata = self._metadata + ((("x-gantry-route-key", route_key),) if route_key else ())
        try:
            reply = self._infer.ModelInfer(request, metadata=metadata, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        outputs = {}
        for i, out in enumerate(reply.outputs):
            dtype = _NUMPY.get(out.datatype)
            if dtype is None or i >= len(reply.raw_output_contents):
                continue
            raw = np.frombuffer(reply.raw_output_contents[i], dtype=dtype.newbyteorder("<"))
            outputs[out.name] = raw.astype(dtype).reshape(tuple(out.shape))
        return reply.model_version, outputs

    def generate(
        self,
        name: str,
        prompt: str,
        *,
        max_tokens: int = 64,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Iterator[str]:
        """Stream generated text piece by piece (Triton's ModelStreamInfer)."""
        request = ipb.ModelInferRequest(model_name=name)
        tensor = request.inputs.add(name="text_input", datatype="BYTES")
        tensor.shape.append(1)
        tensor.contents.bytes_contents.append(prompt.encode())
        request.parameters["max_tokens"].int64_param = max_tokens
        request.parameters["temperature"].double_param = temperature
        if seed is not None:
            request.parameters["seed"].int64_param = seed
        try:
            replies = self._infer.ModelStreamInfer(
                iter([request]), metadata=self._metadata, timeout=self._timeout
            )
            for reply in replies:
                if reply.error_message:
                    raise InvalidInput(reply.error_message)
                response = reply.infer_response
                for out in response.outputs:
                    if out.name != "text_output":
                        continue
                    if out.contents.bytes_contents:
                        yield out.contents.bytes_contents[0].decode()
                    elif response.raw_output_contents:
                        raw = response.raw_output_contents[0]
                        yield raw[4:].decode()
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.RpcError as exc:
            raise self._error(exc) from None


__all__ = ["CanaryInfo", "DeploymentInfo", "HistoryItem", "ServingClient", "VersionInfo"]
