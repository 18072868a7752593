"""The Kubernetes backend's glue: node inventories from the API, job shapes, status reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate

from gantry.scheduler.backend import kube_job, nodes_from_kubernetes
from gantry.scheduler.control import Control
from gantry.scheduler.kube import job_manifests
from gantry.scheduler.settings import SchedulerOptions
from gantry.scheduler.store import connect, migrate

SPEC = """apiVersion: gantry/v1
kind: TrainingJob
metadata: {name: bert, queue: default, priority: high}
spec:
  replicas: 2
  resources: {gpus: 2, cpus: 4, memory: 16Gi}
  entrypoint: {module: train, args: [--epochs, "1"]}
"""


def k8s_node(name: str, *, gpus: int, ready: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "63500m", "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_nodes_are_read_from_the_kubernetes_node_list() -> None:
    nodes = nodes_from_kubernetes(
        [
            k8s_node("gpu-a", gpus=8, **{"nvidia.com/gpu.product": "A100", "gantry.io/pool": "p"}),
            k8s_node("cpu-b", gpus=0, ready=False, **{"gantry.io/rack": "r2"}),
        ]
    )
    (a, a_ready), (b, b_ready) = nodes
    assert (a.node, a.pool, a.cpu_milli, a.memory_mib) == ("gpu-a", "p", 63500, 256 * 1024)
    assert [g.model for g in a.gpus] == ["A100"] * 8 and a_ready
    assert (b.pool, b.labels["rack"], b.gpus, b_ready) == ("default", "r2", [], False)


def test_a_placed_job_becomes_valid_kubernetes_jobs(tmp_path: Path) -> None:
    db = connect(f"sqlite:///{tmp_path / 's.db'}")
    migrate(db)
    control = Control(db, SchedulerOptions())
    control.recover()
    for node, (inventory, _) in zip(
        ("gpu-a", "gpu-b"),
        nodes_from_kubernetes([k8s_node("gpu-a", gpus=2), k8s_node("gpu-b", gpus=2)]),
        strict=True,
    ):
        control.node_registered(inventory)
        control.heartbeat(node)
    job, _ = control.submit(SPEC, owner="mia", roles=["ml-developer"])
    launched: list[Any] = []
    control.launcher = lambda row, start: launched.append(kube_job(row, "img:1"))
    control.schedule()
    (kj,) = launched
    assert kj.command == ("python", "-m", "train", "--epochs", "1")
    assert sorted(w.node for w in kj.workers) == ["gpu-a", "gpu-b"]
    assert all(w.gpus == 2 and w.cpu_milli == 4000 for w in kj.workers)
    for manifest in job_manifests(kj, "gantry-jobs"):
        kubernetes_validate.validate(manifest, "1.31", strict=True)
    # the pods' statuses drive the job like agent reports do
    for w in kj.workers:
        control.worker_report(job.id, 1, w.node, [w.rank], "started")
    assert control.get(job.id).state == "running"
    for w in kj.workers:
        control.worker_report(job.id, 1, w.node, [w.rank], "succeeded")
    assert control.get(job.id).state == "succeeded"
