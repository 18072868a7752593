"""Serving features against the real service (a real nats-server, governance registry and
serving process): token streaming from the example transformer over REST (SSE) and gRPC,
shadow traffic, sticky A/B routing, a hot swap under load with no failed request, overload
answered with 503 + Retry-After while admitted requests stay bounded, autoscaling events, and
the Prometheus metrics."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from gantry.client.audit import AuditClient, Filter
from gantry.client.model_registry import ModelsClient
from gantry.client.serving import ServingClient
from gantry.core.runfile import run_info
from gantry.supervisor.platform import Platform
from gantry.training.examples.transformer import ALPHABET, CONTEXT, CharTransformer
from gantry.training.export import export_model

pytestmark = pytest.mark.timeout(300)

FEATURES = 4


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = nn.Parameter(torch.tensor(factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Slow(nn.Module):
    """About 50-100 ms of matrix products per call on this machine, whatever the batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(384, 384) / 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w
        for _ in range(40):
            y = torch.tanh(y @ self.w)
        return x * y[0, 0]


def _register(platform: Platform, admin: str, name: str, model: nn.Module, example: Any,
              tmp: Path, **extra: Any) -> int:  # fmt: skip
    artifact, fmt, signature = export_model(model.eval(), example, tmp)
    with ModelsClient(platform.address("governance"), admin) as registry:
        version = registry.register_model(
            name,
            tmp / artifact,
            framework="pytorch",
            signature={**signature, "format": fmt, **extra},
        )
    return version.version


def _rest(platform: Platform) -> str:
    address = run_info(platform.data_dir, "serving", "http")
    assert address is not None
    return address


def _body(rows: int, value: float = 1.0) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT__0", "shape": [rows, FEATURES], "datatype": "FP32",
                        "data": [value] * (rows * FEATURES)}]}  # fmt: skip


def test_tokens_stream_over_sse_and_grpc(platform: Platform, admin: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    lm = CharTransformer()
    example = torch.zeros(2, CONTEXT, dtype=torch.int64)
    _register(platform, admin, "village-lm", lm, example, tmp_path,
              generation={"vocabulary": ALPHABET, "context": CONTEXT})  # fmt: skip
    with ServingClient(platform.address("serving"), admin) as serving:
        serving.deploy("village-lm", max_batch_size=8)
        pieces = list(serving.generate("village-lm", "The miller ", max_tokens=12))
    assert len(pieces) == 12 and all(len(p) == 1 and p in ALPHABET for p in pieces)
    headers = {"Authorization": f"Bearer {admin}"}
    body = {"text_input": "The miller ", "parameters": {"max_tokens": 12}}
    with httpx.Client(base_url=_rest(platform), timeout=60) as http:
        events = []
        with http.stream(
            "POST", "/v2/models/village-lm/generate_stream", json=body, headers=headers
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        whole = http.post("/v2/models/village-lm/generate", json=body, headers=headers).json()
        odd = {"text_input": "~~~", "parameters": {"max_tokens": 2}}
        refused = http.post("/v2/models/village-lm/generate", headers=headers, json=odd)
    assert [e["index"] for e in events] == list(range(12)) and events[-1]["final"] is True
    # greedy decoding: the same text over gRPC, SSE and the non-streaming call
    assert "".join(e["text_output"] for e in events) == "".join(pieces) == whole["text_output"]
    assert refused.status_code == 400 and "~" in refused.json()["error"]


def test_shadow_gets_a_copy_and_sticky_routing_keeps_callers(
    platform: Platform, admin: str, tmp_path: Path
) -> None:
    x = torch.ones(2, FEATURES)
    v1 = _register(platform, admin, "scale", Scale(1.0), x, tmp_path / "1")
    v2 = _register(platform, admin, "scale", Scale(2.0), x, tmp_path / "2")
    with ServingClient(platform.address("serving"), admin) as serving:
        serving.deploy("scale", version=v1, max_batch_size=4)
        shadowed = serving.deploy("scale", version=v2, shadow_percent=100)
        assert {v.role for v in shadowed.versions} == {"stable", "shadow"}
        for _ in range(20):
            version, out = serving.infer("scale", {"INPUT__0": np.ones((1, FEATURES), np.float32)})
            assert version == str(v1) and out["OUTPUT__0"][0, 0] == 1.0  # the caller sees v1
        deadline = time.monotonic() + 10
        while True:
            shadow = next(v for v in serving.get("scale").versions if v.role == "shadow")
            if shadow.requests >= 20 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert shadow.requests >= 20  # every request was mirrored to v2, answers discarded

        # A/B: promote the shadow into a 50/50 split, sticky by a header
        split = serving.set_traffic("scale", {v1: 50, v2: 50}, sticky_header="x-user")
        assert split.weights() == {v1: 50, v2: 50} and split.sticky_header == "x-user"
    seen: dict[str, set[str]] = {}
    with httpx.Client(base_url=_rest(platform), timeout=30) as http:
        for user in [f"user-{n}" for n in range(16)] * 3:
            reply = http.post("/v2/models/scale/infer", json=_body(1), headers={
                "Authorization": f"Bearer {admin}", "x-user": user})  # fmt: skip
            assert reply.status_code == 200, reply.text
            seen.setdefault(user, set()).add(reply.json()["model_version"])
    assert all(len(versions) == 1 for versions in seen.values())  # each user keeps its version
    assert {v for versions in seen.values() for v in versions} == {str(v1), str(v2)}


def test_hot_swap_under_load_drops_nothing(platform: Platform, admin: str, tmp_path: Path) -> None:
    x = torch.ones(2, FEATURES)
    v1 = _register(platform, admin, "swap", Scale(1.0), x, tmp_path / "1")
    v2 = _register(platform, admin, "swap", Scale(3.0), x, tmp_path / "2")
    with ServingClient(platform.address("serving"), admin) as serving:
        serving.deploy("swap", version=v1, max_batch_size=8, max_queue_delay_us=1000)
    stop = threading.Event()
    codes: dict[tuple[int, str], int] = {}
    lock = threading.Lock()

    def drive() -> None:
        with httpx.Client(base_url=_rest(platform), timeout=30) as http:
            while not stop.is_set():
                reply = http.post("/v2/models/swap/infer", json=_body(1),
                                  headers={"Authorization": f"Bearer {admin}"})  # fmt: skip
                key = (reply.status_code, reply.json().get("model_version", reply.text))
                with lock:
                    codes[key] = codes.get(key, 0) + 1

    workers = [threading.Thread(target=drive, daemon=True) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.0)
        with ServingClient(platform.address("serving"), admin) as serving:
            swapped = serving.deploy("swap", version=v2)
        assert swapped.weights() == {v2: 100}
        time.sleep(1.0)
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    assert {code for code, _ in codes} == {200}, codes  # not one request failed
    assert codes.get((200, str(v1)), 0) > 0 and codes.get((200, str(v2)), 0) > 0


def test_overload_answers_503_and_scales_out(
    platform: Platform, admin: str, tmp_path: Path
) -> None:
    _register(platform, admin, "slow", Slow(), torch.ones(1, FEATURES), tmp_path)
    with ServingClient(platform.address("serving"), admin) as serving:
        serving.deploy("slow", max_batch_size=1, queue_capacity=4, timeout_ms=20_000,
                       min_instances=1, max_instances=2)  # fmt: skip
    url = f"{_rest(platform)}/v2/models/slow/infer"

    def call(_: int) -> tuple[int, float, str | None]:
        started = time.monotonic()
        request = urllib.request.Request(url, data=json.dumps(_body(1)).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {admin}",
                                                  "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                reply.read()
                return reply.status, time.monotonic() - started, None
        except urllib.error.HTTPError as exc:
            return exc.code, time.monotonic() - started, exc.headers.get("Retry-After")

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(call, range(48)))
    codes = [code for code, _, _ in results]
    assert 503 in codes and 200 in codes, codes
    assert set(codes) <= {200, 503}
    retry = [int(r) for code, _, r in results if code == 503 and r is not None]
    assert retry and all(r >= 1 for r in retry)  # every 503 says when to come back
    # admitted requests waited behind at most the queue's capacity, never an unbounded queue
    admitted = sorted(t for code, t, _ in results if code == 200)
    assert admitted[-1] < 20
    with AuditClient(platform.address("audit"), admin) as audit:
        deadline = time.monotonic() + 30
        while True:
            scaled = [json.loads(r.event_json)["data"] for r in
                      audit.query(Filter(types=["gantry.serving.scaled"]))]  # fmt: skip
            if any(e["deployment"] == "slow" and e["instances_to"] == 2 for e in scaled):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"no scale-out event: {scaled}")
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(call, range(16)))
    reason = next(e["reason"] for e in scaled if e["deployment"] == "slow")
    assert any(ch.isdigit() for ch in reason)  # the reason gives its numbers


