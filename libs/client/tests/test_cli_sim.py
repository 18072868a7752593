"""`gantry sim`: policies side by side on a small trace, with plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gantry.client import cli


def test_sim_compares_policies_and_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,4,A100\nn2,64000,262144,4,A100\n"
    )
    jobs = tmp_path / "jobs.csv"
    rows = ["submit_time,duration,num_gpus,name", "0,1000,4,wide-1", "1,1000,8,whole-1"]
    rows += [f"{2 + i},10,1,short-{i}" for i in range(20)]
    jobs.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    code = cli.main(["sim", "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "avg_jct_s" in printed.out and "sjf-oracle" in printed.out
    figures = json.loads((out / "results.json").read_text())
    assert set(figures) == {"fifo", "sjf-oracle", "gantry"}
    assert figures["sjf-oracle"]["avg_jct_s"] < figures["fifo"]["avg_jct_s"]
    for png in ("jct_cdf.png", "gpu_allocation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,4,A100\n")
    assert cli.main(["sim", "--nodes", str(nodes)]) == 2
    assert "exactly one of --jobs and --alibaba" in capsys.readouterr().err
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("submit_time,duration\n1,2\n")
    assert cli.main(["sim", "--nodes", str(nodes), "--jobs", str(jobs)]) == 2
    assert "no num_gpus column" in capsys.readouterr().err
    args = ["sim", "--nodes", str(nodes), "--jobs", str(jobs), "--policies", "lottery"]
    assert cli.main(args) == 2
    assert "unknown ordering lottery" in capsys.readouterr().err
