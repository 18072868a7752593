"""The model runtime: a registered model artefact turned into something that runs batches.

The training runtime exports a model as a ``torch.export`` program (``model.pt2``, dynamic
batch dimension 0) or, when ``torch.export`` cannot capture it, as TorchScript
(``model.ts``); the registry holds the file's bytes with its signature (``{"inputs":
[{"shape": [-1, ...], "dtype": "float32"}], "outputs": [...], "format": ...}``, plus
``"generation"`` for language models). :func:`load_model` reads those bytes into a
:class:`LoadedModel` on a device, optionally with its linear layers dynamically quantised to
INT8 (:mod:`gantry.serving.quantize`, CPU only); :meth:`LoadedModel.run` computes one batch
of numpy arrays, checked against the model's :class:`~gantry.serving.protocol.TensorSpec`
metadata; :meth:`LoadedModel.warm_up` runs synthetic batches before the model takes traffic.

**Threads.** :meth:`LoadedModel.run` may be called from several threads at once. The module
of a ``torch.export`` program is a plain FX graph over read-only parameters, and a TorchScript
module's interpreter is re-entrant, so concurrent calls on one module are safe and run in
parallel (torch releases the GIL inside its kernels); ``torch.inference_mode`` is per thread.
The exception is a model that writes its own state while computing (an in-place op on a buffer
or parameter, e.g. a call counter): it is detected from the graph, and calls on it are
serialised by a lock. A model that writes into its inputs gets copies of the caller's arrays.
:meth:`LoadedModel.clone` makes another instance: one that shares the module (and memory) for
a stateless model, a deep copy with its own lock for a stateful one.

Torch's thread settings (``torch.set_num_threads``) are the service's business, not set here.
"""

from __future__ import annotations

import copy
import io
import threading
import time
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from gantry.core import GantryError, InvalidInput
from gantry.serving import quantize as quantization
from gantry.serving.artifact import Artifact
from gantry.serving.errors import BadRequest, InferenceError, ModelFailed
from gantry.serving.generation import Generation
from gantry.serving.protocol import DATATYPES, TensorSpec

#: Artefact format -> the platform the model metadata reports (Triton's naming).
PLATFORMS = {"torch.export": "pytorch_torch_export", "torchscript": "pytorch_torchscript"}

#: torch dtype name (as the training export writes it) -> Open Inference Protocol datatype.
TORCH_DATATYPES = {
    "float32": "FP32",
    "float": "FP32",
    "float64": "FP64",
    "double": "FP64",
    "float16": "FP16",
    "half": "FP16",
    "int64": "INT64",
    "long": "INT64",
    "int32": "INT32",
    "int": "INT32",
    "int16": "INT16",
    "short": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "bool": "BOOL",
}

#: TorchScript ops whose output is a view of their first input (followed back to find
#: what an in-place op writes).
_SCRIPTED_VIEWS = frozenset(
    f"aten::{op}"
    for op in (
        "view", "reshape", "select", "slice", "narrow", "transpose", "permute", "expand",
        "squeeze", "unsqueeze", "as_strided", "t", "flatten", "unflatten", "diagonal",
        "detach", "alias", "view_as", "expand_as", "unfold",
    )
)  # fmt: skip


class ModelLoadError(GantryError):
    """A model artefact cannot be served: unreadable, of an unknown format, asking for a
    device or quantisation this machine cannot give, or failing on synthetic inputs."""

    grpc_code = "FAILED_PRECONDITION"


