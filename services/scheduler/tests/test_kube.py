"""The Kubernetes backend: its manifests against the Kubernetes OpenAPI schema, its client path
through the real ``kubernetes`` client against a small stand-in for the API server, and a real
cluster (k3s in Docker, through testcontainers) where a Docker engine answers."""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
from kubernetes import client

from gantry.core import ConfigError, Conflict, InvalidInput, NotFound, PermissionDenied, Unavailable
from gantry.events.catalog import JobWorkersReported, WorkerPlacement
from gantry.scheduler.kube import (
    EXIT_UNKNOWN,
    MANAGED_SELECTOR,
    KubeBackend,
    KubeJob,
    KubeOptions,
    KubeWorker,
    WorkerStatus,
    job_manifests,
    job_selector,
    load_api_client,
    priority_class_for,
    priority_class_manifests,
)
from gantry.testing import docker_unreachable_reason

NS = "gantry-jobs"
K8S_VERSION = "1.31"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def make_job(workers: tuple[KubeWorker, ...], **overrides: Any) -> KubeJob:
    job = KubeJob(
        job_id="j-3f2a9c81d0e4",
        name="resnet-ft",
        owner="alice@example.com",
        queue="vision",
        priority=1000,
        attempt=1,
        image="registry.example.com/train:1.4",
        command=("python", "-m", "train"),
        env={"EPOCHS": "3"},
        workers=workers,
        max_runtime_s=86400,
    )
    return replace(job, **overrides)


CPU_JOB = make_job((KubeWorker(0, "cpu-1", 0, 0, 500, 256),), job_id="j-00000000000a", priority=500)
GANG = make_job(
    tuple(KubeWorker(rank, f"gpu-{rank // 2}", 2, 0, 8000, 65536) for rank in range(4)),
    job_id="j-00000000000b",
)
FRACTIONAL = make_job((KubeWorker(0, "gpu-7", 1, 250, 2000, 8192),), job_id="j-00000000000c")


def containers(job_manifest: dict[str, Any]) -> dict[str, Any]:
    [container] = job_manifest["spec"]["template"]["spec"]["containers"]
    return container


def env_of(job_manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in containers(job_manifest)["env"]}


# -- the manifests against the Kubernetes schema --------------------------------------------------


def _all_manifests() -> list[Any]:
    manifests = priority_class_manifests()
    for job in (CPU_JOB, GANG, FRACTIONAL):
        manifests += job_manifests(job, NS)
    return [pytest.param(m, id=f"{m['kind']}:{m['metadata']['name']}") for m in manifests]


@pytest.mark.parametrize(
    "version", [K8S_VERSION, "1.27", kubernetes_validate.utils.latest_version()[:4]]
)
@pytest.mark.parametrize("manifest", _all_manifests())
def test_every_manifest_is_valid_kubernetes(manifest: dict[str, Any], version: str) -> None:
    assert kubernetes_validate.validate(manifest, version, strict=True) == version


def test_the_schema_check_can_fail() -> None:
    job = job_manifests(CPU_JOB, NS)[1]
    typo = copy.deepcopy(job)
    typo["spec"]["template"]["spec"]["nodeAfinity"] = {}  # unknown field: strict rejects it
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeAfinity"):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["backoffLimit"] = "none"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSION, strict=True)
    no_image = copy.deepcopy(job)
    del containers(no_image)["name"]
    with pytest.raises(kubernetes_validate.ValidationError, match="'name' is a required"):
        kubernetes_validate.validate(no_image, K8S_VERSION, strict=True)


# -- what the manifests say ----------------------------------------------------------------------


