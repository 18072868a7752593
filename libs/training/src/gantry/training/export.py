"""The inference artefact of a finished job, and what the node agent registers with it.

:func:`export_model` writes the trained model as a ``torch.export`` program (``.pt2``, with a
dynamic batch dimension), falling back to TorchScript (``.ts``) for models ``torch.export``
cannot capture; with ``quantize`` the linear layers are dynamically quantised to INT8 first.
:class:`ModelManifest` (``model.json`` beside it) carries the name, metrics, signature and code
version the agent registers in the governance model registry, with the job and the dataset
versions as lineage. :func:`load_exported` reads such a directory back (an evaluation job's
``$GANTRY_MODEL_DIR``, which its agent fills from the registry in the same shape).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gantry.core import InvalidInput
from gantry.core.logging import get_logger
from gantry.training.outputs import clean_metrics

MANIFEST = "model.json"
_log = get_logger("gantry.training")


@dataclass(frozen=True)
class ModelManifest:
    """What the agent registers: read from and written to ``<dir>/model.json``."""

    name: str
    artifact: str
    format: str
    framework: str = "pytorch"
    metrics: dict[str, float] = field(default_factory=dict)
    signature: dict[str, Any] = field(default_factory=dict)
    code_version: str = ""
    description: str = ""
    quantized: bool = False

    def write(self, directory: Path) -> Path:
        """Write ``model.json`` into ``directory`` (atomically); its path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / MANIFEST
        tmp = directory / f".{MANIFEST}.{os.getpid()}.tmp"  # agents may share the directory
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, directory: Path) -> ModelManifest | None:
        """The manifest in ``directory``; None when the job exported no model."""
        path = directory / MANIFEST
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            manifest = cls(**raw)
        except (OSError, ValueError, TypeError) as exc:
            raise InvalidInput(f"{path} is not a model manifest: {exc}") from None
        if "/" in manifest.artifact or not (directory / manifest.artifact).is_file():
            raise InvalidInput(f"{path} names artefact {manifest.artifact!r}, which is missing")
        return manifest


def export_model(
    model: nn.Module,
    example: Any,
    directory: Path,
    *,
    quantize: bool = False,
) -> tuple[str, str, dict[str, Any]]:
    """Export ``model`` (evaluated on CPU) traced with ``example``; (file name, format,
    signature). ``example`` is one batch of inputs (a tensor or a tuple of tensors)."""
    directory.mkdir(parents=True, exist_ok=True)
    module = copy.deepcopy(model).cpu().eval()
    if quantize:
        module = quantize_dynamic(module)
    args = tuple(_cpu(a) for a in example) if isinstance(example, tuple) else (_cpu(example),)
    signature = {"inputs": [_describe(a) for a in args]}
    with torch.no_grad():
        outputs = module(*args)
    signature["outputs"] = [
        _describe(o) for o in (outputs if isinstance(outputs, tuple) else (outputs,))
    ]
    try:
        dims = tuple(
            {0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) else None for a in args
        )
        program = torch.export.export(module, args, dynamic_shapes=dims)
        path = directory / "model.pt2"
        torch.export.save(program, str(path))
        return path.name, "torch.export", signature
    except Exception as exc:  # torch.export refuses many dynamic models; TorchScript may not
        _log.warning(
            "torch.export failed, trying TorchScript", error=f"{type(exc).__name__}: {exc}"
        )
    path = directory / "model.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings; torch 2.13 deprecates jit.save
        traced = torch.jit.trace(module, args)  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(path))
    return path.name, "torchscript", signature


#: Artefact formats :func:`export_model` writes, and the file name each is kept under.
FORMATS = {"torch.export": "model.pt2", "torchscript": "model.ts"}


def load_exported(directory: Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The model in ``directory`` (``model.json`` and the artefact it names) as a module on
    ``device``, for inference: a ``torch.export`` program's module or a TorchScript module.

    Its parameters do not require gradients. A ``torch.export`` module is already in eval
    mode and refuses ``.eval()``/``.train()``; call it, do not train it.
    """
    manifest = ModelManifest.read(directory)
    if manifest is None:
        raise InvalidInput(
            f"{directory} holds no {MANIFEST}",
            hint="an evaluation's model directory holds model.json and the artefact it names "
            "(what the training runtime exports, and what the node agent downloads)",
        )
    path = directory / manifest.artifact
    target = torch.device(device)
    module: nn.Module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's, not the caller's
        warnings.simplefilter("ignore", FutureWarning)
        try:
            if manifest.format == "torch.export":
                program = torch.export.load(str(path))
                if target.type != "cpu":
                    from torch.export.passes import move_to_device_pass

                    program = move_to_device_pass(program, target)
                module = program.module()
            elif manifest.format == "torchscript":
                module = torch.jit.load(str(path), map_location=target)  # type: ignore[no-untyped-call]
                module.eval()
            else:
                raise InvalidInput(
                    f"model {manifest.name} has artefact format {manifest.format!r}",
                    hint=f"load models exported by gantry training: {', '.join(FORMATS)}",
                )
        except InvalidInput:
            raise
        except Exception as exc:  # torch says what is wrong with the bytes
            first = (str(exc).strip().splitlines() or ["(no message)"])[0][:300]
            raise InvalidInput(
                f"cannot load {path.name} of model {manifest.name} as {manifest.format}: "
                f"{type(exc).__name__}: {first}"
            ) from exc
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def quantize_dynamic(model: nn.Module) -> nn.Module:
    """``model`` with its ``nn.Linear`` layers dynamically quantised to INT8 (weights int8,
    activations quantised per batch at run time): smaller and faster on CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
        from torch.ao.quantization import quantize_dynamic as quantize

        quantized: nn.Module = quantize(  # type: ignore[no-untyped-call]
            model, {nn.Linear}, dtype=torch.qint8
        )
        return quantized


def code_version(module_name: str) -> str:
    """Which code trained the model: the git commit of the task's module (when it lives in a
    git work tree, ``+dirty`` when changed) and a hash of the module's source."""
    module = sys.modules.get(module_name)
    path = Path(getattr(module, "__file__", "") or "")
    parts = []
    if path.is_file():
        try:
            head = subprocess.run(
                ["git", "-C", str(path.parent), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(path.parent), "status", "--porcelain", "--", str(path)],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            parts.append(f"git:{head[:12]}{'+dirty' if dirty else ''}")
        except (OSError, subprocess.SubprocessError):
            pass
        parts.append("sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16])
    return " ".join(parts) or f"module:{module_name}"


def _cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _describe(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {"shape": [-1, *value.shape[1:]], "dtype": str(value.dtype).removeprefix("torch.")}
    return {"type": type(value).__name__}


__all__ = [
    "FORMATS",
    "MANIFEST",
    "ModelManifest",
    "clean_metrics",
    "code_version",
    "export_model",
    "load_exported",
    "quantize_dynamic",
]