def use_threads(threads: int) -> None:
    """Set torch's intra-op threads (``threads`` > 0; 0 leaves torch's default)."""
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def sniff_format(data: bytes) -> str:
    """The format of an artefact's bytes ("torch.export" or "torchscript"); "" when neither.

    Both are zip archives: a ``torch.export`` archive holds ``archive_format`` and
    ``models/*.json``, a TorchScript one ``code/`` and ``constants.pkl``."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError):
        return ""
    if any(n.endswith("/archive_format") or "/models/" in n for n in names):
        return "torch.export"
    if any("/code/" in n or n.endswith("/constants.pkl") for n in names):
        return "torchscript"
    return ""


class LoadedModel:
    """A model ready to compute batches on its device (build one with :func:`load_model`).

    ``inputs`` and ``outputs`` are the model's tensors as its metadata reports them (shape
    -1 = any size; dimension 0 is the batch). ``generation`` is set for language models that
    can stream text. See the module doc for what may run concurrently.
    """

    def __init__(
        self,
        *,
        name: str,
        version: int,
        module: nn.Module,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        platform: str,
        device: str,
        quantized: bool = False,
        generation: Generation | None = None,
        stateful: bool = False,
        copies_inputs: bool = False,
        lock: threading.Lock | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.inputs = inputs
        self.outputs = outputs
        self.platform = platform
        self.device = device
        self.quantized = quantized
        self.generation = generation
        self.stateful = stateful
        """The model writes its own state while computing: calls are serialised."""
        self._module = module
        self._torch_device = torch.device(device)
        self._copies_inputs = copies_inputs
        self._lock = lock if lock is not None else (threading.Lock() if stateful else None)
        self._dtypes = tuple(DATATYPES[spec.datatype] for spec in inputs)

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, version={self.version}, platform={self.platform!r}, "
            f"device={self.device!r}, quantized={self.quantized})"
        )

    @property
    def module(self) -> nn.Module:
        """The torch module that computes (an FX ``GraphModule`` or a TorchScript module)."""
        return self._module

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One batch: ``inputs`` (one array per input, batched along dimension 0) in, the
        outputs (numpy, on the CPU) out. :class:`BadRequest` when the arrays do not match the
        inputs' datatypes and shapes; :class:`ModelFailed` when the model raises."""
        arrays = self._check(inputs)
        tensors = [self._tensor(a) for a in arrays]
        try:
            with self._lock or nullcontext(), torch.inference_mode():
                result = self._module(*tensors)
            outputs = _flatten(result)
        except InferenceError:
            raise
        except Exception as exc:
            raise ModelFailed(
                f"model {self.name} version {self.version} failed on a batch of "
                f"{len(arrays[0])}: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        if len(outputs) != len(self.outputs):
            raise ModelFailed(
                f"model {self.name} version {self.version} returned {len(outputs)} outputs; "
                f"its signature declares {len(self.outputs)}"
            )
        return [t.detach().cpu().numpy() for t in outputs]

    def warm_up(self, max_batch_size: int) -> float:
        """Run synthetic batches of 1 and ``max_batch_size`` rows (twice each: the first
        calls pay for lazy initialisation and TorchScript's profiling) and check the outputs'
        shapes; the seconds it took. :class:`ModelLoadError` when the model fails on them."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, not {max_batch_size}")
        started = time.perf_counter()
        for size in sorted({1, max_batch_size}):
            batch = self.synthetic_inputs(size)
            for _ in range(2):
                try:
                    outputs = self.run(batch)
                except InferenceError as exc:
                    raise ModelLoadError(
                        f"model {self.name} version {self.version} fails on a synthetic batch "
                        f"of {size}: {exc.message}",
                        hint="check that the registered signature matches the model",
                    ) from exc
                self._check_outputs(outputs, size)
        return time.perf_counter() - started

    def synthetic_inputs(self, batch_size: int) -> list[np.ndarray]:
        """Inputs of the right datatypes and shapes: normal floats, zeros otherwise (valid
        token ids for embeddings); a dynamic dimension other than the batch is 1."""
        rng = np.random.default_rng(0)
        arrays = []
        for spec, dtype in zip(self.inputs, self._dtypes, strict=True):
            shape = (batch_size, *(d if d >= 0 else 1 for d in spec.shape[1:]))
            if dtype.kind == "f":
                arrays.append(rng.standard_normal(shape).astype(dtype))
            else:
                arrays.append(np.zeros(shape, dtype=dtype))
        return arrays

    def clone(self) -> LoadedModel:
        """Another instance of this model. A stateless model's instances share one module
        (no extra memory; calls run concurrently anyway); a stateful one gets a deep copy with
        its own lock, so instances compute in parallel (or, if the module cannot be copied,
        the same module and the same lock)."""
        module, lock = self._module, self._lock
        if self.stateful:
            try:
                with _quiet():
                    module = copy.deepcopy(self._module)
                lock = threading.Lock()
            except Exception:  # some modules cannot be copied: share, serialised
                module, lock = self._module, self._lock
        return LoadedModel(
            name=self.name,
            version=self.version,
            module=module,
            inputs=self.inputs,
            outputs=self.outputs,
            platform=self.platform,
            device=self.device,
            quantized=self.quantized,
            generation=self.generation,
            stateful=self.stateful,
            copies_inputs=self._copies_inputs,
            lock=lock,
        )

    def _check(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise BadRequest(
                f"model {self.name} takes {len(self.inputs)} input(s) ({names}); got {len(inputs)}"
            )
        arrays = []
        batch: int | None = None
        for spec, dtype, array in zip(self.inputs, self._dtypes, inputs, strict=True):
            if not isinstance(array, np.ndarray):
                raise BadRequest(f"input {spec.name} is a {type(array).__name__}, not an array")
            if array.dtype != dtype:
                if array.dtype.newbyteorder("=") != dtype:
                    raise BadRequest(
                        f"input {spec.name} must be {spec.datatype}, not "
                        f"{_datatype_of(array.dtype)}"
                    )
                array = array.astype(dtype)  # the same type in the other byte order
            if array.ndim != len(spec.shape) or any(
                want >= 0 and got != want
                for want, got in zip(spec.shape[1:], array.shape[1:], strict=False)
            ):
                raise BadRequest(
                    f"input {spec.name} has shape {list(array.shape)}; model {self.name} "
                    f"expects {list(spec.shape)} (-1 = any size, the first is the batch)"
                )
            if batch is None:
                batch = array.shape[0]
            elif array.shape[0] != batch:
                raise BadRequest(
                    f"input {spec.name} has {array.shape[0]} rows, the first input {batch}: "
                    "every input of a batch must have the same number of rows"
                )
            arrays.append(array)
        if not batch:
            raise BadRequest(f"model {self.name} got an empty batch (no rows)")
        return arrays

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        # torch.from_numpy shares the array's memory: copy only what it cannot share (read-only
        # buffers, negative strides) or what the model would write into
        if self._copies_inputs or not array.flags.writeable or any(s < 0 for s in array.strides):
            array = np.array(array, copy=True, order="C")
        tensor = torch.from_numpy(array)
        if self._torch_device.type != "cpu":
            tensor = tensor.to(self._torch_device, non_blocking=False)
        return tensor

    def _check_outputs(self, outputs: Sequence[np.ndarray], size: int) -> None:
        for spec, array in zip(self.outputs, outputs, strict=True):
            expected = (size, *spec.shape[1:])
            if array.ndim != len(expected) or any(
                want >= 0 and got != want for want, got in zip(expected, array.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"model {self.name} version {self.version} returned {spec.name} of shape "
                    f"{list(array.shape)} for a batch of {size}; its signature declares "
                    f"{list(spec.shape)}",
                    hint="export the model again (its signature is out of date), or export it "
                    "with a dynamic batch dimension",
                )
            if _datatype_of(array.dtype) != spec.datatype:
                raise ModelLoadError(
                    f"model {self.name} version {self.version} returned {spec.name} as "
                    f"{_datatype_of(array.dtype)}; its signature declares {spec.datatype}"
                )


def load_model(artifact: Artifact, *, device: str = "cpu", quantize: bool = False) -> LoadedModel:
    """Read ``artifact`` onto ``device`` ("cpu", "cuda", "cuda:N") in inference mode; with
    ``quantize``, its linear layers dynamically quantised to INT8 (CPU only).
    :class:`ModelLoadError` says what prevents it."""
    label = f"model {artifact.name} version {artifact.version}"
    target = _device(device, label, quantize)
    fmt = artifact.format or sniff_format(artifact.data)
    if fmt not in PLATFORMS:
        raise ModelLoadError(
            f"{label} has artefact format {fmt or 'unknown'!r}"
            + ("" if artifact.format else " (its bytes are neither kind of archive)"),
            hint="serve models exported by gantry training: torch.export or torchscript",
        )
    signature = artifact.signature
    try:
        if fmt == "torch.export":
            module, stateful, copies_inputs, derived = _load_exported(artifact.data, target)
        else:
            module, stateful, copies_inputs = _load_scripted(artifact.data, target)
            derived = None
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read {label} as a {fmt} artefact ({len(artifact.data)} bytes): "
            f"{type(exc).__name__}: {_first_line(exc)}",
            hint="the registered bytes are damaged or not what their format says",
        ) from exc
    inputs = _specs(signature, "inputs", "INPUT", label, derived)
    outputs = _specs(signature, "outputs", "OUTPUT", label, derived)
    if quantize:
        module = _quantize(module, label)
    quantized = quantization.count_quantized(module) > 0
    if quantized and target.type != "cpu":
        raise ModelLoadError(
            f"{label} is stored quantised (INT8 dynamic), which runs only on the CPU",
            hint="serve it on the CPU, or register a float export for the GPU",
        )
    try:
        generation = Generation.from_signature(signature)
    except InvalidInput as exc:
        raise ModelLoadError(f"{label}: {exc.message}") from None
    if generation is not None:
        _check_generative(generation, inputs, outputs, label)
    return LoadedModel(
        name=artifact.name,
        version=artifact.version,
        module=module,
        inputs=inputs,
        outputs=outputs,
        platform=PLATFORMS[fmt],
        device=str(target),
        quantized=quantized,
        generation=generation,
        stateful=stateful,
        copies_inputs=copies_inputs,
    )


def _device(device: str, label: str, quantize: bool) -> torch.device:
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"cannot load {label}: {device!r} is not a device ({exc})") from None
    if target.type == "cpu":
        return torch.device("cpu")
    if target.type != "cuda":
        raise ModelLoadError(f"cannot load {label} on {device!r}: use cpu, cuda or cuda:N")
    if quantize:
        raise ModelLoadError(
            f"cannot quantise {label} on {device}: dynamically quantised INT8 kernels run "
            "only on the CPU",
            hint="serve it on the CPU, or on the GPU without quantize",
        )
    if not torch.cuda.is_available():
        raise ModelLoadError(
            f"cannot load {label} on {device}: this machine has no usable CUDA device "
            "(torch.cuda.is_available() is false)",
            hint="serve it on cpu, or run the service on a GPU node with a CUDA build of torch",
        )
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        raise ModelLoadError(
            f"cannot load {label} on {device}: this machine has {count} CUDA device(s), "
            f"cuda:0..cuda:{count - 1}"
        )
    return target


def _load_exported(
    data: bytes, device: torch.device
) -> tuple[nn.Module, bool, bool, dict[str, list[TensorSpec]]]:
    with _quiet():
        program = torch.export.load(io.BytesIO(data))
        if device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        derived = _program_specs(program)
        module = program.module()
    assert isinstance(module, fx.GraphModule)
    stateful, writes_inputs = _exported_writes(module)
    stateful = stateful or bool(program.graph_signature.buffers_to_mutate)
    writes_inputs = writes_inputs or bool(program.graph_signature.user_inputs_to_mutate)
    # the program was captured in eval mode; its module refuses .eval() (NotImplementedError)
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module, stateful, writes_inputs, derived


def _load_scripted(data: bytes, device: torch.device) -> tuple[nn.Module, bool, bool]:
    with _quiet():
        module: nn.Module = torch.jit.load(  # type: ignore[no-untyped-call]
            io.BytesIO(data), map_location=device
        )
    module.eval()
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    stateful, writes_inputs = _scripted_writes(module)
    return module, stateful, writes_inputs


def _quantize(module: nn.Module, label: str) -> nn.Module:
    try:
        if isinstance(module, fx.GraphModule):
            count = quantization.quantize_graph_module(module)
        elif isinstance(module, torch.jit.ScriptModule):
            module, count = quantization.quantize_scripted(module)
        else:  # pragma: no cover - load_model only builds the two kinds
            raise TypeError(type(module).__name__)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot quantise {label}: {type(exc).__name__}: {_first_line(exc)}",
            hint="serve it without quantize",
        ) from exc
    if count == 0 and quantization.count_quantized(module) == 0:
        raise ModelLoadError(
            f"cannot quantise {label}: it has no float32 linear layers with constant weights",
            hint="serve it without quantize",
        )
    return module


def _specs(
    signature: Mapping[str, Any],
    key: str,
    prefix: str,
    label: str,
    derived: Mapping[str, list[TensorSpec]] | None,
) -> tuple[TensorSpec, ...]:
    entries = signature.get(key)
    if entries is None or entries == []:
        if derived is not None and derived.get(key):
            return tuple(derived[key])
        raise ModelLoadError(
            f"{label} has no {key} in its signature",
            hint="register the signature gantry training's export writes "
            '({"inputs": [{"shape": [-1, ...], "dtype": "float32"}], "outputs": [...]})',
        )
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise ModelLoadError(f"{label}: signature.{key} must be a list, not {entries!r}")
    specs = []
    for i, entry in enumerate(entries):
        where = f"{label}: signature.{key}[{i}]"
        if not isinstance(entry, Mapping) or "dtype" not in entry or "shape" not in entry:
            raise ModelLoadError(
                f"{where} is {entry!r}: serving supports only tensor {key} with a shape and a dtype"
            )
        name = str(entry.get("name") or f"{prefix}__{i}")
        dtype = str(entry["dtype"]).removeprefix("torch.")
        datatype = TORCH_DATATYPES.get(dtype) or (dtype if dtype in DATATYPES else None)
        if datatype is None or datatype == "BYTES":
            raise ModelLoadError(
                f"{where} has dtype {dtype!r}, which the inference protocol cannot carry",
                hint=f"export it as one of {', '.join(sorted(set(TORCH_DATATYPES)))}",
            )
        shape = entry["shape"]
        if (
            not isinstance(shape, Sequence)
            or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)
        ):
            raise ModelLoadError(
                f"{where} has shape {shape!r}; expected a list of sizes (-1 = any), the first "
                "being the batch"
            )
        specs.append(TensorSpec(name=name, datatype=datatype, shape=(-1, *shape[1:])))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ModelLoadError(f"{label}: signature.{key} repeats a name: {names}")
    return tuple(specs)


def _program_specs(program: Any) -> dict[str, list[TensorSpec]]:
    """Input and output specs read from a program's graph (for artefacts registered without
    a signature); empty lists when its values are not all tensors of known datatypes."""
    values: dict[str, Any] = {
        n.name: n.meta.get("val") for n in program.graph.nodes if n.op != "output"
    }
    output = next(n for n in program.graph.nodes if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    out_values = {n.name: n.meta.get("val") for n in outs if isinstance(n, fx.Node)}
    derived: dict[str, list[TensorSpec]] = {"inputs": [], "outputs": []}
    for key, prefix, names, table in (
        ("inputs", "INPUT", program.graph_signature.user_inputs, values),
        ("outputs", "OUTPUT", program.graph_signature.user_outputs, out_values),
    ):
        for i, name in enumerate(names):
            value = table.get(name)
            dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
            if not isinstance(value, torch.Tensor) or dtype not in TORCH_DATATYPES:
                derived[key] = []
                break
            shape = [d if isinstance(d, int) else -1 for d in value.shape]
            derived[key].append(
                TensorSpec(f"{prefix}__{i}", TORCH_DATATYPES[dtype], (-1, *shape[1:]))
            )
    return derived


def _exported_writes(module: fx.GraphModule) -> tuple[bool, bool]:
    """Whether the graph writes into its own state (parameters, buffers, constants) and
    whether it writes into its inputs (in-place ops; torch 2.13's export keeps them)."""
    state = inputs = False
    for node in module.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args, strict=False):
            alias = argument.alias_info
            if alias is None or not alias.is_write or not isinstance(value, fx.Node):
                continue
            root = _fx_root(value)
            state = state or root.op == "get_attr"
            inputs = inputs or root.op == "placeholder"
    return state, inputs


