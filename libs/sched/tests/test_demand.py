"""Demand validation and the pod list loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.core.errors import InvalidInput
from gantry.sched import Demand, load_pods_csv


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 0, 0), (1, 1, 0, 5), (1, 1, 1, 0), (1, 1, 1, 1001), (1, 1, 2, 500), (1, 1, -1, 0)],
)
def test_invalid_demands_are_refused(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(InvalidInput):
        Demand(*args)


def test_total_gpu_and_shape() -> None:
    assert Demand(1, 1, 4, 1000).total_gpu_milli == 4000
    assert Demand(1, 1, 1, 250, frozenset({"T4"})).shape == (1, 250, frozenset({"T4"}))


def test_loads_pods_with_and_without_spec(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p0,1000,100,1,470,T4|P100\np1,2000,200,0,0,\np2,3000,300,2,1000,\n"
    )
    pods = load_pods_csv(path)
    assert pods[0] == Demand(1000, 100, 1, 470, frozenset({"T4", "P100"}))
    assert pods[1] == Demand(2000, 200)
    assert pods[2].total_gpu_milli == 2000


def test_bad_pod_lists_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("cpu_milli,memory_mib,num_gpu\n1,1,1\n")
    with pytest.raises(InvalidInput, match="lacks columns"):
        load_pods_csv(path)
    path.write_text("cpu_milli,memory_mib,num_gpu,gpu_milli\n1,1,1,1\n1,1,1,2000\n")
    with pytest.raises(InvalidInput, match="line 3"):
        load_pods_csv(path)