def test_a_gang_pins_each_worker_to_its_node_with_its_gpus() -> None:
    service, *jobs = job_manifests(GANG, NS)
    assert [j["metadata"]["name"] for j in jobs] == [
        f"gantry-j-00000000000b-a1-w{rank}" for rank in range(4)
    ]
    for worker, job in zip(GANG.workers, jobs, strict=True):
        pod = job["spec"]["template"]["spec"]
        [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term == {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [worker.node]}
            ]
        }
        resources = containers(job)["resources"]
        assert resources["limits"] == {"cpu": "8000m", "memory": "65536Mi", "nvidia.com/gpu": "2"}
        assert resources["requests"] == resources["limits"]
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert pod["priorityClassName"] == "gantry-high"
        assert pod["restartPolicy"] == "Never"
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels == {
            "app.kubernetes.io/managed-by": "gantry-scheduler",
            "gantry.io/job-id": "j-00000000000b",
            "gantry.io/attempt": "1",
            "gantry.io/worker": str(worker.rank),
            "gantry.io/queue": "vision",
        }
        notes = job["spec"]["template"]["metadata"]["annotations"]
        assert notes["gantry.io/owner"] == "alice@example.com"
        assert notes["gantry.io/gpu-milli"] == "2000"
        # rendezvous: worker 0 by its stable DNS name in the headless Service
        assert pod["subdomain"] == service["metadata"]["name"]
        env = env_of(job)
        assert env["RANK"] == str(worker.rank) and env["WORLD_SIZE"] == "4"
        assert (
            env["MASTER_ADDR"]
            == f"{jobs[0]['spec']['template']['spec']['hostname']}.{pod['subdomain']}"
        )
        assert env["MASTER_PORT"] == "29500"
        assert env["GANTRY_JOB_ID"] == "j-00000000000b" and env["GANTRY_ATTEMPT"] == "1"
        assert env["EPOCHS"] == "3"
        assert job["spec"]["backoffLimit"] == 0
        assert job["spec"]["activeDeadlineSeconds"] == 86400
        assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    selector = service["spec"]["selector"]
    assert all(
        j["spec"]["template"]["metadata"]["labels"].items() >= selector.items() for j in jobs
    )
    assert selector["gantry.io/attempt"] == "1"


def test_a_cpu_worker_asks_for_no_gpu_and_runs_unprivileged() -> None:
    _, job = job_manifests(CPU_JOB, NS)
    pod = job["spec"]["template"]["spec"]
    container = containers(job)
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert "tolerations" not in pod
    assert "gantry.io/gpu-milli" not in job["spec"]["template"]["metadata"]["annotations"]
    assert pod["priorityClassName"] == "gantry-normal"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert container["command"] == ["python", "-m", "train"]
    assert "alice@example.com" not in json.dumps(job["metadata"]["labels"])


