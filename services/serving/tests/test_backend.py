"""The inference backend over real deployments (exported MLPs, a real gate): requests are
authorised, routed by the weights (sticky by the deployment's header), or to the version they
name; their inputs are checked against the model with messages that say what to send; the
outputs asked for are returned; a shadow's copy never changes, fails or delays the caller's
answer; generation is refused for models that cannot generate and streams for one that can."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import torch

from gantry.security import (
    Authorizer,
    MemoryDecisionSink,
    SigningKey,
    TokenIssuer,
    TokenVerifier,
    TrustStore,
    default_policy,
)
from gantry.serving import backend as backend_module
from gantry.serving import store
from gantry.serving.backend import EXTENSIONS, SERVER_NAME, Backend
from gantry.serving.batcher import BatchingConfig
from gantry.serving.deployments import CanaryPolicy, ServingSpec
from gantry.serving.errors import (
    BadRequest,
    Forbidden,
    ModelFailed,
    ModelNotFound,
    NotAuthenticated,
)
from gantry.serving.gate import Gate
from gantry.serving.protocol import (
    Caller,
    GenerateRequest,
    InferRequest,
    RequestedOutput,
    Tensor,
    TensorSpec,
)
from gantry.serving.rollout import Rollouts
from gantry.serving.runtime import Artifact

from .exported_models import ALPHABET, FEATURES, OUTPUTS, exported

#: a canary that never steps by itself during a test
POLICY = CanaryPolicy(interval_s=3600.0)
GENERATIVE = 9


def artifact_for(model: str, version: int) -> Artifact:
    """Odd versions compute model "a", even ones model "b"; v9 is the generative "writer"."""
    kind = "writer" if version == GENERATIVE else "ab"[1 - version % 2]
    return exported(kind).artifact(model, version)


def eager(version: int, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = exported("ab"[1 - version % 2]).model(torch.from_numpy(x)).numpy()
    return out


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = store.connect(f"sqlite:///{tmp_path / 'serving.db'}")
    store.migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
async def rollouts(engine: sa.Engine) -> AsyncIterator[Rollouts]:
    running = Rollouts(
        engine,
        artifact_for,
        batching=BatchingConfig(max_batch_size=8, max_queue_delay_us=500, queue_capacity=512),
        min_instances=1,
        max_instances=1,
        default_interval_s=3600.0,
        drain_timeout_s=5.0,
    )
    yield running
    await running.close()


KEY = SigningKey.generate("backend-test")
ISSUER = TokenIssuer(KEY)


@pytest.fixture(scope="module")
def consumer() -> Caller:
    return Caller(token=ISSUER.issue("app", ["model-consumer"], dt.timedelta(hours=1)))


@pytest.fixture
def sink() -> MemoryDecisionSink:
    return MemoryDecisionSink()


@pytest.fixture
async def backend(rollouts: Rollouts, sink: MemoryDecisionSink) -> AsyncIterator[Backend]:
    policy = default_policy()
    verifier = TokenVerifier(
        TrustStore({KEY.kid: KEY.public_key_bytes()}), known_roles=policy.roles
    )
    gate = Gate(verifier, Authorizer(policy), sink, allow_anonymous=True)
    served = Backend(rollouts, gate)
    yield served
    # let shadow copies finish before the versions are closed
    await asyncio.gather(*list(served._shadow_tasks), return_exceptions=True)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, FEATURES)).astype(np.float32)


def request(x: np.ndarray, model: str = "scorer", **extra: Any) -> InferRequest:
    inputs = (Tensor("INPUT__0", "FP32", x.shape, x),)
    return InferRequest(model=model, inputs=inputs, **extra)


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def deploy_canary(rollouts: Rollouts, percent: int = 30) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    await rollouts.deploy(
        model="scorer", version=2, canary_percent=percent, canary_policy=POLICY, actor="alice"
    )


# -- routing ------------------------------------------------------------------------------------


async def test_requests_follow_the_weights_and_each_answer_is_its_versions(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await deploy_canary(rollouts, 30)
    x = rows(3)
    answers = await asyncio.gather(
        *(backend.infer(request(x, id=str(i)), consumer) for i in range(200))
    )
    counts = Counter(a.version for a in answers)
    assert set(counts) == {"1", "2"}
    assert 25 <= counts["2"] <= 110  # 30% of 200, with a wide margin
    for i, answer in enumerate(answers):
        assert (answer.model, answer.id) == ("scorer", str(i))
        (out,) = answer.outputs
        assert (out.name, out.datatype, out.shape) == ("OUTPUT__0", "FP32", (3, 2))
        np.testing.assert_allclose(out.data, eager(int(answer.version), x), rtol=1e-5, atol=1e-6)
    # every answer fed its version's figures (the canary analysis reads them)
    versions = rollouts.get("scorer").versions
    assert versions[2].requests == counts["2"] and versions[1].requests == counts["1"]
    assert versions[1].errors == versions[2].errors == 0


async def test_a_sticky_header_keeps_each_caller_on_one_version(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await deploy_canary(rollouts, 50)
    await rollouts.set_traffic("scorer", {}, "X-User", actor="alice")
    x = rows(1)
    seen: dict[str, set[str]] = {}
    for user in range(40):
        caller = Caller(token=consumer.token, headers={"x-user": f"user-{user}"})
        for _ in range(4):
            answer = await backend.infer(request(x), caller)
            seen.setdefault(f"user-{user}", set()).add(answer.version)
    assert all(len(v) == 1 for v in seen.values())
    assert {v for vs in seen.values() for v in vs} == {"1", "2"}  # users spread over both
    # without the header, the front end's sticky key stands in for it
    caller = Caller(token=consumer.token, sticky_key="user-7")
    assert {(await backend.infer(request(x), caller)).version for _ in range(4)} == seen["user-7"]


async def test_a_request_may_name_its_version(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await deploy_canary(rollouts, 10)
    x = rows(2)
    for _ in range(5):
        answer = await backend.infer(request(x, version="2"), consumer)
        assert answer.version == "2"
        np.testing.assert_allclose(answer.outputs[0].data, eager(2, x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ModelNotFound, match=r"has no version 7 \(versions: 1, 2\)"):
        await backend.infer(request(x, version="7"), consumer)
    for bad in ("abc", "0", "-1"):
        with pytest.raises(BadRequest, match="is not a version number"):
            await backend.infer(request(x, version=bad), consumer)


async def test_an_unknown_model_names_the_deployed_ones(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    with pytest.raises(ModelNotFound, match=r"deployed: none"):
        await backend.infer(request(rows(1)), consumer)
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(
        ModelNotFound, match=r"no model named 'other' is deployed here \(deployed: scorer\)"
    ):
        await backend.infer(request(rows(1), model="other"), consumer)


# -- inputs and outputs -------------------------------------------------------------------------


async def test_inputs_that_do_not_fit_say_what_the_model_takes(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    x = rows(2)
    with pytest.raises(BadRequest, match=r"model 'scorer': missing input\(s\) INPUT__0") as info:
        await backend.infer(InferRequest(model="scorer"), consumer)
    assert "it takes INPUT__0 (FP32 [-1, 4])" in (info.value.hint or "")
    assert "GET /v2/models/scorer" in (info.value.hint or "")

    wrong = InferRequest(model="scorer", inputs=(Tensor("features", "FP32", x.shape, x),))
    with pytest.raises(
        BadRequest, match=r"missing input\(s\) INPUT__0; unknown input\(s\) features"
    ):
        await backend.infer(wrong, consumer)

    extra = InferRequest(
        model="scorer",
        inputs=(Tensor("INPUT__0", "FP32", x.shape, x), Tensor("more", "FP32", x.shape, x)),
    )
    with pytest.raises(BadRequest, match=r"unknown input\(s\) more"):
        await backend.infer(extra, consumer)

    doubles = x.astype(np.float64)
    typed = InferRequest(model="scorer", inputs=(Tensor("INPUT__0", "FP64", x.shape, doubles),))
    with pytest.raises(BadRequest, match="input INPUT__0 is FP64, the model takes FP32") as info:
        await backend.infer(typed, consumer)
    assert info.value.hint == "send INPUT__0 with datatype FP32"

    # a shape the model cannot take is the caller's mistake (400), not the model's failure
    narrow = rows(2)[:, :3].copy()
    with pytest.raises(BadRequest, match=r"INPUT__0 has shape \[2, 3\], the model takes \[-1, 4\]"):
        await backend.infer(request(narrow), consumer)
    with pytest.raises(BadRequest, match=r"INPUT__0 has shape \[8\], the model takes \[-1, 4\]"):
        await backend.infer(request(rows(2).ravel()), consumer)

    # a caller's bad request is not the version's failure
    runtime = rollouts.get("scorer").versions[1]
    assert runtime.requests == 6 and runtime.errors == 0


async def test_the_outputs_asked_for_are_returned(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    x = rows(2)
    wanted = (RequestedOutput("OUTPUT__0", binary=True, parameters={"binary_data": True}),)
    answer = await backend.infer(request(x, outputs=wanted), consumer)
    (out,) = answer.outputs
    assert out.name == "OUTPUT__0" and out.parameters == {"binary_data": True}
    assert out.shape == (2, 2)
    with pytest.raises(BadRequest, match="model 'scorer' has no output 'scores'") as info:
        await backend.infer(request(x, outputs=(RequestedOutput("scores"),)), consumer)
    assert info.value.hint == "its outputs: OUTPUT__0"


@pytest.mark.parametrize("timeout", [-1, 0, True, "soon"])
async def test_a_bad_timeout_parameter_is_refused(
    rollouts: Rollouts, backend: Backend, consumer: Caller, timeout: Any
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(BadRequest, match=r"parameter timeout .* must be a positive number"):
        await backend.infer(request(rows(1), parameters={"timeout": timeout}), consumer)


async def test_a_server_side_failure_counts_against_the_version(
    rollouts: Rollouts, backend: Backend, consumer: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    runtime = rollouts.get("scorer").versions[1]

    async def fail(inputs: Any, *, timeout_s: float | None = None) -> list[np.ndarray]:
        raise ModelFailed("model scorer version 1 failed on a batch of 1: boom")

    async def bug(inputs: Any, *, timeout_s: float | None = None) -> list[np.ndarray]:
        raise RuntimeError("a bug in the service")

    monkeypatch.setattr(runtime.batcher, "submit", fail)
    with pytest.raises(ModelFailed, match="boom"):
        await backend.infer(request(rows(1)), consumer)
    assert (runtime.requests, runtime.errors) == (1, 1)
    # an unexpected error is a server-side failure too, not a success
    monkeypatch.setattr(runtime.batcher, "submit", bug)
    with pytest.raises(RuntimeError):
        await backend.infer(request(rows(1)), consumer)
    assert (runtime.requests, runtime.errors) == (2, 2)
    stats = runtime.window.take(time.monotonic())
    assert (stats.requests, stats.errors) == (2, 2)


# -- shadow -------------------------------------------------------------------------------------


async def deploy_with_shadow(rollouts: Rollouts) -> tuple[Any, Any]:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    await rollouts.deploy(model="scorer", version=4, shadow_percent=100, actor="alice")
    versions = rollouts.get("scorer").versions
    return versions[1], versions[4]


async def test_a_shadow_gets_copies_and_the_caller_gets_the_stable_answer(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    stable, shadow = await deploy_with_shadow(rollouts)
    x = rows(2)
    for _ in range(10):
        answer = await backend.infer(request(x), consumer)
        assert answer.version == "1"
        np.testing.assert_allclose(answer.outputs[0].data, eager(1, x), rtol=1e-5, atol=1e-6)
    await until(lambda: shadow.requests == 10, "the shadow copies")
    assert stable.requests == 10 and shadow.errors == 0
    # a shadow is not a version callers see in the metadata
    assert backend.model_metadata("scorer", "", consumer).versions == ("1",)


async def test_a_failing_shadow_never_reaches_the_caller(
    rollouts: Rollouts, backend: Backend, consumer: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    stable, shadow = await deploy_with_shadow(rollouts)
    calls = 0

    async def fail(inputs: Any, *, timeout_s: float | None = None) -> list[np.ndarray]:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise ModelFailed("the shadow broke")
        raise RuntimeError("not even an inference error")

    monkeypatch.setattr(shadow.batcher, "submit", fail)
    for _ in range(6):
        assert (await backend.infer(request(rows(1)), consumer)).version == "1"
    await until(lambda: calls == 6 and not backend._shadow_tasks, "the shadow copies")
    assert stable.errors == 0
    assert shadow.errors == 6  # both count against the shadow (and are only logged)
    # a bad request fails for the caller (from the stable version), not twice
    with pytest.raises(BadRequest, match="missing input"):
        await backend.infer(InferRequest(model="scorer"), consumer)


async def test_a_slow_shadow_never_delays_the_caller_and_copies_are_bounded(
    rollouts: Rollouts, backend: Backend, consumer: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    stable, shadow = await deploy_with_shadow(rollouts)
    release = asyncio.Event()
    started = 0

    async def hang(inputs: Any, *, timeout_s: float | None = None) -> list[np.ndarray]:
        nonlocal started
        started += 1
        await release.wait()
        return [np.zeros((len(inputs[0]), 2), np.float32)]

    monkeypatch.setattr(shadow.batcher, "submit", hang)
    monkeypatch.setattr(backend_module, "MAX_SHADOW_IN_FLIGHT", 2)
    for _ in range(5):
        answer = await backend.infer(request(rows(1)), consumer)  # returns with shadows hung
        assert answer.version == "1"
    await until(lambda: started == 2, "the shadow copies to start")
    assert len(backend._shadow_tasks) == 2  # the other three copies were skipped
    release.set()
    await until(lambda: not backend._shadow_tasks, "the shadow copies to finish")
    assert (stable.requests, shadow.requests) == (5, 2)


# -- authorisation ------------------------------------------------------------------------------


async def test_calls_are_authorised_per_deployment(
    rollouts: Rollouts, backend: Backend, consumer: Caller, sink: MemoryDecisionSink
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    await rollouts.deploy(
        model="scorer", version=1, name="open", spec=ServingSpec(anonymous=True), actor="alice"
    )
    with pytest.raises(NotAuthenticated, match="model 'scorer' needs a token for infer"):
        await backend.infer(request(rows(1)), Caller())
    with pytest.raises(NotAuthenticated):
        backend.model_metadata("scorer", "", Caller())
    auditor = Caller(token=ISSUER.issue("eve", ["auditor"], dt.timedelta(hours=1)))
    with pytest.raises(Forbidden, match="eve may not infer model 'scorer'"):
        await backend.infer(request(rows(1)), auditor)
    assert (await backend.infer(request(rows(1)), consumer)).version == "1"
    # metadata and readiness need the right to call the model, not to read (download) it
    service = Caller(token=ISSUER.issue("svc", ["service"], dt.timedelta(hours=1)))
    with pytest.raises(Forbidden, match="svc may not infer model 'scorer'"):
        backend.model_metadata("scorer", "", service)
    with pytest.raises(Forbidden):
        backend.model_ready("scorer", "", service)
    assert backend.model_metadata("scorer", "", consumer).name == "scorer"
    # the anonymous deployment answers without a token (the service allows it too)
    assert (await backend.infer(request(rows(1), model="open"), Caller())).model == "open"
    decisions = [(d.principal, d.resource_name, d.action, d.decision) for d in sink.decisions]
    assert ("eve", "scorer", "infer", "deny") in decisions
    assert ("app", "scorer", "infer", "allow") in decisions


# -- metadata and readiness ---------------------------------------------------------------------


async def test_metadata_and_readiness(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    assert backend.live() and backend.ready()  # nothing deployed: nothing to wait for
    name, _, extensions = backend.server_metadata()
    assert (name, extensions) == (SERVER_NAME, EXTENSIONS)
    await deploy_canary(rollouts, 10)
    assert backend.ready()
    meta = backend.model_metadata("scorer", "", consumer)
    assert (meta.name, meta.versions, meta.platform) == (
        "scorer",
        ("1", "2"),
        "pytorch_torch_export",
    )
    assert meta.inputs == (TensorSpec("INPUT__0", "FP32", (-1, FEATURES)),)
    assert meta.outputs == (TensorSpec("OUTPUT__0", "FP32", (-1, OUTPUTS)),)
    assert backend.model_metadata("scorer", "2", consumer).inputs == meta.inputs
    assert backend.model_ready("scorer", "", consumer)
    assert backend.model_ready("scorer", "2", consumer)
    with pytest.raises(ModelNotFound, match="has no version 3"):
        backend.model_ready("scorer", "3", consumer)
    with pytest.raises(ModelNotFound):
        backend.model_metadata("nope", "", consumer)


# -- generation ---------------------------------------------------------------------------------


async def test_generation_is_refused_for_a_model_that_cannot_generate(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(BadRequest, match="model 'scorer' is not a generative model") as info:
        backend.generate(GenerateRequest(model="scorer", text_input="hi"), consumer)
    assert "/infer" in (info.value.hint or "")
    with pytest.raises(ModelNotFound):
        backend.generate(GenerateRequest(model="nope", text_input="hi"), consumer)
    with pytest.raises(NotAuthenticated):
        backend.generate(GenerateRequest(model="scorer", text_input="hi"), Caller())


async def test_a_generative_model_streams_and_checks_its_parameters(
    rollouts: Rollouts, backend: Backend, consumer: Caller
) -> None:
    await rollouts.deploy(model="writer", version=GENERATIVE, actor="alice")
    for changes, message in (
        ({"max_tokens": 0}, "max_tokens 0 must be 1..2048"),
        ({"max_tokens": 5000}, "max_tokens 5000 must be 1..2048"),
        ({"temperature": -1.0}, "temperature -1.0 must be 0..10"),
        ({"temperature": 11.0}, "temperature 11.0 must be 0..10"),
    ):
        with pytest.raises(BadRequest, match=message):
            backend.generate(GenerateRequest(model="writer", text_input="ab", **changes), consumer)
    chunks = [
        c
        async for c in backend.generate(
            GenerateRequest(model="writer", text_input="ab", max_tokens=3, id="g1"), consumer
        )
    ]
    assert [c.index for c in chunks] == [0, 1, 2]
    assert [c.final for c in chunks] == [False, False, True]
    assert all(
        c.model == "writer" and c.version == str(GENERATIVE) and c.id == "g1" for c in chunks
    )
    assert all(len(c.text_output) == 1 and c.text_output in ALPHABET for c in chunks)
    # greedy generation is deterministic
    again = [
        c.text_output
        async for c in backend.generate(
            GenerateRequest(model="writer", text_input="ab", max_tokens=3), consumer
        )
    ]
    assert again == [c.text_output for c in chunks]
    assert rollouts.get("writer").versions[GENERATIVE].requests == 6
