"""`gantry sim --queues`: quotas and cohort borrowing in the replay, preemptions reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gantry.client import cli

QUEUES = """\
queues:
  - {name: research, cohort: lab, quota: {gpus: 2, cpus: 32, memory: 64Gi}}
  - {name: prod, cohort: lab, quota: {gpus: 2, cpus: 32, memory: 64Gi}}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,4,A100\n")
    # research borrows prod's idle half of the node; prod's job then reclaims it
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        "submit_time,duration,num_gpus,queue,name\n0,1000,4,research,wide\n10,100,2,prod,urgent\n"
    )
    queues = tmp_path / "queues.yaml"
    queues.write_text(QUEUES)
    return nodes, jobs, queues


def test_sim_with_queues_reclaims_lent_quota_and_reports_preemptions(
    tmp_path: Path, files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, jobs, queues = files
    args = ["sim", "--nodes", str(nodes), "--jobs", str(jobs), "--policies", "fifo,gantry"]
    out = tmp_path / "with"
    assert cli.main([*args, "--queues", str(queues), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 jobs on 1 nodes in 2 queues" in printed and "preemptions" in printed
    figures = json.loads((out / "results.json").read_text())
    assert {o: figures[o]["preemptions"] for o in figures} == {"fifo": 1.0, "gantry": 1.0}
    # the urgent job started at once instead of waiting for the wide one to end
    assert figures["gantry"]["p50_queueing_s"] < 100

    plain = tmp_path / "without"
    assert cli.main([*args, "--out", str(plain)]) == 0
    capsys.readouterr()
    figures = json.loads((plain / "results.json").read_text())
    assert {o: figures[o]["preemptions"] for o in figures} == {"fifo": 0.0, "gantry": 0.0}


def test_sim_queues_errors_are_clear(
    tmp_path: Path, files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, jobs, queues = files
    args = ["sim", "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(tmp_path / "o")]
    assert cli.main([*args, "--queues", str(tmp_path / "nope.yaml")]) == 2
    assert "no queues file" in capsys.readouterr().err
    queues.write_text("queues:\n  - {name: research, quota: {gpus: 4}}\n")
    assert cli.main([*args, "--queues", str(queues)]) == 2
    err = capsys.readouterr().err
    assert "does not define the trace's queues prod" in err
    queues.write_text("queues: {name: research}\n")
    assert cli.main([*args, "--queues", str(queues)]) == 2
    assert "a queues file needs a 'queues:' list" in capsys.readouterr().err
