"""The management gRPC API (``gantry.serving.v1.ServingService``): handlers only.

The interceptor lets in callers who may ``read`` models; what a call changes is authorised
here with its attributes — ``deploy`` on ``model`` for the deployment's environment (an
ml-developer deploys to staging only) — and every decision is recorded. The work is done by
:class:`~gantry.serving.rollout.Rollouts`.
"""

from __future__ import annotations

from typing import Any

from gantry.core import PermissionDenied
from gantry.events.catalog import AuthzDecision
from gantry.protos.v1 import serving_pb2 as pb
from gantry.protos.v1 import serving_pb2_grpc
from gantry.security import Authorizer, MethodRule, Principal, current_principal
from gantry.security.interceptor import DecisionSink
from gantry.security.rpc_errors import rpc_errors
from gantry.serving.deployments import CanaryPolicy, Deployment, ServingSpec
from gantry.serving.fleet import DeploymentRuntime
from gantry.serving.gate import SERVICE_NAME
from gantry.serving.rollout import Rollouts

SERVICE = "gantry.serving.v1.ServingService"
_READ = MethodRule("read", "model")
METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/{name}": _READ
    for name in (
        "Deploy",
        "SetTraffic",
        "Promote",
        "Rollback",
        "Undeploy",
        "GetDeployment",
        "ListDeployments",
    )
}


class ServingApi(serving_pb2_grpc.ServingServiceServicer):
    """Deployments, traffic and canaries."""

    def __init__(self, rollouts: Rollouts, authorizer: Authorizer, sink: DecisionSink) -> None:
        self.rollouts = rollouts
        self.authorizer = authorizer
        self.sink = sink

    def _may_deploy(self, principal: Principal, name: str, environment: str, method: str) -> None:
        decision = self.authorizer.decide(
            principal.subject, principal.roles, "deploy", "model", {"environment": environment}
        )
        self.sink.record(
            AuthzDecision(
                principal=principal.subject,
                roles=list(principal.roles),
                action="deploy",
                resource_kind="model",
                resource_name=name,
                decision="allow" if decision.allowed else "deny",
                reason=decision.reason,
                service=SERVICE_NAME,
                method=f"/{SERVICE}/{method}",
                via=principal.via,
                address=principal.address,
            ),
            actor=principal.subject,
        )
        if not decision.allowed:
            raise PermissionDenied(
                principal.subject,
                "deploy",
                f"model {name} ({environment})",
                reason=decision.reason,
                hint="ml-developers deploy to staging; production needs a platform admin",
            )

    def _environment(self, name: str) -> str:
        running = self.rollouts.deployments.get(name)
        return running.deployment.spec.environment if running else "staging"

    @rpc_errors
    async def Deploy(self, request: pb.DeployRequest, context: Any) -> pb.Deployment:
        """Create a deployment, swap its version, start a canary or add a shadow."""
        principal = current_principal()
        name = request.name or request.model
        existing = self.rollouts.deployments.get(name)
        given = request.HasField("batching") or request.HasField("scaling") or bool(
            request.device or request.quantize or request.anonymous or request.environment
            or request.sticky_header or request.auto_canary_percent
        )  # fmt: skip
        spec = _spec(request, existing) if existing is None or given else None
        target = spec if spec is not None else existing.deployment.spec if existing else None
        environment = target.environment if target else "staging"
        self._may_deploy(principal, name, environment, "Deploy")
        if existing is not None and existing.deployment.spec.environment != environment:
            # moving a deployment between environments needs the right to deploy to both
            self._may_deploy(principal, name, existing.deployment.spec.environment, "Deploy")
        policy = _policy(request.canary_spec) if request.HasField("canary_spec") else None
        deployment = await self.rollouts.deploy(
            model=request.model,
            version=request.version,
            name=request.name,
            canary_percent=request.canary_percent,
            shadow_percent=request.shadow_percent,
            spec=spec,
            canary_policy=policy,
            actor=principal.subject,
        )
        return self._pb(deployment)

    @rpc_errors
    async def SetTraffic(self, request: pb.SetTrafficRequest, context: Any) -> pb.Deployment:
        """A manual traffic split (A/B) or the sticky header."""
        principal = current_principal()
        self._may_deploy(principal, request.name, self._environment(request.name), "SetTraffic")
        deployment = await self.rollouts.set_traffic(
            request.name, dict(request.weights), request.sticky_header, actor=principal.subject
        )
        return self._pb(deployment)

    @rpc_errors
    async def Promote(self, request: pb.NameRequest, context: Any) -> pb.Deployment:
        """Promote the canary now."""
        principal = current_principal()
        self._may_deploy(principal, request.name, self._environment(request.name), "Promote")
        return self._pb(await self.rollouts.promote(request.name, actor=principal.subject))

    @rpc_errors
    async def Rollback(self, request: pb.NameRequest, context: Any) -> pb.Deployment:
        """Roll the canary back now."""
        principal = current_principal()
        self._may_deploy(principal, request.name, self._environment(request.name), "Rollback")
        deployment = await self.rollouts.rollback(
            request.name, request.reason, actor=principal.subject
        )
        return self._pb(deployment)

    @rpc_errors
    async def Undeploy(self, request: pb.NameRequest, context: Any) -> pb.Deployment:
        """Remove the deployment."""
        principal = current_principal()
        self._may_deploy(principal, request.name, self._environment(request.name), "Undeploy")
        return self._pb(await self.rollouts.undeploy(request.name, actor=principal.subject))

    @rpc_errors
    async def GetDeployment(self, request: pb.NameRequest, context: Any) -> pb.Deployment:
        """A deployment with its versions, canary state and history."""
        running = self.rollouts.get(request.name)
        return deployment_pb(running.deployment, running)

    @rpc_errors
    async def ListDeployments(
        self, request: pb.ListDeploymentsRequest, context: Any
    ) -> pb.ListDeploymentsResponse:
        """Every deployment."""
        return pb.ListDeploymentsResponse(
            deployments=[
                deployment_pb(r.deployment, r) for _, r in sorted(self.rollouts.deployments.items())
            ]
        )

    def _pb(self, deployment: Deployment) -> pb.Deployment:
        return deployment_pb(deployment, self.rollouts.deployments.get(deployment.name))


