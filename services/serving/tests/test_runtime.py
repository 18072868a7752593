"""The model runtime: artefacts exported by gantry training load from their registered bytes,
compute batches equal to the eager model's, check what they are given, run from several
threads at once, and fail to load with a clear ModelLoadError when they cannot be served."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from gantry.serving.errors import BadRequest, ModelFailed
from gantry.serving.protocol import TensorSpec
from gantry.serving.runtime import (
    Artifact,
    LoadedModel,
    ModelLoadError,
    load_model,
    sniff_format,
)
from gantry.training.examples.transformer import ALPHABET, CONTEXT, CharTransformer
from gantry.training.export import export_model

Export = Callable[..., Artifact]


@pytest.fixture
def export(tmp_path: Path) -> Export:
    """Export a model as gantry training does; the Artifact the registry would hand out."""
    count = 0

    def build(model: nn.Module, example: Any, **extra: Any) -> Artifact:
        nonlocal count
        count += 1
        directory = tmp_path / f"export{count}"
        name, fmt, signature = export_model(model, example, directory)
        data = (directory / name).read_bytes()
        return Artifact("m", count, data, fmt, {**signature, "format": fmt, **extra})

    return build


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)).eval()


class DataDependent(nn.Module):
    """torch.export refuses a branch on a value; tracing records the branch taken."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out if x.sum() > 0 else -out


class Counter(nn.Module):
    """Writes its own buffer on every call: a stateful model."""

    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        out: torch.Tensor = self.linear(x)
        return out


def eager(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = model(torch.from_numpy(x)).numpy()
    return out


def rows(n: int, width: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def test_an_exported_mlp_computes_what_the_eager_model_does(export: Export) -> None:
    model = mlp()
    artifact = export(model, torch.randn(4, 8))
    assert artifact.format == "torch.export" and sniff_format(artifact.data) == "torch.export"

    loaded = load_model(artifact)
    assert loaded.platform == "pytorch_torch_export"
    assert (loaded.device, loaded.quantized, loaded.generation) == ("cpu", False, None)
    assert loaded.inputs == (TensorSpec("INPUT__0", "FP32", (-1, 8)),)
    assert loaded.outputs == (TensorSpec("OUTPUT__0", "FP32", (-1, 3)),)
    for n in (1, 5, 64):
        x = rows(n)
        (out,) = loaded.run([x])
        assert out.dtype == np.float32 and out.shape == (n, 3)
        np.testing.assert_allclose(out, eager(model, x), rtol=1e-5, atol=1e-6)
    assert 0 < loaded.warm_up(16) < 30


def test_signature_names_are_used_and_an_unnamed_format_is_sniffed(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    signature = dict(artifact.signature)
    signature["inputs"] = [{**signature["inputs"][0], "name": "features"}]
    signature["outputs"] = [{**signature["outputs"][0], "name": "scores"}]
    loaded = load_model(Artifact("m", 1, artifact.data, "", signature))
    assert [s.name for s in loaded.inputs] == ["features"]
    assert [s.name for s in loaded.outputs] == ["scores"]
    assert loaded.platform == "pytorch_torch_export"


def test_without_a_signature_the_program_describes_itself(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    loaded = load_model(Artifact("m", 1, artifact.data, "torch.export", {}))
    assert loaded.inputs == (TensorSpec("INPUT__0", "FP32", (-1, 8)),)
    assert loaded.outputs == (TensorSpec("OUTPUT__0", "FP32", (-1, 3)),)


def test_a_model_torch_export_refuses_falls_back_to_torchscript_and_runs(export: Export) -> None:
    torch.manual_seed(0)
    model = DataDependent().eval()
    artifact = export(model, torch.rand(4, 8))  # positive: the traced branch
    assert artifact.format == "torchscript" and sniff_format(artifact.data) == "torchscript"

    loaded = load_model(Artifact("m", 1, artifact.data, "", artifact.signature))
    assert loaded.platform == "pytorch_torchscript"
    assert loaded.inputs == (TensorSpec("INPUT__0", "FP32", (-1, 8)),)
    x = np.abs(rows(6))
    np.testing.assert_allclose(loaded.run([x])[0], eager(model, x), rtol=1e-5, atol=1e-6)
    assert loaded.warm_up(4) > 0


def test_the_char_transformer_loads_with_int64_tokens_and_fp32_logits(export: Export) -> None:
    torch.manual_seed(0)
    model = CharTransformer().eval()
    generation = {"vocabulary": ALPHABET, "context": CONTEXT}
    artifact = export(model, torch.zeros(2, CONTEXT, dtype=torch.long), generation=generation)
    loaded = load_model(artifact)
    assert loaded.inputs == (TensorSpec("INPUT__0", "INT64", (-1, CONTEXT)),)
    assert loaded.outputs == (TensorSpec("OUTPUT__0", "FP32", (-1, CONTEXT, len(ALPHABET))),)
    assert loaded.generation is not None
    assert (loaded.generation.vocabulary, loaded.generation.context) == (ALPHABET, CONTEXT)
    tokens = np.random.default_rng(1).integers(0, len(ALPHABET), (3, CONTEXT))
    (logits,) = loaded.run([tokens])
    assert logits.shape == (3, CONTEXT, len(ALPHABET)) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, eager(model, tokens), rtol=1e-4, atol=1e-5)
    assert loaded.warm_up(4) > 0  # token id inputs are zeros: valid for the embedding


def test_a_generation_that_does_not_fit_the_model_is_refused(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8), generation={"vocabulary": "ab", "context": 8})
    with pytest.raises(ModelLoadError, match="generative model takes INT64"):
        load_model(artifact)
    artifact = export(mlp(), torch.randn(4, 8), generation={"vocabulary": "aa", "context": 8})
    with pytest.raises(ModelLoadError, match="repeats 'a'"):
        load_model(artifact)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "takes 1 input"),
        ([rows(2), rows(2)], "takes 1 input"),
        ([rows(2).astype(np.float64)], "must be FP32, not FP64"),
        ([rows(2, width=9)], r"has shape \[2, 9\]; model m expects \[-1, 8\]"),
        ([rows(2)[None]], r"has shape \[1, 2, 8\]"),
        ([np.zeros((0, 8), np.float32)], "empty batch"),
        ([[[0.0] * 8]], "is a list, not an array"),
    ],
)
def test_inputs_that_do_not_match_the_signature_are_bad_requests(
    export: Export, inputs: list[Any], message: str
) -> None:
    loaded = load_model(export(mlp(), torch.randn(4, 8)))
    with pytest.raises(BadRequest, match=message):
        loaded.run(inputs)


