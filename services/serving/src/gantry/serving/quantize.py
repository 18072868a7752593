"""Dynamic INT8 quantisation of a loaded model's linear layers, for CPU serving.

Dynamic quantisation stores each linear layer's weight as int8 (per tensor, with a scale and
zero point) and quantises the activations per call from their observed range; the matrix
product runs in int8 (fbgemm / qnnpack) and the result is float again. Weights take a quarter
of the memory and large linear layers run faster; results differ from float by about a
percent of their magnitude. The kernels are CPU-only.

``torch.ao.quantization.quantize_dynamic`` swaps ``nn.Linear`` modules, but the module of a
``torch.export`` program has none: its linear layers are ``aten.linear`` calls on parameters
fetched with ``get_attr``. :func:`quantize_graph_module` therefore rewrites the FX graph: each
``aten.linear.default`` whose weight (and bias) are ``get_attr`` float32 constants becomes a
``call_module`` of a :class:`torch.ao.nn.quantized.dynamic.Linear` built from them (by the
library's own ``quantize_dynamic`` of an ``nn.Linear`` holding those weights, so the
quantisation is exactly the library's); float weights nothing else uses are deleted.

TorchScript modules are quantised by :func:`quantize_scripted`, TorchScript's own graph pass
(``quantize_dynamic_jit``: ``aten::linear`` -> ``quantized::linear_dynamic`` with packed int8
weights), which torch 2.13 still ships and which works on traced modules.

Both are deprecated in torch in favour of ``torchao``; their deprecation warnings are silenced
here, where they are expected.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn

#: The operator the pass replaces.
LINEAR = torch.ops.aten.linear.default
#: The TorchScript operator of a dynamically quantised linear layer.
SCRIPTED_QUANTIZED_LINEAR = "quantized::linear_dynamic"


@contextmanager
def _quiet() -> Iterator[None]:
    """torch.ao.quantization and torch.jit announce their deprecation on every use."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization.*")
        warnings.filterwarnings("ignore", message=r".*quantize_per_tensor.*")
        warnings.filterwarnings("ignore", message=r".*\.grad attribute of a Tensor.*")
        yield


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """A dynamically quantised (int8) linear layer computing ``x @ weight.T + bias``."""
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight.detach())
        if bias is not None:
            assert linear.bias is not None
            linear.bias.copy_(bias.detach())
    with _quiet():
        from torch.ao.quantization import quantize_dynamic

        wrapped: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8
        )
    quantized: nn.Module = wrapped[0]  # type: ignore[index]
    return quantized


def quantize_graph_module(module: fx.GraphModule) -> int:
    """Replace the float linear layers of ``module`` (a ``torch.export`` program's module)
    by dynamically quantised ones, in place; how many were replaced.

    A linear call is replaced when its weight (and bias, if any) come straight from
    ``get_attr`` and are 2-D (1-D) float32 CPU tensors; others (computed weights, other
    dtypes) stay float. Tied weights share one quantised module.
    """
    graph = module.graph
    replaced: dict[tuple[str, str | None], str] = {}
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not LINEAR:
            continue
        weight_node = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        weight = _constant(module, weight_node)
        if weight is None or weight.dim() != 2:
            continue
        bias = None
        if bias_node is not None:
            bias = _constant(module, bias_node)
            if bias is None or bias.dim() != 1:
                continue
        key = (weight_node.target, bias_node.target if bias_node is not None else None)
        name = replaced.get(key)
        if name is None:
            name = _free_name(module, f"quantized_linear_{len(replaced)}")
            module.add_submodule(name, quantize_linear(weight, bias))
            replaced[key] = name
        with graph.inserting_before(node):
            call = graph.call_module(name, (node.args[0],))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        count += 1
    if count:
        for node in list(graph.nodes):
            if node.op == "get_attr" and not node.users:
                target = str(node.target)
                graph.erase_node(node)
                if not any(n.op == "get_attr" and n.target == target for n in graph.nodes):
                    owner, _, attribute = target.rpartition(".")
                    delattr(module.get_submodule(owner), attribute)
        module.delete_all_unused_submodules()
        graph.lint()
        module.recompile()
    return count


def quantize_scripted(module: torch.jit.ScriptModule) -> tuple[torch.jit.ScriptModule, int]:
    """``module`` (TorchScript, on CPU) with its linear layers dynamically quantised by
    TorchScript's graph pass, and how many were quantised (a new module; ``module`` is left
    as it is)."""
    with _quiet():
        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic_jit

        quantized: torch.jit.ScriptModule = quantize_dynamic_jit(  # type: ignore[no-untyped-call]
            module, {"": default_dynamic_qconfig}
        )
    return quantized, count_quantized(quantized)


def count_quantized(module: nn.Module) -> int:
    """How many dynamically quantised linear layers ``module`` runs (FX or TorchScript)."""
    if isinstance(module, torch.jit.ScriptModule):
        graph: Any = module.inlined_graph
        return sum(1 for n in graph.nodes() if n.kind() == SCRIPTED_QUANTIZED_LINEAR)
    with _quiet():
        from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

        return sum(1 for m in module.modules() if isinstance(m, QuantizedLinear))


def _constant(module: fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The float32 CPU tensor a ``get_attr`` node fetches; None for anything else."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    value: Any
    try:
        value = module.get_parameter(str(node.target))
    except AttributeError:
        try:
            value = module.get_buffer(str(node.target))
        except AttributeError:
            owner, _, attribute = str(node.target).rpartition(".")
            value = getattr(module.get_submodule(owner), attribute, None)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return None
    if value.device.type != "cpu" or value.is_quantized:
        return None
    return value


def _free_name(module: nn.Module, base: str) -> str:
    name, n = base, 0
    while hasattr(module, name):
        n += 1
        name = f"{base}_{n}"
    return name


__all__ = [
    "LINEAR",
    "SCRIPTED_QUANTIZED_LINEAR",
    "count_quantized",
    "quantize_graph_module",
    "quantize_linear",
    "quantize_scripted",
]
