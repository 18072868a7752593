"""Node agents as separate processes, for tests that kill them.

:func:`spawn_agent` starts ``python -m gantry.training_agent`` (the real node agent; named by
module so this library does not import the service) with declared hardware, so no GPU
detection slows the start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The module the node agent runs as.
AGENT_MODULE = "gantry.training_agent"


def spawn_agent(
    nats_url: str,
    data_dir: Path,
    node: str,
    *,
    pool: str = "default",
    gpus: int = 0,
    heartbeat_s: float = 0.2,
    args: Sequence[str] = (),
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start an agent as a separate process (one a test can SIGKILL), logging to
    ``log_path`` (default ``<data_dir>/agent-<node>.log``). ``gpus`` GPUs are declared; the
    caller kills and waits for the process."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_path or data_dir / f"agent-{node}.log"
    command = [
        sys.executable,
        "-m",
        AGENT_MODULE,
        "--node",
        node,
        "--pool",
        pool,
        "--gpus",
        str(gpus),
        "--heartbeat",
        str(heartbeat_s),
        "--data-dir",
        str(data_dir),
        *args,
    ]
    child_env = {**os.environ, **(env or {}), "GANTRY_NATS__URL": nats_url}
    with log_path.open("ab") as log:
        return subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT)


__all__ = ["AGENT_MODULE", "spawn_agent"]
