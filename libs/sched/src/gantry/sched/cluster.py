"""The cluster as arrays of node state, so that policies can score every node at once.

Each node offers CPU (milli-cores), memory (MiB) and up to ``max_gpus`` GPUs of one model,
each GPU divisible into 1,000 milli-GPU. Per-GPU free capacity lives in one 2-D array
(nodes x max_gpus) where an absent GPU is ``-1``, so "free >= request" is false for it.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from gantry.core.errors import Conflict, InvalidInput

if TYPE_CHECKING:
    from gantry.sched.demand import Demand

GPU_MILLI = 1000
"""Milli-GPU in one whole GPU."""

NO_GPU = ""
"""The model name of a node without GPUs; its model code is always 0."""

_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


class Cluster:
    """Mutable node state as numpy arrays; ``allocate``/``release`` keep them consistent.

    Arrays (index = node number):

    - ``cpu_total`` / ``cpu_free``: milli-cores; ``mem_total`` / ``mem_free``: MiB.
    - ``gpu_count``: GPUs on the node; ``model``: GPU model code into ``model_names``
      (code 0 = no GPU).
    - ``gpu_free``: nodes x ``max_gpus`` free milli-GPU per GPU, ``-1`` for absent GPUs.
    - ``version``: bumped on every change of the node, so callers can cache per-node scores.
    """

    def __init__(
        self,
        names: Sequence[str],
        cpu_milli: Sequence[int],
        memory_mib: Sequence[int],
        gpus: Sequence[int],
        models: Sequence[str],
        racks: Sequence[str] | None = None,
    ) -> None:
        n = len(names)
        if not all(len(column) == n for column in (cpu_milli, memory_mib, gpus, models)):
            raise InvalidInput(
                "node columns have different lengths", hint="pass one value per node"
            )
        if n == 0:
            raise InvalidInput("a cluster needs at least one node")
        self.names: tuple[str, ...] = tuple(names)
        self.racks: tuple[str, ...] | None = tuple(racks) if racks is not None else None
        self.cpu_total = np.asarray(cpu_milli, dtype=np.int64)
        self.mem_total = np.asarray(memory_mib, dtype=np.int64)
        self.gpu_count = np.asarray(gpus, dtype=np.int64)
        for label, values in (
            ("cpu_milli", self.cpu_total),
            ("memory_mib", self.mem_total),
            ("gpu", self.gpu_count),
        ):
            if (values < 0).any():
                bad = int(np.argmax(values < 0))
                raise InvalidInput(
                    f"node {self.names[bad]!r} has negative {label} {int(values[bad])}",
                    hint="every node resource must be >= 0",
                )
        model_list = [m if g > 0 else NO_GPU for m, g in zip(models, gpus, strict=True)]
        self.model_names: tuple[str, ...] = (NO_GPU, *sorted({m for m in model_list} - {NO_GPU}))
        code = {name: i for i, name in enumerate(self.model_names)}
        self.model = np.asarray([code[m] for m in model_list], dtype=np.int64)
        self.max_gpus = max(1, int(self.gpu_count.max()))
        present = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.gpu_free = np.where(present, GPU_MILLI, -1).astype(np.int64)
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.version = np.zeros(n, dtype=np.int64)

    @property
    def num_nodes(self) -> int:
        """The number of nodes."""
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        """The cluster's GPU capacity in milli-GPU."""
        return int(self.gpu_count.sum()) * GPU_MILLI

    @property
    def allocated_gpu_milli(self) -> int:
        """Milli-GPU currently allocated to tasks."""
        return self.total_gpu_milli - int(np.clip(self.gpu_free, 0, None).sum())

    def model_code(self, name: str) -> int | None:
        """The code of GPU model ``name``, or None when no node has it."""
        try:
            return self.model_names.index(name)
        except ValueError:
            return None

    def copy(self) -> Cluster:
        """An independent copy with the same state (for what-if runs)."""
        clone = Cluster.__new__(Cluster)
        clone.__dict__.update(self.__dict__)
        for attr in ("cpu_free", "mem_free", "gpu_free", "version"):
            setattr(clone, attr, getattr(self, attr).copy())
        return clone

    def allocate(self, node: int, demand: Demand, gpus: Sequence[tuple[int, int]]) -> None:
        """Take ``demand``'s CPU and memory and ``gpus`` ((gpu index, milli) pairs) on ``node``.

        Raises Conflict, changing nothing, when the node lacks any of it.
        """
        self._check_node(node)
        if self.cpu_free[node] < demand.cpu_milli or self.mem_free[node] < demand.memory_mib:
            raise Conflict(
                f"node {self.names[node]!r} has {int(self.cpu_free[node])} milli-CPU and "
                f"{int(self.mem_free[node])} MiB free; the task needs {demand.cpu_milli} and "
                f"{demand.memory_mib}",
                hint="choose a node with enough CPU and memory",
            )
        row = self.gpu_free[node]
        take = self._gpu_amounts(node, gpus)
        if ((take > 0) & (row < take)).any():
            raise Conflict(
                f"node {self.names[node]!r} GPUs free {row.tolist()} cannot give {list(gpus)}",
                hint="place on GPUs with enough free milli-GPU",
            )
        row -= take
        self.cpu_free[node] -= demand.cpu_milli
        self.mem_free[node] -= demand.memory_mib
        self.version[node] += 1

    def release(self, node: int, demand: Demand, gpus: Sequence[tuple[int, int]]) -> None:
        """Give back what ``allocate(node, demand, gpus)`` took.

        Raises Conflict, changing nothing, when that would exceed the node's capacity.
        """
        self._check_node(node)
        give = self._gpu_amounts(node, gpus)
        row = self.gpu_free[node]
        if (
            ((give > 0) & ((row < 0) | (row + give > GPU_MILLI))).any()
            or self.cpu_free[node] + demand.cpu_milli > self.cpu_total[node]
            or self.mem_free[node] + demand.memory_mib > self.mem_total[node]
        ):
            raise Conflict(
                f"releasing {list(gpus)} on node {self.names[node]!r} exceeds its capacity",
                hint="release only what was allocated",
            )
        row += give
        self.cpu_free[node] += demand.cpu_milli
        self.mem_free[node] += demand.memory_mib
        self.version[node] += 1

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self.num_nodes:
            raise InvalidInput(f"node {node} out of range 0..{self.num_nodes - 1}")

    def _gpu_amounts(self, node: int, gpus: Sequence[tuple[int, int]]) -> NDArray[np.int64]:
        amounts = np.zeros(self.max_gpus, dtype=np.int64)
        for index, milli in gpus:
            if not 0 <= index < int(self.gpu_count[node]) or not 0 < milli <= GPU_MILLI:
                raise InvalidInput(
                    f"GPU share ({index}, {milli}) is invalid on node {self.names[node]!r} "
                    f"with {int(self.gpu_count[node])} GPUs",
                    hint="use 0 <= gpu index < gpu count and 1..1000 milli-GPU",
                )
            amounts[index] += milli
        return amounts


