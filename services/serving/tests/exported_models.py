"""Tiny models exported as gantry training exports them, once per test session (exporting costs
a second or two; the controller and backend tests share them).

* ``"a"``, ``"b"``: MLPs (``INPUT__0`` FP32 ``[-1, 4]`` -> ``OUTPUT__0`` FP32 ``[-1, 2]``) with
  different weights, so an answer shows which one computed it.
* ``"writer"``: a generative model (token ids INT64 ``[-1, CONTEXT]`` -> logits) with its
  ``generation`` signature entry, small enough to export quickly.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gantry.serving.runtime import Artifact
from gantry.training.export import export_model

FEATURES = 4
OUTPUTS = 2
ALPHABET = "abcdefgh \n"
CONTEXT = 8


@dataclass(frozen=True)
class Exported:
    """An exported model: the eager module, the artefact's bytes, format and signature."""

    model: nn.Module
    data: bytes = field(repr=False)
    format: str
    signature: dict[str, Any]

    def artifact(self, name: str, version: int) -> Artifact:
        """The artefact a registry would hand out for ``name`` v``version``."""
        return Artifact(name, version, self.data, self.format, self.signature)


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, OUTPUTS)).eval()


def _writer() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Embedding(len(ALPHABET), 8), nn.Linear(8, len(ALPHABET))).eval()


@functools.cache
def exported(kind: str) -> Exported:
    """The model ``kind`` ("a", "b" or "writer"), exported once."""
    extra: dict[str, Any] = {}
    if kind == "writer":
        model = _writer()
        example = torch.zeros(2, CONTEXT, dtype=torch.long)
        extra = {"generation": {"vocabulary": ALPHABET, "context": CONTEXT}}
    else:
        model = _mlp({"a": 1, "b": 2}[kind])
        example = torch.randn(2, FEATURES)
    with tempfile.TemporaryDirectory(prefix="gantry-serving-test-") as tmp:
        name, fmt, signature = export_model(model, example, Path(tmp))
        data = (Path(tmp) / name).read_bytes()
    return Exported(model, data, fmt, {**signature, "format": fmt, **extra})


__all__ = ["ALPHABET", "CONTEXT", "FEATURES", "OUTPUTS", "Exported", "exported"]
