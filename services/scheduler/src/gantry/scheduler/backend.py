"""The Kubernetes backend wired into the control loop (adapter).

With ``backend: kubernetes`` a placed job is not handed to Gantry node agents: the scheduler
creates one Kubernetes Job per worker on the nodes it chose (:mod:`gantry.scheduler.kube`),
deletes them on a stop request, and turns the pods' watch events into the same worker reports
the agents send — so the job lifecycle, preemption, usage and every event stay the same.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes.client import CoreV1Api
from kubernetes.utils import parse_quantity

from gantry.core import GantryError, get_logger
from gantry.events.catalog import GpuDevice, NodeRegistered, WorkerPlacement
from gantry.sched.engine import Start
from gantry.scheduler.control import Control, JobRow
from gantry.scheduler.kube import (
    KubeBackend,
    KubeJob,
    KubeOptions,
    KubeWorker,
    WorkerStatus,
    load_api_client,
)
from gantry.scheduler.settings import KubernetesOptions

_log = get_logger("gantry.scheduler.backend")


def kube_job(job: JobRow, image: str) -> KubeJob:
    """The Kubernetes shape of a job's current attempt."""
    spec = job.spec.spec
    entry = spec.entrypoint
    command = (
        ("python", "-m", entry.module, *entry.args)
        if entry.module
        else (*entry.command, *entry.args)
    )
    workers = tuple(
        KubeWorker.from_placement(
            WorkerPlacement(
                worker=p["worker"],
                node=p["node"],
                gpus=[(int(i), int(m)) for i, m in p["gpus"]],
                cpu_milli=p["cpu_milli"],
                memory_mib=p["memory_mib"],
            )
        )
        for p in job.placements
    )
    return KubeJob(
        job_id=job.id,
        name=job.name,
        owner=job.owner,
        queue=job.queue,
        priority=job.priority,
        attempt=job.attempt,
        image=image,
        command=command,
        env={"GANTRY_RESUME": "1" if job.attempt > 1 else "0"},
        workers=workers,
        max_runtime_s=spec.max_runtime_s,
    )


class KubernetesRunner:
    """Launches, stops and watches jobs on Kubernetes for one :class:`Control`."""

    def __init__(
        self,
        control: Control,
        backend: KubeBackend,
        image: str,
        *,
        submit: Callable[[Callable[[], None]], object],
    ) -> None:
        self.control = control
        self.backend = backend
        self.image = image
        self._submit = submit  # runs a function on the control thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kube-watch", daemon=True)

    def launch(self, job: JobRow, start: Start) -> None:
        """Create the attempt's Jobs (called on the control thread after the commit)."""
        del start
        try:
            self.backend.launch(kube_job(job, self.image))
        except GantryError as exc:
            _log.error("kubernetes launch failed", job=job.id, error=str(exc))

    def stop(self, job: JobRow, ranks: list[int]) -> None:
        """Delete the attempt's Jobs (only the given ranks' for a shrink)."""
        try:
            self.backend.stop(job.id, job.attempt, ranks)
        except GantryError as exc:
            _log.error("kubernetes stop failed", job=job.id, error=str(exc))

    def start(self) -> None:
        """Start watching pods."""
        self._thread.start()

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.backend.watch(self._status, self._stop, timeout_s=60)
            except GantryError as exc:
                _log.warning("kubernetes watch failed; retrying", error=str(exc))
                self._stop.wait(5)

    def _status(self, status: WorkerStatus) -> None:
        def apply() -> None:
            self.control.worker_report(
                status.job_id,
                status.attempt,
                status.node,
                [status.worker],
                status.status,
                exit_code=status.exit_code,
                message=status.message,
            )

        if status.status != "pending":
            self._submit(apply)


#: Node labels Gantry reads: GPU model (NVIDIA GPU feature discovery), pool and rack.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
POOL_LABEL = "gantry.io/pool"
RACK_LABEL = "gantry.io/rack"
#: How often the node list is read (it stands in for the agents' heartbeats).
NODE_SYNC_S = 5.0


