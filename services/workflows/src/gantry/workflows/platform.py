"""What a run does to the rest of the platform (adapter): jobs through the scheduler, model
rollouts through serving — always *as the run's owner*.

The workflows service calls the other services' public APIs with its own service token and
the ``act-as`` headers naming the owner and the roles the owner had when they submitted the
pipeline or started the run, so the owner's quotas, priorities, RBAC rules and audit trail
apply (the orchestrator role lets it act as a user, never do more than that user may).
:class:`Platform` is the port the controller uses; :class:`ServicePlatform` is the real one.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from gantry.core import TlsSettings
from gantry.workflows.pipelines import Deploy


@dataclass(frozen=True)
class Owner:
    """Whom a call is made for."""

    subject: str
    roles: tuple[str, ...]


@dataclass(frozen=True)
class JobStatus:
    """A job as a step needs to see it."""

    id: str
    state: str
    reason: str = ""
    model: str = ""
    dataset_version: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    attempt: int = 0
    device_seconds: float = 0.0
    """Run time times devices (GPUs, or 1 per CPU-only worker), over its workers."""
    rendezvous: str = ""
    """``host:port`` where its running rank 0 listens (a dev session's server)."""

    @property
    def terminal(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Rollout:
    """Where a model version stands in a deployment."""

    deployment: str
    version: int
    weight: int = 0
    role: str = ""
    state: str = ""
    phase: str = ""
    """The canary's phase: "", progressing, promoted or rolled_back."""
    detail: str = ""

    @property
    def promoted(self) -> bool:
        return self.role == "stable" and self.weight == 100

    @property
    def rolled_back(self) -> bool:
        return (
            self.phase == "rolled_back"
            or self.state == "failed"
            or (self.role == "" and self.weight == 0)
        )


class Platform(Protocol):
    """The calls a run makes."""

    def submit_job(self, document: Mapping[str, Any], *, request_id: str, owner: Owner) -> str:
        """Submit (idempotently: the same ``request_id`` returns the same job); the job id."""
        ...

    def job(self, job_id: str, *, owner: Owner) -> JobStatus:
        """The job's state and, once it succeeded, what it produced."""
        ...

    def cancel_job(self, job_id: str, reason: str, *, owner: Owner) -> None:
        """Cancel the job (a finished job is left as it is)."""
        ...

    def deploy(self, spec: Deploy, model: str, version: int, *, owner: Owner) -> Rollout:
        """Deploy ``model`` ``version`` (a canary when the deployment already serves one)."""
        ...

    def rollout(self, deployment: str, version: int, *, owner: Owner) -> Rollout | None:
        """Where ``version`` stands in ``deployment`` (None when it does not serve it)."""
        ...

    def answers(self, endpoint: str) -> bool:
        """Whether something accepts connections at ``endpoint`` (``host:port``) yet: a dev
        session's server is ``running`` only once it does."""
        ...


def tcp_answers(endpoint: str, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within ``timeout_s``."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class ServicePlatform:
    """:class:`Platform` over the scheduler and serving gRPC APIs (over TLS when ``tls`` is
    enabled)."""

    def __init__(
        self,
        scheduler_addr: Callable[[], str],
        serving_addr: Callable[[], str],
        token: Callable[[], str],
        *,
        timeout_s: float = 30.0,
        deploy_timeout_s: float = 600.0,
        tls: TlsSettings | None = None,
    ) -> None:
        self._scheduler_addr = scheduler_addr
        self._serving_addr = serving_addr
        self._token = token
        self._timeout = timeout_s
        self._deploy_timeout = deploy_timeout_s
        self._tls = tls

    def _scheduler(self, owner: Owner) -> Any:
        from gantry.client.scheduler import SchedulerClient

        return SchedulerClient(
            self._scheduler_addr(),
            self._token(),
            timeout_s=self._timeout,
            act_as=(owner.subject, owner.roles),
            tls=self._tls,
        )

    def _serving(self, owner: Owner, timeout_s: float) -> Any:
        from gantry.client.serving import ServingClient

        return ServingClient(
            self._serving_addr(),
            self._token(),
            timeout_s=timeout_s,
            act_as=(owner.subject, owner.roles),
            tls=self._tls,
        )

    def submit_job(self, document: Mapping[str, Any], *, request_id: str, owner: Owner) -> str:
        text = yaml.safe_dump(dict(document), sort_keys=False, width=1000)
        with self._scheduler(owner) as client:
            return str(client.submit(text, request_id=request_id).job.id)

    def job(self, job_id: str, *, owner: Owner) -> JobStatus:
        with self._scheduler(owner) as client:
            info = client.get(job_id)
        devices = max(info.gpu_milli / 1000, 1.0) * max(info.workers, 1)
        ran_ms = (info.finished_ms or int(time.time() * 1000)) - info.started_ms
        return JobStatus(
            id=info.id,
            state=info.state,
            reason=info.reason,
            model=info.model,
            dataset_version=getattr(info, "dataset_version", ""),
            metrics=dict(getattr(info, "metrics", {}) or {}),
            attempt=info.attempt,
            device_seconds=devices * ran_ms / 1000 if info.started_ms else 0.0,
            rendezvous=info.rendezvous,
        )

    def answers(self, endpoint: str) -> bool:
        return tcp_answers(endpoint)

    def cancel_job(self, job_id: str, reason: str, *, owner: Owner) -> None:
        with self._scheduler(owner) as client:
            info = client.get(job_id)
            if not info.terminal:
                client.cancel(job_id, reason=reason)

    def deploy(self, spec: Deploy, model: str, version: int, *, owner: Owner) -> Rollout:
        from gantry.client.errors import RemoteNotFound

        with self._serving(owner, self._deploy_timeout) as client:
            try:
                current = client.get(spec.deployment)
            except RemoteNotFound:
                current = None
            serving = current is not None and any(
                v.weight > 0 and v.state != "failed" for v in current.versions
            )
            already = _rollout(current, version) if current is not None else None
            if already is not None and not already.rolled_back:
                return already  # a restart after the call went through
            # the analysis is kept with the deployment, for this canary and the next ones
            info = client.deploy(
                model,
                version=version,
                name=spec.deployment,
                environment=spec.environment,
                canary_percent=spec.canary.percent if serving else 0,
                canary=spec.canary.analysis() or None,
                max_batch_size=spec.max_batch_size,
                max_queue_delay_us=spec.max_queue_delay_us,
            )
        found = _rollout(info, version)
        if found is None:
            return Rollout(spec.deployment, version, detail="the deployment does not list it")
        return found

    def rollout(self, deployment: str, version: int, *, owner: Owner) -> Rollout | None:
        from gantry.client.errors import RemoteNotFound

        with self._serving(owner, self._timeout) as client:
            try:
                info = client.get(deployment)
            except RemoteNotFound:
                return None
        return _rollout(info, version)


def _rollout(info: Any, version: int) -> Rollout | None:
    canary = info.canary
    phase = canary.phase if canary.canary_version == version else ""
    for v in info.versions:
        if v.version == version:
            return Rollout(info.name, version, v.weight, v.role, v.state, phase, v.reason)
    if phase == "rolled_back":
        return Rollout(info.name, version, 0, "", "", phase, canary.last_check)
    return None


def lineage_of(document: Mapping[str, Any]) -> Sequence[tuple[str, str, str]]:
    """``(kind, name, version)`` of what a job document reads: datasets and a model."""
    spec = document.get("spec") or {}
    out: list[tuple[str, str, str]] = [
        ("dataset", str(d.get("dataset", "")), str(d.get("version", "")))
        for d in spec.get("data") or ()
        if isinstance(d, Mapping)
    ]
    model = spec.get("model")
    if isinstance(model, Mapping):
        out.append(("model", str(model.get("name", "")), str(model.get("version", ""))))
    return out


__all__ = [
    "JobStatus",
    "Owner",
    "Platform",
    "Rollout",
    "ServicePlatform",
    "lineage_of",
    "tcp_answers",
]
