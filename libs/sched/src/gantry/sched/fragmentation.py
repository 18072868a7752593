"""GPU fragmentation of a node for a target workload (the measure of the FGD paper, ATC'23).

The target workload is the popularity distribution of GPU task shapes (num_gpu, milli-GPU per
GPU, allowed models), each with a representative CPU and memory demand (the median of its
tasks). For one shape, a node's free GPU capacity is *fragmented* when the shape cannot use
it: all of it when a task of that shape cannot run on the node at all (GPU model not allowed,
not enough CPU or memory, no GPU with enough free milli-GPU or too few whole GPUs), otherwise
the free milli-GPU on GPUs with less free than the shape takes per GPU. A node's fragmentation
is the expectation over shapes: the capacity the next typical task could not use.

:func:`stranded` is a second, coarser measure Gantry adds: GPU capacity that the node's free
CPU and memory cannot feed at the workload's usual CPU-and-memory-per-GPU ratio.
:func:`model_pressure` says which GPU models the model-constrained tasks depend on.

Everything here works on batches: P rows of node state (free per GPU, CPU, memory, model) with
one demand per row, so a policy scores many nodes, or one node for many demands, in one pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gantry.core.errors import InvalidInput
from gantry.sched.cluster import GPU_MILLI
from gantry.sched.demand import Demand

Ints = NDArray[np.int64]
Floats = NDArray[np.float64]
Bools = NDArray[np.bool_]

_NO_FIT = np.int64(1 << 40)

_Key = tuple[int, int, frozenset[str]]


@dataclass(frozen=True)
class Workload:
    """The target workload: M GPU task shapes and their probabilities, for one cluster's models.

    Arrays of length M: ``num_gpu``, ``milli`` (per GPU), ``cpu_milli``, ``memory_mib``,
    ``prob`` (shares of ALL tasks, CPU-only ones included, so they sum to <= 1), and
    ``allowed`` (M x number of model codes). ``cpu_per_milli`` / ``memory_per_milli``: the
    CPU (milli-cores) and memory (MiB) GPU tasks ask for per milli-GPU, over the workload.
    """

    num_gpu: Ints
    milli: Ints
    cpu_milli: Ints
    memory_mib: Ints
    prob: Floats
    allowed: Bools
    cpu_per_milli: float = 0.0
    memory_per_milli: float = 0.0

    @classmethod
    def from_demands(cls, demands: Iterable[Demand], model_names: Sequence[str]) -> Workload:
        """The shape distribution of ``demands`` (e.g. a pod list) for a cluster's models.

        CPU-only demands count towards the total (so ``prob`` sums to the GPU tasks' share)
        but form no shape: they leave no GPU capacity unusable.
        """
        counts: Counter[_Key] = Counter()
        cpus: defaultdict[_Key, list[int]] = defaultdict(list)
        mems: defaultdict[_Key, list[int]] = defaultdict(list)
        total = 0
        gpu_milli = cpu = memory = 0
        for demand in demands:
            total += 1
            if demand.num_gpu == 0:
                continue
            gpu_milli += demand.total_gpu_milli
            cpu += demand.cpu_milli
            memory += demand.memory_mib
            key = demand.shape
            counts[key] += 1
            cpus[key].append(demand.cpu_milli)
            mems[key].append(demand.memory_mib)
        if not counts:
            raise InvalidInput("the target workload has no GPU tasks", hint="pass a pod list")
        shapes = sorted(counts, key=lambda s: (s[0], s[1], sorted(s[2])))
        allowed = [
            [not models or name in models for name in model_names] for (_, _, models) in shapes
        ]
        for row in allowed:
            row[0] = False  # code 0 = node without GPUs: no GPU task runs there
        return cls(
            num_gpu=np.asarray([s[0] for s in shapes], dtype=np.int64),
            milli=np.asarray([s[1] for s in shapes], dtype=np.int64),
            cpu_milli=np.asarray([int(np.median(cpus[s])) for s in shapes], dtype=np.int64),
            memory_mib=np.asarray([int(np.median(mems[s])) for s in shapes], dtype=np.int64),
            prob=np.asarray([counts[s] / total for s in shapes], dtype=np.float64),
            allowed=np.asarray(allowed, dtype=np.bool_).reshape(len(shapes), len(model_names)),
            cpu_per_milli=cpu / gpu_milli,
            memory_per_milli=memory / gpu_milli,
        )

    @property
    def size(self) -> int:
        """The number of shapes M."""
        return int(self.num_gpu.size)


def fragmentation(workload: Workload, free: Ints, cpu: Ints, mem: Ints, model: Ints) -> Floats:
    """Expected unusable free milli-GPU of P node states (``free`` is P x G, -1 = no GPU)."""
    usable = np.clip(free, 0, None)
    total = usable.sum(axis=1)
    # milli-GPU on GPUs too small for each shape: P x M
    small = (free[:, :, None] < workload.milli[None, None, :]) & (free[:, :, None] > 0)
    stranded = np.einsum("pg,pgm->pm", usable, small.astype(np.int64))
    single = workload.num_gpu == 1
    gpu_fit = np.where(
        single[None, :],
        free.max(axis=1)[:, None] >= workload.milli[None, :],
        (free == GPU_MILLI).sum(axis=1)[:, None] >= workload.num_gpu[None, :],
    )
    fits = (
        gpu_fit
        & workload.allowed.T[model]
        & (cpu[:, None] >= workload.cpu_milli[None, :])
        & (mem[:, None] >= workload.memory_mib[None, :])
    )
    unusable = np.where(fits, stranded, total[:, None])
    result: Floats = unusable.astype(np.float64) @ workload.prob
    return result


def stranded(workload: Workload, gpu_free: Ints, cpu: Ints, mem: Ints) -> Floats:
    """Free milli-GPU that the free CPU and memory cannot feed (summed over both), per node.

    A node with ``gpu_free`` milli-GPU free needs about ``gpu_free * cpu_per_milli`` CPU to
    use it for the typical workload; GPU beyond what its CPU (or memory) covers is stranded,
    whatever task comes next. Unlike :func:`fragmentation`, which looks one task ahead, this
    sees CPU running out across all of the node's remaining GPUs.
    """
    cpu_need = workload.cpu_per_milli or 1.0
    mem_need = workload.memory_per_milli or 1.0
    result: Floats = np.maximum(0.0, gpu_free - cpu / cpu_need) + np.maximum(
        0.0, gpu_free - mem / mem_need
    )
    return result


def model_pressure(workload: Workload, capacity: Floats) -> Floats:
    """Per GPU model code, how much the workload's model-constrained tasks lean on it.

    ``capacity`` is the cluster's milli-GPU per model code. A constrained shape's GPU demand is
    spread over its allowed models in proportion to their capacity; a model's pressure is the
    constrained demand per unit of its capacity, relative to the whole workload's demand per
    unit of the cluster's capacity. 0 = no constrained task needs it; 1 = constrained tasks
    alone would load it as much as the whole workload loads the cluster.
    """
    demand = workload.prob * workload.num_gpu * workload.milli
    any_gpu = workload.allowed[:, 1:].all(axis=1)
    pressure = np.zeros(capacity.size, dtype=np.float64)
    for s in np.flatnonzero(~any_gpu):
        usable = float(capacity @ workload.allowed[s])
        if usable > 0:
            pressure += workload.allowed[s] * (demand[s] / usable)
    overall = float(demand.sum()) / max(float(capacity.sum()), 1.0)
    result: Floats = pressure / overall if overall > 0 else pressure
    return result


@dataclass(frozen=True)
class DemandBatch:
    """P demands as arrays, one per row of a node-state batch."""

    num_gpu: Ints
    milli: Ints
    cpu_milli: Ints
    memory_mib: Ints
    allowed: Bools
    """P x number of model codes."""


def feasible(batch: DemandBatch, free: Ints, cpu: Ints, mem: Ints, model: Ints) -> Bools:
    """Row-wise: does demand p fit node state p."""
    rows = np.arange(model.size)
    gpu_fit = np.where(
        batch.num_gpu == 0,
        True,
        np.where(
            batch.num_gpu == 1,
            free.max(axis=1) >= batch.milli,
            (free == GPU_MILLI).sum(axis=1) >= batch.num_gpu,
        ),
    )
    model_ok = (batch.num_gpu == 0) | batch.allowed[rows, model]
    ok: Bools = (cpu >= batch.cpu_milli) & (mem >= batch.memory_mib) & model_ok & gpu_fit
    return ok


def place(batch: DemandBatch, free: Ints, cpu: Ints, mem: Ints) -> tuple[Ints, Ints, Ints]:
    """Row-wise node state after placing demand p (which must fit) on node state p.

    GPUs follow :func:`gantry.sched.placement.choose_gpus`: the best-fitting GPU for one-GPU
    demands, the lowest-numbered whole GPUs for multi-GPU demands.
    """
    rows = np.arange(free.shape[0])
    after = free.copy()
    one = batch.num_gpu == 1
    if one.any():
        best = np.argmin(np.where(free >= batch.milli[:, None], free, _NO_FIT), axis=1)
        after[rows[one], best[one]] -= batch.milli[one]
    many = batch.num_gpu > 1
    if many.any():
        whole = free == GPU_MILLI
        take = whole & (np.cumsum(whole, axis=1) <= batch.num_gpu[:, None]) & many[:, None]
        after[take] = 0
    return after, cpu - batch.cpu_milli, mem - batch.memory_mib
