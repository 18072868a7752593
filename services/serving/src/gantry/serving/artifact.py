"""A registered model version's artefact as the serving service fetched it (no torch here: the
service starts without importing torch, which loads only with the first model)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Artifact:
    """A registered model version's artefact: the exported file's bytes and its signature.

    ``format`` is ``"torch.export"`` or ``"torchscript"``; "" reads it from the bytes."""

    name: str
    version: int
    data: bytes = field(repr=False)
    format: str = ""
    signature: Mapping[str, Any] = field(default_factory=dict)


__all__ = ["Artifact"]
