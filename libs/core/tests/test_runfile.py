"""Run files: where a running service says it listens."""

from __future__ import annotations

from pathlib import Path

from gantry.core.runfile import grpc_address, run_file, write_run_file


def test_a_written_run_file_gives_the_grpc_address_and_a_missing_or_bad_one_none(
    tmp_path: Path,
) -> None:
    assert grpc_address(tmp_path, "governance") is None
    write_run_file(tmp_path, "governance", host="127.0.0.1", grpc_port=7032, metrics_port=9032)
    assert grpc_address(tmp_path, "governance") == "127.0.0.1:7032"
    run_file(tmp_path, "governance").write_text("{not json")
    assert grpc_address(tmp_path, "governance") is None
    run_file(tmp_path, "governance").write_text('{"pid": 1}')
    assert grpc_address(tmp_path, "governance") is None
