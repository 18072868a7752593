"""Run placed Gantry jobs on a Kubernetes cluster: the scheduler's Kubernetes backend.

Gantry's engine (:mod:`gantry.sched`) decides where every worker goes; this backend only carries
that decision out on Kubernetes instead of on Gantry's own node agents. The manifests therefore
pin each worker to its node and leave kube-scheduler nothing to decide:

* one ``batch/v1`` Job per worker, ``gantry-<job id>-a<attempt>-w<rank>``, with
  ``backoffLimit: 0`` (Gantry, not Kubernetes, decides whether a failed attempt runs again) and
  ``activeDeadlineSeconds`` = the job's max runtime;
* required node affinity on ``kubernetes.io/hostname`` = the placed node; cpu and memory
  requests equal to limits (Guaranteed QoS: what Gantry accounted is what the pod gets);
  ``nvidia.com/gpu`` for whole GPUs, or one unit of a shared-GPU resource for a fractional
  share (the NVIDIA device plugin cannot split a GPU; only a sharing plugin can);
* a PriorityClass per Gantry priority class (``gantry-low`` ...) with ``preemptionPolicy:
  Never``: Gantry preempts by stopping jobs itself, so kube-scheduler must not evict for it;
* one headless Service per attempt; every pod sets ``hostname``/``subdomain`` so worker 0 is
  ``<worker-0 name>.<service>``, the rendezvous ``MASTER_ADDR``. The Service is owned by
  worker 0's Job, so it goes when that Job's TTL expires.

Status comes back by watching the pods labelled ``app.kubernetes.io/managed-by=gantry-scheduler``
and mapping them onto the ``gantry.job.workers`` statuses::

    Running → started      Succeeded → succeeded      Failed → failed (exit code and reason)
    deleted (or being deleted) before it finished → stopped
    Pending and stuck (Unschedulable, ImagePullBackOff, ...) for stuck_after_s → failed

Label values are sanitised (and hashed when shortened) so Kubernetes accepts them; the exact job
id, owner and job name travel in annotations. API failures become :mod:`gantry.core` errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from kubernetes import client as kube_client
from kubernetes import config as _kube_config
from kubernetes import watch as _kube_watch
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gantry.core import (
    ConfigError,
    Conflict,
    GantryError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from gantry.events.catalog import JobWorkersReported, WorkerPlacement
from gantry.sched.spec import MILLI, PRIORITY_CLASSES

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gantry-scheduler"
#: Selects every object this backend creates.
MANAGED_SELECTOR = f"{MANAGED_BY}={MANAGER}"
JOB_ID = "gantry.io/job-id"  # label (sanitised) and annotation (exact)
ATTEMPT = "gantry.io/attempt"
WORKER = "gantry.io/worker"
QUEUE = "gantry.io/queue"
OWNER = "gantry.io/owner"
JOB_NAME = "gantry.io/job-name"
NODE = "gantry.io/node"
GPU_MILLI = "gantry.io/gpu-milli"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: ``exit_code`` of a worker whose container never ran or whose code is not known.
EXIT_UNKNOWN = -1
MAX_NAME = 63

WorkerState = Literal["pending", "started", "succeeded", "failed", "stopped"]
_TERMINAL = frozenset({"succeeded", "failed", "stopped"})
_RESERVED_ENV = frozenset(
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GANTRY_JOB_ID",
     "GANTRY_ATTEMPT", "GANTRY_WORKER", "GANTRY_GPU_MILLI"}
)  # fmt: skip
# Waiting reasons that will not fix themselves; InvalidImageName never will, so it fails at once.
_STUCK_WAITING = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
     "CreateContainerError", "RunContainerError"}
)  # fmt: skip
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
_UNREACHABLE: tuple[type[Exception], ...] = (HTTPError, OSError)
_FAILURES: tuple[type[Exception], ...] = (ApiException, *_UNREACHABLE)
# The client's config and watch modules are only partly annotated.
kube_config: Any = _kube_config
kube_watch: Any = _kube_watch


@dataclass(frozen=True)
class KubeOptions:
    """How jobs are shaped on Kubernetes; one per backend, built from the scheduler settings."""

    ttl_after_finished_s: int = 3600
    """Seconds a finished Job and its pods are kept: an hour to read a failure's logs, short
    enough that finished pods do not pile up."""
    run_as_user: int | None = 1000
    """UID the workers run as. Pods always set ``runAsNonRoot``; a UID makes images whose
    ``USER`` is root (most base images) start anyway. ``None`` trusts the image's own non-root
    numeric ``USER``."""
    shared_gpu_resource: str = "nvidia.com/gpu.shared"
    """Extended resource a fractional-GPU worker requests one unit of: the name a GPU sharing
    device plugin (time-slicing or MPS, ``renameByDefault: true``) advertises."""
    rendezvous_port: int = 29500
    """``MASTER_PORT``: torch.distributed's conventional port."""
    stuck_after_s: float = 300.0
    """Seconds a pod may stay unschedulable or unable to pull its image before its worker is
    reported failed: long enough for a slow registry or a node coming back, short enough that a
    gang does not hold its other GPUs for long."""
    watch_poll_s: int = 5
    """Seconds one watch request lasts: how soon :meth:`KubeBackend.watch` notices its stop
    event and re-checks stuck pods."""
    request_timeout_s: float = 30.0
    """Seconds to wait for the API server on each call."""

    def __post_init__(self) -> None:
        problems = []
        if self.ttl_after_finished_s < 0:
            problems.append("ttl_after_finished_s must be 0 or more seconds")
        if self.run_as_user is not None and self.run_as_user < 1:
            problems.append("run_as_user must be a non-root UID (1 or more) or None")
        if not 1 <= self.rendezvous_port <= 65535:
            problems.append("rendezvous_port must be a TCP port (1..65535)")
        if self.stuck_after_s < 0:
            problems.append("stuck_after_s must be 0 or more seconds")
        if self.watch_poll_s < 1:
            problems.append("watch_poll_s must be at least 1 second")
        if self.request_timeout_s <= 0:
            problems.append("request_timeout_s must be more than 0 seconds")
        if problems:
            raise ConfigError("invalid Kubernetes backend options: " + "; ".join(problems))


