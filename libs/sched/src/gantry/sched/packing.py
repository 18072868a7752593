"""Fragmentation-aware packing: the FGD baseline and Gantry's production policy.

Both score a placement by how much it raises the node's fragmentation for the target
workload (:mod:`gantry.sched.fragmentation`). The scores live in a table (nodes x distinct
demands seen); a decision is one column's argmin, and only the rows of nodes whose
``Cluster.version`` changed since are recomputed (one batch over all known demands), so a
decision costs a few passes over node arrays, not a Python loop over nodes.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from gantry.sched.cluster import Cluster
from gantry.sched.demand import Demand
from gantry.sched.fragmentation import (
    DemandBatch,
    Workload,
    feasible,
    fragmentation,
    model_pressure,
    place,
    stranded,
)
from gantry.sched.placement import Placement, allowed_models, best_fit_order, choose_gpus

_BATCH_ROWS = 16_384
"""(node, demand) rows scored in one numpy pass when refreshing the table."""

_TIE = 1e-6
"""Score differences below this (in milli-GPU) are ties: float noise, not preference."""


class DeltaTable:
    """Fragmentation increase of placing each known demand on each node; +inf = infeasible.

    Bound to one cluster object (held weakly); columns are added on first sight of a demand,
    up to ``max_columns`` (demands beyond that are scored afresh each time, never cached), and
    rows are refreshed lazily from ``Cluster.version``.
    """

    def __init__(self, cluster: Cluster, workload: Workload, *, max_columns: int = 512) -> None:
        self._cluster = weakref.ref(cluster)
        self.workload = workload
        self.max_columns = max_columns
        self._columns: dict[Demand, int] = {}
        self._demands: list[Demand] = []
        n = cluster.num_nodes
        self._table = np.empty((n, 0), dtype=np.float64)
        self._seen = cluster.version.copy()
        self._node_frag = fragmentation(
            workload, cluster.gpu_free, cluster.cpu_free, cluster.mem_free, cluster.model
        )
        self._batch = _batch([], cluster)
        self.gpu_free_total: NDArray[np.int64] = np.clip(cluster.gpu_free, 0, None).sum(axis=1)
        """Per node, free milli-GPU (kept current with the rows)."""
        self.stranded_now: NDArray[np.float64] = stranded(
            workload, self.gpu_free_total, cluster.cpu_free, cluster.mem_free
        )
        """Per node, :func:`stranded` GPU now (kept current with the rows)."""
        capacity = np.bincount(
            cluster.model,
            weights=(cluster.gpu_count * 1000).astype(np.float64),
            minlength=len(cluster.model_names),
        ).astype(np.float64)
        self.node_pressure: NDArray[np.float64] = model_pressure(workload, capacity)[cluster.model]
        """Per node, the :func:`model_pressure` of its GPU model."""
        self.pressure_penalty: NDArray[np.float64] = np.minimum(self.node_pressure, 1.0) ** 2
        """Per node, min(1, pressure)²: what Gantry charges per milli-GPU placed there."""

    @property
    def cluster(self) -> Cluster:
        """The cluster this table scores."""
        cluster = self._cluster()
        if cluster is None:
            raise RuntimeError("the cluster of this DeltaTable no longer exists")
        return cluster

    def column(self, demand: Demand) -> NDArray[np.float64]:
        """Per node, the fragmentation increase of placing ``demand`` there (inf: cannot)."""
        self._refresh()
        index = self._columns.get(demand)
        if index is not None:
            cached: NDArray[np.float64] = self._table[:, index].copy()
            return cached
        c = self.cluster
        batch = _batch([demand] * c.num_nodes, c)
        column = self._deltas(
            np.arange(c.num_nodes), batch, c.gpu_free, c.cpu_free, c.mem_free, c.model
        )
        if len(self._demands) < self.max_columns:
            self._add(demand, column)
        return column

    def _add(self, demand: Demand, column: NDArray[np.float64]) -> None:
        c = self.cluster
        self._table = np.concatenate([self._table, column[:, None]], axis=1)
        self._demands.append(demand)
        self._columns[demand] = len(self._demands) - 1
        self._batch = _batch(self._demands, c)

    def _refresh(self) -> None:
        c = self.cluster
        changed = np.flatnonzero(c.version != self._seen)
        if changed.size == 0:
            return
        self._seen[changed] = c.version[changed]
        self.gpu_free_total[changed] = np.clip(c.gpu_free[changed], 0, None).sum(axis=1)
        self.stranded_now[changed] = stranded(
            self.workload, self.gpu_free_total[changed], c.cpu_free[changed], c.mem_free[changed]
        )
        self._node_frag[changed] = fragmentation(
            self.workload,
            c.gpu_free[changed],
            c.cpu_free[changed],
            c.mem_free[changed],
            c.model[changed],
        )
        s = len(self._demands)
        if s == 0:
            return
        step = max(1, _BATCH_ROWS // s)  # bounds memory when many nodes changed at once
        for start in range(0, changed.size, step):
            part = changed[start : start + step]
            rows = np.repeat(part, s)
            b, n = self._batch, part.size
            tiled = DemandBatch(
                np.tile(b.num_gpu, n),
                np.tile(b.milli, n),
                np.tile(b.cpu_milli, n),
                np.tile(b.memory_mib, n),
                np.tile(b.allowed, (n, 1)),
            )
            deltas = self._deltas(
                rows, tiled, c.gpu_free[rows], c.cpu_free[rows], c.mem_free[rows], c.model[rows]
            )
            self._table[part] = deltas.reshape(n, s)

    def _deltas(
        self,
        rows: NDArray[np.int64],
        batch: DemandBatch,
        free: NDArray[np.int64],
        cpu: NDArray[np.int64],
        mem: NDArray[np.int64],
        model: NDArray[np.int64],
    ) -> NDArray[np.float64]:
        out = np.full(rows.size, np.inf)
        ok = np.flatnonzero(feasible(batch, free, cpu, mem, model))
        if ok.size == 0:
            return out
        sub = DemandBatch(
            batch.num_gpu[ok],
            batch.milli[ok],
            batch.cpu_milli[ok],
            batch.memory_mib[ok],
            batch.allowed[ok],
        )
        after, cpu_after, mem_after = place(sub, free[ok], cpu[ok], mem[ok])
        frag_after = fragmentation(self.workload, after, cpu_after, mem_after, model[ok])
        out[ok] = frag_after - self._node_frag[rows[ok]]
        return out


def _batch(demands: list[Demand], cluster: Cluster) -> DemandBatch:
    models = len(cluster.model_names)
    return DemandBatch(
        np.asarray([d.num_gpu for d in demands], dtype=np.int64),
        np.asarray([d.gpu_milli for d in demands], dtype=np.int64),
        np.asarray([d.cpu_milli for d in demands], dtype=np.int64),
        np.asarray([d.memory_mib for d in demands], dtype=np.int64),
        np.asarray([allowed_models(cluster, d) for d in demands], dtype=np.bool_).reshape(
            len(demands), models
        ),
    )


class _FragmentationPolicy:
    """Shared plumbing: one DeltaTable per cluster object, kept while that cluster lives."""

    name = "fragmentation"

    def __init__(self, workload: Sequence[Demand] | Workload) -> None:
        self._source = workload
        self._tables: weakref.WeakKeyDictionary[Cluster, DeltaTable] = weakref.WeakKeyDictionary()

    def table(self, cluster: Cluster) -> DeltaTable:
        """The delta table for ``cluster``, built on first use.

        Callers that change the cluster's arrays other than through ``allocate``/``release``
        must bump ``cluster.version`` of the nodes they touch.
        """
        table = self._tables.get(cluster)
        if table is None:
            workload = self._source
            if not isinstance(workload, Workload):
                workload = Workload.from_demands(workload, cluster.model_names)
            table = self._tables[cluster] = DeltaTable(cluster, workload)
        return table


class FgdPolicy(_FragmentationPolicy):
    """Fragmentation Gradient Descent (Weng et al., ATC'23): least fragmentation increase.

    ``workload`` is the target workload: a pod list (its shape distribution is used) or a
    prepared :class:`Workload`. Ties go to the lowest node number.
    """

    name = "fgd"

    def choose(
        self, cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
    ) -> Placement | None:
        """The node whose fragmentation rises least; GPUs by ``choose_gpus``."""
        column = self.table(cluster).column(demand)
        if nodes is not None:
            column[~nodes] = np.inf
        node = int(np.argmin(column))
        if not np.isfinite(column[node]):
            return None
        return Placement(node, choose_gpus(cluster, node, demand))


class GantryPolicy(_FragmentationPolicy):
    """Gantry's production placement policy: fragmentation, stranding and model pressure.

    Score of a node, in milli-GPU (lower is better), for a task taking ``r`` milli-GPU:

    - FGD's fragmentation increase (:func:`fragmentation`, one typical task ahead);
    - ``stranding_weight`` x the increase of GPU capacity stranded for lack of CPU or memory
      (:func:`stranded`): FGD lets CPU-hungry tasks (CPU-only ones included) drain the CPU of
      nodes whose GPUs are still free; this steers them to nodes with CPU to spare;
    - ``pressure_weight`` x min(1, the node model's :func:`model_pressure`)² x ``r``: tasks
      that may run elsewhere keep off the GPU models that model-constrained tasks depend on.
      Squared so that a model constrained tasks barely use (pressure 0.2 -> 0.04) stays
      open to everyone; capped at 1 so that it never outweighs the other terms by much.

    Among ties, best fit: least GPU left, then least CPU share left, which keeps emptier
    nodes whole for multi-GPU tasks. Uses the workload's distribution, never arrival order.
    """

    name = "gantry"

    def __init__(
        self,
        workload: Sequence[Demand] | Workload,
        *,
        stranding_weight: float = 1.0,
        pressure_weight: float = 2.0,
    ) -> None:
        super().__init__(workload)
        self.stranding_weight = stranding_weight
        self.pressure_weight = pressure_weight

    def scores(self, cluster: Cluster, demand: Demand) -> NDArray[np.float64]:
        """Per node, the score of placing ``demand`` there (inf: it does not fit)."""
        table = self.table(cluster)
        score = table.column(demand)
        if self.stranding_weight:
            gpu_free = table.gpu_free_total
            before = table.stranded_now
            after = stranded(
                table.workload,
                gpu_free - demand.total_gpu_milli,
                cluster.cpu_free - demand.cpu_milli,
                cluster.mem_free - demand.memory_mib,
            )
            score = score + self.stranding_weight * (after - before)
        if self.pressure_weight and demand.num_gpu:
            weight = self.pressure_weight * demand.total_gpu_milli
            score = score + weight * table.pressure_penalty
        return score

    def choose(
        self, cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
    ) -> Placement | None:
        """The node with the least score, best fit among ties; GPUs by ``choose_gpus``."""
        score = self.scores(cluster, demand)
        if nodes is not None:
            score = np.where(nodes, score, np.inf)
        best = float(score.min())
        if not np.isfinite(best):
            return None
        ties = np.flatnonzero(score <= best + _TIE)
        node = int(ties[0]) if ties.size == 1 else int(best_fit_order(cluster, demand, ties)[0])
        return Placement(node, choose_gpus(cluster, node, demand))