def test_read_only_strided_and_big_endian_arrays_are_accepted(export: Export) -> None:
    model = mlp()
    loaded = load_model(export(model, torch.randn(4, 8)))
    x = rows(6)
    expected = eager(model, x)
    frozen = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(6, 8)  # read-only
    assert not frozen.flags.writeable
    np.testing.assert_allclose(loaded.run([frozen])[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded.run([x[::-1]])[0], expected[::-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded.run([x.astype(">f4")])[0], expected, rtol=1e-5, atol=1e-6)


def test_several_threads_share_one_module(export: Export) -> None:
    model = mlp()
    loaded = load_model(export(model, torch.randn(4, 8)))
    assert not loaded.stateful
    clone = loaded.clone()
    assert clone.module is loaded.module  # a stateless model's instances share the module
    errors: list[BaseException] = []

    def work(instance: LoadedModel, seed: int) -> None:
        try:
            for i in range(50):
                x = rows(1 + (seed + i) % 16, seed=seed * 100 + i)
                np.testing.assert_allclose(
                    instance.run([x])[0], eager(model, x), rtol=1e-5, atol=1e-6
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(m, s)) for s, m in enumerate([loaded, clone] * 3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


def test_a_model_that_writes_its_state_is_serialised_and_cloned_apart(export: Export) -> None:
    loaded = load_model(export(Counter().eval(), torch.randn(3, 4)))
    assert loaded.stateful
    clone = loaded.clone()
    assert clone.module is not loaded.module and clone.stateful

    def count(instance: LoadedModel) -> float:
        return float(dict(instance.module.named_buffers())["count"])

    start = count(loaded)  # what export's trial run left in it
    x = np.ones((2, 4), np.float32)

    def run() -> None:
        for _ in range(25):
            loaded.run([x])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert count(loaded) == start + 100  # no lost update: the calls were serialised
    assert count(clone) == start  # a copy of its own


def test_a_model_that_writes_its_input_gets_a_copy(export: Export) -> None:
    class Doubler(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(2)
            return x + 1

    loaded = load_model(export(Doubler().eval(), torch.randn(3, 4)))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(loaded.run([x])[0], np.full((2, 4), 3, np.float32))
    np.testing.assert_array_equal(x, np.ones((2, 4), np.float32))  # the caller's array


def test_a_model_raising_at_run_time_is_model_failed(export: Export) -> None:
    loaded = load_model(export(DataDependent().eval(), torch.rand(4, 8)))
    module = loaded.module

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("kaboom")

    loaded._module = Boom()
    with pytest.raises(ModelFailed, match="failed on a batch of 2: RuntimeError: kaboom"):
        loaded.run([rows(2)])
    with pytest.raises(ModelLoadError, match="fails on a synthetic batch of 1"):
        loaded.warm_up(4)
    loaded._module = module


def test_a_signature_that_lies_about_the_outputs_fails_the_warm_up(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    signature = {**artifact.signature, "outputs": [{"shape": [-1, 7], "dtype": "float32"}]}
    loaded = load_model(Artifact("m", 1, artifact.data, artifact.format, signature))
    with pytest.raises(ModelLoadError, match=r"returned OUTPUT__0 of shape \[1, 3\]"):
        loaded.warm_up(2)


def test_damaged_bytes_are_a_model_load_error(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    broken = artifact.data[: len(artifact.data) // 2]
    with pytest.raises(ModelLoadError, match=r"cannot read model m version 1 as a torch.export"):
        load_model(Artifact("m", 1, broken, "torch.export", artifact.signature))
    with pytest.raises(ModelLoadError, match="format 'unknown'"):
        load_model(Artifact("m", 1, b"not a model", "", artifact.signature))
    with pytest.raises(ModelLoadError, match="format 'onnx'"):
        load_model(Artifact("m", 1, artifact.data, "onnx", artifact.signature))
    with pytest.raises(ModelLoadError, match="as a torchscript artefact"):
        load_model(Artifact("m", 1, artifact.data, "torchscript", artifact.signature))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"shape": [-1, 8], "dtype": "bfloat16"}, "dtype 'bfloat16'"),
        ({"type": "int"}, "only tensor inputs"),
        ({"shape": "(-1, 8)", "dtype": "float32"}, "has shape"),
    ],
)
def test_signatures_serving_cannot_carry_are_refused(
    export: Export, entry: dict[str, Any], message: str
) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    signature = {**artifact.signature, "inputs": [entry]}
    with pytest.raises(ModelLoadError, match=message):
        load_model(Artifact("m", 1, artifact.data, artifact.format, signature))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_model_load_error(export: Export, device: str) -> None:
    with pytest.raises(ModelLoadError, match=r"no usable CUDA device"):
        load_model(export(mlp(), torch.randn(4, 8)), device=device)


def test_devices_that_are_not_devices_are_refused(export: Export) -> None:
    artifact = export(mlp(), torch.randn(4, 8))
    with pytest.raises(ModelLoadError, match="is not a device"):
        load_model(artifact, device="gpu0")
    with pytest.raises(ModelLoadError, match="use cpu, cuda or cuda:N"):
        load_model(artifact, device="meta")


def test_quantizing_on_cuda_is_refused(export: Export) -> None:
    with pytest.raises(ModelLoadError, match="run only on the CPU"):
        load_model(export(mlp(), torch.randn(4, 8)), device="cuda", quantize=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_model_computes_what_the_cpu_does(export: Export) -> None:
    torch.manual_seed(0)
    model = CharTransformer().eval()
    artifact = export(model, torch.zeros(2, CONTEXT, dtype=torch.long))
    loaded = load_model(artifact, device="cuda")
    assert loaded.device == "cuda"
    tokens = np.random.default_rng(1).integers(0, len(ALPHABET), (3, CONTEXT))
    np.testing.assert_allclose(loaded.run([tokens])[0], eager(model, tokens), atol=1e-3)
    assert loaded.warm_up(8) > 0
