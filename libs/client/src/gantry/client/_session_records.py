"""What the workflows service says about dev sessions, as plain frozen records.

A dev session (:class:`SessionInfo`) is an interactive Jupyter server or shell on a slice of a
GPU. Its life is a series of generations (:class:`SessionGenerationInfo`), each one job: a
session that was culled, expired, stopped or that failed resumes as its next generation, with
its files. :class:`~gantry.client.workflows.WorkflowsClient` returns these; they are
re-exported by :mod:`gantry.client.workflows`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.protos.v1 import workflows_pb2 as pb

#: Session states, in the order a session may pass through them.
SESSION_STATES = ("starting", "running", "waiting", "culled", "expired", "stopped", "failed")
#: States of a session whose job is queued or running (``waiting``: preempted, it comes back
#: by itself when a GPU frees up).
SESSION_ACTIVE = frozenset({"starting", "running", "waiting"})
#: States of a session whose job has ended and whose GPU is free; ``resume`` starts it again.
SESSION_DONE = frozenset({"culled", "expired", "stopped", "failed"})


@dataclass(frozen=True)
class SessionGenerationInfo:
    """One generation of a session: its job, when it ran and how it ended."""

    number: int
    """From 1."""
    job_id: str
    started_ms: int
    ended_ms: int
    """0 while it runs."""
    how: str
    """culled | expired | stopped | failed; "" while it runs."""
    active_s: float
    """Seconds of activity the service saw in it (what the idle timeout is measured against)."""

    @classmethod
    def from_pb(cls, g: pb.SessionGeneration) -> SessionGenerationInfo:
        """From the protocol message."""
        return cls(
            number=g.number,
            job_id=g.job_id,
            started_ms=g.started_ms,
            ended_ms=g.ended_ms,
            how=g.how,
            active_s=g.active_s,
        )

    @property
    def duration_ms(self) -> int | None:
        """How long it ran (None before it started or while it runs)."""
        if not self.started_ms or not self.ended_ms:
            return None
        return max(self.ended_ms - self.started_ms, 0)


@dataclass(frozen=True)
class SessionInfo:
    """A dev session: where it stands and why, where to reach it, what it may use, its history.

    ``url`` and ``endpoint`` are set only while it runs; ``token`` (the server's login token) is
    only ever sent to the session's owner, and is "" for anyone else.
    """

    name: str
    owner: str
    state: str
    """One of :data:`SESSION_STATES`."""
    reason: str
    spec_yaml: str
    """The DevSession document as submitted."""
    interface: str
    """jupyter | shell"""
    url: str
    """The server's base URL while it runs; "" otherwise."""
    token: str
    """The login token, for its owner only ("" for anyone else, and for a dry run)."""
    generation: int
    """The current (or last) generation's number, from 1; 0 for a dry run."""
    job_id: str
    """The current (or last) generation's job."""
    endpoint: str
    """``host:port`` while it runs; "" otherwise."""
    active_s: float
    """Seconds of activity the service saw, over every generation."""
    history: tuple[SessionGenerationInfo, ...]
    """Every generation, oldest first."""
    created_ms: int
    started_ms: int
    ended_ms: int
    """0 unless it has ended."""
    idle_timeout_s: float
    """Idle this long, it is culled and its GPU goes back to the pool."""
    lifetime_s: float
    """It expires after this long in any case."""
    gpus: float
    """GPUs asked for; a fraction for a slice (``gpuMilli: 250`` is 0.25)."""
    dataset: str
    """The datasets it may read, de-identified, comma-separated; "" for none."""

    @classmethod
    def from_pb(cls, s: pb.DevSession) -> SessionInfo:
        """From the protocol message."""
        return cls(
            name=s.name,
            owner=s.owner,
            state=s.state,
            reason=s.reason,
            spec_yaml=s.spec_yaml,
            interface=s.interface,
            url=s.url,
            token=s.token,
            generation=s.generation,
            job_id=s.job_id,
            endpoint=s.endpoint,
            active_s=s.active_s,
            history=tuple(SessionGenerationInfo.from_pb(g) for g in s.history),
            created_ms=s.created_ms,
            started_ms=s.started_ms,
            ended_ms=s.ended_ms,
            idle_timeout_s=s.idle_timeout_s,
            lifetime_s=s.lifetime_s,
            gpus=s.gpus,
            dataset=s.dataset,
        )

    @property
    def done(self) -> bool:
        """Whether its job has ended (culled, expired, stopped or failed); it can be resumed."""
        return self.state in SESSION_DONE

    @property
    def running(self) -> bool:
        """Whether its server answers at :attr:`url`."""
        return self.state == "running"


__all__ = [
    "SESSION_ACTIVE",
    "SESSION_DONE",
    "SESSION_STATES",
    "SessionGenerationInfo",
    "SessionInfo",
]