def _fx_root(node: fx.Node) -> fx.Node:
    """The tensor ``node`` is a view of (following ops whose result aliases their input)."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node):
        schema = getattr(node.target, "_schema", None)
        if schema is None or not schema.arguments or schema.arguments[0].alias_info is None:
            break
        node = node.args[0]
    return node


def _scripted_writes(module: nn.Module) -> tuple[bool, bool]:
    graph: Any = getattr(module, "inlined_graph", None)
    if graph is None:
        return False, False
    state = inputs = False
    for node in graph.nodes():
        kind = node.kind()
        if not (kind.startswith("aten::") and kind.endswith("_") and not kind.endswith("__")):
            continue
        values = list(node.inputs())
        if not values:
            continue
        root = values[0].node()
        while root.kind() in _SCRIPTED_VIEWS:
            root = next(iter(root.inputs())).node()
        state = state or root.kind() == "prim::GetAttr"
        inputs = inputs or root.kind() == "prim::Param"
    return state, inputs


def _check_generative(
    generation: Generation,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    label: str,
) -> None:
    expected_in = (-1, generation.context)
    expected_out = (-1, generation.context, generation.size)
    ok = (
        len(inputs) == 1
        and inputs[0].datatype == "INT64"
        and _fits(inputs[0].shape, expected_in)
        and len(outputs) >= 1
        and outputs[0].datatype in {"FP32", "FP16", "FP64"}
        and _fits(outputs[0].shape, expected_out)
    )
    if not ok:
        raise ModelLoadError(
            f"{label} declares generation (vocabulary of {generation.size}, context "
            f"{generation.context}) but takes {[(s.datatype, list(s.shape)) for s in inputs]} "
            f"and returns {[(s.datatype, list(s.shape)) for s in outputs]}; a generative model "
            f"takes INT64 {list(expected_in)} token ids and returns float logits "
            f"{list(expected_out)}"
        )


def _fits(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return len(shape) == len(expected) and all(
        a == -1 or b == -1 or a == b for a, b in zip(shape, expected, strict=True)
    )


def _flatten(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    items = list(result.values()) if isinstance(result, Mapping) else result
    if isinstance(items, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in items):
        return list(items)
    raise ModelFailed(f"the model returned {type(result).__name__}, not tensors")


def _datatype_of(dtype: np.dtype[Any]) -> str:
    for name, known in DATATYPES.items():
        if known == dtype:
            return name
    return str(dtype)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else "(no message)"


#: torch.export.load keeps its deserializer in a process-wide global ("_CURRENT_DESERIALIZER
#: is already set" when two threads load at once) and warnings.catch_warnings swaps the
#: process's filters: loads and copies from several threads take turns.
_LOADING = threading.RLock()


@contextmanager
def _quiet() -> Iterator[None]:
    """torch.jit.load, torch.export.load and deep copies of exported modules warn about
    deprecations that are torch's business, not the caller's (one thread at a time)."""
    with _LOADING, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


__all__ = [
    "PLATFORMS",
    "Artifact",
    "LoadedModel",
    "ModelLoadError",
    "load_model",
    "sniff_format",
    "use_threads",
]