def _quantity(text: str) -> float:
    """A Kubernetes quantity (``64``, ``500m``, ``256Gi``) as a number."""
    return float(parse_quantity(text))  # type: ignore[no-untyped-call]


def nodes_from_kubernetes(items: list[dict[str, Any]]) -> list[tuple[NodeRegistered, bool]]:
    """Inventories of Kubernetes nodes (API JSON), each with whether the node is Ready.

    GPUs are the node's allocatable ``nvidia.com/gpu``, their model the GPU feature discovery
    label (``unknown`` without it); the pool and rack come from ``gantry.io/pool`` /
    ``gantry.io/rack`` (default pool ``default``). Cordoned nodes count as not ready.
    """
    out = []
    for item in items:
        meta = item.get("metadata", {})
        labels = meta.get("labels", {}) or {}
        status = item.get("status", {})
        alloc = status.get("allocatable") or status.get("capacity") or {}
        gpus = int(_quantity(alloc.get("nvidia.com/gpu", "0")))
        model = labels.get(GPU_PRODUCT_LABEL, "unknown")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", []) or []
        ) and not (item.get("spec", {}) or {}).get("unschedulable", False)
        node_labels = {"node": meta.get("name", "")}
        if RACK_LABEL in labels:
            node_labels["rack"] = labels[RACK_LABEL]
        out.append(
            (
                NodeRegistered(
                    node=meta.get("name", ""),
                    pool=labels.get(POOL_LABEL, "default"),
                    cpu_milli=int(_quantity(alloc.get("cpu", "0")) * 1000),
                    memory_mib=int(_quantity(alloc.get("memory", "0")) / (1 << 20)),
                    gpus=[GpuDevice(index=i, model=model) for i in range(gpus)],
                    labels=node_labels,
                    heartbeat_s=NODE_SYNC_S,
                    agent="kubernetes",
                ),
                ready,
            )
        )
    return out


class NodeSync:
    """Keeps the scheduler's node list equal to the Kubernetes cluster's (no agents there)."""

    def __init__(
        self,
        control: Control,
        api_client: Any,
        *,
        submit: Callable[[Callable[[], None]], object],
    ) -> None:
        self.control = control
        self.api = CoreV1Api(api_client)
        self._submit = submit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-nodes", daemon=True)

    def start(self) -> None:
        """Start syncing."""
        self._thread.start()

    def close(self) -> None:
        """Stop syncing."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                response: Any = self.api.list_node(_preload_content=False)
                nodes = nodes_from_kubernetes(orjson.loads(response.data).get("items", []))
            except Exception as exc:
                _log.warning("listing Kubernetes nodes failed; retrying", error=str(exc))
            else:
                self._submit(functools.partial(self.apply, nodes))
            self._stop.wait(NODE_SYNC_S)

    def apply(self, nodes: list[tuple[NodeRegistered, bool]]) -> None:
        """Register every node; a Ready node's listing counts as its heartbeat."""
        for inventory, ready in nodes:
            self.control.node_registered(inventory)
            if ready:
                self.control.heartbeat(inventory.node)


def attach_kubernetes(
    control: Control,
    options: KubernetesOptions,
    submit: Callable[[Callable[[], None]], object],
) -> tuple[KubernetesRunner, NodeSync]:
    """Route ``control``'s launches and stops to Kubernetes, sync its nodes, watch its pods.

    ``submit`` runs a function on the control thread (and asks for a scheduling pass).
    """
    api_client = load_api_client(options.kubeconfig)
    backend = KubeBackend(api_client, options.namespace, KubeOptions())
    backend.ensure_priority_classes()
    runner = KubernetesRunner(control, backend, options.image, submit=submit)
    control.launcher = runner.launch
    control.stopper = runner.stop
    sync = NodeSync(control, api_client, submit=submit)
    sync.start()
    runner.start()
    return runner, sync


__all__ = ["KubernetesRunner", "NodeSync", "attach_kubernetes", "kube_job", "nodes_from_kubernetes"]
