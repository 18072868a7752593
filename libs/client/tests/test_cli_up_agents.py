"""`gantry up --agents N`: the scheduler and N local node agents, supervised, Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)


def test_gantry_up_runs_local_agents_that_register_with_the_scheduler(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gantry.client.cli", "up", "--data-dir", str(data),
         "--nats-port", "0", "--agents", "2", "--agent-gpus", "2", "--agent-gpu-model", "L4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        seen = []
        deadline = time.monotonic() + 45
        for raw in proc.stdout:
            seen.append(raw.decode())
            if "Press Ctrl-C to stop." in seen[-1] or time.monotonic() > deadline:
                break
        text = "".join(seen)
        assert "Press Ctrl-C to stop." in text, text
        assert "scheduler gRPC" in text
        assert "local-1 in pool default" in text and "2 L4 GPUs (declared)" in text

        def nodes() -> dict[str, dict[str, object]]:
            listed = subprocess.run(
                [sys.executable, "-m", "gantry.client.cli", "nodes", "list", "--json",
                 "--data-dir", str(data)],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            return {n["name"]: n for n in json.loads(listed.stdout)}

        found = nodes()
        while set(found) != {"local-1", "local-2"} and time.monotonic() < deadline:
            time.sleep(0.3)
            found = nodes()
        assert set(found) == {"local-1", "local-2"}, found
        gpus = found["local-1"]["gpus"]
        assert isinstance(gpus, list) and [g["model"] for g in gpus] == ["L4", "L4"]
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
    assert proc.wait(30) == 0, rest
    assert "Gantry stopped." in rest and "did not stop in time" not in rest
    assert rest.count('"event": "node agent stopped"') == 2  # both agents stopped cleanly
