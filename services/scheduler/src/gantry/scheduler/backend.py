"""The Kubernetes backend wired into the control loop (adapter).

With ``backend: kubernetes`` a placed job is not handed to Gantry node agents: the scheduler
creates one Kubernetes Job per worker on the nodes it chose (:mod:`gantry.scheduler.kube`),
deletes them on a stop request, and turns the pods' watch events into the same worker reports
the agents send — so the job lifecycle, preemption, usage and every event stay the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gantry.core import GantryError, get_logger
from gantry.events.catalog import WorkerPlacement
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
        """Delete the attempt's Jobs (a stop of some ranks deletes the whole attempt)."""
        del ranks
        try:
            self.backend.stop(job.id, job.attempt)
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


def attach_kubernetes(
    control: Control, options: KubernetesOptions, submit: Callable[[Callable[[], None]], object]
) -> KubernetesRunner:
    """Route ``control``'s launches and stops to Kubernetes and start the pod watch."""
    backend = KubeBackend(load_api_client(options.kubeconfig), options.namespace, KubeOptions())
    backend.ensure_priority_classes()
    runner = KubernetesRunner(control, backend, options.image, submit=submit)
    control.launcher = runner.launch
    control.stopper = runner.stop
    runner.start()
    return runner


__all__ = ["KubernetesRunner", "attach_kubernetes", "kube_job"]