def test_a_fractional_gpu_needs_a_sharing_plugin_and_says_its_share() -> None:
    _, job = job_manifests(FRACTIONAL, NS)
    limits = containers(job)["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    assert limits["nvidia.com/gpu.shared"] == "1"
    assert job["spec"]["template"]["metadata"]["annotations"]["gantry.io/gpu-milli"] == "250"
    assert env_of(job)["GANTRY_GPU_MILLI"] == "250"
    assert job["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    # a sharing plugin advertising another name
    options = KubeOptions(shared_gpu_resource="nvidia.com/gpu.mps")
    _, job = job_manifests(FRACTIONAL, NS, options)
    assert containers(job)["resources"]["limits"]["nvidia.com/gpu.mps"] == "1"
    # a share of 1000 is one whole GPU from the ordinary device plugin
    whole = make_job((KubeWorker(0, "gpu-7", 0, 1000, 1000, 1024),))
    _, job = job_manifests(whole, NS)
    assert containers(job)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "GANTRY_GPU_MILLI" not in env_of(job)


def test_names_and_labels_stay_valid_for_any_job_id() -> None:
    long_id = "J_" + "ABCDEF" * 20 + ".x"
    workers = tuple(KubeWorker(rank, "n" * 63, 0, 0, 100, 64) for rank in (0, 1))
    job = make_job(workers, job_id=long_id, attempt=12, queue="Team Vision/Prod")
    manifests = job_manifests(job, NS)
    other = job_manifests(replace(job, job_id=long_id[:-1] + "y"), NS)
    names = [m["metadata"]["name"] for m in manifests]
    assert len(set(names)) == 3
    assert not set(names) & {m["metadata"]["name"] for m in other}
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
        for value in manifest["metadata"]["labels"].values():
            assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value
        assert manifest["metadata"]["annotations"]["gantry.io/job-id"] == long_id
        assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    assert DNS_1035.fullmatch(names[0])  # Service names must start with a letter
    assert names[1].endswith("-a12-w0") and names[2].endswith("-a12-w1")
    assert manifests[1]["spec"]["template"]["spec"]["hostname"] == names[1]
    assert job_selector(long_id, 12).endswith(
        f"gantry.io/job-id={manifests[0]['metadata']['labels']['gantry.io/job-id']},"
        "gantry.io/attempt=12"
    )


@pytest.mark.parametrize(
    ("priority", "cls"),
    [
        (0, "low"),
        (100, "low"),
        (499, "low"),
        (500, "normal"),
        (999, "normal"),
        (1000, "high"),
        (4999, "high"),
        (5000, "critical"),
        (1_000_000, "critical"),
    ],
)
def test_priority_class_for(priority: int, cls: str) -> None:
    assert priority_class_for(priority) == f"gantry-{cls}"


def test_priority_classes_carry_gantrys_values_and_never_preempt() -> None:
    by_name = {m["metadata"]["name"]: m for m in priority_class_manifests()}
    assert {n: m["value"] for n, m in by_name.items()} == {
        "gantry-low": 100,
        "gantry-normal": 500,
        "gantry-high": 1000,
        "gantry-critical": 5000,
    }
    assert {m["preemptionPolicy"] for m in by_name.values()} == {"Never"}
    assert not any(m["globalDefault"] for m in by_name.values())


def test_a_job_that_cannot_run_says_every_problem() -> None:
    bad = make_job(
        (KubeWorker(0, "", 2, 500, 100, 64), KubeWorker(2, "n", 0, 0, 100, 64)),
        env={"RANK": "7", "MASTER_ADDR": "x"},
        max_runtime_s=0,
    )
    with pytest.raises(InvalidInput) as err:
        job_manifests(bad, NS)
    text = str(err.value)
    for expected in (
        "ranks [0, 2]",
        "node: empty",
        "cannot go with gpus 2",
        "max_runtime_s",
        "MASTER_ADDR, RANK",
    ):
        assert expected in text, text
    with pytest.raises(ConfigError, match="run_as_user"):
        KubeOptions(run_as_user=0)


def test_a_placement_becomes_a_worker() -> None:
    whole = WorkerPlacement(
        worker=3, node="n1", gpus=[(0, 1000), (1, 1000)], cpu_milli=4000, memory_mib=1024
    )
    assert KubeWorker.from_placement(whole) == KubeWorker(3, "n1", 2, 0, 4000, 1024)
    share = WorkerPlacement(worker=0, node="n1", gpus=[(5, 300)])
    assert KubeWorker.from_placement(share) == KubeWorker(0, "n1", 1, 300, 0, 0)
    with pytest.raises(InvalidInput, match="share of exactly one"):
        KubeWorker.from_placement(WorkerPlacement(worker=0, node="n", gpus=[(0, 500), (1, 500)]))


def test_a_status_becomes_a_gantry_job_workers_event() -> None:
    status = WorkerStatus("j-1", 2, 3, "n1", "failed", 3, "Error (exit code 3)")
    assert status.to_event() == JobWorkersReported(
        job_id="j-1",
        attempt=2,
        node="n1",
        workers=[3],
        status="failed",
        exit_code=3,
        message="Error (exit code 3)",
    )
    with pytest.raises(InvalidInput, match="pending"):
        replace(status, status="pending").to_event()


# -- the client path against a stand-in API server ------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/v1|apis/batch/v1|apis/scheduling\.k8s\.io/v1)(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<kind>jobs|services|pods|priorityclasses)(?:/(?P<name>[^/]+))?$"
)


@dataclass
class Request:
    method: str
    kind: str
    name: str | None
    query: dict[str, str]
    body: dict[str, Any] | None
    authorization: str | None


class KubeApi(ThreadingHTTPServer):
    """Just enough of the Kubernetes API: create, read and delete-collection of Jobs, Services
    and PriorityClasses (409 on a second create), pod lists with label selectors, and pod
    watches streaming scripted events. Every created object is checked against the schema."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.invalid: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.watch_batches: list[list[dict[str, Any]]] = []
        self.missing_namespaces: set[str] = set()
        self.refuse: Callable[[str, str, str | None], int | None] = lambda *_: None
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def of(self, method: str, kind: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.kind == kind]

    def stored(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: obj for (k, _, name), obj in self.objects.items() if k == kind}


_TERM = re.compile(r"([^,=\s]+)\s+in\s+\(([^)]*)\)|([^,=]+)=([^,]*)")


def _matches(obj: dict[str, Any], selector: str) -> bool:
    """Equality terms and set-based ``key in (a,b)`` terms, as the API server reads them."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in _TERM.finditer(selector):
        if term.group(1):
            if labels.get(term.group(1)) not in [v.strip() for v in term.group(2).split(",")]:
                return False
        elif labels.get(term.group(3)) != term.group(4):
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    server: KubeApi

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": reason,
                "message": message,
                "code": code,
            },
        )

    def _handle(self, method: str) -> None:
        server = self.server
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        match = _PATH.match(url.path)
        body = None
        if "Content-Length" in self.headers:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
        if match is None:
            return self._status(404, "NotFound", f"no route {url.path}")
        ns, kind, name = match.group("ns") or "", match.group("kind"), match.group("name")
        server.requests.append(
            Request(method, kind, name, query, body, self.headers.get("Authorization"))
        )
        refused = server.refuse(method, kind, name or (body or {}).get("metadata", {}).get("name"))
        if refused:
            return self._status(
                refused,
                "Forbidden" if refused == 403 else "InternalError",
                f"{kind} refused by the test",
            )
        if ns in server.missing_namespaces:
            return self._status(404, "NotFound", f'namespaces "{ns}" not found')
        with server.lock:
            if kind == "pods" and method == "GET":
                return self._pods(query)
            if method == "POST" and body is not None:
                return self._create(kind, ns, body)
            if method == "GET" and name:
                obj = server.objects.get((kind, ns, name))
                if obj is None:
                    return self._status(404, "NotFound", f'{kind} "{name}" not found')
                return self._reply(200, obj)
            if method == "DELETE" and not name:
                selector = query.get("labelSelector", "")
                gone = [
                    k
                    for k, o in server.objects.items()
                    if k[0] == kind and k[1] == ns and _matches(o, selector)
                ]
                items = [server.objects.pop(k) for k in gone]
                return self._reply(200, {"kind": "List", "apiVersion": "v1", "items": items})
        return self._status(405, "MethodNotAllowed", f"{method} {url.path}")

    def _create(self, kind: str, ns: str, body: dict[str, Any]) -> None:
        server = self.server
        name = body["metadata"]["name"]
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            server.invalid.append(f"{kind}/{name}: {exc.message}")
            return self._status(422, "Invalid", exc.message)
        if (kind, ns, name) in server.objects:
            return self._status(409, "AlreadyExists", f'{kind} "{name}" already exists')
        stored = copy.deepcopy(body)
        stored["metadata"] |= {"uid": str(uuid.uuid4()), "resourceVersion": "1"}
        server.objects[(kind, ns, name)] = stored
        self._reply(201, stored)

    def _pods(self, query: dict[str, str]) -> None:
        server = self.server
        selector = query.get("labelSelector", "")
        if query.get("watch") != "true":
            items = [p for p in server.pods if _matches(p, selector)]
            return self._reply(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "items": items,
                    "metadata": {"resourceVersion": "1"},
                },
            )
        batch = server.watch_batches.pop(0) if server.watch_batches else []
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for event in batch:
            self.wfile.write(json.dumps(event).encode() + b"\n")
            self.wfile.flush()
        if not batch:  # nothing new: hold the watch open a little, as a real server would
            time.sleep(min(float(query.get("timeoutSeconds", 1)), 0.2))


