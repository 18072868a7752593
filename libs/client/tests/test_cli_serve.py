"""`gantry serve`: the option parsing on its own, the printing against a fake client, and the
whole command group against the real platform (NATS, audit, governance and serving)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gantry.client import cli
from gantry.client.cli import _serve
from gantry.client.cli._serve import (
    numpy_dtype,
    parse_duration,
    parse_fraction,
    parse_input,
    parse_inputs,
    parse_percent,
    parse_weights,
)
from gantry.client.serving import DeploymentInfo
from gantry.core import InvalidInput
from gantry.protos.v1 import serving_pb2 as pb

FEATURES = 8


@dataclass
class Result:
    code: int
    out: str
    err: str


Run = Callable[..., Result]


@pytest.fixture
def gantry(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``gantry ARGS`` through cli.main and capture what it printed."""

    def run(*args: str | Path) -> Result:
        capsys.readouterr()
        code = cli.main([str(a) for a in args])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        return Result(code, captured.out, captured.err)

    return run


# ---------------------------------------------------------------------- parsing


def test_percentages_with_and_without_the_sign() -> None:
    assert parse_percent("10%", "--canary") == 10
    assert parse_percent("10", "--canary") == 10
    assert parse_percent(" 25 % ", "--canary") == 25
    assert parse_percent("100", "--shadow") == 100
    assert parse_percent("0", "--x") == 0
    assert parse_percent("50.0%", "--x") == 50
    for bad in ("", "%", "ten", "-5", "12.5%", "101", "10%%", "1e1"):
        with pytest.raises(InvalidInput, match="invalid --canary") as caught:
            parse_percent(bad, "--canary")
        assert "--canary 10%" in str(caught.value.hint)
    with pytest.raises(InvalidInput, match=r"1\.\.99"):
        parse_percent("100%", "--canary", low=1, high=99)
    with pytest.raises(InvalidInput, match=r"1\.\.100"):
        parse_percent("0", "--shadow", low=1)


def test_fractions_as_percent_or_fraction() -> None:
    assert parse_fraction("99%", "--canary-success-rate") == pytest.approx(0.99)
    assert parse_fraction("0.99", "--canary-success-rate") == pytest.approx(0.99)
    assert parse_fraction("99", "--canary-success-rate") == pytest.approx(0.99)
    assert parse_fraction("99.5%", "--canary-success-rate") == pytest.approx(0.995)
    assert parse_fraction("1", "--canary-success-rate") == 1.0
    assert parse_fraction("100%", "--canary-success-rate") == 1.0
    for bad in ("0", "0%", "101", "150%", "-0.5", "high", ""):
        with pytest.raises(InvalidInput, match="invalid --canary-success-rate"):
            parse_fraction(bad, "--canary-success-rate")


def test_durations_with_units_or_plain_seconds() -> None:
    assert parse_duration("60s", "--canary-interval") == 60
    assert parse_duration("1m", "--canary-interval") == 60
    assert parse_duration("0.5", "--canary-interval") == 0.5
    assert parse_duration("1.5m", "--canary-interval") == 90
    assert parse_duration("2h", "--canary-interval") == 7200
    assert parse_duration("250ms", "--canary-interval") == pytest.approx(0.25)
    assert parse_duration(" 30 s ", "--canary-interval") == 30
    for bad in ("0", "0s", "-1s", "soon", "1d", "1 minute", "", "nan", "inf"):
        with pytest.raises(InvalidInput, match="invalid --canary-interval") as caught:
            parse_duration(bad, "--canary-interval")
        assert "60s" in str(caught.value.hint)


def test_traffic_weights() -> None:
    assert parse_weights(["1=90", "2=10"]) == {1: 90, 2: 10}
    assert parse_weights(["v1=90%", "v2=10%"]) == {1: 90, 2: 10}
    assert parse_weights([]) == {}
    with pytest.raises(InvalidInput, match="VERSION=PERCENT"):
        parse_weights(["1:90"])
    with pytest.raises(InvalidInput, match="VERSION=PERCENT"):
        parse_weights(["x=90"])
    with pytest.raises(InvalidInput, match="twice"):
        parse_weights(["1=50", "v1=50"])
    with pytest.raises(InvalidInput, match="weight of v2"):
        parse_weights(["1=90", "2=ten"])


