"""The fragmentation and stranding measures, against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gantry.core.errors import InvalidInput
from gantry.sched import Demand, Workload, fragmentation, model_pressure, stranded

MODELS = ("", "T4", "V100")


def _workload() -> Workload:
    # 2/4 whole-GPU tasks, 1/4 half-GPU tasks on T4 only, 1/4 CPU-only.
    return Workload.from_demands(
        [
            Demand(4000, 100, 1, 1000),
            Demand(4000, 100, 1, 1000),
            Demand(2000, 100, 1, 500, frozenset({"T4"})),
            Demand(9000, 100),
        ],
        MODELS,
    )


def test_workload_shapes_and_ratios() -> None:
    w = _workload()
    assert w.size == 2
    assert w.milli.tolist() == [500, 1000]
    assert w.prob.tolist() == [0.25, 0.5]
    assert w.allowed.tolist() == [[False, True, False], [False, True, True]]
    assert w.cpu_per_milli == pytest.approx(10_000 / 2500)


def test_fragmentation_by_hand() -> None:
    w = _workload()
    free = np.asarray([[1000, 600, 300], [1000, 600, -1], [200, -1, -1]])
    cpu = np.asarray([10_000, 10_000, 10_000])
    mem = np.asarray([1000, 1000, 1000])
    # node 0 (T4): 500-shape loses the 300 GPU; 1000-shape loses 600 + 300.
    # node 1 (V100): 500-shape cannot run at all (T4 only): all 1600; 1000-shape loses 600.
    # node 2 (T4): neither fits: all 200 for both.
    expected = [0.25 * 300 + 0.5 * 900, 0.25 * 1600 + 0.5 * 600, 0.75 * 200]
    got = fragmentation(w, free, cpu, mem, np.asarray([1, 2, 1]))
    assert got.tolist() == pytest.approx(expected)
    # Without CPU for the median task, every shape loses all of the node's free GPU.
    starved = fragmentation(w, free, np.asarray([1000] * 3), mem, np.asarray([1, 2, 1]))
    assert starved.tolist() == pytest.approx([0.75 * 1900, 0.75 * 1600, 0.75 * 200])


def test_stranded_by_hand() -> None:
    w = _workload()  # 4 milli-CPU and 0.12 MiB per milli-GPU
    got = stranded(w, np.asarray([1000, 1000]), np.asarray([8000, 2000]), np.asarray([10**6] * 2))
    assert got.tolist() == pytest.approx([0.0, 500.0])


def test_workload_needs_gpu_tasks() -> None:
    with pytest.raises(InvalidInput, match="no GPU tasks"):
        Workload.from_demands([Demand(1, 1)], MODELS)


def test_model_pressure_by_hand() -> None:
    w = _workload()  # demand: T4-only 0.25 x 500 = 125; any model 0.5 x 1000 = 500
    capacity = np.asarray([0.0, 1000.0, 3000.0])  # T4: 1 GPU, V100: 3 GPUs
    # T4 carries 125 of constrained demand per 1000 capacity; overall 625 per 4000.
    assert model_pressure(w, capacity).tolist() == pytest.approx([0.0, 0.125 / 0.15625, 0.0])