def _do(method: str) -> Callable[[_Handler], None]:
    return lambda self: self._handle(method)


_Handler.do_GET = _do("GET")  # type: ignore[attr-defined]
_Handler.do_POST = _do("POST")  # type: ignore[attr-defined]
_Handler.do_DELETE = _do("DELETE")  # type: ignore[attr-defined]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    server = KubeApi()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        assert server.invalid == []


@pytest.fixture
def api_client(api: KubeApi) -> Iterator[Any]:
    api_client = client.ApiClient(client.Configuration(host=api.url))
    try:
        yield api_client
    finally:
        api_client.close()


FAST = KubeOptions(watch_poll_s=1, request_timeout_s=5)


def pod_of(job: dict[str, Any], phase: str, *, rv: int = 2, **status: Any) -> dict[str, Any]:
    """The pod the Job controller would make from ``job``, in ``phase``; schema-checked."""
    template = job["spec"]["template"]
    name = job["metadata"]["name"]
    deleting = status.pop("deleting", False)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-x7k2p",
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": {**template["metadata"]["labels"], "job-name": name},
            "annotations": template["metadata"]["annotations"],
            **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {}),
        },
        "spec": {**template["spec"], "nodeName": "node-from-kubelet"},
        "status": {"phase": phase, **status},
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    return pod


