"""What every workflow document shares: the envelope, YAML loading, readable validation errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gantry.core import InvalidInput

API_VERSION = "gantry/v1"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class DocModel(BaseModel):
    """Strict, frozen, accepting both field names and their YAML aliases."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Metadata(DocModel):
    """The document's name and description."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


def load_document(source: str) -> dict[str, Any]:
    """The YAML mapping in ``source``; :class:`InvalidInput` if it is not one."""
    try:
        doc = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the file is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(
            "a workflow file must be a mapping with apiVersion, kind, metadata and spec",
            hint=f"start with 'apiVersion: {API_VERSION}' and 'kind: Pipeline'",
        )
    return doc


def validation_problems(exc: ValidationError, raw: Mapping[str, Any]) -> list[str]:
    out = []
    for e in exc.errors():
        where = _where(e["loc"], raw)
        message = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = "is not a known field (check its spelling and indentation)"
        elif e["type"] == "missing":
            message = "is required"
        out.append(f"{where}: {message}")
    return out


def _where(loc: Sequence[int | str], raw: Mapping[str, Any]) -> str:
    names = {"api_version": "apiVersion", "depends_on": "dependsOn", "at_least": "atLeast"}
    parts: list[str] = []
    node: Any = raw
    for p in loc:
        if isinstance(p, int):
            label = f"[{p}]"
            if isinstance(node, list) and p < len(node) and isinstance(node[p], dict):
                step = node[p].get("name")
                label += f" ({step})" if isinstance(step, str) else ""
            parts.append(label)
            node = node[p] if isinstance(node, list) and p < len(node) else None
        else:
            parts.append(names.get(p, p))
            node = node.get(p) if isinstance(node, dict) else None
    return ".".join(parts).replace(".[", "[") or "(document)"


__all__ = [
    "API_VERSION",
    "NAME_PATTERN",
    "DocModel",
    "Metadata",
    "load_document",
    "validation_problems",
]
