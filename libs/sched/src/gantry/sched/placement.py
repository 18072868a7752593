"""Where a task goes: the Placement result, the policy Protocol, feasibility, simple policies.

Every policy answers ``choose(cluster, demand) -> Placement | None`` and only ever returns a
feasible placement: the node has the CPU and memory, an allowed GPU model, and the GPU shape
(``gpu_milli`` free on ONE GPU, or ``num_gpu`` whole free GPUs). The GPUs inside the chosen
node follow one rule for every policy (:func:`choose_gpus`): a sharing task takes the
best-fitting GPU (least free that still fits, so already-shared GPUs fill up first), a
multi-GPU task the lowest-numbered whole free GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from gantry.sched.cluster import GPU_MILLI, Cluster
from gantry.sched.demand import Demand

_NO_FIT = np.int64(1 << 40)


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: ``node`` and the ((gpu index, milli-GPU), ...) taken on it."""

    node: int
    gpus: tuple[tuple[int, int], ...] = ()


@runtime_checkable
class PlacementPolicy(Protocol):
    """A placement policy: a feasible placement for ``demand``, or None when none exists.

    ``choose`` does not change the cluster; the caller allocates the result. ``nodes``, when
    given, is a mask of the nodes the caller allows (pools, health, a gang's topology); the
    policy picks among them only.
    """

    name: str

    def choose(
        self, cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
    ) -> Placement | None:
        """Pick a node (and GPUs on it) for ``demand``, among ``nodes`` when given."""
        ...


def allowed_models(cluster: Cluster, demand: Demand) -> NDArray[np.bool_]:
    """A mask over the cluster's model codes: which GPU models ``demand`` may run on."""
    if not demand.models or demand.num_gpu == 0:
        return np.ones(len(cluster.model_names), dtype=np.bool_)
    return np.asarray([name in demand.models for name in cluster.model_names], dtype=np.bool_)


def feasible_nodes(
    cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
) -> NDArray[np.bool_]:
    """A mask over nodes: where ``demand`` fits right now (among ``nodes`` when given)."""
    ok = (cluster.cpu_free >= demand.cpu_milli) & (cluster.mem_free >= demand.memory_mib)
    if nodes is not None:
        ok &= nodes
    if demand.num_gpu == 0:
        return ok
    ok &= allowed_models(cluster, demand)[cluster.model]
    if demand.num_gpu == 1:
        ok &= cluster.gpu_free.max(axis=1) >= demand.gpu_milli
    else:
        ok &= (cluster.gpu_free == GPU_MILLI).sum(axis=1) >= demand.num_gpu
    return ok


def choose_gpus(cluster: Cluster, node: int, demand: Demand) -> tuple[tuple[int, int], ...]:
    """The GPUs ``demand`` takes on ``node`` (which must fit): best-fit GPU, or whole GPUs."""
    row = cluster.gpu_free[node]
    if demand.num_gpu == 0:
        return ()
    if demand.num_gpu == 1:
        gpu = int(np.argmin(np.where(row >= demand.gpu_milli, row, _NO_FIT)))
        return ((gpu, demand.gpu_milli),)
    whole = np.flatnonzero(row == GPU_MILLI)[: demand.num_gpu]
    return tuple((int(g), GPU_MILLI) for g in whole)


def best_fit_order(
    cluster: Cluster, demand: Demand, candidates: NDArray[np.int64]
) -> NDArray[np.int64]:
    """``candidates`` sorted best-fit first: least GPU left, then least CPU share left."""
    gpu_left = np.clip(cluster.gpu_free[candidates], 0, None).sum(axis=1)
    cpu_left = (cluster.cpu_free[candidates] - demand.cpu_milli) / np.maximum(
        cluster.cpu_total[candidates], 1
    )
    order: NDArray[np.int64] = candidates[np.lexsort((candidates, cpu_left, gpu_left))]
    return order


class RandomPolicy:
    """Uniformly random among feasible nodes (seeded): the baseline floor."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(
        self, cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
    ) -> Placement | None:
        """A random feasible node; GPUs by :func:`choose_gpus`."""
        candidates = np.flatnonzero(feasible_nodes(cluster, demand, nodes))
        if candidates.size == 0:
            return None
        node = int(candidates[self._rng.integers(candidates.size)])
        return Placement(node, choose_gpus(cluster, node, demand))


class BestFitPolicy:
    """Best fit: the node with the least GPU left after placement, then least CPU share left."""

    name = "bestfit"

    def choose(
        self, cluster: Cluster, demand: Demand, nodes: NDArray[np.bool_] | None = None
    ) -> Placement | None:
        """The best-fitting feasible node; GPUs by :func:`choose_gpus`."""
        candidates = np.flatnonzero(feasible_nodes(cluster, demand, nodes))
        if candidates.size == 0:
            return None
        node = int(best_fit_order(cluster, demand, candidates)[0])
        return Placement(node, choose_gpus(cluster, node, demand))