def container_status(**state: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": "worker",
            "image": "i",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": state,
        }
    ]


def event(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": pod}


def collect(
    backend: KubeBackend, want: int, timeout_s: float = 20
) -> tuple[list[WorkerStatus], float]:
    seen: list[WorkerStatus] = []
    stop = threading.Event()

    def on_status(status: WorkerStatus) -> None:
        seen.append(status)
        if len(seen) >= want:
            stop.set()

    started = time.monotonic()
    backend.watch(on_status, stop, timeout_s=timeout_s)
    return seen, time.monotonic() - started


def test_priority_classes_are_created_once(api: KubeApi, api_client: Any) -> None:
    backend = KubeBackend(api_client, NS)
    backend.ensure_priority_classes()
    assert [r.body for r in api.of("POST", "priorityclasses")] == priority_class_manifests()
    backend.ensure_priority_classes()  # 409s: already there with the right values
    assert len(api.of("POST", "priorityclasses")) == 8
    assert len(api.stored("priorityclasses")) == 4
    api.objects[("priorityclasses", "", "gantry-high")]["value"] = 42
    with pytest.raises(Conflict, match="gantry-high exists with value 42, but Gantry needs 1000"):
        backend.ensure_priority_classes()


def test_launch_creates_the_validated_manifests_once(api: KubeApi, api_client: Any) -> None:
    backend = KubeBackend(api_client, NS)
    backend.launch(GANG)
    service, *jobs = job_manifests(GANG, NS)
    assert [r.body for r in api.of("POST", "jobs")] == jobs
    [posted_service] = [r.body for r in api.of("POST", "services")]
    worker0 = api.stored("jobs")["gantry-j-00000000000b-a1-w0"]
    assert posted_service is not None
    assert posted_service["metadata"].pop("ownerReferences") == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "gantry-j-00000000000b-a1-w0",
            "uid": worker0["metadata"]["uid"],
        }
    ]
    assert posted_service == service
    # a retried launch meets 409s and changes nothing
    backend.launch(GANG)
    assert len(api.of("POST", "jobs")) == 8 and len(api.stored("jobs")) == 4
    assert len(api.stored("services")) == 1
    assert api.of("GET", "jobs")[0].name == "gantry-j-00000000000b-a1-w0"


def test_a_failed_launch_leaves_no_part_of_the_gang(api: KubeApi, api_client: Any) -> None:
    api.refuse = lambda method, kind, name: 500 if name == "gantry-j-00000000000b-a1-w2" else None
    with pytest.raises(
        Unavailable, match=r"could not create Job gantry-j-00000000000b-a1-w2 \(HTTP 500\)"
    ):
        KubeBackend(api_client, NS).launch(GANG)
    assert len(api.of("POST", "jobs")) == 3
    assert api.stored("jobs") == {} and api.stored("services") == {}


