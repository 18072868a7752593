"""Deep traces: ``torch.profiler`` recordings of a few steps of a job, stored encrypted.

:meth:`Traces.request` records the request and queues ``gantry.job.trace.requested`` in the
same transaction; the node agents running the job pass it to the workers, which record the
next steps and hand the agents a gzipped Chrome trace (Perfetto opens it too). The agents
upload each rank's file with :meth:`Traces.store` — it must come from a node the rank runs
on — and it is written to the object store (AES-256-GCM, like every blob in Gantry) under
``profiler/traces/<trace_id>/rank<r>.json.gz``, with ``gantry.job.trace.ready`` announcing it.
:meth:`Traces.open` streams it back for a download.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.core import Conflict, InvalidInput, NotFound, PermissionDenied
from gantry.events.catalog import TRACE_READY, TRACE_REQUESTED, TraceReady, TraceRequested
from gantry.profiler import store
from gantry.profiler.recording import ACTOR, Recorder
from gantry.profiler.views import resolve_job
from gantry.storage import ObjectStore

MAX_STEPS = 1000
CHUNK = 1 << 20


@dataclass(frozen=True)
class TraceFileView:
    rank: int
    node: str
    state: str
    bytes: int
    sha256: str
    reason: str
    first_step: int
    steps: int


@dataclass(frozen=True)
class TraceView:
    trace_id: str
    job_id: str
    attempt: int
    steps: int
    state: str
    requested_by: str
    requested_ms: int
    files: list[TraceFileView]
    owner: str


@dataclass(frozen=True)
class Upload:
    """The first message of an upload: what the data is."""

    trace_id: str
    job_id: str
    attempt: int
    rank: int
    node: str
    first_step: int
    steps: int
    failed_reason: str = ""


class Traces:
    """Trace requests, uploads and downloads."""

    def __init__(
        self, recorder: Recorder, objects: ObjectStore, *, max_bytes: int, expire_s: float = 660.0
    ) -> None:
        self.recorder = recorder
        self.objects = objects
        self.max_bytes = max_bytes
        self.expire_s = expire_s
        """A trace some ranks never answered is ``expired`` (or ``partial``) after this long:
        the job ended first, or no agent got the request."""

    def request(self, job: str, steps: int, ranks: list[int], actor: str) -> TraceView:
        """Ask the running attempt of ``job`` for a trace of its next ``steps`` steps."""
        if not 1 <= steps <= MAX_STEPS:
            raise InvalidInput(
                f"cannot trace {steps} steps", hint=f"ask for 1 to {MAX_STEPS} steps"
            )
        job_id = resolve_job(self.recorder, job)
        with self.recorder.lock:
            record = self.recorder.profiles.jobs.get(job_id)
            if record is None or not record.running:
                raise Conflict(
                    f"job {job_id} is not running: only a running job can be traced",
                    hint="trace it while it trains (`gantry jobs get` shows its state)",
                )
            world = sorted(record.gang.ranks)
            attempt = record.attempt
        bad = sorted(set(ranks) - set(world))
        if bad:
            raise InvalidInput(
                f"job {job_id} has no rank {', '.join(map(str, bad))}",
                hint=f"its ranks are {world[0]}-{world[-1]}",
            )
        trace_id = f"tr-{uuid.uuid4().hex[:12]}"
        now = self.recorder.clock()
        with self.recorder.engine.begin() as conn:
            conn.execute(
                store.traces.insert().values(
                    trace_id=trace_id,
                    job_id=job_id,
                    attempt=attempt,
                    steps=steps,
                    ranks_json=store.dumps(sorted(set(ranks)) or world),
                    requested_by=actor,
                    requested_ms=now,
                )
            )
            store.record(
                conn,
                TRACE_REQUESTED.type,
                TraceRequested(
                    trace_id=trace_id,
                    job_id=job_id,
                    attempt=attempt,
                    steps=steps,
                    ranks=sorted(set(ranks)),
                    requested_by=actor,
                ),
                actor=actor,
                subject=job_id,
            )
        self.recorder.on_change()
        return self.get(trace_id)

    def get(self, trace_id: str) -> TraceView:
        with self.recorder.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.traces).where(store.traces.c.trace_id == trace_id)
            ).first()
            if row is None:
                raise NotFound("trace", trace_id, hint="`gantry profile traces JOB` lists them")
            return self._view(conn, row)

    def owner(self, job: str) -> tuple[str, str]:
        """(job id, owner) of a job given by id or name."""
        job_id = resolve_job(self.recorder, job)
        with self.recorder.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.jobs.c.owner)
                .where(store.jobs.c.job_id == job_id)
                .order_by(store.jobs.c.attempt.desc())
                .limit(1)
            ).first()
        return job_id, row.owner if row is not None else ""

    def list(self, job: str) -> list[TraceView]:
        job_id = resolve_job(self.recorder, job)
        with self.recorder.engine.connect() as conn:
            rows = conn.execute(
                sa.select(store.traces)
                .where(store.traces.c.job_id == job_id)
                .order_by(store.traces.c.requested_ms.desc())
            ).all()
            return [self._view(conn, r) for r in rows]

    def _view(self, conn: sa.Connection, r: Any) -> TraceView:
        trace_id = r.trace_id
        files = [
            TraceFileView(
                rank=f.rank,
                node=f.node,
                state=f.state,
                bytes=f.bytes,
                sha256=f.sha256,
                reason=f.reason,
                first_step=f.first_step,
                steps=f.steps,
            )
            for f in conn.execute(
                sa.select(store.trace_files)
                .where(store.trace_files.c.trace_id == trace_id)
                .order_by(store.trace_files.c.rank)
            ).all()
        ]
        job = conn.execute(
            sa.select(store.jobs.c.owner, store.jobs.c.placements_json).where(
                store.jobs.c.job_id == r.job_id,
                store.jobs.c.attempt == r.attempt,
            )
        ).first()
        wanted = orjson.loads(r.ranks_json)
        done = {f.rank for f in files}
        ready = [f for f in files if f.state == "ready"]
        if files and done >= set(wanted):
            state = "ready" if len(ready) == len(files) else ("partial" if ready else "failed")
        elif self.recorder.clock() - r.requested_ms > self.expire_s * 1000:
            state = ("partial" if ready else "expired") if files else "expired"
        else:
            state = "pending"
        return TraceView(
            trace_id=trace_id,
            job_id=r.job_id,
            attempt=r.attempt,
            steps=r.steps,
            state=state,
            requested_by=r.requested_by,
            requested_ms=r.requested_ms,
            files=files,
            owner=job.owner if job is not None else "",
        )

    def check_upload(self, up: Upload, uploader: str) -> None:
        """Refuse an upload for an unknown trace, a rank not asked for, or from another node."""
        trace = self.get(up.trace_id)
        if trace.job_id != up.job_id or trace.attempt != up.attempt:
            raise InvalidInput(
                f"trace {up.trace_id} is of job {trace.job_id} attempt {trace.attempt}, not "
                f"{up.job_id} attempt {up.attempt}"
            )
        with self.recorder.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.jobs.c.placements_json).where(
                    store.jobs.c.job_id == up.job_id, store.jobs.c.attempt == up.attempt
                )
            ).first()
        nodes = (
            {int(p["worker"]): p["node"] for p in orjson.loads(row.placements_json)} if row else {}
        )
        if nodes.get(up.rank) != up.node:
            raise PermissionDenied(
                uploader,
                "trace",
                f"job {up.job_id}",
                reason=f"rank {up.rank} of job {up.job_id} does not run on node {up.node}",
            )
        if any(f.rank == up.rank for f in trace.files):
            raise Conflict(f"trace {up.trace_id} already has rank {up.rank}")

    def store(self, up: Upload, chunks: Iterable[bytes], uploader: str) -> TraceFileView:
        """Write one rank's file (or its failure) and announce it."""
        self.check_upload(up, uploader)
        key = f"profiler/traces/{up.trace_id}/rank{up.rank}.json.gz"
        digest = hashlib.sha256()
        size = 0
        state, reason = "ready", up.failed_reason
        if up.failed_reason:
            state, key = "failed", ""
        else:
            with self.objects.writer(
                key, metadata={"content-type": "application/gzip", "job": up.job_id}
            ) as writer:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise InvalidInput(
                            f"trace file larger than {self.max_bytes} bytes",
                            hint="trace fewer steps",
                        )
                    digest.update(chunk)
                    writer.write(chunk)
            if size == 0:
                state, reason, key = "failed", "the worker recorded an empty trace", ""
                self.objects.delete(f"profiler/traces/{up.trace_id}/rank{up.rank}.json.gz")
        now = self.recorder.clock()
        sha = digest.hexdigest() if state == "ready" else ""
        with self.recorder.engine.begin() as conn:
            conn.execute(
                store.trace_files.insert().values(
                    trace_id=up.trace_id,
                    rank=up.rank,
                    node=up.node,
                    state=state,
                    bytes=size,
                    sha256=sha,
                    reason=reason,
                    first_step=up.first_step,
                    steps=up.steps,
                    object_key=key,
                    stored_ms=now,
                )
            )
            store.record(
                conn,
                TRACE_READY.type,
                TraceReady(
                    trace_id=up.trace_id,
                    job_id=up.job_id,
                    attempt=up.attempt,
                    rank=up.rank,
                    node=up.node,
                    state="ready" if state == "ready" else "failed",
                    bytes=size,
                    sha256=sha,
                    first_step=up.first_step,
                    steps=up.steps,
                    reason=reason,
                ),
                actor=ACTOR,
                subject=up.job_id,
            )
        self.recorder.on_change()
        return TraceFileView(up.rank, up.node, state, size, sha, reason, up.first_step, up.steps)

    def open(self, trace_id: str, rank: int) -> Iterator[bytes]:
        """The stored file of one rank, in pieces (decrypted and checked as it is read)."""
        with self.recorder.engine.connect() as conn:
            row = conn.execute(
                sa.select(store.trace_files).where(
                    store.trace_files.c.trace_id == trace_id, store.trace_files.c.rank == rank
                )
            ).first()
        if row is None or row.state != "ready":
            raise NotFound(
                f"recorded file of trace {trace_id} for rank",
                str(rank),
                hint="`gantry profile traces JOB` shows what is ready",
            )
        reader = self.objects.open(row.object_key)
        try:
            while True:
                piece = reader.read(CHUNK)
                if not piece:
                    return
                yield bytes(piece)
        finally:
            reader.close()


__all__ = ["MAX_STEPS", "TraceFileView", "TraceView", "Traces", "Upload"]