@dataclass(frozen=True)
class KubeWorker:
    """One placed worker: its rank, the node Gantry chose and what it takes there.

    ``gpus`` counts whole GPUs. ``gpu_milli`` is a share of ONE GPU in thousandths, as in the
    TrainingJob spec: 0 for CPU or whole-GPU workers, 1000 for exactly one whole GPU, 1..999
    for a fractional share (then ``gpus`` is 0 or 1).
    """

    rank: int
    node: str
    gpus: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs to request from the NVIDIA device plugin (0 for a fractional share)."""
        if self.gpu_milli:
            return 1 if self.gpu_milli >= MILLI else 0
        return self.gpus

    @property
    def fractional(self) -> bool:
        """Whether this worker takes a share of one GPU."""
        return 0 < self.gpu_milli < MILLI

    @property
    def milli_gpus(self) -> int:
        """GPU demand in milli-GPU (whole GPUs times 1000, or the share of one)."""
        return self.gpu_milli if self.gpu_milli else self.gpus * MILLI

    @classmethod
    def from_placement(cls, placement: WorkerPlacement) -> KubeWorker:
        """The worker a ``gantry.job.scheduled`` placement describes."""
        shares = [milli for _, milli in placement.gpus]
        if len(shares) == 1 and shares[0] < MILLI:
            gpus, gpu_milli = 1, shares[0]
        elif any(share != MILLI for share in shares):
            raise InvalidInput(
                f"worker {placement.worker} takes GPU shares {shares}: on Kubernetes a worker "
                "takes whole GPUs or a share of exactly one",
                hint="place fractional workers on one GPU each",
            )
        else:
            gpus, gpu_milli = len(shares), 0
        return cls(
            placement.worker,
            placement.node,
            gpus,
            gpu_milli,
            placement.cpu_milli,
            placement.memory_mib,
        )


@dataclass(frozen=True)
class KubeJob:
    """One attempt of a placed job: what runs, as whom, and where each worker goes."""

    job_id: str
    name: str
    owner: str
    queue: str
    priority: int
    attempt: int
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    workers: tuple[KubeWorker, ...]
    max_runtime_s: int


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker's pod says, in ``gantry.job.workers`` terms.

    ``status`` is one of that event's statuses, except ``pending``, which only
    :meth:`KubeBackend.worker_statuses` returns (a snapshot must say something about a pod that
    has not started); :meth:`KubeBackend.watch` never reports it. ``exit_code`` is the
    container's, or :data:`EXIT_UNKNOWN` when it never ran.
    """

    job_id: str
    attempt: int
    worker: int
    node: str
    status: WorkerState
    exit_code: int
    message: str

    def to_event(self) -> JobWorkersReported:
        """The ``gantry.job.workers`` event data for this status."""
        if self.status == "pending":
            raise InvalidInput(
                f"worker {self.worker} of job {self.job_id} is pending, which is no "
                "gantry.job.workers status",
                hint="report it once it starts, fails or stops",
            )
        return JobWorkersReported(
            job_id=self.job_id,
            attempt=self.attempt,
            node=self.node,
            workers=[self.worker],
            status=self.status,
            exit_code=self.exit_code,
            message=self.message,
        )


