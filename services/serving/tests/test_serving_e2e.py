"""The serving service end to end, as `gantry up` runs it: a real nats-server, audit,
governance (the model registry) and serving processes. Models are registered in the registry,
deployed through the management API, called over REST (exactly as the Open Inference Protocol
shows) and gRPC, rolled out as canaries (promoted, and rolled back automatically when broken),
refused when tampered with, and restored after a restart of the service."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from gantry.client.admin import create_token
from gantry.client.audit import AuditClient, Filter
from gantry.client.errors import RemotePermissionDenied
from gantry.client.model_registry import ModelsClient
from gantry.client.serving import ServingClient
from gantry.core import GantryError
from gantry.core.runfile import run_info
from gantry.supervisor.platform import Platform
from gantry.training.export import export_model

pytestmark = pytest.mark.timeout(300)

FEATURES = 8


class Mlp(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


class Broken(nn.Module):
    """Passes warm-up (random normal rows) and fails on the traffic here (rows of ones)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x >= 0.5).all()):
            raise RuntimeError("deliberately broken model")
        return x[:, :3]


@pytest.fixture(scope="module")
def models(platform: Platform, admin: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Register scorer v1, v2 (two MLPs) and v3 (broken) in the registry."""
    tmp = tmp_path_factory.mktemp("models")
    example = torch.randn(4, FEATURES)
    eager = {}
    with ModelsClient(platform.address("governance"), admin) as registry:
        for version, seed in ((1, 1), (2, 2)):
            model = Mlp(seed).eval()
            eager[version] = model
            path = tmp / f"v{version}"
            artifact, fmt, signature = export_model(model, example, path)
            registry.register_model(
                "scorer", path / artifact, framework="pytorch",
                signature={**signature, "format": fmt},
            )  # fmt: skip
        broken = tmp / "broken.ts"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit
            scripted = torch.jit.script(Broken())  # type: ignore[no-untyped-call]
            torch.jit.save(scripted, str(broken))
        registry.register_model(
            "scorer", broken, framework="pytorch",
            signature={"inputs": [{"shape": [-1, FEATURES], "dtype": "float32"}],
                       "outputs": [{"shape": [-1, 3], "dtype": "float32"}],
                       "format": "torchscript"},
        )  # fmt: skip
    return eager


def _rest(platform: Platform) -> str:
    address = run_info(platform.data_dir, "serving", "http")
    assert address is not None
    return address


def _drive(platform: Platform, token: str, stop: threading.Event, seen: dict) -> None:
    """Closed-loop traffic over REST until ``stop``; counts answers per version and code."""
    ones = np.ones((2, FEATURES), dtype=np.float32).ravel().tolist()
    body = {"inputs": [{"name": "INPUT__0", "shape": [2, FEATURES], "datatype": "FP32",
                        "data": ones}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=_rest(platform), timeout=30) as http:
        while not stop.is_set():
            reply = http.post("/v2/models/scorer/infer", json=body, headers=headers)
            key = (reply.json().get("model_version", "-"), reply.status_code)
            seen[key] = seen.get(key, 0) + 1


def test_deploy_and_infer_over_rest_and_grpc(platform: Platform, admin: str, models: dict) -> None:
    with ServingClient(platform.address("serving"), admin) as serving:
        info = serving.deploy("scorer", version=1, max_batch_size=8, max_queue_delay_us=500)
        assert info.weights() == {1: 100}
        assert info.versions[0].state == "ready"
        x = np.random.default_rng(0).standard_normal((3, FEATURES)).astype(np.float32)
        expected = models[1](torch.from_numpy(x)).detach().numpy()
        version, outputs = serving.infer("scorer", {"INPUT__0": x})
        assert version == "1"
        np.testing.assert_allclose(outputs["OUTPUT__0"], expected, rtol=1e-5, atol=1e-6)

    # REST, exactly as the specification's example request shows
    body = {
        "id": "42",
        "inputs": [
            {"name": "INPUT__0", "shape": [3, FEATURES], "datatype": "FP32",
             "data": x.ravel().tolist()}
        ],
        "outputs": [{"name": "OUTPUT__0"}],
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=_rest(platform), timeout=30) as http:
        assert http.get("/v2/health/live").status_code == 200
        assert http.get("/v2/health/ready").status_code == 200
        meta = http.get("/v2/models/scorer", headers=headers).json()
        assert meta["name"] == "scorer" and meta["versions"] == ["1"]
        assert meta["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, FEATURES]}]
        reply = http.post("/v2/models/scorer/infer", json=body, headers=headers)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert (answer["model_name"], answer["model_version"], answer["id"]) == (
            "scorer",
            "1",
            "42",
        )
        out = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(3, 3)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        # errors in the protocol's shape
        missing = http.post("/v2/models/nope/infer", json=body, headers=headers)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        bad = dict(body, inputs=[dict(body["inputs"][0], shape=[3, FEATURES + 1])])
        wrong = http.post("/v2/models/scorer/infer", json=bad, headers=headers)
        assert wrong.status_code == 400 and "error" in wrong.json()
        anonymous = http.post("/v2/models/scorer/infer", json=body)
        assert anonymous.status_code == 401 and "token" in anonymous.json()["error"]
        auditor = create_token(platform.data_dir, "carol", ["auditor"])
        refused = http.post(
            "/v2/models/scorer/infer", json=body, headers={"Authorization": f"Bearer {auditor}"}
        )
        assert refused.status_code == 403 and "carol" in refused.json()["error"]
        consumer = create_token(platform.data_dir, "app", ["model-consumer"])
        allowed = http.post(
            "/v2/models/scorer/infer", json=body, headers={"Authorization": f"Bearer {consumer}"}
        )
        assert allowed.status_code == 200


def test_only_allowed_roles_deploy(platform: Platform, models: dict) -> None:
    consumer = create_token(platform.data_dir, "app", ["model-consumer"])
    developer = create_token(platform.data_dir, "dev", ["ml-developer"])
    with ServingClient(platform.address("serving"), consumer) as serving:
        with pytest.raises(RemotePermissionDenied):
            serving.deploy("scorer", version=1, name="scorer-app")
    with ServingClient(platform.address("serving"), developer) as serving:
        with pytest.raises(RemotePermissionDenied, match="production"):
            serving.deploy("scorer", version=1, name="scorer-prod", environment="production")
        info = serving.deploy("scorer", version=1, name="scorer-staging")
        assert info.environment == "staging"
        serving.undeploy("scorer-staging")


def test_canary_promoted_then_broken_canary_rolled_back(
    platform: Platform, admin: str, models: dict
) -> None:
    fast = {"interval_s": 0.5, "step_percent": 30, "max_percent": 60, "min_requests": 3,
            "failure_threshold": 2}  # fmt: skip
    stop = threading.Event()
    seen: dict = {}
    traffic = threading.Thread(target=_drive, args=(platform, admin, stop, seen), daemon=True)
    traffic.start()
    try:
        with ServingClient(platform.address("serving"), admin) as serving:
            info = serving.deploy("scorer", version=2, canary_percent=10, canary=fast)
            assert info.weights() == {1: 90, 2: 10} and info.canary.phase == "progressing"
            deadline = time.monotonic() + 60
            while serving.get("scorer").canary.phase == "progressing":
                assert time.monotonic() < deadline, serving.get("scorer")
                time.sleep(0.2)
            promoted = serving.get("scorer")
            assert promoted.canary.phase == "promoted", promoted.canary
            assert promoted.weights() == {2: 100}
            actions = [h.action for h in promoted.history]
            assert "canary.step" in actions and actions[-1] == "promoted"

            started = time.monotonic()
            serving.deploy("scorer", version=3, canary_percent=20, canary=fast)
            while serving.get("scorer").canary.phase == "progressing":
                assert time.monotonic() < started + 60
                time.sleep(0.2)
            rolled = serving.get("scorer")
            assert rolled.canary.phase == "rolled_back", rolled.canary
            assert rolled.weights() == {2: 100}
            assert "success" in rolled.history[-1].detail
    finally:
        stop.set()
        traffic.join(10)
    assert seen.get(("2", 200), 0) > 0 and seen.get(("1", 200), 0) > 0
    assert seen.get(("-", 500), 0) > 0  # the broken canary's failures reached callers
    with ServingClient(platform.address("serving"), admin) as serving:
        version, _ = serving.infer("scorer", {"INPUT__0": np.ones((1, FEATURES), np.float32)})
        assert version == "2"


def test_tampered_version_refused_and_old_keeps_serving(
    platform: Platform, admin: str, models: dict, tmp_path: Path
) -> None:
    with ModelsClient(platform.address("governance"), admin) as registry:
        model = Mlp(4).eval()
        artifact, fmt, signature = export_model(model, torch.randn(2, FEATURES), tmp_path)
        v = registry.register_model(
            "scorer", tmp_path / artifact, framework="pytorch",
            signature={**signature, "format": fmt},
        )  # fmt: skip
    # flip one byte of the newest stored object of the model (encrypted at rest)
    stored = max(
        (
            p
            for p in (platform.data_dir / "objects").rglob("*")
            if p.is_file() and "scorer" in str(p)
        ),
        key=lambda p: p.stat().st_mtime,
    )
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    stored.write_bytes(bytes(raw))
    with ServingClient(platform.address("serving"), admin) as serving:
        before = serving.get("scorer").weights()
        with pytest.raises(GantryError, match=f"v{v.version} cannot be served"):
            serving.deploy("scorer", version=v.version)
        assert serving.get("scorer").weights() == before
        version, _ = serving.infer("scorer", {"INPUT__0": np.ones((1, FEATURES), np.float32)})
        assert version == str(max(before))


def test_history_in_audit_and_restored_after_restart(platform: Platform, admin: str) -> None:
    platform.restart_service("serving")
    with ServingClient(platform.address("serving"), admin) as serving:
        deadline = time.monotonic() + 60
        while True:
            try:
                version, _ = serving.infer(
                    "scorer", {"INPUT__0": np.ones((1, FEATURES), np.float32)}
                )
                break
            except GantryError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert version == "2"
    types = ["gantry.serving.deployment.changed"]
    with AuditClient(platform.address("audit"), admin) as audit:
        deadline = time.monotonic() + 30
        while True:
            records = list(audit.query(Filter(types=types)))
            actions = [r.action for r in records] if records else []
            if len(records) >= 5:
                break
            assert time.monotonic() < deadline, actions
            time.sleep(0.3)
    assert len(records) >= 5


def test_readyz_answers_once_the_service_is_up(platform: Platform) -> None:
    metrics = str(platform.service_info("serving")["metrics"])  # http://host:port/metrics
    with httpx.Client(timeout=10) as http:
        ready = http.get(metrics.removesuffix("/metrics") + "/readyz")
    assert (ready.status_code, ready.text) == (200, "ready\n")
