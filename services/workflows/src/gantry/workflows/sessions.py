"""Dev sessions (application): start, stop, resume; follow each session's job.

A session's life is a series of *generations*, each one job. :meth:`Sessions.tick` looks at
the current generation's job (level-triggered, like the pipeline controller) and names the
session's state after it:

- ``starting``: the job waits for a place (a GPU slice) or its server is starting;
- ``running``: the server answers at :attr:`SessionView.url` (the owner gets the token);
- ``waiting``: it was preempted by more important work — its files are saved and the job is
  back in the queue; it comes back by itself when a GPU frees up;
- ``culled`` (idle past ``idleTimeout``), ``expired`` (``lifetime`` reached), ``stopped`` (its
  owner stopped it) or ``failed``: the job has ended and its GPU is free. ``resume`` starts
  the next generation, which gets the files back and a new token.

The token is made here (``secrets.token_urlsafe``), kept in the service's database sealed
(AES-256-GCM, :mod:`gantry.workflows.sealing`) and shown only to the session's owner; the node
only ever gets its SHA-256. A session is ``running`` once its server accepts connections, not
merely once its job runs.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
import yaml

from gantry.core import (
    AlreadyExists,
    Clock,
    Conflict,
    GantryError,
    NotFound,
    SystemClock,
    Unavailable,
    get_logger,
)
from gantry.events.catalog import DevSessionChanged
from gantry.workflows import store
from gantry.workflows.devsessions import (
    DevSession,
    SessionDoc,
    SessionSpec,
    job_document,
    parse_session,
)
from gantry.workflows.platform import JobStatus, Owner, Platform
from gantry.workflows.sealing import SealBroken, Sealer

_log = get_logger("gantry.workflows.sessions")
ACTIVE = ("starting", "running", "waiting")
ENDED = ("culled", "expired", "stopped", "failed")


@dataclass
class Generation:
    """One run of a session: its job, when and how it ended."""

    number: int
    job_id: str
    started_ms: int
    ended_ms: int = 0
    how: str = ""
    active_s: float = 0.0


@dataclass
class SessionView:
    """A session as the API shows it (``token`` only to its owner)."""

    name: str
    owner: str
    roles: tuple[str, ...]
    state: str
    reason: str
    spec: SessionSpec
    source: str
    token: str
    generation: int
    job_id: str
    endpoint: str = ""
    active_s: float = 0.0
    history: list[Generation] = field(default_factory=list)
    created_ms: int = 0
    started_ms: int = 0
    ended_ms: int = 0

    @property
    def url(self) -> str:
        """The server's base URL while it runs ("" otherwise)."""
        return f"http://{self.endpoint}/" if self.endpoint and self.state == "running" else ""

    @property
    def done(self) -> bool:
        return self.state in ENDED