def test_metrics_expose_latency_histograms(platform: Platform, admin: str, tmp_path: Path) -> None:
    _register(platform, admin, "metered", Scale(1.0), torch.ones(2, FEATURES), tmp_path)
    with ServingClient(platform.address("serving"), admin) as serving:
        serving.deploy("metered")
        serving.infer("metered", {"INPUT__0": np.ones((3, FEATURES), np.float32)})
    metrics = run_info(platform.data_dir, "serving", "metrics")
    assert metrics is not None
    text = httpx.get(metrics, timeout=10).text
    assert 'gantry_serving_request_seconds_bucket{deployment="metered"' in text
    assert 'gantry_serving_requests_total{code="200",deployment="metered",protocol="grpc"' in text
    assert "gantry_serving_batch_size_bucket" in text and "gantry_serving_queue_seconds" in text


def test_a_following_deployment_canaries_each_new_version(
    platform: Platform, admin: str, tmp_path: Path
) -> None:
    x = torch.ones(2, FEATURES)
    v1 = _register(platform, admin, "nightly", Scale(1.0), x, tmp_path / "1")
    with ServingClient(platform.address("serving"), admin) as serving:
        info = serving.deploy("nightly", version=v1, follow_percent=25,
                              canary={"interval_s": 3600})  # fmt: skip
        assert info.follow_percent == 25
        # the retrained model is registered: the deployment rolls it out as a 25% canary
        v2 = _register(platform, admin, "nightly", Scale(1.5), x, tmp_path / "2")
        deadline = time.monotonic() + 60
        while (current := serving.get("nightly")).canary.phase != "progressing":
            assert time.monotonic() < deadline, current
            time.sleep(0.2)
    assert current.canary.canary_version == v2 and current.weights() == {v1: 75, v2: 25}
    assert current.history[-1].actor == "gantry/serving"
