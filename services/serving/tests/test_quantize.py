"""Dynamic INT8 quantisation at load time: the exported program's aten.linear calls become
quantised dynamic linear modules (TorchScript's become quantized::linear_dynamic), the
results stay within a small tolerance of float, and the weights take about a quarter of the
bytes."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import fx, nn

from gantry.serving.quantize import (
    LINEAR,
    count_quantized,
    quantize_graph_module,
    quantize_linear,
)
from gantry.serving.runtime import Artifact, ModelLoadError, load_model
from gantry.training.examples.transformer import ALPHABET, CONTEXT, CharTransformer
from gantry.training.export import export_model

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear


def artifact(model: nn.Module, example: torch.Tensor, directory: Path) -> Artifact:
    name, fmt, signature = export_model(model, example, directory)
    return Artifact("m", 1, (directory / name).read_bytes(), fmt, signature)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ).eval()


def state_bytes(module: nn.Module) -> int:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return len(buffer.getvalue())


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_a_quantised_mlp_is_close_smaller_and_holds_no_float_linear(tmp_path: Path) -> None:
    exported = artifact(mlp(), torch.randn(4, 256), tmp_path)
    full = load_model(exported)
    small = load_model(exported, quantize=True)
    assert small.quantized and not full.quantized
    assert small.inputs == full.inputs and small.outputs == full.outputs

    module = small.module
    assert isinstance(module, fx.GraphModule)
    targets = [n.target for n in module.graph.nodes]
    assert LINEAR not in targets
    quantized = [m for m in module.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == 3 and count_quantized(module) == 3
    called = [n for n in module.graph.nodes if n.op == "call_module"]
    assert {str(n.target) for n in called} >= {"quantized_linear_0", "quantized_linear_2"}
    assert not any(p.dtype == torch.float32 and p.dim() == 2 for p in module.parameters())

    x = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    assert relative_error(small.run([x])[0], full.run([x])[0]) < 0.05
    assert state_bytes(small.module) < 0.3 * state_bytes(full.module)
    assert small.warm_up(8) > 0


def test_the_char_transformer_quantises_its_nine_linear_layers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    exported = artifact(
        CharTransformer().eval(), torch.zeros(2, CONTEXT, dtype=torch.long), tmp_path
    )
    full, small = load_model(exported), load_model(exported, quantize=True)
    assert count_quantized(small.module) == 9  # qkv, out and two MLP layers per block, head
    tokens = np.random.default_rng(0).integers(0, len(ALPHABET), (2, CONTEXT))
    assert relative_error(small.run([tokens])[0], full.run([tokens])[0]) < 0.05


def test_a_torchscript_model_is_quantised_by_torchscripts_pass(tmp_path: Path) -> None:
    class Branchy(nn.Module):  # torch.export refuses it: TorchScript
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.first(x))
            out: torch.Tensor = self.second(h) if x.sum() > 0 else -self.second(h)
            return out

    torch.manual_seed(0)
    exported = artifact(Branchy().eval(), torch.rand(4, 16), tmp_path)
    assert exported.format == "torchscript"
    full, small = load_model(exported), load_model(exported, quantize=True)
    assert small.quantized and count_quantized(small.module) == 2
    x = np.random.default_rng(0).random((8, 16)).astype(np.float32)
    assert relative_error(small.run([x])[0], full.run([x])[0]) < 0.05
    assert full.module is not small.module and count_quantized(full.module) == 0


def test_a_model_exported_quantised_reports_it(tmp_path: Path) -> None:
    name, fmt, signature = export_model(mlp(), torch.randn(4, 256), tmp_path, quantize=True)
    exported = Artifact("m", 1, (tmp_path / name).read_bytes(), fmt, signature)
    assert load_model(exported).quantized
    assert load_model(exported, quantize=True).quantized  # nothing left to do: no error


def test_a_model_without_linear_layers_cannot_be_quantised(tmp_path: Path) -> None:
    exported = artifact(nn.Sequential(nn.Tanh()).eval(), torch.randn(4, 3), tmp_path)
    with pytest.raises(ModelLoadError, match="no float32 linear layers"):
        load_model(exported, quantize=True)


def test_the_pass_shares_tied_weights_and_keeps_weights_used_elsewhere() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = self.linear(self.linear(x))
            return y + self.linear.weight.sum()

    torch.manual_seed(0)
    model = Tied().eval()
    program = torch.export.export(model, (torch.randn(3, 8),))
    module = program.module()
    assert isinstance(module, fx.GraphModule)
    assert quantize_graph_module(module) == 2
    assert count_quantized(module) == 1  # one quantised module called twice
    assert [n.target for n in module.graph.nodes if n.op == "get_attr"] == ["linear.weight"]
    x = torch.randn(3, 8)
    with torch.inference_mode():
        assert torch.allclose(module(x), model(x), rtol=0.05, atol=0.05)


def test_quantize_linear_matches_the_library() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(4, 6), torch.randn(4)
    layer = quantize_linear(weight, bias)
    assert isinstance(layer, QuantizedLinear)
    x = torch.randn(5, 6)
    expected = x @ weight.T + bias
    assert float((layer(x) - expected).abs().max() / expected.abs().max()) < 0.05
    assert quantize_linear(weight, None)(x).shape == (5, 4)
