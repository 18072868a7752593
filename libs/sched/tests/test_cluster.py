"""Cluster loading, and allocate/release keeping the node arrays consistent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gantry.core.errors import Conflict, InvalidInput
from gantry.sched import Cluster, Demand, load_nodes_csv

HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nodes.csv"
    path.write_text(text)
    return path


def test_loads_nodes_models_and_absent_gpus(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "a,32000,1024,0,\nb,96000,4096,2,T4\nc,8000,512,1,V100\n")
    cluster = load_nodes_csv(path)
    assert cluster.num_nodes == 3
    assert cluster.model_names == ("", "T4", "V100")
    assert cluster.model.tolist() == [0, 1, 2]
    assert cluster.gpu_free.tolist() == [[-1, -1], [1000, 1000], [1000, -1]]
    assert cluster.total_gpu_milli == 3000
    assert cluster.racks is None


def test_optional_rack_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model,rack\na,1,1,1,T4,r1\n")
    assert load_nodes_csv(path).racks == ("r1",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("sn,cpu_milli,gpu,model\na,1,1,T4\n", "lacks columns ['memory_mib']"),
        (HEADER + "a,-5,10,1,T4\n", "line 2: negative resource"),
        (HEADER + "a,x,10,1,T4\n", "line 2: cpu_milli, memory_mib and gpu must be integers"),
        (HEADER, "has no nodes"),
    ],
)
def test_bad_node_lists_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        load_nodes_csv(_write(tmp_path, text))
    assert needle in str(caught.value)


def test_missing_file_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read node list"):
        load_nodes_csv(tmp_path / "absent.csv")


def _cluster() -> Cluster:
    return Cluster(["a", "b"], [10_000, 20_000], [1000, 2000], [2, 0], ["T4", ""])


def test_allocate_then_release_restores_every_array() -> None:
    cluster = _cluster()
    pristine = cluster.copy()
    demand = Demand(4000, 500, 1, 300)
    cluster.allocate(0, demand, [(1, 300)])
    assert cluster.gpu_free[0].tolist() == [1000, 700]
    assert (int(cluster.cpu_free[0]), int(cluster.mem_free[0])) == (6000, 500)
    assert cluster.allocated_gpu_milli == 300
    assert cluster.version[0] == 1
    cluster.release(0, demand, [(1, 300)])
    for attr in ("gpu_free", "cpu_free", "mem_free"):
        assert np.array_equal(getattr(cluster, attr), getattr(pristine, attr)), attr
    assert cluster.version[0] == 2


@pytest.mark.parametrize(
    ("node", "demand", "gpus"),
    [
        (0, Demand(11_000, 1), ()),  # too much CPU
        (0, Demand(1, 1001), ()),  # too much memory
        (0, Demand(1, 1, 1, 1000), [(0, 1000), (0, 1000)]),  # same GPU twice
        (1, Demand(1, 1, 1, 10), [(0, 10)]),  # no GPU there
    ],
)
def test_over_allocation_is_refused_and_changes_nothing(
    node: int, demand: Demand, gpus: list[tuple[int, int]]
) -> None:
    cluster = _cluster()
    before = cluster.copy()
    with pytest.raises((Conflict, InvalidInput)):
        cluster.allocate(node, demand, gpus)
    for attr in ("gpu_free", "cpu_free", "mem_free", "version"):
        assert np.array_equal(getattr(cluster, attr), getattr(before, attr)), attr


def test_releasing_more_than_was_taken_is_refused() -> None:
    cluster = _cluster()
    with pytest.raises(Conflict):
        cluster.release(0, Demand(0, 0, 1, 10), [(0, 10)])
    with pytest.raises(Conflict):
        cluster.release(1, Demand(1, 0), ())


def test_constructor_rejects_negative_and_empty() -> None:
    with pytest.raises(InvalidInput, match="negative cpu_milli"):
        Cluster(["a"], [-1], [1], [0], [""])
    with pytest.raises(InvalidInput, match="at least one node"):
        Cluster([], [], [], [], [])