class Sessions:
    """Runs dev sessions; every public method is safe to call from any thread."""

    def __init__(
        self,
        engine: sa.Engine,
        platform: Platform,
        clock: Clock = SystemClock(),
        *,
        sealer: Sealer | None = None,
    ) -> None:
        self.engine = engine
        self.platform = platform
        self.clock = clock
        self.sealer = sealer or Sealer.ephemeral()
        self.on_change: Callable[[], None] = lambda: None
        self._lock = threading.RLock()

    def now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    # -- the API's operations -----------------------------------------------------------------

    def start(self, source: str, *, owner: Owner, dry_run: bool = False) -> SessionView:
        """Check a DevSession document and start its first generation."""
        session = parse_session(source)
        now = self.now_ms()
        view = SessionView(
            name=session.name,
            owner=owner.subject,
            roles=owner.roles,
            state="starting",
            reason="waiting for a place",
            spec=session.spec,
            source=source,
            token=secrets.token_urlsafe(32),
            generation=1,
            job_id="",
            created_ms=now,
            started_ms=now,
        )
        if dry_run:
            return view
        with self._lock:
            with self.engine.begin() as conn:
                exists = conn.execute(
                    sa.select(store.sessions.c.name).where(store.sessions.c.name == session.name)
                ).first()
                if exists is not None:
                    raise AlreadyExists(
                        f"dev session {session.name} already exists",
                        hint=f"resume it with `gantry sessions resume {session.name}`, or "
                        "choose another name",
                    )
                self._write(conn, view, previous="")
            self._submit(view)
        return self.get(session.name)

    def get(self, name: str) -> SessionView:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.sessions).where(store.sessions.c.name == name)
            ).first()
        if row is None:
            raise NotFound("dev session", name, hint="list sessions with `gantry sessions list`")
        return self._view(row)

    def list(self, *, state: str = "") -> list[SessionView]:
        query = sa.select(store.sessions).order_by(store.sessions.c.created_ms.desc())
        if state:
            query = query.where(store.sessions.c.state == state)
        with self.engine.connect() as conn:
            return [self._view(r) for r in conn.execute(query).all()]

    def stop(self, name: str, reason: str) -> SessionView:
        """Stop the session: its server saves the files and its GPU is freed."""
        with self._lock:
            view = self.get(name)
            if view.done:
                raise Conflict(f"dev session {name} is already {view.state}")
            if view.job_id:
                try:
                    self.platform.cancel_job(
                        view.job_id, reason or "stopped", owner=Owner(view.owner, view.roles)
                    )
                except GantryError as exc:
                    _log.warning("session job not cancelled", job=view.job_id, error=str(exc))
            self._end(view, "stopped", reason or "stopped by its owner", None)
        return self.get(name)

    def resume(self, name: str) -> SessionView:
        """Start the next generation of an ended session (its files come back)."""
        with self._lock:
            view = self.get(name)
            if not view.done:
                raise Conflict(
                    f"dev session {name} is {view.state}",
                    hint="only a culled, expired, stopped or failed session can be resumed",
                )
            previous = view.state
            now = self.now_ms()
            view.generation += 1
            view.token = secrets.token_urlsafe(32)
            view.state, view.reason, view.job_id, view.endpoint = (
                "starting",
                f"resumed (generation {view.generation}); waiting for a place",
                "",
                "",
            )
            view.started_ms, view.ended_ms = now, 0
            with self.engine.begin() as conn:
                self._write(conn, view, previous=previous)
            self._submit(view)
        return self.get(name)

    # -- the loop -----------------------------------------------------------------------------

    def tick(self) -> int:
        """Follow every active session's job; how many were looked at."""
        active = [v for v in self.list() if v.state in ACTIVE]
        for view in active:
            try:
                self._follow(view)
            except GantryError as exc:
                _log.warning("session not followed", session=view.name, error=str(exc))
        return len(active)

    def _submit(self, view: SessionView) -> None:
        document = job_document(view.name, view.spec, token=view.token, generation=view.generation)
        try:
            job_id = self.platform.submit_job(
                document,
                request_id=f"session-{view.name}-{view.created_ms}-{view.generation}",
                owner=Owner(view.owner, view.roles),
            )
        except Unavailable as exc:
            _log.warning("session job not submitted yet", session=view.name, error=str(exc))
            return
        except GantryError as exc:
            self._end(view, "failed", f"{type(exc).__name__}: {exc.message}", None)
            return
        view.job_id = job_id
        view.history.append(Generation(view.generation, job_id, self.now_ms()))
        self._save(view, view.state)

    def _follow(self, view: SessionView) -> None:
        with self._lock:
            if not view.job_id:
                self._submit(view)
                return
            status = self.platform.job(view.job_id, owner=Owner(view.owner, view.roles))
            previous = view.state
            if status.terminal:
                how, why = _ending(status)
                self._end(view, how, why, status)
                return
            if (
                status.state == "running"
                and status.rendezvous
                and (previous == "running" or self.platform.answers(status.rendezvous))
            ):
                state, reason, endpoint = "running", "the server is up", status.rendezvous
            elif status.state == "running" and status.rendezvous and previous != "waiting":
                state, reason, endpoint = "starting", "its server is starting", ""
            elif previous in ("running", "waiting") and status.state in ("pending", "admitted"):
                state, reason, endpoint = (
                    "waiting",
                    "preempted by more important work: its files are saved and it waits for "
                    "a place to come back",
                    "",
                )
            else:
                state = "starting" if previous != "waiting" else "waiting"
                reason, endpoint = status.reason or "waiting for a place", ""
            if (state, reason, endpoint) != (view.state, view.reason, view.endpoint):
                view.state, view.reason, view.endpoint = state, reason, endpoint
                self._save(view, previous)

    def _end(self, view: SessionView, how: str, why: str, status: JobStatus | None) -> None:
        previous = view.state
        now = self.now_ms()
        active = float(status.metrics.get("session_active_s", 0.0)) if status else 0.0
        view.state, view.reason, view.endpoint, view.ended_ms = how, why, "", now
        view.active_s += active
        if view.history and view.history[-1].number == view.generation:
            g = view.history[-1]
            g.ended_ms, g.how, g.active_s = now, how, active
        self._save(view, previous)
        _log.info("session ended", session=view.name, how=how, reason=why)

    # -- records and events -------------------------------------------------------------------

    def _save(self, view: SessionView, previous: str) -> None:
        with self.engine.begin() as conn:
            self._write(conn, view, previous=previous)
        self.on_change()

    def _write(self, conn: sa.Connection, view: SessionView, *, previous: str) -> None:
        values = {
            "owner": view.owner,
            "roles_json": store.dumps(list(view.roles)),
            "source": view.source,
            "state": view.state,
            "reason": view.reason,
            "token": self.sealer.seal(view.token, bound_to=view.name),
            "generation": view.generation,
            "job_id": view.job_id,
            "endpoint": view.endpoint,
            "active_s": view.active_s,
            "history_json": store.dumps(
                [
                    [g.number, g.job_id, g.started_ms, g.ended_ms, g.how, g.active_s]
                    for g in view.history
                ]
            ),
            "created_ms": view.created_ms,
            "started_ms": view.started_ms,
            "ended_ms": view.ended_ms,
        }
        table = store.sessions
        if not conn.execute(
            table.update().where(table.c.name == view.name).values(**values)
        ).rowcount:
            conn.execute(table.insert().values(name=view.name, **values))
        if view.state != previous:
            store.record(
                conn,
                "gantry.workflow.session.changed",
                DevSessionChanged(
                    session=view.name,
                    state=view.state,
                    previous=previous,
                    reason=view.reason,
                    owner=view.owner,
                    generation=view.generation,
                    job_id=view.job_id,
                    endpoint=view.endpoint,
                ),
                actor=view.owner,
                subject=view.name,
            )

    def _view(self, row: Any) -> SessionView:
        try:
            token = self.sealer.open(row.token, bound_to=row.name)
        except SealBroken as exc:
            _log.warning("session token unreadable", session=row.name, error=str(exc))
            token = ""
        doc = SessionDoc.model_validate(yaml.safe_load(row.source))
        return SessionView(
            name=row.name,
            owner=row.owner,
            roles=tuple(orjson.loads(row.roles_json)),
            state=row.state,
            reason=row.reason,
            spec=doc.spec,
            source=row.source,
            token=token,
            generation=row.generation,
            job_id=row.job_id,
            endpoint=row.endpoint,
            active_s=row.active_s,
            history=[Generation(*g) for g in orjson.loads(row.history_json)],
            created_ms=row.created_ms,
            started_ms=row.started_ms,
            ended_ms=row.ended_ms,
        )


def _ending(status: JobStatus) -> tuple[str, str]:
    """How a session's job ended: culled, expired, stopped or failed, and why."""
    m = status.metrics
    if status.state == "succeeded":
        if m.get("session_culled"):
            return "culled", "idle past its idleTimeout: its files are saved and its GPU is free"
        if m.get("session_expired"):
            return "expired", "its lifetime ran out: its files are saved and its GPU is free"
        return "stopped", "its server stopped: its files are saved"
    if status.state == "cancelled":
        return "stopped", status.reason or "its job was cancelled"
    return "failed", f"its job {status.state}: {status.reason or 'no reason given'}"


__all__ = ["ACTIVE", "ENDED", "DevSession", "Generation", "SessionView", "Sessions"]
