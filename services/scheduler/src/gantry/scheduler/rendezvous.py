"""Where the workers of one attempt meet: torch.distributed's ``MASTER_ADDR`` and ``MASTER_PORT``.

The scheduler decides both when it places an attempt and sends them in ``gantry.job.scheduled``;
every node agent of the gang passes the same values to its workers. The Kubernetes backend has
its own rendezvous (a headless Service per attempt) and ignores them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Rendezvous ports lie in ``PORT_BASE`` .. ``PORT_BASE + PORT_RANGE - 1``: below the usual
#: ephemeral range, so an outgoing connection rarely holds one.
PORT_BASE = 20000
PORT_RANGE = 10000
#: Added per attempt; prime and coprime with PORT_RANGE, so 10000 attempts in a row of one job
#: all get distinct ports, and neighbouring attempts are far apart.
_STRIDE = 7919


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of a job's attempt.

    Derived from the job id AND the attempt: a requeued attempt must not meet the previous
    attempt's socket, which may linger (TIME_WAIT, a worker slow to die) on the same node.
    Attempt 1 gets the port agents derive from the job id alone, when no port was sent.
    """
    return PORT_BASE + (zlib.crc32(job_id.encode()) + (attempt - 1) * _STRIDE) % PORT_RANGE


def worker_port(job_id: str, attempt: int, restarts: int) -> int:
    """The port rank 0 listens on after its agent restarted the gang ``restarts`` times in the
    attempt: the agent moves the attempt's port on by 7 per restart (its ``launch.master_port``)
    so a restarted gang never meets the previous one's socket."""
    return PORT_BASE + (master_port(job_id, attempt) - PORT_BASE + restarts * 7) % PORT_RANGE


def master_addr(placements: Sequence[Mapping[str, Any]], address: Callable[[str], str]) -> str:
    """The address of the node that hosts rank 0, or ``""`` when the attempt runs on one node
    (its agent then uses loopback).

    ``address(node)`` is the address the node registered; a node that registered none is
    reached by its name (the agents' host names are the node names unless configured).
    """
    if len({p["node"] for p in placements}) <= 1:
        return ""
    rank0 = min(placements, key=lambda p: int(p["worker"]))
    node = str(rank0["node"])
    return address(node) or node


__all__ = ["PORT_BASE", "PORT_RANGE", "master_addr", "master_port", "worker_port"]