def load_nodes_csv(path: str | Path) -> Cluster:
    """Load the Alibaba node list (``sn, cpu_milli, memory_mib, gpu, model``, optional ``rack``).

    Raises InvalidInput naming the file and row for a missing file or column, a bad number or
    a negative resource.
    """
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise InvalidInput(f"cannot read node list {path}: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _NODE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInput(
                f"node list {path} lacks columns {missing}",
                hint=f"the header must name {', '.join(_NODE_COLUMNS)} (rack optional)",
            )
        has_rack = "rack" in (reader.fieldnames or [])
        names: list[str] = []
        numbers: list[tuple[int, int, int]] = []
        models: list[str] = []
        racks: list[str] = []
        for line, row in enumerate(reader, start=2):
            try:
                values = (int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"] or 0))
            except (TypeError, ValueError) as exc:
                raise InvalidInput(
                    f"node list {path} line {line}: cpu_milli, memory_mib and gpu must be integers",
                ) from exc
            if min(values) < 0:
                raise InvalidInput(
                    f"node list {path} line {line}: negative resource in {values}",
                    hint="every node resource must be >= 0",
                )
            names.append(row["sn"])
            numbers.append(values)
            models.append((row["model"] or "").strip())
            racks.append(row.get("rack") or "")
    if not names:
        raise InvalidInput(f"node list {path} has no nodes")
    cpu, mem, gpu = (list(column) for column in zip(*numbers, strict=True))
    return Cluster(names, cpu, mem, gpu, models, racks if has_rack else None)