def test_inputs_from_json_and_files(tmp_path: Path) -> None:
    name, array = parse_input("INPUT__0=[[1, 2, 3], [4, 5, 6]]")
    assert name == "INPUT__0" and array.dtype == np.float32 and array.shape == (2, 3)
    _, ints = parse_input("ids=[[1,2,3]]", "int64")
    assert ints.dtype == np.int64 and ints.tolist() == [[1, 2, 3]]
    saved = np.arange(6, dtype=np.float64).reshape(2, 3)
    np.save(tmp_path / "x.npy", saved)
    _, loaded = parse_input(f"INPUT__0=@{tmp_path / 'x.npy'}")
    assert loaded.dtype == np.float64 and np.array_equal(loaded, saved)  # the file's dtype
    _, cast = parse_input(f"INPUT__0=@{tmp_path / 'x.npy'}", "FP32")
    assert cast.dtype == np.float32
    (tmp_path / "x.json").write_text("[[0.5, 1.5]]")
    _, from_json = parse_input(f"INPUT__0=@{tmp_path / 'x.json'}")
    assert from_json.tolist() == [[0.5, 1.5]]
    both = parse_inputs(["a=[1]", "b=[2]"], "INT32")
    assert list(both) == ["a", "b"] and both["b"].dtype == np.int32
    assert numpy_dtype("fp16") == np.float16 and numpy_dtype("BOOL") == np.bool_


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("INPUT__0", "expected NAME=@file.npy or NAME=<JSON array>"),
        ("=[1]", "expected NAME="),
        ("INPUT__0=", "expected NAME="),
        ("INPUT__0=[[1, 2", "is not valid JSON"),
        ('INPUT__0=["a", "b"]', "must be a JSON array of numbers"),
        ('INPUT__0={"a": 1}', "must be a JSON array of numbers"),
        ("INPUT__0=[[1, 2], [3]]", "not a rectangular array"),
        ("INPUT__0=@/no/such/file.npy", "can't read /no/such/file.npy"),
        ("INPUT__0=@/no/such/file.json", "can't read /no/such/file.json"),
    ],
)
def test_bad_inputs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_input(text)


def test_bad_input_files_and_datatypes(tmp_path: Path) -> None:
    (tmp_path / "bad.npy").write_bytes(b"not numpy at all")
    with pytest.raises(InvalidInput, match=r"not a numeric \.npy array"):
        parse_input(f"x=@{tmp_path / 'bad.npy'}")
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    with pytest.raises(InvalidInput, match="not numbers"):
        parse_input(f"x=@{tmp_path / 'strings.npy'}")
    with pytest.raises(InvalidInput, match="unknown --datatype 'BYTES'") as caught:
        parse_input("x=[1]", "BYTES")
    assert "FP32" in str(caught.value.hint)
    with pytest.raises(InvalidInput, match="given twice"):
        parse_inputs(["x=[1]", "x=[2]"])
    with pytest.raises(InvalidInput, match="at least one --input"):
        parse_inputs([])


