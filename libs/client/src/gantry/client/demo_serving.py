"""The demo's serving chapter: the model trained in the demo goes live, a second version goes
out as a canary and is promoted, a broken third one is rolled back automatically.

1. ``churn-classifier`` v1 (the model the training chapter registered) is live in staging,
   deployed by the release pipeline's gated ``release`` step with dynamic batching (or, when
   the chapter runs on its own, by ``dev-engineer``); the service fetched it from the registry
   (decrypted and digest-checked), loaded and warmed it up before it answered.
2. ``churn-app`` (role ``model-consumer``) scores customers over REST with the Open Inference
   Protocol's JSON, exactly as ``curl`` would, and over gRPC.
3. ``dev-engineer`` registers v2 — v1's weights quantised to INT8 for serving, with v1's lineage —
   and rolls it out as a 20 % canary while ``churn-app`` keeps calling: each passing check
   (every second here; Flagger's default is a minute) adds 20 %, and it is promoted.
4. ``dev-engineer`` registers v3, deliberately broken (it fails on real customers' features
   but passes the service's warm-up), and rolls it out the same way: its failures fail the
   checks and the service rolls it back on its own; v2 keeps serving.
5. An auditor reads the whole history back from the audit log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gantry.client.admin import create_token
from gantry.client.audit import AuditClient, Filter
from gantry.client.demo_data import DEVELOPER
from gantry.client.model_registry import ModelsClient, ModelVersion
from gantry.client.serving import DeploymentInfo, ServingClient
from gantry.core import GantryError, Unavailable

MODEL = "churn-classifier"
APP = "churn-app"
AUDITOR = "demo-auditor"
#: The demo's canary analysis: a check every second, +20 % per pass, promote after 60 %,
#: roll back after 3 failed checks (Flagger: every minute, after 5).
CANARY = {
    "interval_s": 1.0,
    "step_percent": 20,
    "max_percent": 60,
    "failure_threshold": 3,
    "min_requests": 5,
    "min_success_rate": 0.99,
    "max_p99_ms": 500.0,
}
WAIT_S = 90.0
SERVING_TYPES = ("gantry.serving.deployment.changed", "gantry.serving.version.state")


@dataclass
class ServingSummary:
    """What the chapter achieved."""

    rest_url: str = ""
    scores: list[float] = field(default_factory=list)
    grpc_version: str = ""
    promoted: DeploymentInfo | None = None
    rolled_back: DeploymentInfo | None = None
    rollback_s: float = 0.0
    int8_bytes: int = 0
    float_bytes: int = 0
    requests: int = 0
    failed: int = 0
    history: list[tuple[str, str, str, str]] = field(default_factory=list)


def serving_story(
    serving_addr: str,
    governance_addr: str,
    rest_url: str,
    audit_addr: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    model: ModelVersion,
    deployed: bool = False,
) -> ServingSummary:
    """Run the chapter; raise :class:`~gantry.core.GantryError` on any surprise."""
    from gantry.training.examples.tabular import FEATURES, churn_table

    summary = ServingSummary(rest_url=rest_url)
    hour = dt.timedelta(hours=1)
    dev = create_token(data_dir, DEVELOPER, ["ml-developer"], hour)
    app = create_token(data_dir, APP, ["model-consumer"], hour)
    table = churn_table(rows=64, seed=2027)
    features = np.stack([table.column(f).to_numpy().astype(np.float32) for f in FEATURES], 1)

    with ServingClient(serving_addr, dev) as serving:
        if deployed:
            with step(
                f"the pipeline's release step deployed {MODEL} v{model.version} "
                "(staging, batches up to 16)"
            ):
                live = serving.get(MODEL)
                if model.version not in live.weights():
                    raise Unavailable(f"{MODEL} v{model.version} is not live: {live.versions}")
        else:
            with step(f"{DEVELOPER} deployed {MODEL} v{model.version} (staging, batches up to 16)"):
                serving.deploy(
                    MODEL, version=model.version, max_batch_size=16, max_queue_delay_us=2000,
                    canary=CANARY,
                )  # fmt: skip
        with step(f"{APP} scored 4 customers over REST (Open Inference Protocol JSON)"):
            body = {
                "id": "demo-1",
                "inputs": [{"name": "INPUT__0", "shape": [4, len(FEATURES)], "datatype": "FP32",
                            "data": features[:4].ravel().tolist()}],
            }  # fmt: skip
            answer = _post(f"{rest_url}/v2/models/{MODEL}/infer", body, app)
            probabilities = _churn_probability(answer)
            summary.scores = probabilities
        console.print(
            f"  curl -X POST {rest_url}/v2/models/{MODEL}/infer -H 'Authorization: Bearer …' "
            f"-d '{escape(json.dumps(body)[:70])}…'"
        )
        console.print(
            "  → churn probability "
            + ", ".join(f"{p:.2f}" for p in probabilities)
            + f" (answered by v{answer['model_version']})"
        )
        with ServingClient(serving_addr, app) as caller, step(f"{APP} scored them over gRPC"):
            summary.grpc_version, _outputs = caller.infer(MODEL, {"INPUT__0": features[:4]})

        with tempfile.TemporaryDirectory(prefix="gantry-demo-models-") as tmp:
            with step(f"{DEVELOPER} registered {MODEL} v2: v1's weights quantised to INT8"):
                v2, summary.float_bytes, summary.int8_bytes = _register_int8(
                    governance_addr, dev, model, Path(tmp), features[:2]
                )
            console.print(
                f"  v2: {summary.int8_bytes:,} bytes (v1 {summary.float_bytes:,}), "
                f"same job and data lineage"
            )
            traffic = _Traffic(serving_addr, app, features)
            with traffic:
                with step(f"v{v2.version} rolled out as a 20% canary and promoted by its checks"):
                    since = len(serving.get(MODEL).history)
                    serving.deploy(MODEL, version=v2.version, canary_percent=20, canary=CANARY)
                    summary.promoted = _until_settled(serving, console, since)
                    if summary.promoted.canary.phase != "promoted":
                        raise Unavailable(
                            f"the canary of v{v2.version} ended {summary.promoted.canary.phase}: "
                            f"{summary.promoted.canary.last_check}"
                        )
                with step(f"{DEVELOPER} registered {MODEL} v3 (deliberately broken)"):
                    v3 = _register_broken(governance_addr, dev, model, Path(tmp))
                with step(f"v{v3.version} canary rolled back automatically; v2 keeps serving"):
                    since = len(serving.get(MODEL).history)
                    started = time.monotonic()
                    serving.deploy(MODEL, version=v3.version, canary_percent=20, canary=CANARY)
                    summary.rolled_back = _until_settled(serving, console, since)
                    summary.rollback_s = time.monotonic() - started
                    if summary.rolled_back.canary.phase != "rolled_back":
                        raise Unavailable(
                            f"the broken v{v3.version} was not rolled back: "
                            f"{summary.rolled_back.canary.phase}"
                        )
            summary.requests, summary.failed = traffic.requests, traffic.failed
        console.print(
            f"  {APP} sent {summary.requests:,} requests meanwhile; {summary.failed:,} "
            f"failed — the broken canary's share while it was live "
            f"({summary.rollback_s:.1f} s from its deploy to its rollback)"
        )

    auditor = create_token(data_dir, AUDITOR, ["auditor"], hour)
    with (
        AuditClient(audit_addr, auditor) as audit,
        step("the rollout history read from the audit log"),
    ):
        summary.history = _history(audit)
    console.print(history_table(summary))
    return summary


def history_table(summary: ServingSummary) -> Table:
    """The serving history as the audit log holds it."""
    table = Table(title=f"{MODEL}: history in the audit log")
    for column in ("time", "event", "what", "actor"):
        table.add_column(column)
    for row in summary.history:
        table.add_row(*(escape(cell) for cell in row))
    return table


class _Traffic:
    """``churn-app`` calling the model over gRPC in the background, as a real app would."""

    def __init__(self, address: str, token: str, features: np.ndarray) -> None:
        self._address, self._token, self._features = address, token, features
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-traffic", daemon=True)
        self.requests = 0
        self.failed = 0

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with ServingClient(self._address, self._token, timeout_s=10) as client:
            row = 0
            while not self._stop.is_set():
                batch = self._features[row % 60 : row % 60 + 2]
                row += 2
                self.requests += 1
                try:
                    client.infer(MODEL, {"INPUT__0": batch})
                except GantryError:
                    self.failed += 1
                time.sleep(0.01)


def _until_settled(serving: ServingClient, console: Console, since: int) -> DeploymentInfo:
    """Wait for the canary to finish, printing its history entries after the first ``since``."""
    deadline = time.monotonic() + WAIT_S
    shown = since
    while True:
        info = serving.get(MODEL)
        steps = info.history
        for h in steps[shown:]:
            console.print(f"  [dim]{escape(h.action)}: {escape(h.detail)}[/]")
        shown = len(steps)
        if info.canary.phase != "progressing":
            return info
        if time.monotonic() > deadline:
            raise Unavailable(f"the canary did not finish in {WAIT_S:.0f} s: {info.canary}")
        time.sleep(0.25)


def _post(url: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    if not url.startswith(("http://", "https://")):
        raise Unavailable(f"the serving REST address {url!r} is not an http(s) URL")
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - checked
            answer: dict[str, Any] = json.loads(reply.read())
            return answer
    except urllib.error.HTTPError as exc:
        raise Unavailable(f"POST {url} answered {exc.code}: {exc.read().decode()}") from None


def _churn_probability(answer: dict[str, Any]) -> list[float]:
    out = answer["outputs"][0]
    logits = np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return [float(p) for p in (exp / exp.sum(axis=1, keepdims=True))[:, 1]]


def _register_int8(
    governance_addr: str, token: str, v1: ModelVersion, tmp: Path, example: np.ndarray
) -> tuple[ModelVersion, int, int]:
    """v2: v1's weights in the example's model, its linear layers quantised to INT8."""
    import torch

    from gantry.training.examples.tabular import model as tabular_model
    from gantry.training.export import export_model

    with ModelsClient(governance_addr, token) as registry:
        path = tmp / "v1"
        registry.download_model(MODEL, path, version=v1.version)
        fmt = (v1.signature or {}).get("format", "")
        if fmt == "torchscript":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                state = torch.jit.load(str(path)).state_dict()  # type: ignore[no-untyped-call]
        else:
            program = torch.export.load(str(path))
            state = {**program.state_dict, **dict(program.constants)}
        module = tabular_model()
        module.load_state_dict({k: v for k, v in state.items() if isinstance(v, torch.Tensor)})
        artifact, fmt2, signature = export_model(
            module, torch.from_numpy(example), tmp / "v2", quantize=True
        )
        v2 = registry.register_model(
            MODEL,
            tmp / "v2" / artifact,
            framework="pytorch",
            job_id=v1.job_id,
            metrics=dict(v1.metrics),
            signature={**signature, "format": fmt2},
            description=f"v{v1.version} with INT8 linear layers, for serving",
            trained_on=[(ref.dataset, ref.version) for ref in v1.trained_on],
            code_version=v1.code_version,
        )
    return v2, v1.bytes, v2.bytes


def _register_broken(governance_addr: str, token: str, v1: ModelVersion, tmp: Path) -> ModelVersion:
    import torch

    from gantry.client.demo_models import RegressedModel

    path = tmp / "v3.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit
        scripted = torch.jit.script(RegressedModel())  # type: ignore[no-untyped-call]
        torch.jit.save(scripted, str(path))
    signature = dict(v1.signature or {})
    signature["format"] = "torchscript"
    with ModelsClient(governance_addr, token) as registry:
        return registry.register_model(
            MODEL, path, framework="pytorch", signature=signature,
            description="deliberately broken (the demo's bad release)",
        )  # fmt: skip


def _history(audit: AuditClient) -> list[tuple[str, str, str, str]]:
    deadline = time.monotonic() + 30
    while True:
        rows = []
        for record in audit.query(Filter(types=list(SERVING_TYPES))):
            event = json.loads(record.event_json)
            data = event.get("data", {})
            if data.get("deployment") != MODEL:
                continue
            at = dt.datetime.fromtimestamp(record.time_ms / 1000, dt.UTC).strftime("%H:%M:%S")
            what = data.get("detail") or f"v{data.get('version')} {data.get('state')}"
            action = data.get("action") or f"version.{data.get('state')}"
            rows.append((at, action, str(what)[:90], record.actor))
        if any(r[1] == "rolled_back" for r in rows):
            return rows
        if time.monotonic() > deadline:
            raise Unavailable("the audit log did not show the rollback within 30 s")
        time.sleep(0.3)


__all__ = ["CANARY", "MODEL", "ServingSummary", "history_table", "serving_story"]
