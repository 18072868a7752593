"""The loaded versions (runtime): each deployed version's model instances, its batcher, its
autoscaler and its analysis window, and the router over the versions that are ready.

A version is *loading* until its artefact is fetched (decrypted and digest-checked by the
registry), loaded, optionally quantised and warmed up; only then is it *ready* and only ready
versions get traffic. A removed version is *draining*: the router no longer picks it, the
requests already queued or running on it finish, then it is unloaded.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gantry.core import get_logger
from gantry.serving.autoscale import Autoscaler, ScaleDecision, ScalingPolicy
from gantry.serving.batcher import BatchingConfig, DynamicBatcher
from gantry.serving.canary import VersionWindow
from gantry.serving.deployments import Deployment
from gantry.serving.errors import ModelNotFound, ModelNotReady
from gantry.serving.router import Router

if TYPE_CHECKING:  # torch loads with the first model, not with the service
    from gantry.serving.runtime import LoadedModel

_log = get_logger("gantry.serving")


@dataclass
class VersionRuntime:
    """One deployed version as it runs."""

    deployment: str
    version: int
    state: str = "loading"  #: loading | ready | failed | draining
    reason: str = ""
    model: LoadedModel | None = None
    batcher: DynamicBatcher | None = None
    autoscaler: Autoscaler | None = None
    window: VersionWindow = field(default_factory=lambda: VersionWindow(time.monotonic()))
    requests: int = 0
    errors: int = 0
    last_p99_ms: float = 0.0

    @property
    def ready(self) -> bool:
        """It answers requests."""
        return self.state == "ready" and self.batcher is not None and self.model is not None

    def record(self, latency_s: float, *, failed: bool) -> None:
        """One finished request (for status and the canary analysis)."""
        self.requests += 1
        if failed:
            self.errors += 1
        self.window.record(latency_s, failed=failed)

    def scale(self, now: float) -> ScaleDecision | None:
        """Feed the autoscaler a load sample; its decision, applied, or None."""
        if not self.ready or self.autoscaler is None or self.batcher is None:
            return None
        self.autoscaler.observe(self.batcher.snapshot())
        decision = self.autoscaler.decide(self.batcher.instances)
        if decision is not None and decision.instances != self.batcher.instances:
            self.batcher.set_instances(decision.instances)
            return decision
        return None


@dataclass
class DeploymentRuntime:
    """A deployment and its versions as they run."""

    deployment: Deployment
    versions: dict[int, VersionRuntime] = field(default_factory=dict)
    router: Router = field(default_factory=lambda: Router(()))

    def rebuild_router(self) -> None:
        """Route over the versions that are ready; a version not ready gives its share to the
        others in proportion (a canary still loading leaves everything to the stable one)."""
        d = self.deployment
        ready = [s for s in d.slots if self.versions.get(s.version, _MISSING).ready]
        self.router = Router(ready, shadow_percent=d.spec.shadow_percent, salt=d.name)

    def version(self, version: int) -> VersionRuntime:
        """A held version that is ready; ModelNotFound / ModelNotReady otherwise."""
        runtime = self.versions.get(version)
        if runtime is None or runtime.state == "draining":
            held = ", ".join(str(v) for v in self.deployment.versions()) or "none"
            raise ModelNotFound(
                f"model {self.deployment.name!r} has no version {version} (versions: {held})",
                hint=f"GET /v2/models/{self.deployment.name} lists its versions",
            )
        if not runtime.ready:
            raise ModelNotReady(
                f"model {self.deployment.name!r} version {version} is {runtime.state}"
                + (f": {runtime.reason}" if runtime.reason else ""),
                hint="retry when GET /v2/models/{name}/versions/{v}/ready answers 200",
            )
        return runtime


_MISSING = VersionRuntime("", 0, state="missing")


def batching_config(deployment: Deployment, defaults: BatchingConfig) -> BatchingConfig:
    """The deployment's batching, with the service's defaults where it says 0."""
    s = deployment.spec
    return BatchingConfig(
        max_batch_size=s.max_batch_size or defaults.max_batch_size,
        max_queue_delay_us=(
            s.max_queue_delay_us if s.max_queue_delay_us >= 0 else defaults.max_queue_delay_us
        ),
        queue_capacity=s.queue_capacity or defaults.queue_capacity,
        timeout_s=s.timeout_ms / 1000.0 if s.timeout_ms else defaults.timeout_s,
    )


def scaling_policy(deployment: Deployment, minimum: int, maximum: int) -> ScalingPolicy:
    """The deployment's instance bounds, with the service's defaults where it says 0."""
    s = deployment.spec
    low = s.min_instances or minimum
    high = max(low, s.max_instances or maximum)
    return ScalingPolicy(min_instances=low, max_instances=high)


async def start_version(
    runtime: VersionRuntime,
    deployment: Deployment,
    load: Callable[[], LoadedModel],
    config: BatchingConfig,
    policy: ScalingPolicy,
) -> VersionRuntime:
    """Load, warm up and start batching one version; ``runtime.state`` says how it went."""
    started = time.monotonic()
    try:
        model = await asyncio.to_thread(load)
        await asyncio.to_thread(model.warm_up, config.max_batch_size)
    except Exception as exc:  # any load failure leaves the version failed, never the service
        runtime.state = "failed"
        runtime.reason = str(exc) if str(exc) else type(exc).__name__
        _log.warning(
            "model version failed to load",
            deployment=runtime.deployment,
            version=runtime.version,
            error=runtime.reason,
        )
        return runtime
    # A loaded model leaves many long-lived objects (modules, graphs); moved out of the
    # collector's sight, they no longer make full collections pause the serving (90-450 ms
    # pauses were seen under load before this).
    gc.collect()
    gc.freeze()
    runtime.model = model
    runtime.batcher = DynamicBatcher(
        model.run,
        config,
        instances=policy.min_instances,
        max_instances=policy.max_instances,
        labels={"deployment": deployment.name, "version": str(runtime.version)},
    )
    runtime.autoscaler = Autoscaler(policy)
    runtime.window = VersionWindow(time.monotonic())
    runtime.state = "ready"
    runtime.reason = f"loaded in {time.monotonic() - started:.2f} s"
    return runtime


async def stop_version(runtime: VersionRuntime, timeout_s: float) -> None:
    """Drain ``runtime`` (its requests finish) and unload it."""
    runtime.state = "draining"
    batcher = runtime.batcher
    if batcher is not None:
        try:
            await asyncio.wait_for(batcher.drain(), timeout_s)
        except TimeoutError:
            _log.warning(
                "version did not drain in time; closing it",
                deployment=runtime.deployment,
                version=runtime.version,
                timeout_s=timeout_s,
            )
        await batcher.close()
    runtime.model = None
    runtime.batcher = None


__all__ = [
    "DeploymentRuntime",
    "VersionRuntime",
    "batching_config",
    "scaling_policy",
    "start_version",
    "stop_version",
]