def test_bad_options_are_refused_before_any_call(gantry: Run, tmp_path: Path) -> None:
    # no platform runs in tmp_path: each of these must fail on the option itself
    where = ("--data-dir", tmp_path, "--token", "t")
    cases = [
        (("deploy", "--model", "m", "--canary", "150%"), "invalid --canary '150%'"),
        (("deploy", "--model", "m", "--shadow", "x"), "invalid --shadow 'x'"),
        (("deploy", "--model", "m", "--canary", "10", "--shadow", "5"), "not both"),
        (("deploy", "--model", "m", "--canary-interval", "soon"), "invalid --canary-interval"),
        (("deploy", "--model", "m", "--canary-step", "0"), "invalid --canary-step"),
        (("deploy", "--model", "m", "--canary-max", "200"), "invalid --canary-max"),
        (("deploy", "--model", "m", "--canary-success-rate", "2%x"), "--canary-success-rate"),
        (("deploy", "--model", "m", "--canary-p99-ms", "0"), "invalid --canary-p99-ms"),
        (("deploy", "--model", "m", "--canary-min-requests", "0"), "at least 1 request"),
        (("deploy", "--model", "m", "--device", "tpu"), "invalid --device 'tpu'"),
        (("traffic", "d", "1=90", "2=20"), "add up to 110"),
        (("traffic", "d"), "nothing to change"),
        (("traffic", "d", "--sticky-header", "h", "--no-sticky"), "not both"),
        (("infer", "d", "--input", "x=[[1],[2,3]]"), "not a rectangular array"),
    ]
    for args, message in cases:
        result = gantry("serve", *args, *where)
        assert result.code == 2, (args, result)
        assert "gantry: error:" in result.err and message in result.err, (args, result.err)
    # click's own checks name the option too
    env = gantry("serve", "deploy", "--model", "m", "--env", "prod", *where)
    assert env.code == 2 and "--env" in env.err
    failures = gantry("serve", "deploy", "--model", "m", "--canary-failures", "0", *where)
    assert failures.code == 2 and "--canary-failures" in failures.err
    missing = gantry("serve", "infer", "d", *where)
    assert missing.code == 2 and "--input" in missing.err


def test_no_platform_is_a_clear_error(gantry: Run, tmp_path: Path) -> None:
    result = gantry("serve", "list", "--data-dir", tmp_path, "--token", "t")
    assert result.code == 2
    assert "don't know where the serving service is" in result.err
    assert "gantry up" in result.err


# ---------------------------------------------------------------------- printing (fake client)


def _deployment() -> DeploymentInfo:
    return DeploymentInfo.from_pb(
        pb.Deployment(
            name="scorer", model="scorer", environment="production", device="cpu",
            sticky_header="x-user-id", shadow_percent=5,
            versions=[
                pb.VersionState(version=1, weight=80, role="stable", state="ready", instances=2,
                                device="cpu", requests=1200, errors=3, p99_ms=12.5, queued=1),
                pb.VersionState(version=2, weight=20, role="canary", state="ready", instances=1,
                                device="cpu", requests=300, p99_ms=14.0, quantized=True),
                pb.VersionState(version=3, role="shadow", state="failed", device="cpu",
                                reason="warm-up failed [shape]"),
            ],
            canary=pb.CanaryStatus(phase="progressing", canary_version=2, stable_version=1,
                                   weight=20, failed_checks=1, started_ms=1_767_225_600_000,
                                   last_check="success 98.0% < 99.0%"),
            canary_spec=pb.CanarySpec(step_percent=10, max_percent=50, interval_s=60,
                                      failure_threshold=5, min_success_rate=0.99,
                                      max_p99_ms=500, min_requests=10),
            batching=pb.BatchingSpec(max_batch_size=8, max_queue_delay_us=500),
            history=[
                pb.HistoryEntry(at_ms=1_767_225_500_000, action="deployed",
                                detail="scorer v1 serves 100%", actor="admin"),
                pb.HistoryEntry(at_ms=1_767_225_600_000, action="canary.started",
                                detail="canary scorer v2 gets 20%, v1 keeps 80%", actor="dev"),
            ],
        )
    )  # fmt: skip


class FakeClient:
    """What the commands call, answering from :func:`_deployment`."""

    address = "fake:1"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def get(self, name: str) -> DeploymentInfo:
        self.calls.append(("get", name))
        return _deployment()

    def list(self) -> list[DeploymentInfo]:
        return [_deployment()]

    def deploy(self, model: str, **kwargs: Any) -> DeploymentInfo:
        self.calls.append(("deploy", {"model": model, **kwargs}))
        return _deployment()

    def infer(
        self, name: str, inputs: dict[str, np.ndarray], *, version: str = ""
    ) -> tuple[str, dict[str, np.ndarray]]:
        self.calls.append(("infer", inputs))
        return "2", {"OUTPUT__0": np.array([[0.25, 0.75]], dtype=np.float32)}

    def generate(self, name: str, prompt: str, **kwargs: Any) -> Iterator[str]:
        self.calls.append(("generate", {"prompt": prompt, **kwargs}))
        yield from ("Hel", "lo", " [world]")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()

    @contextlib.contextmanager
    def serving_client(settings: Any) -> Iterator[FakeClient]:
        yield client

    monkeypatch.setattr(_serve, "serving_client", serving_client)
    return client


