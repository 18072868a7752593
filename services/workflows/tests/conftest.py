"""Shared pipeline documents for the workflows tests."""

from __future__ import annotations

import asyncio
import dataclasses
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gantry.core import ManualClock, NatsSettings, Unavailable
from gantry.workflows import store
from gantry.workflows.app import WorkflowService
from gantry.workflows.controller import Caller, Controller
from gantry.workflows.pipelines import Deploy
from gantry.workflows.platform import JobStatus, Owner, Rollout
from gantry.workflows.registry import Registry
from gantry.workflows.settings import WorkflowOptions, WorkflowSettings

CHURN = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Pipeline
    metadata:
      name: churn
      description: preprocess, train, evaluate, deploy when good enough
    spec:
      queue: research
      params:
        epochs: 3
        min_accuracy: 0.7
        source: "0123"
      steps:
        - name: preprocess
          data:
            commit: churn-features
            entrypoint: {transform: "gantry.training.examples.tabular:features"}
            data: [{dataset: churn, version: "${params.source}"}]
        - name: train
          train:
            replicas: 2
            entrypoint:
              task: gantry.training.examples.tabular:task
              args: ["epochs=${params.epochs}"]
            data:
              - {dataset: churn-features, version: "${steps.preprocess.outputs.version}"}
        - name: evaluate
          evaluate:
            model: ${steps.train.outputs.model}
            entrypoint: {task: gantry.training.examples.tabular:task}
            data:
              - {dataset: churn-features, version: "${steps.preprocess.outputs.version}"}
        - name: deploy
          gate:
            metric: ${steps.evaluate.outputs.metrics.accuracy}
            atLeast: ${params.min_accuracy}
          deploy:
            deployment: churn
            model: ${steps.evaluate.outputs.model}
            canary: {percent: 20}
    """
)


DEV = Caller("dev", ("ml-developer", "data-steward"))


class FakePlatform:
    """An in-process stand-in for the scheduler and serving (unit tests of the controller)."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, str] = {}
        self.submissions: list[tuple[str, str, Owner]] = []
        self.cancelled: list[str] = []
        self.deploys: list[tuple[str, str, int, Owner]] = []
        self.rollouts: dict[tuple[str, int], Rollout] = {}
        self.down = False
        self.silent: set[str] = set()  # endpoints that do not answer yet

    def answers(self, endpoint: str) -> bool:
        return endpoint not in self.silent

    def submit_job(self, document: Mapping[str, Any], *, request_id: str, owner: Owner) -> str:
        if self.down:
            raise Unavailable("scheduler down")
        if request_id in self.requests:
            return self.requests[request_id]
        job_id = f"job-{len(self.jobs) + 1}"
        self.jobs[job_id] = {"doc": dict(document), "state": "running", "owner": owner}
        self.requests[request_id] = job_id
        self.submissions.append((request_id, job_id, owner))
        return job_id

    def finish(self, job_id: str, state: str = "succeeded", **outputs: Any) -> None:
        self.jobs[job_id].update(state=state, **outputs)

    def submitted(self, step: str) -> bool:
        """Whether a job was submitted for ``step``."""
        return any(
            d["doc"]["metadata"]["labels"]["gantry.io/step"] == step for d in self.jobs.values()
        )

    def job_of(self, step: str) -> str:
        """The latest job submitted for ``step``."""
        found = [
            j
            for j, d in self.jobs.items()
            if d["doc"]["metadata"]["labels"]["gantry.io/step"] == step
        ]
        assert found, f"no job was submitted for {step}"
        return found[-1]

    def job(self, job_id: str, *, owner: Owner) -> JobStatus:
        if self.down:
            raise Unavailable("scheduler down")
        d = self.jobs[job_id]
        return JobStatus(
            id=job_id,
            state=d["state"],
            reason=d.get("reason", ""),
            model=d.get("model", ""),
            dataset_version=d.get("dataset_version", ""),
            metrics=d.get("metrics", {}),
            device_seconds=d.get("device_seconds", 0.0),
            rendezvous=d.get("rendezvous", ""),
        )

    def cancel_job(self, job_id: str, reason: str, *, owner: Owner) -> None:
        self.cancelled.append(job_id)
        self.jobs[job_id]["state"] = "cancelled"

    def deploy(self, spec: Deploy, model: str, version: int, *, owner: Owner) -> Rollout:
        self.deploys.append((spec.deployment, model, version, owner))
        serving = any(k[0] == spec.deployment for k in self.rollouts)
        r = Rollout(
            spec.deployment,
            version,
            spec.canary.percent if serving else 100,
            "canary" if serving else "stable",
            "ready",
            "progressing" if serving else "",
        )
        self.rollouts[(spec.deployment, version)] = r
        return r

    def rollout(self, deployment: str, version: int, *, owner: Owner) -> Rollout | None:
        return self.rollouts.get((deployment, version))

    def promote(self, deployment: str, version: int) -> None:
        r = self.rollouts[(deployment, version)]
        self.rollouts[(deployment, version)] = dataclasses.replace(
            r, weight=100, role="stable", phase="promoted"
        )


@dataclasses.dataclass
class Rig:
    platform: FakePlatform
    clock: ManualClock
    registry: Registry
    controller: Controller
    path: Path

    def restart(self) -> Rig:
        """A new controller on the same database (a restarted service)."""
        engine = store.connect(f"sqlite:///{self.path}")
        registry = Registry(engine, self.clock)
        return Rig(
            self.platform,
            self.clock,
            registry,
            Controller(engine, registry, self.platform, self.clock, resync_s=0, poll_s=0),
            self.path,
        )


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    path = tmp_path / "workflows.db"
    engine = store.connect(f"sqlite:///{path}")
    store.migrate(engine)
    clock = ManualClock()
    platform = FakePlatform()
    registry = Registry(engine, clock)
    controller = Controller(engine, registry, platform, clock, resync_s=0, poll_s=0)
    return Rig(platform, clock, registry, controller, path)


def workflow_service(data: Path, nats_url: str, platform: FakePlatform) -> WorkflowService:
    """The service as a process runs it, on ``nats_url``, with ``platform`` for the others."""
    settings = WorkflowSettings(
        data_dir=data,
        nats=NatsSettings(url=nats_url, reconnect_wait_s=0.1),
        workflows=WorkflowOptions(grpc_port=0, metrics_port=0, tick_s=0.1, resync_s=60, poll_s=60),
    )
    return WorkflowService(settings, platform=platform)


async def serving(service: WorkflowService) -> None:
    """Wait until ``service`` listens and consumes."""
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or service.intake is None:
            await asyncio.sleep(0.05)