def test_stop_deletes_one_job_by_label(api: KubeApi, api_client: Any) -> None:
    backend = KubeBackend(api_client, NS)
    backend.launch(GANG)
    backend.launch(CPU_JOB)
    backend.launch(replace(CPU_JOB, attempt=2))
    backend.stop(CPU_JOB.job_id, attempt=1)
    deletes = api.of("DELETE", "jobs") + api.of("DELETE", "services")
    assert {r.kind for r in deletes} == {"jobs", "services"}
    for request in deletes:
        assert request.query["labelSelector"] == (
            "app.kubernetes.io/managed-by=gantry-scheduler,gantry.io/job-id=j-00000000000a,"
            "gantry.io/attempt=1"
        )
        assert request.query["propagationPolicy"] == "Background"
    assert sorted(api.stored("jobs")) == ["gantry-j-00000000000a-a2-w0"] + [
        f"gantry-j-00000000000b-a1-w{r}" for r in range(4)
    ]
    backend.stop(GANG.job_id)  # every attempt
    assert list(api.stored("jobs")) == ["gantry-j-00000000000a-a2-w0"]
    assert list(api.stored("services")) == ["gantry-j-00000000000a-a2"]


def test_a_shrink_deletes_only_the_released_ranks_jobs(api: KubeApi, api_client: Any) -> None:
    backend = KubeBackend(api_client, NS)
    backend.launch(GANG)
    backend.stop(GANG.job_id, GANG.attempt, workers=[3, 2])
    assert api.of("DELETE", "services") == []  # rendezvous stays for the kept ranks
    (delete,) = api.of("DELETE", "jobs")
    assert delete.query["labelSelector"].endswith("gantry.io/worker in (2,3)")
    assert sorted(api.stored("jobs")) == [f"gantry-j-00000000000b-a1-w{r}" for r in (0, 1)]


def test_worker_statuses_lists_the_jobs_pods(api: KubeApi, api_client: Any) -> None:
    _, w0, w1, *_ = job_manifests(GANG, NS)
    _, other = job_manifests(CPU_JOB, NS)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    api.pods = [
        pod_of(w1, "Pending", conditions=[unschedulable]),
        pod_of(w0, "Running"),
        pod_of(other, "Running"),
    ]
    statuses = KubeBackend(api_client, NS).worker_statuses(GANG.job_id)
    assert api.of("GET", "pods")[0].query["labelSelector"] == job_selector(GANG.job_id)
    assert statuses == [
        WorkerStatus(GANG.job_id, 1, 0, "node-from-kubelet", "started", 0, ""),
        WorkerStatus(
            GANG.job_id,
            1,
            1,
            "node-from-kubelet",
            "pending",
            EXIT_UNKNOWN,
            "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        ),
    ]


def test_watch_maps_pod_phases_to_worker_statuses(api: KubeApi, api_client: Any) -> None:
    _, w0, w1, *_ = job_manifests(GANG, NS)
    failed = container_status(terminated={"exitCode": 3, "reason": "Error"})
    succeeded = container_status(terminated={"exitCode": 0, "reason": "Completed"})
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x", "labels": {}},
        "status": {"phase": "Failed"},
    }
    api.watch_batches = [
        [
            event("ADDED", pod_of(w0, "Pending")),
            event("MODIFIED", pod_of(w0, "Running", rv=3)),
            event("MODIFIED", pod_of(w0, "Running", rv=4)),  # no change: no report
            event("ADDED", pod_of(w1, "Running", rv=5)),
            event("MODIFIED", foreign),
            event("MODIFIED", pod_of(w0, "Succeeded", rv=6, containerStatuses=succeeded)),
            event("MODIFIED", pod_of(w1, "Failed", rv=7, containerStatuses=failed)),
            event("DELETED", pod_of(w0, "Succeeded", rv=8)),  # finished stays finished
        ]
    ]
    seen, _ = collect(KubeBackend(api_client, NS, FAST), want=4)
    node = "node-from-kubelet"
    assert seen == [
        WorkerStatus(GANG.job_id, 1, 0, node, "started", 0, ""),
        WorkerStatus(GANG.job_id, 1, 1, node, "started", 0, ""),
        WorkerStatus(GANG.job_id, 1, 0, node, "succeeded", 0, ""),
        WorkerStatus(GANG.job_id, 1, 1, node, "failed", 3, "Error (exit code 3)"),
    ]
    [watch] = [r for r in api.of("GET", "pods") if r.query.get("watch") == "true"][:1]
    assert watch.query["labelSelector"] == MANAGED_SELECTOR
    assert seen[-1].to_event().exit_code == 3