def test_status_prints_versions_canary_settings_and_history(gantry: Run, fake: FakeClient) -> None:
    shown = gantry("serve", "status", "scorer")
    assert shown.code == 0, shown.err
    out = shown.out
    assert "v1 80% / v2 20% + shadow v3 5%" in out
    for text in ("1,200", "12.5", "warm-up failed [shape]", "5% mirrored", "progressing",
                 "1/5", "success 98.0% < 99.0%", "x-user-id", "500 µs", "step 10%",
                 "canary.started", "canary scorer v2 gets 20%,", "dev", "settings",
                 "2026-01-01 00:00:00"):  # fmt: skip
        assert text in out, text
    assert "REST" not in out  # the fake's address is no platform of the data directory
    listed = gantry("serve", "list")
    assert (
        listed.code == 0 and "v1 80% / v2 20%" in listed.out and "progressing v2 20%" in listed.out
    )
    assert "production" in listed.out
    as_json = json.loads(gantry("serve", "status", "scorer", "--json").out)
    assert as_json["canary"]["phase"] == "progressing" and as_json["endpoint"] is None
    assert [v["version"] for v in as_json["versions"]] == [1, 2, 3]
    assert json.loads(gantry("serve", "list", "--json").out)[0]["name"] == "scorer"


def test_deploy_sends_the_parsed_options(gantry: Run, fake: FakeClient) -> None:
    result = gantry("serve", "deploy", "--model", "scorer", "--version", "2", "--canary", "20%",
                    "--env", "production", "--device", "cuda:0", "--quantize",
                    "--canary-interval", "1m", "--canary-success-rate", "99.5%",
                    "--canary-step", "5", "--canary-p99-ms", "250",
                    "--max-queue-delay-us", "0")  # fmt: skip
    assert result.code == 0, result.err
    assert "canary scorer v2 gets 20%" in result.out and "progressing at 20%" in result.out
    (_, sent), *_ = fake.calls
    assert sent["canary_percent"] == 20 and sent["environment"] == "production"
    assert sent["device"] == "cuda:0" and sent["quantize"] and sent["max_queue_delay_us"] == 0
    assert sent["canary"] == {"interval_s": 60.0, "min_success_rate": pytest.approx(0.995),
                              "step_percent": 5, "max_p99_ms": 250.0}  # fmt: skip
    plain = gantry("serve", "deploy", "--model", "scorer")
    assert plain.code == 0
    sent = fake.calls[-1][1]
    assert sent["canary"] is None and sent["max_queue_delay_us"] is None
    assert sent["environment"] == "" and sent["canary_percent"] == 0


def test_infer_prints_the_version_and_outputs(gantry: Run, fake: FakeClient) -> None:
    shown = gantry("serve", "infer", "scorer", "--input", "INPUT__0=[[1, 2]]")
    assert shown.code == 0, shown.err
    assert "scorer v2 answered" in shown.out and "OUTPUT__0 (FP32, 1x2)" in shown.out
    assert "[[0.25 0.75]]" in shown.out
    as_json = json.loads(
        gantry("serve", "infer", "scorer", "-i", "INPUT__0=[[1, 2]]", "--json").out
    )
    assert as_json["model_version"] == "2"
    assert as_json["outputs"] == [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}
    ]


