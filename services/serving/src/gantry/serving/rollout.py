"""Rollouts (the serving service's controller): deploy, swap, split, mirror, canary, promote,
roll back and remove — each change authorised by the caller, persisted with its history and
its event in one transaction, then applied to the running versions.

A new version is loaded and warmed up *before* it gets any traffic: if it cannot be loaded
(the registry refuses it, its bytes fail verification, torch cannot load it) the change is
refused with the reason and the versions already serving keep serving. A removed version is
drained in the background (its queued and running requests finish).

:meth:`Rollouts.analyse` runs the canary checks that are due and :meth:`Rollouts.autoscale`
feeds the autoscalers; the service calls both periodically.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from gantry.core import (
    Conflict,
    GantryError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unavailable,
    get_logger,
)
from gantry.events.catalog import (
    ServingChanged,
    ServingScaled,
    ServingVersionState,
    ServingVersionWeight,
)
from gantry.serving import metrics, store
from gantry.serving.artifact import Artifact
from gantry.serving.batcher import BatchingConfig
from gantry.serving.canary import judge
from gantry.serving.deployments import (
    MAX_HISTORY,
    CanaryPolicy,
    Change,
    Deployment,
    HistoryEntry,
    ServingSpec,
    check_name,
)
from gantry.serving.fleet import (
    DeploymentRuntime,
    VersionRuntime,
    batching_config,
    scaling_policy,
    start_version,
    stop_version,
)

if TYPE_CHECKING:  # torch loads with the first model, not with the service
    from gantry.serving.runtime import LoadedModel

_log = get_logger("gantry.serving")

#: How long a version restored after a restart waits for an unavailable registry.
RESTORE_RETRY_S = 300.0
#: Fetches a registered version: (model, version) -> Artifact. Version 0 = latest.
Fetch = Callable[[str, int], Artifact]


def now_ms() -> int:
    """Wall-clock milliseconds."""
    return int(time.time() * 1000)


class Rollouts:
    """Every deployment of this service, running."""

    def __init__(
        self,
        engine: sa.Engine,
        fetch: Fetch,
        *,
        batching: BatchingConfig,
        min_instances: int,
        max_instances: int,
        default_interval_s: float,
        drain_timeout_s: float,
        notify: Callable[[], None] = lambda: None,
        torch_threads: int = 0,
    ) -> None:
        """``torch_threads`` (> 0) sets torch's intra-op threads when the first model loads."""
        self.engine = engine
        self._torch_threads = torch_threads
        self._fetch = fetch
        self._batching = batching
        self._min_instances = min_instances
        self._max_instances = max_instances
        self._default_interval_s = default_interval_s
        self._drain_timeout_s = drain_timeout_s
        self._notify = notify
        self.deployments: dict[str, DeploymentRuntime] = {}
        self._lock = asyncio.Lock()
        self._next_check: dict[str, float] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # -- start and stop ----------------------------------------------------------------------

    async def restore(self) -> None:
        """Load every stored deployment and start its versions (in the background)."""
        for deployment in await asyncio.to_thread(store.load_all, self.engine):
            running = DeploymentRuntime(deployment)
            self.deployments[deployment.name] = running
            for version in deployment.versions():
                self._spawn(self._load_into(running, version, actor="gantry/serving"))
            if deployment.canary_active():
                self._next_check[deployment.name] = time.monotonic() + self._interval(deployment)
        if self.deployments:
            _log.info("deployments restored", deployments=sorted(self.deployments))

    async def close(self) -> None:
        """Stop every version (requests in flight finish, up to the drain timeout)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        stops = [
            stop_version(v, self._drain_timeout_s)
            for d in self.deployments.values()
            for v in d.versions.values()
        ]
        await asyncio.gather(*stops, return_exceptions=True)

    # -- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> DeploymentRuntime:
        """A deployment; :class:`NotFound` (with the names there are) otherwise."""
        running = self.deployments.get(name)
        if running is None:
            names = ", ".join(sorted(self.deployments)) or "none"
            raise NotFound(
                "deployment",
                name,
                hint=f"deployments: {names}; create one with gantry serve deploy",
            )
        return running

    # -- changes -----------------------------------------------------------------------------

    async def deploy(
        self,
        *,
        model: str,
        version: int,
        name: str = "",
        canary_percent: int = 0,
        shadow_percent: int = 0,
        spec: ServingSpec | None = None,
        canary_policy: CanaryPolicy | None = None,
        actor: str,
    ) -> Deployment:
        """Create a deployment, swap its version, start a canary or add a shadow."""
        check_name(model, "model")
        name = check_name(name or model)
        if canary_percent and shadow_percent:
            raise InvalidInput("a version is either a canary or a shadow, not both")
        async with self._lock:
            try:
                artifact = await asyncio.to_thread(self._fetch, model, version)
            except (NotFound, Unavailable, PermissionDenied):
                raise
            except GantryError as exc:  # e.g. the stored artefact failed verification
                reason = f"the registry could not give its artefact: {exc}"
                await asyncio.to_thread(self._record_failure, name, model, version, reason, actor)
                raise Conflict(
                    f"{model} v{version or 'latest'} cannot be served: {reason}",
                    hint="the versions already deployed keep serving",
                ) from None
            version = artifact.version
            running = self.deployments.get(name)
            if running is not None and running.deployment.model != model:
                raise Conflict(
                    f"deployment {name} serves model {running.deployment.model}, not {model}",
                    hint="choose another deployment name with --name",
                )
            if running is None:
                if canary_percent or shadow_percent:
                    raise Conflict(
                        f"deployment {name} does not exist yet, so it has no stable version",
                        hint="deploy a first version without --canary / --shadow",
                    )
                now = now_ms()
                fresh = Deployment(
                    name=name,
                    model=model,
                    spec=(spec or ServingSpec()).check(),
                    canary_policy=self._policy(canary_policy),
                    created_ms=now,
                    updated_ms=now,
                )
                running = DeploymentRuntime(fresh)
            held = running.versions.get(version)
            if held is not None and held.state == "failed" and not canary_percent:
                # a held version that could not be loaded (e.g. after a restart): load it again
                d = running.deployment
                await self._load_version(running, d, version, artifact, actor=actor)
                await self._commit(running, Change("reloaded", f"{model} v{version} loaded again"),
                                   actor)  # fmt: skip
                return d
            draft = _copy(running.deployment)
            # the options of an existing deployment change only when given
            if spec is not None:
                draft.spec = spec.check()
            if canary_policy is not None:
                draft.canary_policy = self._policy(canary_policy)
            if shadow_percent:
                change = draft.set_shadow(version, shadow_percent)
            elif canary_percent:
                change = draft.start_canary(version, canary_percent, now_ms())
            else:
                change = draft.deploy(version)
            for added in change.added:
                await self._load_version(running, draft, added, artifact, actor=actor)
            running.deployment = draft
            self.deployments[name] = running
            await self._commit(running, change, actor)
            if change.action == "canary.started":
                running.versions[version].window.take(time.monotonic())
                self._next_check[name] = time.monotonic() + self._interval(draft)
            return draft

    async def set_traffic(
        self, name: str, weights: Mapping[int, int], sticky_header: str, *, actor: str
    ) -> Deployment:
        """A manual split over held versions (and the sticky header: "-" clears it)."""
        async with self._lock:
            running = self.get(name)
            draft = _copy(running.deployment)
            change = draft.set_traffic(weights) if weights else None
            if sticky_header:
                header = "" if sticky_header == "-" else sticky_header.lower()
                draft.spec = replace(draft.spec, sticky_header=header).check()
                note = f"sticky routing by {header}" if header else "sticky routing off"
                change = (
                    Change("traffic", note)
                    if change is None
                    else replace(change, detail=f"{change.detail}; {note}")
                )
            if change is None:
                raise InvalidInput("give weights (e.g. 1=90 2=10) or a sticky header to set")
            running.deployment = draft
            await self._commit(running, change, actor)
            return draft

    async def promote(self, name: str, *, actor: str) -> Deployment:
        """Promote the canary now."""
        async with self._lock:
            running = self.get(name)
            draft = _copy(running.deployment)
            change = draft.promote(now_ms(), reason=f"promoted by {actor}")
            running.deployment = draft
            await self._commit(running, change, actor)
            return draft

    async def rollback(self, name: str, reason: str, *, actor: str) -> Deployment:
        """Roll the canary back now."""
        async with self._lock:
            running = self.get(name)
            draft = _copy(running.deployment)
            change = draft.rollback(now_ms(), reason=reason or f"rolled back by {actor}")
            running.deployment = draft
            await self._commit(running, change, actor)
            return draft

    async def undeploy(self, name: str, *, actor: str) -> Deployment:
        """Remove the deployment; its versions drain and unload."""
        async with self._lock:
            running = self.get(name)
            d = running.deployment
            entry = HistoryEntry(now_ms(), "removed", f"deployment {name} removed", actor)
            event = ServingChanged(deployment=name, model=d.model, action="removed",
                                   detail=entry.detail)  # fmt: skip

            def write() -> None:
                with self.engine.begin() as conn:
                    store.delete(conn, name, entry)
                    store.record(
                        conn, "gantry.serving.deployment.changed", event, actor=actor,
                        subject=f"deployment/{name}",
                    )  # fmt: skip

            await asyncio.to_thread(write)
            self._notify()
            del self.deployments[name]
            self._next_check.pop(name, None)
            for runtime in running.versions.values():
                metrics.forget_version(name, str(runtime.version))
                self._spawn(stop_version(runtime, self._drain_timeout_s))
            d.history.append(entry)
            return d

    # -- periodic work -----------------------------------------------------------------------

    async def analyse(self, now: float | None = None) -> list[Change]:
        """Run every canary check that is due; the changes made."""
        now = time.monotonic() if now is None else now
        made = []
        for name, due in list(self._next_check.items()):
            if now < due:
                continue
            async with self._lock:
                running = self.deployments.get(name)
                if running is None or not running.deployment.canary_active():
                    self._next_check.pop(name, None)
                    continue
                d = running.deployment
                self._next_check[name] = now + self._interval(d)
                canary = running.versions.get(d.canary.canary_version)
                if canary is None:
                    continue
                stats = canary.window.take(now)
                canary.last_p99_ms = stats.p99_ms
                verdict = judge(stats, d.canary_policy)
                draft = _copy(d)
                if verdict.outcome == "skipped":
                    draft.canary_skipped(verdict.summary, now_ms())
                    running.deployment = draft
                    await asyncio.to_thread(self._save, draft)
                    continue
                if verdict.outcome == "passed":
                    change = draft.canary_passed(verdict.summary, verdict.evidence, now_ms())
                else:
                    change = draft.canary_failed(verdict.summary, verdict.evidence, now_ms())
                running.deployment = draft
                await self._commit(running, change, "gantry/serving")
                made.append(change)
                if not draft.canary_active():
                    self._next_check.pop(name, None)
        return made

    async def autoscale(self, now: float | None = None) -> list[ServingScaled]:
        """Feed every ready version's autoscaler; the scaling changes made (also published)."""
        now = time.monotonic() if now is None else now
        events = []
        for running in list(self.deployments.values()):
            for runtime in list(running.versions.values()):
                before = runtime.batcher.instances if runtime.batcher else 0
                decision = runtime.scale(now)
                if decision is None:
                    continue
                event = ServingScaled(
                    deployment=running.deployment.name,
                    model=running.deployment.model,
                    version=runtime.version,
                    instances_from=before,
                    instances_to=decision.instances,
                    reason=decision.reason,
                )
                events.append(event)
                _log.info("version scaled", **event.model_dump())
        if events:
            await asyncio.to_thread(self._record_all, events)
        return events

    # -- internals ---------------------------------------------------------------------------

    def _policy(self, policy: CanaryPolicy | None) -> CanaryPolicy:
        chosen = policy or CanaryPolicy(interval_s=self._default_interval_s)
        return chosen.check()

    def _interval(self, deployment: Deployment) -> float:
        return deployment.canary_policy.interval_s or self._default_interval_s

    async def _load_version(
        self,
        running: DeploymentRuntime,
        d: Deployment,
        version: int,
        artifact: Artifact,
        *,
        actor: str,
    ) -> None:
        runtime = VersionRuntime(d.name, version)
        await self._start(runtime, d, artifact, actor)
        if not runtime.ready:
            raise Conflict(
                f"{d.model} v{version} cannot be served: {runtime.reason}",
                hint="the versions already deployed keep serving; fix or re-register the model",
            )
        old = running.versions.get(version)
        running.versions[version] = runtime
        if old is not None:
            self._spawn(stop_version(old, self._drain_timeout_s))

    async def _load_into(self, running: DeploymentRuntime, version: int, *, actor: str) -> None:
        """Load a stored version after a restart (failures stay visible in its state)."""
        d = running.deployment
        runtime = VersionRuntime(d.name, version)
        running.versions[version] = runtime
        delay = 0.5
        deadline = time.monotonic() + RESTORE_RETRY_S
        while True:
            try:
                artifact = await asyncio.to_thread(self._fetch, d.model, version)
                break
            except Unavailable as exc:  # the registry is not up yet (it starts beside us)
                if time.monotonic() + delay > deadline or running.versions.get(version) is not (
                    runtime
                ):
                    runtime.state, runtime.reason = "failed", str(exc)
                    await asyncio.to_thread(self._record_state, d, runtime, 0.0, actor)
                    return
                runtime.reason = f"waiting for the registry: {exc}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except Exception as exc:  # the registry refuses it: keep the reason
                runtime.state, runtime.reason = "failed", str(exc)
                await asyncio.to_thread(self._record_state, d, runtime, 0.0, actor)
                return
        await self._start(runtime, d, artifact, actor, loaded=running.rebuild_router)

    async def _start(
        self,
        runtime: VersionRuntime,
        d: Deployment,
        artifact: Artifact,
        actor: str,
        *,
        loaded: Callable[[], None] = lambda: None,
    ) -> None:
        """Load, warm up and start ``runtime`` with ``d``'s options; record how it went (after
        calling ``loaded``)."""
        spec = d.spec
        threads = self._torch_threads

        def load() -> LoadedModel:
            from gantry.serving.runtime import load_model, use_threads

            use_threads(threads)
            return load_model(artifact, device=spec.device, quantize=spec.quantize)

        started = time.monotonic()
        await start_version(
            runtime,
            d,
            load,
            batching_config(d, self._batching),
            scaling_policy(d, self._min_instances, self._max_instances),
        )
        loaded()
        await asyncio.to_thread(self._record_state, d, runtime, time.monotonic() - started, actor)

    async def _commit(self, running: DeploymentRuntime, change: Change, actor: str) -> None:
        d = running.deployment
        d.updated_ms = now_ms()
        entry = HistoryEntry(d.updated_ms, change.action, change.detail, actor)
        event = ServingChanged(
            deployment=d.name,
            model=d.model,
            action=change.action,
            versions=[
                ServingVersionWeight(version=s.version, weight=s.weight, role=s.role)
                for s in d.slots
            ],
            detail=change.detail,
            evidence=dict(change.evidence),
        )

        def write() -> None:
            with self.engine.begin() as conn:
                store.save(conn, d, entry)
                store.record(
                    conn, "gantry.serving.deployment.changed", event, actor=actor,
                    subject=f"deployment/{d.name}",
                )  # fmt: skip

        await asyncio.to_thread(write)
        self._notify()
        d.history.append(entry)
        del d.history[:-MAX_HISTORY]
        running.rebuild_router()
        _log.info("deployment changed", deployment=d.name, action=change.action,
                  detail=change.detail, actor=actor)  # fmt: skip
        for slot in d.slots:
            metrics.set_canary_weight(d.name, str(slot.version), slot.weight / 100)
        for version in change.removed:
            if d.slot(version) is None:
                metrics.forget_version(d.name, str(version))
                runtime = running.versions.pop(version, None)
                if runtime is not None:
                    self._spawn(stop_version(runtime, self._drain_timeout_s))

    def _save(self, deployment: Deployment) -> None:
        with self.engine.begin() as conn:
            store.save(conn, deployment)

    def _record_state(
        self, d: Deployment, runtime: VersionRuntime, load_s: float, actor: str
    ) -> None:
        model = runtime.model
        event = ServingVersionState(
            deployment=d.name,
            model=d.model,
            version=runtime.version,
            state=runtime.state,
            reason=runtime.reason,
            device=model.device if model else d.spec.device,
            quantized=model.quantized if model else d.spec.quantize,
            load_s=max(0.0, load_s),
        )
        with self.engine.begin() as conn:
            store.record(conn, "gantry.serving.version.state", event, actor=actor,
                         subject=f"deployment/{d.name}")  # fmt: skip
        self._notify()

    def _record_failure(self, name: str, model: str, version: int, reason: str, actor: str) -> None:
        event = ServingVersionState(
            deployment=name, model=model, version=max(1, version), state="failed", reason=reason
        )
        with self.engine.begin() as conn:
            store.record(conn, "gantry.serving.version.state", event, actor=actor,
                         subject=f"deployment/{name}")  # fmt: skip
        self._notify()

    def _record_all(self, events: list[ServingScaled]) -> None:
        with self.engine.begin() as conn:
            for event in events:
                store.record(conn, "gantry.serving.scaled", event, actor="gantry/serving",
                             subject=f"deployment/{event.deployment}")  # fmt: skip
        self._notify()

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _copy(d: Deployment) -> Deployment:
    """A working copy to apply a transition to (the original stays if it raises)."""
    return replace(d, slots=list(d.slots), history=d.history)


__all__ = ["Fetch", "Rollouts", "now_ms"]
