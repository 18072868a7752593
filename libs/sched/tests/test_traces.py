"""Trace formats: the generic jobs CSV and the Alibaba converter."""

from __future__ import annotations

from pathlib import Path

import pytest

from gantry.core import InvalidInput
from gantry.sched.traces import (
    jobs_from_alibaba,
    load_jobs_csv,
    parse_jobs_csv,
    write_jobs_csv,
)

ALIBABA = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "alibaba-gpu-2023"


def test_generic_csv_round_trips_and_sorts() -> None:
    text = (
        "submit_time,duration,num_gpus,queue,gpu_milli,gpu_model,cpus,memory_mib,name\n"
        "10,100,1,a,250,T4|A10,2,4096,x\n"
        "5,50,4,b,,,,,y\n"
    )
    jobs = parse_jobs_csv(text)
    assert [j.name for j in jobs] == ["y", "x"]
    assert jobs[1].gpu_milli_total == 250 and jobs[1].gpu_models == ("T4", "A10")
    assert jobs[0].gpu_milli_total == 4000 and jobs[0].cpu_milli == 1000
    again = parse_jobs_csv("".join(write_jobs_csv(jobs)))
    assert again == jobs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit_time,duration\n1,2\n", "no num_gpus column"),
        ("submit_time,duration,num_gpus,colour\n1,2,3,red\n", "unknown columns: colour"),
        ("submit_time,duration,num_gpus\n1,-2,3\n", "line 2: duration must not be negative"),
        ("submit_time,duration,num_gpus\n1,2,1.5\n", "line 2: num_gpus must be a whole number"),
        ("submit_time,duration,num_gpus,gpu_milli\n1,2,1,2000\n", "gpu_milli must be 1..1000"),
    ],
)
def test_bad_rows_name_the_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_jobs_csv(text)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read the jobs CSV"):
        load_jobs_csv(tmp_path / "nope.csv")


@pytest.mark.skipif(not ALIBABA.is_dir(), reason="the shared Alibaba trace is not on this machine")
def test_the_alibaba_pod_list_converts() -> None:
    jobs = jobs_from_alibaba(ALIBABA / "openb_pod_list_default.csv")
    assert 7000 < len(jobs) < 8152  # pods never scheduled are left out
    assert all(j.duration > 0 for j in jobs)
    assert jobs == sorted(jobs, key=lambda j: j.submit_time)
    assert {j.queue for j in jobs} >= {"ls", "be"}