def test_watch_reports_deleted_and_stuck_workers(api: KubeApi, api_client: Any) -> None:
    _, w0, w1, w2, w3 = job_manifests(GANG, NS)
    backoff = container_status(
        waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "train:1.4"'}
    )
    api.watch_batches = [
        [
            event("ADDED", pod_of(w0, "Running")),
            event("MODIFIED", pod_of(w0, "Running", rv=3, deleting=True)),
            event("MODIFIED", pod_of(w0, "Failed", rv=4)),  # killed by the deletion: still stopped
            event("ADDED", pod_of(w1, "Pending", containerStatuses=backoff)),
            event("ADDED", pod_of(w2, "Pending")),
            event("DELETED", pod_of(w2, "Pending", rv=5)),
            event("ADDED", pod_of(w3, "Pending", containerStatuses=backoff)),
        ]
    ]
    options = replace(FAST, stuck_after_s=0.5)
    seen, _ = collect(KubeBackend(api_client, NS, options), want=5)
    assert [(s.worker, s.status) for s in seen[:2]] == [(0, "started"), (0, "stopped")]
    assert seen[1].message == "the pod was deleted before it finished"
    assert (seen[2].worker, seen[2].status) == (2, "stopped")
    # both stuck workers fail together once stuck_after_s has passed
    assert {(s.worker, s.status, s.exit_code) for s in seen[3:]} == {
        (1, "failed", EXIT_UNKNOWN),
        (3, "failed", EXIT_UNKNOWN),
    }
    assert "ImagePullBackOff: Back-off pulling image" in seen[3].message
    assert seen[3].message.startswith("stuck pending for")


def test_a_briefly_stuck_pod_is_not_reported(api: KubeApi, api_client: Any) -> None:
    _, w0 = job_manifests(CPU_JOB, NS)
    backoff = container_status(waiting={"reason": "ErrImagePull", "message": "timeout"})
    hopeless = container_status(waiting={"reason": "InvalidImageName", "message": "bad"})
    api.watch_batches = [[event("ADDED", pod_of(w0, "Pending", containerStatuses=backoff))]]
    seen, took = collect(KubeBackend(api_client, NS, FAST), want=1, timeout_s=1.5)
    assert seen == [] and took >= 1.5
    api.watch_batches = [[event("ADDED", pod_of(w0, "Pending", containerStatuses=hopeless))]]
    seen, _ = collect(KubeBackend(api_client, NS, FAST), want=1)
    assert [(s.status, s.exit_code) for s in seen] == [("failed", EXIT_UNKNOWN)]
    assert "InvalidImageName: bad" in seen[0].message


def test_watch_starts_over_when_its_version_expires(api: KubeApi, api_client: Any) -> None:
    _, w0, w1, *_ = job_manifests(GANG, NS)
    gone = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    }
    api.watch_batches = [
        [event("ADDED", pod_of(w0, "Running", rv=5))],
        [{"type": "ERROR", "object": gone}],
        [event("ADDED", pod_of(w0, "Running", rv=9)), event("ADDED", pod_of(w1, "Running", rv=9))],
    ]
    seen, _ = collect(KubeBackend(api_client, NS, FAST), want=2)
    assert [(s.worker, s.status) for s in seen] == [(0, "started"), (1, "started")]
    watches = [r for r in api.of("GET", "pods") if r.query.get("watch") == "true"]
    assert [r.query.get("resourceVersion") for r in watches[:3]] == [None, "5", None]


def test_refusals_become_gantry_errors(api: KubeApi, api_client: Any) -> None:
    api.refuse = lambda method, kind, name: 403 if kind == "priorityclasses" else None
    with pytest.raises(PermissionDenied) as denied:
        KubeBackend(api_client, NS).ensure_priority_classes()
    assert "may not create PriorityClass gantry-low" in str(denied.value)
    assert "docs/kubernetes-backend.md" in str(denied.value)
    api.missing_namespaces.add("nowhere")
    with pytest.raises(NotFound, match='namespaces "nowhere" not found'):
        KubeBackend(api_client, "nowhere").launch(CPU_JOB)