# -- names and labels ---------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _shorten(clean: str, original: str, room: int, strip: str) -> str:
    """``clean`` when it is ``original`` and fits; else its head plus a hash of ``original``, so
    two ids that sanitise alike still get different names."""
    if clean == original and len(clean) <= room:
        return clean
    head = clean[: room - 9].rstrip(strip)
    return f"{head}-{_digest(original)}" if head else _digest(original)


def object_name(job_id: str, attempt: int, rank: int | None = None) -> str:
    """The DNS-1123 label (≤ 63 chars) naming a worker's Job (or, without ``rank``, the
    attempt's Service): ``gantry-<job id>-a<attempt>[-w<rank>]``."""
    suffix = f"-a{attempt}" + ("" if rank is None else f"-w{rank}")
    room = MAX_NAME - len("gantry-") - len(suffix)
    clean = _NOT_DNS.sub("-", job_id.lower()).strip("-")
    return f"gantry-{_shorten(clean, job_id, room, '-')}{suffix}"


def label_value(text: str) -> str:
    """``text`` as a valid label value (≤ 63 chars of ``[A-Za-z0-9._-]``, alphanumeric ends)."""
    clean = _NOT_LABEL.sub("-", text).strip("-_.")
    return _shorten(clean, text, MAX_NAME, "-_.")


def job_selector(job_id: str, attempt: int | None = None) -> str:
    """The label selector of a job's objects (of one attempt, or of all)."""
    selector = f"{MANAGED_SELECTOR},{JOB_ID}={label_value(job_id)}"
    return selector if attempt is None else f"{selector},{ATTEMPT}={attempt}"


# -- manifests ----------------------------------------------------------------------------------


def priority_class_for(priority: int) -> str:
    """The PriorityClass of a numeric priority: the highest Gantry class whose value is at most
    ``priority`` (``gantry-low`` below the lowest)."""
    eligible = [(value, name) for name, value in PRIORITY_CLASSES.items() if value <= priority]
    name = max(eligible)[1] if eligible else min(PRIORITY_CLASSES, key=PRIORITY_CLASSES.__getitem__)
    return f"gantry-{name}"