def test_generate_streams_each_piece(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    class Recorder(io.StringIO):
        """Standard output that notes what was written by each flush."""

        def __init__(self) -> None:
            super().__init__()
            self.flushed: list[str] = []
            self.mark = 0

        def flush(self) -> None:
            text = self.getvalue()
            if len(text) > self.mark:
                self.flushed.append(text[self.mark :])
                self.mark = len(text)
            super().flush()

    stdout = Recorder()
    monkeypatch.setattr(sys, "stdout", stdout)
    code = cli.main(["serve", "generate", "lm", "Hi", "--max-tokens", "3", "--seed", "7"])
    assert code == 0
    assert stdout.getvalue() == "Hello [world]\n"  # raw: rich markup is not applied
    assert stdout.flushed[:3] == ["Hel", "lo", " [world]"]  # one flush per piece, as it came
    assert fake.calls[-1] == (
        "generate", {"prompt": "Hi", "max_tokens": 3, "temperature": 0.0, "seed": 7}
    )  # fmt: skip


# ---------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gantry.supervisor.platform import Platform

    data = tmp_path_factory.mktemp("serve-platform") / "data"
    logs: list[str] = []
    running = Platform(
        data,
        services=("audit", "governance", "serving"),
        nats_port=0,
        service_env={"GANTRY_SERVING__TORCH_THREADS": "1"},
        log_sink=logs.append,
    )
    running.start()
    yield running
    running.stop()


def _models(platform: Any, admin: str, tmp: Path) -> dict[int, Any]:
    """Register scorer v1 and v2 (two small MLPs) and lm v1 (a tiny generative model)."""
    import torch
    from torch import nn

    from gantry.client.model_registry import ModelsClient
    from gantry.training.export import export_model

    class Mlp(nn.Module):
        def __init__(self, seed: int) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.net(x), dim=-1)

    class TinyLm(nn.Module):
        """Token ids (batch, context) to logits (batch, context, vocabulary): per position."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(3, 4)
            self.out = nn.Linear(4, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids))

    eager = {}
    with ModelsClient(platform.address("governance"), admin) as registry:
        for version in (1, 2):
            model = Mlp(version).eval()
            eager[version] = model
            name, fmt, signature = export_model(
                model, torch.randn(4, FEATURES), tmp / f"v{version}"
            )
            registry.register_model("scorer", tmp / f"v{version}" / name, framework="pytorch",
                                    signature={**signature, "format": fmt})  # fmt: skip
        ids = torch.zeros(2, 8, dtype=torch.long)
        name, fmt, signature = export_model(TinyLm().eval(), ids, tmp / "lm")
        signature = {**signature, "format": fmt, "generation": {"vocabulary": "abc", "context": 8}}
        registry.register_model("lm", tmp / "lm" / name, framework="pytorch", signature=signature)
    return eager


def test_serve_through_the_cli(platform: Any, gantry: Run, tmp_path: Path) -> None:
    import torch

    from gantry.client.admin import create_token

    admin = create_token(platform.data_dir, "admin", ["platform-admin"])
    developer = create_token(platform.data_dir, "dev", ["ml-developer"])
    eager = _models(platform, admin, tmp_path)

    def serve(*args: str | Path, token: str = admin) -> Result:
        return gantry("serve", *args, "--data-dir", platform.data_dir, "--token", token)

    deployed = serve("deploy", "--model", "scorer", "--version", "1", "--max-batch-size", "8",
                     "--max-queue-delay-us", "500")  # fmt: skip
    assert deployed.code == 0, deployed.err
    assert "scorer v1 serves 100%" in deployed.out and "ready" in deployed.out

    x = np.random.default_rng(0).standard_normal((3, FEATURES)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = eager[1](torch.from_numpy(x)).detach().numpy()
    answered = serve("infer", "scorer", "--input", f"INPUT__0=@{tmp_path / 'x.npy'}", "--json")
    assert answered.code == 0, answered.err
    reply = json.loads(answered.out)
    assert reply["model_version"] == "1"
    (output,) = reply["outputs"]
    assert (output["name"], output["shape"]) == ("OUTPUT__0", [3, 3])
    got = np.array(output["data"], dtype=np.float32).reshape(3, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    row = json.dumps(x[:1].tolist())
    printed = serve("infer", "scorer", "--input", f"INPUT__0={row}")
    assert printed.code == 0 and "scorer v1 answered" in printed.out, printed.err
    wrong = serve("infer", "scorer", "--input", "INPUT__0=[[1, 2]]")
    assert wrong.code == 2 and "gantry: error:" in wrong.err

    no_canary = serve("rollback", "scorer")
    assert no_canary.code == 2
    assert "has no canary in progress" in no_canary.err and "--canary" in no_canary.err
    refused = serve("deploy", "--model", "scorer", "--name", "prod", "--env", "production",
                    token=developer)  # fmt: skip
    assert refused.code == 2 and "production" in refused.err

    # a canary that cannot move on its own: no traffic, so every check is skipped
    canary = serve("deploy", "--model", "scorer", "--version", "2", "--canary", "20%",
                   "--canary-interval", "0.3", "--canary-step", "30%", "--canary-max", "60",
                   "--canary-min-requests", "1000", "--canary-failures", "2")  # fmt: skip
    assert canary.code == 0, canary.err
    assert "canary scorer v2 gets 20%, v1 keeps 80%" in canary.out
    listed = serve("list")
    assert listed.code == 0 and "v1 80% / v2 20%" in listed.out and "progressing" in listed.out
    status = serve("status", "scorer")
    assert status.code == 0, status.err
    assert "/v2/models/scorer/infer" in status.out and "canary.started" in status.out
    assert "progressing v2 against v1" in status.out

    promoted = serve("promote", "scorer")
    assert promoted.code == 0 and "v2 promoted to 100%" in promoted.out, promoted.err
    detail = json.loads(serve("status", "scorer", "--json").out)
    assert detail["canary"]["phase"] == "promoted"
    assert [(v["version"], v["weight"]) for v in detail["versions"]] == [(2, 100)]
    assert detail["history"][-1]["action"] == "promoted"
    assert detail["endpoint"].endswith("/v2/models/scorer/infer")
    assert "promoted" in serve("status", "scorer").out
    asked = serve("infer", "scorer", "-i", f"INPUT__0={row}", "--version", "v2")
    assert asked.code == 0 and "scorer v2 answered" in asked.out, asked.err

    # an A/B split: v1 comes back as a canary, and a manual split takes over from the analysis
    assert serve("deploy", "--model", "scorer", "--version", "1", "--canary", "10").code == 0
    split = serve("traffic", "scorer", "1=50", "2=50", "--sticky-header", "X-User-Id")
    assert split.code == 0, split.err
    assert (
        "traffic split v1=50%, v2=50%" in split.out and "sticky routing by x-user-id" in split.out
    )
    assert "v1 50% / v2 50%" in serve("list").out
    detail = json.loads(serve("status", "scorer", "--json").out)
    assert detail["sticky_header"] == "x-user-id" and detail["canary"]["phase"] != "progressing"
    no_canary = serve("rollback", "scorer")
    assert no_canary.code == 2 and "has no canary in progress" in no_canary.err
    back_to_one = serve("traffic", "scorer", "2=100", "--no-sticky")
    assert back_to_one.code == 0 and "sticky routing off" in back_to_one.out, back_to_one.err
    bad_split = serve("traffic", "scorer", "7=100")
    assert bad_split.code == 2 and "v7 is not a version of scorer" in bad_split.err

    # roll a canary back by hand, with the reason kept
    again = serve("deploy", "--model", "scorer", "--version", "1", "--canary", "10")
    assert again.code == 0, again.err
    back = serve("rollback", "scorer", "--reason", "p99 too high")
    assert back.code == 0 and "rolled back: p99 too high" in back.out, back.err

    lm = serve("deploy", "--model", "lm")
    assert lm.code == 0, lm.err
    text = serve("generate", "lm", "ab", "--max-tokens", "5", "--seed", "1")
    assert text.code == 0, text.err
    assert text.out.endswith("\n") and len(text.out) == 6 and set(text.out[:-1]) <= set("abc")
    not_lm = serve("generate", "scorer", "ab")
    assert not_lm.code == 2 and "gantry: error:" in not_lm.err

    for name in ("scorer", "lm"):
        gone = serve("undeploy", name)
        assert gone.code == 0 and f"undeployed {name}" in gone.out, gone.err
    missing = serve("status", "scorer")
    assert missing.code == 2 and "not found" in missing.err
    assert "0 deployments" in serve("list").out