def test_an_unreachable_api_is_unavailable() -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = closed.server_address[1]
    closed.server_close()
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    with client.ApiClient(config) as api_client:
        backend = KubeBackend(api_client, NS, FAST)
        with pytest.raises(Unavailable) as err:
            backend.worker_statuses("j-1")
        assert f"cannot reach the Kubernetes API at http://127.0.0.1:{port}" in str(err.value)
        assert "kubeconfig" in str(err.value)
        with pytest.raises(Unavailable, match="cannot reach"):
            backend.watch(lambda s: None, threading.Event(), timeout_s=5)


def test_a_client_comes_from_a_kubeconfig(api: KubeApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: stub\n"
        f"clusters: [{{name: stub, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: sched, user: {token: t0ken}}]\n"
        "contexts: [{name: stub, context: {cluster: stub, user: sched}}]\n"
    )
    with load_api_client(str(kubeconfig)) as api_client:
        assert KubeBackend(api_client, NS).worker_statuses("j-1") == []
    assert api.requests[0].authorization == "Bearer t0ken"
    with pytest.raises(
        ConfigError, match=r"cannot load a Kubernetes client configuration from .*absent"
    ):
        load_api_client(str(tmp_path / "absent"))


# -- a real cluster -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k3s_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A k3s cluster in Docker; skipped, with the reason, when no Docker engine is reachable."""
    reason = docker_unreachable_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.community.k3s import K3SContainer

    with K3SContainer("rancher/k3s:v1.31.4-k3s1") as k3s:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(k3s.config_yaml())
        yield path


@pytest.mark.timeout(600)
# K3SContainer waits for its start with testcontainers' deprecated wait_for_logs
@pytest.mark.filterwarnings("ignore:The wait_for_logs function:DeprecationWarning")
def test_jobs_run_succeed_fail_and_stop_on_k3s(k3s_kubeconfig: Path) -> None:
    with load_api_client(str(k3s_kubeconfig)) as api_client:
        core = client.CoreV1Api(api_client)
        deadline = time.monotonic() + 120
        while not (nodes := core.list_node().items) and time.monotonic() < deadline:
            time.sleep(1)  # the server is up; its node registers a moment later
        [node] = nodes
        hostname = node.metadata.labels["kubernetes.io/hostname"]
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        backend = KubeBackend(api_client, NS, KubeOptions(watch_poll_s=2))
        backend.ensure_priority_classes()
        backend.ensure_priority_classes()

        def job(job_id: str, script: str) -> KubeJob:
            return make_job(
                (KubeWorker(0, hostname, 0, 0, 100, 64),),
                job_id=job_id,
                image="busybox:1.36",
                command=("sh", "-c", script),
                env={},
                max_runtime_s=600,
            )

        ok, bad, long = (
            job("j-0000000000a1", "exit 0"),
            job("j-0000000000a2", "exit 3"),
            job("j-0000000000a3", "sleep 600"),
        )
        for each in (ok, bad, long):
            backend.launch(each)
        backend.launch(ok)  # idempotent against a real API server too

        seen: list[WorkerStatus] = []
        stop = threading.Event()

        def on_status(status: WorkerStatus) -> None:
            seen.append(status)
            if status.job_id == long.job_id and status.status == "started":
                backend.stop(long.job_id)
            if {s.job_id for s in seen if s.status in ("succeeded", "failed", "stopped")} == {
                ok.job_id,
                bad.job_id,
                long.job_id,
            }:
                stop.set()

        backend.watch(on_status, stop, timeout_s=420)
        final = {s.job_id: s for s in seen}
        assert final[ok.job_id].status == "succeeded", seen
        assert (final[bad.job_id].status, final[bad.job_id].exit_code) == ("failed", 3), seen
        assert final[long.job_id].status == "stopped", seen
        assert final[ok.job_id].node == hostname
        assert [s.status for s in backend.worker_statuses(ok.job_id)] == ["succeeded"]