def priority_class_manifests() -> list[dict[str, Any]]:
    """One ``scheduling.k8s.io/v1`` PriorityClass per Gantry priority class."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"gantry-{name}", "labels": {MANAGED_BY: MANAGER}},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": f"Gantry priority class {name!r}; Gantry preempts, not kube-scheduler",
        }
        for name, value in PRIORITY_CLASSES.items()
    ]


def _problems(job: KubeJob, namespace: str) -> list[str]:
    problems = []
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        problems.append(f"namespace {namespace!r} is not a DNS label")
    if job.attempt < 1:
        problems.append(f"attempt: {job.attempt} (must be 1 or more)")
    if not job.image.strip():
        problems.append("image: empty (name the container image the workers run)")
    if job.max_runtime_s < 1:
        problems.append(f"max_runtime_s: {job.max_runtime_s} (must be 1 or more seconds)")
    ranks = sorted(w.rank for w in job.workers)
    if ranks != list(range(len(job.workers))):
        problems.append(f"workers: ranks {ranks} (must be 0..n-1, each once)")
    for w in job.workers:
        where = f"workers[rank {w.rank}]"
        if not w.node:
            problems.append(f"{where}.node: empty (the node Gantry placed the worker on)")
        if w.gpus < 0 or not 0 <= w.gpu_milli <= MILLI:
            problems.append(
                f"{where}: gpus {w.gpus}, gpu_milli {w.gpu_milli} (gpus ≥ 0, gpu_milli 0..1000)"
            )
        elif w.gpu_milli and w.gpus > 1:
            problems.append(f"{where}: gpu_milli shares ONE GPU; it cannot go with gpus {w.gpus}")
        if w.cpu_milli < 0 or w.memory_mib < 0:
            problems.append(f"{where}: negative cpu_milli or memory_mib")
    reserved = sorted(_RESERVED_ENV & set(job.env))
    if reserved:
        problems.append(f"env: {', '.join(reserved)} are set by Gantry for the rendezvous")
    return problems


def _job_labels(job: KubeJob) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGER,
        JOB_ID: label_value(job.job_id),
        ATTEMPT: str(job.attempt),
        QUEUE: label_value(job.queue),
    }


def _service(job: KubeJob, namespace: str, opts: KubeOptions) -> dict[str, Any]:
    labels = _job_labels(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": object_name(job.job_id, job.attempt),
            "namespace": namespace,
            "labels": labels,
            "annotations": {JOB_ID: job.job_id},
        },
        "spec": {
            "clusterIP": "None",
            "selector": {k: labels[k] for k in (MANAGED_BY, JOB_ID, ATTEMPT)},
            # workers resolve worker 0 before any of them is "ready"
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": "rendezvous",
                    "port": opts.rendezvous_port,
                    "targetPort": opts.rendezvous_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _worker_job(job: KubeJob, w: KubeWorker, namespace: str, opts: KubeOptions) -> dict[str, Any]:
    name = object_name(job.job_id, job.attempt, w.rank)
    service = object_name(job.job_id, job.attempt)
    labels = {**_job_labels(job), WORKER: str(w.rank)}
    annotations = {JOB_ID: job.job_id, JOB_NAME: job.name, OWNER: job.owner, NODE: w.node}
    uses_gpu = w.milli_gpus > 0
    if uses_gpu:
        annotations[GPU_MILLI] = str(w.milli_gpus)
    env = {
        "RANK": str(w.rank),
        "WORLD_SIZE": str(len(job.workers)),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": f"{object_name(job.job_id, job.attempt, 0)}.{service}",
        "MASTER_PORT": str(opts.rendezvous_port),
        "GANTRY_JOB_ID": job.job_id,
        "GANTRY_ATTEMPT": str(job.attempt),
        "GANTRY_WORKER": str(w.rank),
    }
    if w.fractional:
        env["GANTRY_GPU_MILLI"] = str(w.gpu_milli)
    env.update(job.env)
    amounts: dict[str, str] = {}
    if w.cpu_milli:
        amounts["cpu"] = f"{w.cpu_milli}m"
    if w.memory_mib:
        amounts["memory"] = f"{w.memory_mib}Mi"
    if w.whole_gpus:
        amounts[GPU_RESOURCE] = str(w.whole_gpus)
    elif w.fractional:
        amounts[opts.shared_gpu_resource] = "1"
    container: dict[str, Any] = {
        "name": "worker",
        "image": job.image,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "rendezvous", "containerPort": opts.rendezvous_port, "protocol": "TCP"}],
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if job.command:
        container["command"] = list(job.command)
    pod_security: dict[str, Any] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if opts.run_as_user is not None:
        pod_security |= {"runAsUser": opts.run_as_user, "runAsGroup": opts.run_as_user}
    node_term = {
        "matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [w.node]}]
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class_for(job.priority),
        "hostname": name,
        "subdomain": service,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [node_term]}
            }
        },
        "securityContext": pod_security,
        # workers need no Kubernetes API access and no service environment variables
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
    }
    if uses_gpu:
        pod_spec["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "completions": 1,
            "parallelism": 1,
            "activeDeadlineSeconds": job.max_runtime_s,
            "ttlSecondsAfterFinished": opts.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def job_manifests(
    job: KubeJob, namespace: str, options: KubeOptions | None = None
) -> list[dict[str, Any]]:
    """The attempt's headless Service, then one Job per worker in rank order.

    Raises :class:`~gantry.core.InvalidInput` listing every problem with ``job``.
    """
    problems = _problems(job, namespace)
    if problems:
        raise InvalidInput(
            f"job {job.job_id} cannot run on Kubernetes: " + "; ".join(problems),
            hint="fix the placement or the job spec",
        )
    opts = options or KubeOptions()
    workers = sorted(job.workers, key=lambda w: w.rank)
    return [_service(job, namespace, opts)] + [
        _worker_job(job, w, namespace, opts) for w in workers
    ]


# -- pod status ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PodView:
    key: str
    status: WorkerStatus
    stuck: bool = False
    hopeless: bool = False


def _view(pod: Mapping[str, Any], *, deleted: bool = False) -> _PodView | None:
    """What a pod (as the API's JSON) says about its worker; ``None`` for foreign pods."""
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    try:
        attempt, worker = int(labels[ATTEMPT]), int(labels[WORKER])
    except (KeyError, ValueError):
        return None
    job_id = notes.get(JOB_ID) or labels.get(JOB_ID, "")
    node = (pod.get("spec") or {}).get("nodeName") or notes.get(NODE, "")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    key = meta.get("uid") or meta.get("name") or f"{job_id}/{attempt}/{worker}"

    def view(state: WorkerState, code: int = 0, message: str = "", **kw: bool) -> _PodView:
        return _PodView(
            key, WorkerStatus(job_id, attempt, worker, node, state, code, message), **kw
        )

    terminated = [
        cs["state"]["terminated"]
        for cs in status.get("containerStatuses") or ()
        if (cs.get("state") or {}).get("terminated")
    ]
    if phase == "Succeeded":
        return view("succeeded")
    if phase == "Failed":
        parts = [p for p in (status.get("reason"), status.get("message")) if p]
        code = EXIT_UNKNOWN
        if terminated:
            code = int(terminated[0].get("exitCode", EXIT_UNKNOWN))
            reason = terminated[0].get("reason") or "Error"
            detail = terminated[0].get("message")
            parts.append(f"{reason} (exit code {code})" + (f": {detail}" if detail else ""))
        return view("failed", code, "; ".join(parts) or "the pod failed")
    if deleted or meta.get("deletionTimestamp"):
        message = "the pod was deleted before it finished"
        for cond in status.get("conditions") or ():
            if cond.get("type") == "DisruptionTarget":  # eviction, preemption, taint, kubelet
                message += f" ({cond.get('reason')}: {cond.get('message', '')})"
        return view("stopped", EXIT_UNKNOWN, message)
    if phase == "Running":
        return view("started")
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return view(
                "pending", EXIT_UNKNOWN, f"Unschedulable: {cond.get('message', '')}", stuck=True
            )
    for cs in status.get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            message = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
            hopeless = waiting["reason"] == "InvalidImageName"
            return view("pending", EXIT_UNKNOWN, message, stuck=True, hopeless=hopeless)
    return view("pending", EXIT_UNKNOWN, status.get("reason") or "")


class _Tracker:
    """Turns a stream of pod events into one report per status change of each worker."""

    def __init__(self, stuck_after_s: float) -> None:
        self.stuck_after_s = stuck_after_s
        self._reported: dict[str, WorkerState] = {}
        self._stuck: dict[str, tuple[float, WorkerStatus]] = {}

    def observe(self, kind: str, pod: Mapping[str, Any]) -> list[WorkerStatus]:
        view = _view(pod, deleted=kind == "DELETED")
        if view is None:
            return []
        reports = self._observe(view)
        if kind == "DELETED":  # no more events for this pod: forget it
            self._reported.pop(view.key, None)
            self._stuck.pop(view.key, None)
        return reports

    def _observe(self, view: _PodView) -> list[WorkerStatus]:
        if self._reported.get(view.key) in _TERMINAL:
            return []  # a finished worker stays finished whatever its pod does next
        status = view.status
        if status.status == "pending":
            if not view.stuck:
                self._stuck.pop(view.key, None)
                return []
            since = self._stuck.get(view.key, (time.monotonic(), status))[0]
            self._stuck[view.key] = (since, status)
            return self._expire(view.key) if view.hopeless else self.expire()
        self._stuck.pop(view.key, None)
        if self._reported.get(view.key) == status.status:
            return []
        self._reported[view.key] = status.status
        return [status]

    def expire(self) -> list[WorkerStatus]:
        """Failures of pods stuck for ``stuck_after_s`` or more."""
        now = time.monotonic()
        due = [k for k, (since, _) in self._stuck.items() if now - since >= self.stuck_after_s]
        return [s for key in due for s in self._expire(key)]

    def _expire(self, key: str) -> list[WorkerStatus]:
        since, status = self._stuck.pop(key)
        waited = time.monotonic() - since
        self._reported[key] = "failed"
        message = f"stuck pending for {waited:.0f}s: {status.message}"
        return [replace(status, status="failed", exit_code=EXIT_UNKNOWN, message=message)]


# -- the backend --------------------------------------------------------------------------------


def load_api_client(kubeconfig: str | None = None) -> ApiClient:
    """An API client from ``kubeconfig``; without one, the pod's service account when running
    in a pod, else the default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
    if kubeconfig is None:
        configuration = kube_client.Configuration()
        try:
            kube_config.load_incluster_config(client_configuration=configuration)
            return kube_client.ApiClient(configuration)
        except kube_config.ConfigException:
            pass  # not in a pod
    try:
        api_client: ApiClient = kube_config.new_client_from_config(config_file=kubeconfig)
    except Exception as exc:  # the loader raises ConfigException, OSError, YAML errors, ...
        where = kubeconfig or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        raise ConfigError(
            f"cannot load a Kubernetes client configuration from {where}: {exc}",
            hint="run the scheduler in a pod with a ServiceAccount, or point "
            "GANTRY_SCHEDULER__KUBERNETES__KUBECONFIG at a readable kubeconfig file",
        ) from None
    return api_client


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason or "no reason given")


class KubeBackend:
    """Launches, stops and watches Gantry jobs in one namespace of a Kubernetes cluster.

    Every call is synchronous (run it in a thread from async code); creates are idempotent, so
    a launch retried after a timeout finishes the job's objects instead of failing. See
    ``docs/kubernetes-backend.md`` for the RBAC the scheduler's ServiceAccount needs.
    """

    def __init__(
        self, api_client: ApiClient, namespace: str, options: KubeOptions | None = None
    ) -> None:
        self.namespace = namespace
        self.options = options or KubeOptions()
        self._host = str(api_client.configuration.host)
        self._core = kube_client.CoreV1Api(api_client)
        self._batch = kube_client.BatchV1Api(api_client)
        self._scheduling = kube_client.SchedulingV1Api(api_client)

    def ensure_priority_classes(self) -> None:
        """Create the ``gantry-*`` PriorityClasses; existing ones must have Gantry's values."""
        for manifest in priority_class_manifests():
            name = manifest["metadata"]["name"]
            create = self._scheduling.create_priority_class
            if self._create("create", f"PriorityClass {name}", create, manifest) is not None:
                continue
            existing = self._call(
                "read", f"PriorityClass {name}", self._scheduling.read_priority_class, name
            )
            if existing.get("value") != manifest["value"]:
                raise Conflict(
                    f"PriorityClass {name} exists with value {existing.get('value')}, but Gantry "
                    f"needs {manifest['value']}",
                    hint=f"delete it (kubectl delete priorityclass {name}) so Gantry recreates it",
                )

    def launch(self, job: KubeJob) -> None:
        """Create the attempt's Jobs and Service (what already exists is kept).

        When a create fails, the objects already created for this attempt are deleted again,
        so no part of a gang is left waiting for workers that will never come.
        """
        manifests = job_manifests(job, self.namespace, self.options)
        service, jobs = manifests[0], manifests[1:]
        try:
            owner: dict[str, Any] | None = None
            for manifest in jobs:
                name = manifest["metadata"]["name"]
                created = self._create(
                    "create",
                    f"Job {name}",
                    self._batch.create_namespaced_job,
                    self.namespace,
                    manifest,
                )
                if created is None:  # already there: a retried launch
                    created = self._call(
                        "read", f"Job {name}", self._batch.read_namespaced_job, name, self.namespace
                    )
                owner = owner or created
            assert owner is not None  # _problems() insists on workers 0..n-1
            service["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                }
            ]
            name = service["metadata"]["name"]
            self._create(
                "create",
                f"Service {name}",
                self._core.create_namespaced_service,
                self.namespace,
                service,
            )
        except GantryError:
            with contextlib.suppress(GantryError):  # the first error is the one to report
                self.stop(job.job_id, job.attempt)
            raise

    def stop(self, job_id: str, attempt: int | None = None, workers: Sequence[int] = ()) -> None:
        """Delete the job's Jobs and Services (of one attempt, or all); Kubernetes then deletes
        their pods in the background, each with its termination grace period. With
        ``workers`` (a shrink), only those ranks' Jobs go; the Service stays."""
        selector = job_selector(job_id, attempt)
        target = f"the objects of job {job_id}"
        deletes = [
            self._batch.delete_collection_namespaced_job,
            self._core.delete_collection_namespaced_service,
        ]
        if workers:
            ranks = ",".join(str(w) for w in sorted(set(workers)))
            selector = f"{selector},{WORKER} in ({ranks})"
            target = f"workers {ranks} of job {job_id}"
            deletes = deletes[:1]
        for delete in deletes:
            self._call(
                "delete",
                target,
                delete,
                self.namespace,
                label_selector=selector,
                propagation_policy="Background",
            )

    def worker_statuses(self, job_id: str) -> list[WorkerStatus]:
        """The status of each of the job's worker pods now, by attempt and rank."""
        pods = self._call(
            "list",
            f"the pods of job {job_id}",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=job_selector(job_id),
        )
        views = (_view(pod) for pod in pods.get("items") or ())
        statuses = [v.status for v in views if v is not None]
        return sorted(statuses, key=lambda s: (s.attempt, s.worker))

    def watch(
        self,
        on_status: Callable[[WorkerStatus], None],
        stop: threading.Event,
        timeout_s: float | None = None,
    ) -> None:
        """Call ``on_status`` for each change of a Gantry worker pod in the namespace until
        ``stop`` is set (noticed within ``watch_poll_s``) or ``timeout_s`` passes.

        Each watch starts with the current state of every pod, so a restarted watcher reports
        each worker's status once more: consumers must treat reports as idempotent. Never
        reports ``pending``; a pod stuck pending is reported failed after ``stuck_after_s``.
        """
        tracker = _Tracker(self.options.stuck_after_s)
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        version: str | None = None

        def list_pods(*args: Any, **kwargs: Any) -> Any:
            # No return annotation on purpose: Watch then yields the raw JSON of each pod (its
            # documented fallback) instead of deserialising every event into models.
            return self._core.list_namespaced_pod(*args, **kwargs)

        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            window = max(1, math.ceil(min(self.options.watch_poll_s, left)))
            watcher = kube_watch.Watch()
            try:
                for event in watcher.stream(
                    list_pods,
                    self.namespace,
                    label_selector=MANAGED_SELECTOR,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=window,
                    _request_timeout=(
                        self.options.request_timeout_s,
                        window + self.options.request_timeout_s,
                    ),
                ):
                    pod = event.get("raw_object") or {}
                    version = (pod.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        for status in tracker.observe(event["type"], pod):
                            on_status(status)
                    if stop.is_set() or time.monotonic() >= deadline:
                        watcher.stop()
            except ApiException as exc:
                if exc.status != 410:
                    raise self._error(exc, "watch", "the Gantry pods") from None
                version = None  # the watch expired: start again from the current state
            except _UNREACHABLE as exc:
                raise self._error(exc, "watch", "the Gantry pods") from None
            for status in tracker.expire():
                on_status(status)

    # -- API calls ------------------------------------------------------------------------------

    def _call(
        self, action: str, target: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """``fn`` with a timeout; the JSON it answered (raw: no model round trip)."""
        try:
            response = fn(
                *args,
                _preload_content=False,
                _request_timeout=self.options.request_timeout_s,
                **kwargs,
            )
            try:
                body = json.loads(response.data or b"{}")
            finally:
                response.release_conn()
        except _FAILURES as exc:
            raise self._error(exc, action, target) from None
        return body if isinstance(body, dict) else {}

    def _create(
        self, action: str, target: str, fn: Callable[..., Any], *args: Any
    ) -> dict[str, Any] | None:
        """What ``fn`` created; ``None`` when the object already exists (409)."""
        try:
            return self._call(action, target, fn, *args)
        except Conflict:
            return None

    def _error(self, exc: Exception, action: str, target: str) -> GantryError:
        status = getattr(exc, "status", None) if isinstance(exc, ApiException) else None
        if not status:
            reason = getattr(exc, "reason", None) or exc
            return Unavailable(
                f"cannot reach the Kubernetes API at {self._host}: {reason}",
                hint="check the kubeconfig (server address, certificates) and that the API "
                "server is up",
            )
        assert isinstance(exc, ApiException)
        detail = _status_message(exc)
        if status == 401:
            return Unauthenticated(
                f"the Kubernetes API at {self._host} refused the scheduler's credentials: {detail}",
                hint="refresh the kubeconfig or the ServiceAccount token",
            )
        if status == 403:
            return PermissionDenied(
                "the scheduler's ServiceAccount",
                action,
                target,
                reason=detail,
                hint="grant it the Role and ClusterRole in docs/kubernetes-backend.md",
            )
        if status == 404:
            return NotFound(
                "Kubernetes object",
                target,
                hint=f"check that namespace {self.namespace!r} exists ({detail})",
            )
        if status == 409:
            return Conflict(f"cannot {action} {target}: {detail}")
        if status in (400, 422):
            return InvalidInput(
                f"the Kubernetes API rejected {target}: {detail}",
                hint="this is a Gantry bug; report it with this message",
            )
        return Unavailable(
            f"the Kubernetes API at {self._host} could not {action} {target} (HTTP {status}): "
            f"{detail}",
            hint="retry later",
        )


__all__ = [
    "EXIT_UNKNOWN",
    "MANAGED_SELECTOR",
    "KubeBackend",
    "KubeJob",
    "KubeOptions",
    "KubeWorker",
    "WorkerState",
    "WorkerStatus",
    "job_manifests",
    "job_selector",
    "label_value",
    "load_api_client",
    "object_name",
    "priority_class_for",
    "priority_class_manifests",
]