def _spec(request: pb.DeployRequest, existing: DeploymentRuntime | None) -> ServingSpec:
    base = existing.deployment.spec if existing else ServingSpec()
    b, s = request.batching, request.scaling
    return ServingSpec(
        max_batch_size=b.max_batch_size or base.max_batch_size,
        max_queue_delay_us=(
            b.max_queue_delay_us if request.HasField("batching") else base.max_queue_delay_us
        ),
        queue_capacity=b.queue_capacity or base.queue_capacity,
        timeout_ms=b.timeout_ms or base.timeout_ms,
        min_instances=s.min_instances or base.min_instances,
        max_instances=s.max_instances or base.max_instances,
        quantize=request.quantize or base.quantize,
        device=request.device or base.device,
        anonymous=request.anonymous or base.anonymous,
        environment=request.environment or base.environment,
        sticky_header=(request.sticky_header or base.sticky_header).lower(),
        shadow_percent=base.shadow_percent,
        auto_canary_percent=(
            0
            if request.auto_canary_percent < 0  # -1 turns following off
            else request.auto_canary_percent or base.auto_canary_percent
        ),
    )


def _policy(spec: pb.CanarySpec) -> CanaryPolicy:
    default = CanaryPolicy()
    return CanaryPolicy(
        step_percent=spec.step_percent or default.step_percent,
        max_percent=spec.max_percent or default.max_percent,
        interval_s=spec.interval_s or default.interval_s,
        failure_threshold=spec.failure_threshold or default.failure_threshold,
        min_success_rate=spec.min_success_rate or default.min_success_rate,
        max_p99_ms=spec.max_p99_ms or default.max_p99_ms,
        min_requests=spec.min_requests or default.min_requests,
    )


def deployment_pb(d: Deployment, running: DeploymentRuntime | None) -> pb.Deployment:
    """The protocol message of a deployment (with live figures when it runs here)."""
    versions = []
    for slot in d.slots:
        runtime = running.versions.get(slot.version) if running else None
        model = runtime.model if runtime else None
        batcher = runtime.batcher if runtime else None
        versions.append(
            pb.VersionState(
                version=slot.version,
                weight=slot.weight,
                role=slot.role,
                state=runtime.state if runtime else "unknown",
                reason=runtime.reason if runtime else "",
                instances=batcher.instances if batcher else 0,
                quantized=model.quantized if model else d.spec.quantize,
                device=model.device if model else d.spec.device,
                requests=runtime.requests if runtime else 0,
                errors=runtime.errors if runtime else 0,
                p99_ms=runtime.last_p99_ms if runtime else 0.0,
                queued=batcher.queued if batcher else 0,
            )
        )
    s, c, p = d.spec, d.canary, d.canary_policy
    return pb.Deployment(
        name=d.name,
        model=d.model,
        versions=versions,
        sticky_header=s.sticky_header,
        batching=pb.BatchingSpec(
            max_batch_size=s.max_batch_size,
            max_queue_delay_us=max(0, s.max_queue_delay_us),
            queue_capacity=s.queue_capacity,
            timeout_ms=s.timeout_ms,
        ),
        scaling=pb.ScalingSpec(min_instances=s.min_instances, max_instances=s.max_instances),
        canary_spec=pb.CanarySpec(
            step_percent=p.step_percent,
            max_percent=p.max_percent,
            interval_s=p.interval_s,
            failure_threshold=p.failure_threshold,
            min_success_rate=p.min_success_rate,
            max_p99_ms=p.max_p99_ms,
            min_requests=p.min_requests,
        ),
        canary=pb.CanaryStatus(
            phase=c.phase,
            canary_version=c.canary_version,
            stable_version=c.stable_version,
            weight=c.weight,
            failed_checks=c.failed_checks,
            last_check=c.last_check,
            started_ms=c.started_ms,
            updated_ms=c.updated_ms,
        ),
        quantize=s.quantize,
        device=s.device,
        anonymous=s.anonymous,
        environment=s.environment,
        shadow_percent=s.shadow_percent,
        auto_canary_percent=s.auto_canary_percent,
        history=[
            pb.HistoryEntry(at_ms=h.at_ms, action=h.action, detail=h.detail, actor=h.actor)
            for h in d.history
        ],
        created_ms=d.created_ms,
        updated_ms=d.updated_ms,
    )


__all__ = ["METHOD_RULES", "SERVICE", "ServingApi", "deployment_pb"]
