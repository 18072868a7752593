"""The inference artefact: torch.export with a dynamic batch, the TorchScript fallback, INT8
dynamic quantisation, the manifest the agent registers, and the code version."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import gantry.training.export
from gantry.core import InvalidInput
from gantry.training.export import (
    MANIFEST,
    ModelManifest,
    clean_metrics,
    code_version,
    export_model,
    quantize_dynamic,
)


def classifier() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))


class TwoInputs(nn.Module):
    """Takes a tuple of inputs and returns a tuple of outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joint = self.a(x) + self.b(z)
        return joint, joint.sum(dim=1)


class DataDependent(nn.Module):
    """Branches on the values of its input: torch.export cannot capture it, tracing can."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out if x.sum() > 0 else -out


def load_torchscript(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates torch.jit
        return torch.jit.load(str(path))  # type: ignore[no-untyped-call]


def test_public_surface_is_pinned() -> None:
    assert sorted(gantry.training.export.__all__) == [
        "FORMATS",
        "MANIFEST",
        "ModelManifest",
        "clean_metrics",
        "code_version",
        "export_model",
        "load_exported",
        "quantize_dynamic",
    ]


# -- export_model --------------------------------------------------------------------------------


def test_export_round_trips_with_a_dynamic_batch(tmp_path: Path) -> None:
    model = classifier()  # in training mode: the export must evaluate it (no dropout)
    artifact, fmt, signature = export_model(model, torch.randn(2, 8), tmp_path / "out")

    assert (artifact, fmt) == ("model.pt2", "torch.export")
    assert signature == {
        "inputs": [{"shape": [-1, 8], "dtype": "float32"}],
        "outputs": [{"shape": [-1, 3], "dtype": "float32"}],
    }
    assert model.training  # the caller's model is left as it was
    loaded = torch.export.load(str(tmp_path / "out" / artifact)).module()
    model.eval()
    with torch.no_grad():
        for batch in (2, 7):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-6)


def test_export_of_tuple_inputs_and_outputs(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = TwoInputs()
    artifact, fmt, signature = export_model(model, (torch.randn(3, 4), torch.randn(3, 6)), tmp_path)

    assert fmt == "torch.export"
    assert [i["shape"] for i in signature["inputs"]] == [[-1, 4], [-1, 6]]
    assert [o["shape"] for o in signature["outputs"]] == [[-1, 2], [-1]]
    loaded = torch.export.load(str(tmp_path / artifact)).module()
    x, z = torch.randn(5, 4), torch.randn(5, 6)
    with torch.no_grad():
        for got, want in zip(loaded(x, z), model(x, z), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_model_torch_export_cannot_capture_falls_back_to_torchscript(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = DataDependent()
    artifact, fmt, _ = export_model(model, torch.ones(2, 8), tmp_path)

    assert (artifact, fmt) == ("model.ts", "torchscript")
    assert not (tmp_path / "model.pt2").exists()
    loaded = load_torchscript(tmp_path / artifact)
    x = torch.rand(7, 8)  # positive sum: the branch the trace recorded
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-6)


def test_a_quantized_export_loads_and_stays_close(tmp_path: Path) -> None:
    model = classifier().eval()
    artifact, fmt, signature = export_model(model, torch.randn(2, 8), tmp_path, quantize=True)

    path = tmp_path / artifact
    assert path.is_file() and signature["outputs"] == [{"shape": [-1, 3], "dtype": "float32"}]
    loaded = (
        torch.export.load(str(path)).module() if fmt == "torch.export" else load_torchscript(path)
    )
    x = torch.randn(7, 8)
    with torch.no_grad():
        want, got = model(x), loaded(x)
    assert got.shape == want.shape
    # INT8 weights and activations: close, not equal
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    assert not torch.equal(got, want)


def test_quantize_dynamic_replaces_only_the_linear_layers() -> None:
    model = classifier()
    quantized = quantize_dynamic(model)

    assert isinstance(quantized, nn.Sequential)
    kinds = [type(m).__name__ for m in quantized]
    assert kinds[1:3] == ["ReLU", "Dropout"]
    assert all("quantized" in type(quantized[i]).__module__ for i in (0, 3))
    assert isinstance(model[0], nn.Linear)  # the original is untouched


# -- ModelManifest -------------------------------------------------------------------------------


def manifest(**changes: Any) -> ModelManifest:
    base: dict[str, Any] = {
        "name": "ranker",
        "artifact": "model.pt2",
        "format": "torch.export",
        "metrics": {"final_loss": 0.25, "eval_loss": 0.3},
        "signature": {"inputs": [{"shape": [-1, 8], "dtype": "float32"}]},
        "code_version": "sha256:0123456789abcdef",
        "description": "ranks things",
        "quantized": False,
    }
    return ModelManifest(**(base | changes))


def test_a_manifest_round_trips(tmp_path: Path) -> None:
    (tmp_path / "model.pt2").write_bytes(b"artefact")
    written = manifest()

    path = written.write(tmp_path)

    assert path == tmp_path / MANIFEST == tmp_path / "model.json"
    assert json.loads(path.read_text())["framework"] == "pytorch"
    assert not list(tmp_path.glob(".*"))  # the temporary file was renamed into place
    assert ModelManifest.read(tmp_path) == written


def test_no_manifest_means_no_model(tmp_path: Path) -> None:
    assert ModelManifest.read(tmp_path) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not a model manifest"),
        ("[1, 2]", "is not a model manifest"),
        (json.dumps({"name": "x", "artifact": "model.pt2"}), "is not a model manifest"),
        (
            json.dumps({"name": "x", "artifact": "model.pt2", "format": "f", "owner": "me"}),
            "is not a model manifest",
        ),
        (json.dumps({"name": "x", "artifact": "gone.pt2", "format": "f"}), "which is missing"),
        (json.dumps({"name": "x", "artifact": "../model.pt2", "format": "f"}), "which is missing"),
        (json.dumps({"name": "x", "artifact": "sub/model.pt2", "format": "f"}), "which is missing"),
    ],
)
def test_bad_manifests_are_refused(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "model.pt2").write_bytes(b"artefact")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.pt2").write_bytes(b"artefact")
    (tmp_path / MANIFEST).write_text(content)
    with pytest.raises(InvalidInput, match=message):
        ModelManifest.read(tmp_path)


# -- metrics and code version --------------------------------------------------------------------


def test_clean_metrics_gives_finite_floats() -> None:
    cleaned = clean_metrics(
        {"loss": 0.5, "steps": 12, "accuracy": np.float32(0.75), "auc": torch.tensor(0.875)}
    )
    assert cleaned == {"loss": 0.5, "steps": 12.0, "accuracy": 0.75, "auc": 0.875}
    assert all(type(v) is float for v in cleaned.values())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (math.nan, "is nan, not a finite number"),
        (math.inf, "is inf, not a finite number"),
        (-math.inf, "is -inf, not a finite number"),
        ("high", "is 'high', not a number"),
        (None, "is None, not a number"),
        ([1.0], r"is \[1.0\], not a number"),
    ],
)
def test_clean_metrics_refuses_what_is_not_a_finite_number(value: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=f"metric 'm' {message}"):
        clean_metrics({"m": value})


@pytest.fixture
def module_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real module, imported from a directory outside any git work tree."""
    path = tmp_path / "gantry_export_code_version_task.py"
    path.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(path.stem)
    yield path
    sys.modules.pop(path.stem, None)


def test_code_version_hashes_the_module_source(module_file: Path) -> None:
    digest = hashlib.sha256(module_file.read_bytes()).hexdigest()[:16]
    version = code_version(module_file.stem)
    # no git work tree around /tmp: the hash alone
    assert version.split()[-1] == f"sha256:{digest}"
    module_file.write_text("VALUE = 2\n")  # other code, another version
    assert code_version(module_file.stem) != version


def test_code_version_of_a_module_that_was_not_imported_names_it() -> None:
    assert code_version("gantry_never_imported") == "module:gantry_never_imported"
