"""Deep traces of a job's steps: the profiler asks, the workers record, the agent uploads.

The profiler publishes ``gantry.job.trace.requested`` (source ``gantry/profiler``, signed by
its service key). For an attempt with workers on this node, the agent writes the request into
the attempt's trace directory -- the workers' ``GANTRY_TRACE_DIR``, ``<job_dir>/traces-<attempt>``,
mode 0700 -- where each worker's :class:`gantry.training.tracing.TraceOnRequest` picks it up,
records the next steps and leaves ``<trace_id>.rank<R>.json.gz`` and, last,
``<trace_id>.rank<R>.done.json``.

:meth:`TraceRelay.relay` polls for the done files of this node's ranks (every 0.5 s), uploads
each trace -- or why there is none -- with the profiler's client-streaming ``UploadTrace``
(first a message naming it, then the gzipped trace in chunks of 1 MiB; the agent's service
token as bearer, as for governance), retries an upload that fails on the way a few times, and
removes the files. A rank without a done file when the attempt ends, or after a minute per
traced step (at most ``trace_wait_s``), is uploaded as failed. Errors are logged; nothing here
stops the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from gantry.core import GantryError, Unavailable, get_logger
from gantry.core.runfile import run_file, service_address
from gantry.events.catalog import TraceRequested
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.protos.v1 import profiler_pb2_grpc as pb_grpc
from gantry.security.tls import secure_or_insecure_aio_channel
from gantry.training.tracing import REQUEST_FILE, done_file, trace_file, valid_trace_id
from gantry.training_agent.settings import AgentSettings

#: Only the profiler asks for traces; its events must be signed by a service key.
PROFILER_SOURCE = "gantry/profiler"
#: The most trace bytes in one ``UploadTrace`` message.
CHUNK_BYTES = 1 << 20
#: Seconds between looks for the workers' done files.
POLL_S = 0.5
#: Seconds a traced step may take before its rank is given up (at most ``trace_wait_s``).
SECONDS_PER_STEP = 60.0
#: Pauses before the retries of a failed upload.
RETRY_DELAYS_S = (1.0, 3.0, 9.0)
#: Failures an upload is tried again after (the profiler restarting, a network blip).
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
_REMEMBERED = 1000
_log = get_logger("gantry.training_agent")


def trace_dir(job_dir: Path, attempt: int) -> Path:
    """The trace directory of one attempt of a job (its workers' ``GANTRY_TRACE_DIR``)."""
    return job_dir / f"traces-{attempt}"


def prepare_trace_dir(job_dir: Path, attempt: int) -> Path:
    """Create the attempt's trace directory, readable by this user only; its path."""
    path = trace_dir(job_dir, attempt)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)  # the umask, or an older directory, may have left it wider
    return path


def write_request(directory: Path, request: TraceRequested) -> Path:
    """Write ``request.json`` for the workers, atomically (agents may share the directory)."""
    path = directory / REQUEST_FILE
    tmp = directory / f".{REQUEST_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    body = {"trace_id": request.trace_id, "steps": request.steps, "ranks": list(request.ranks)}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(body))
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class RankTrace:
    """What one rank left: its trace file, or why it has none."""

    rank: int
    first_step: int = 0
    steps: int = 0
    failed_reason: str = ""
    path: Path | None = None


def read_done(directory: Path, trace_id: str, rank: int) -> RankTrace | None:
    """The rank's outcome once its done file is there; None while it is not."""
    path = done_file(directory, trace_id, rank)
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        first_step, steps = int(raw.get("first_step") or 0), int(raw.get("steps") or 0)
        reason = str(raw.get("failed_reason") or "")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        return RankTrace(rank, failed_reason=f"the worker's done file is unreadable: {exc}")
    if reason:
        return RankTrace(rank, first_step, steps, reason[:2000])
    gz = trace_file(directory, trace_id, rank)
    if not gz.is_file():
        return RankTrace(rank, first_step, steps, "the worker's trace file is missing")
    return RankTrace(rank, first_step, steps, path=gz)


class ProfilerLink:
    """``UploadTrace`` calls to the profiler, authenticated with the agent's service token."""

    def __init__(
        self, settings: AgentSettings, token: Callable[[], str], *, timeout_s: float = 600.0
    ) -> None:
        self._settings = settings
        self._token = token
        self._timeout_s = timeout_s

    def address(self) -> str:
        """The profiler's address (setting, else the embedded platform's run file)."""
        return service_address(
            self._settings.data_dir,
            "profiler",
            configured=self._settings.agent.profiler_addr,
            setting="GANTRY_AGENT__PROFILER_ADDR",
        )

    def known(self) -> bool:
        """Whether a profiler is configured or runs on this platform."""
        return bool(self._settings.agent.profiler_addr) or (
            run_file(self._settings.data_dir, "profiler").exists()
        )

    async def upload(
        self, first: pb.UploadTraceRequest, path: Path | None
    ) -> pb.UploadTraceResponse:
        """One ``UploadTrace``: ``first``, then the file at ``path`` (if any) in chunks."""
        address = self.address()
        metadata = (("authorization", f"Bearer {self._token()}"),)
        source = await asyncio.to_thread(path.open, "rb") if path is not None else None
        try:
            options = [("grpc.max_send_message_length", CHUNK_BYTES + (64 << 10))]
            async with secure_or_insecure_aio_channel(
                address, self._settings.tls, options
            ) as channel:
                stub = pb_grpc.ProfilerServiceStub(channel)
                reply: pb.UploadTraceResponse = await stub.UploadTrace(
                    _messages(first, source), metadata=metadata, timeout=self._timeout_s
                )
                return reply
        finally:
            if source is not None:
                source.close()


async def _messages(
    first: pb.UploadTraceRequest, source: IO[bytes] | None
) -> AsyncIterator[pb.UploadTraceRequest]:
    yield first
    if source is None:
        return
    while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
        yield pb.UploadTraceRequest(data=chunk)


class TraceRelay:
    """Passes trace requests to the workers and their traces to the profiler."""

    def __init__(
        self,
        link: ProfilerLink,
        node: str,
        *,
        wait_s: float = 600.0,
        poll_s: float = POLL_S,
        retry_delays_s: Sequence[float] = RETRY_DELAYS_S,
    ) -> None:
        self.link = link
        self.node = node
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.retry_delays_s = tuple(retry_delays_s)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.retries = 0
        """Uploads tried again after a transient failure, so far."""
        self.failures: list[tuple[str, int, int, str]] = []
        """(trace id, rank, tries, error) of each upload given up, the last 100."""

    def _gave_up(
        self, log: Any, request: TraceRequested, rank: int, tries: int, error: str
    ) -> bool:
        log.error("trace upload failed", error=error, tries=tries)
        self.failures = [*self.failures[-99:], (request.trace_id, rank, tries, error)]
        return False

    def claim(self, trace_id: str) -> bool:
        """Whether ``trace_id`` is new here (a redelivered request is relayed once)."""
        if trace_id in self._seen:
            return False
        self._seen[trace_id] = None
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        return True

    async def relay(
        self,
        request: TraceRequested,
        directory: Path,
        ranks: Sequence[int],
        alive: Callable[[], bool],
    ) -> None:
        """Write the request for ``ranks`` (this node's) in ``directory``, wait for their
        traces while ``alive()`` (the attempt runs) and upload them; never raises."""
        log = _log.bind(trace_id=request.trace_id, job=request.job_id, attempt=request.attempt)
        pending = sorted(set(ranks))
        if not valid_trace_id(request.trace_id):
            log.warning("trace request refused: its id cannot name files")
            await self._fail_all(request, pending, "the trace id cannot name files")
            return
        try:
            try:
                write_request(directory, request)
            except OSError as exc:
                log.error("trace request not passed to the workers", error=str(exc))
                await self._fail_all(request, pending, f"the node agent could not ask: {exc}")
                return
            log.info("trace requested", ranks=pending, steps=request.steps, node=self.node)
            pending = await self._collect(request, directory, pending, alive)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not take the agent down
            log.exception("trace relay failed")
        finally:  # also when cancelled (the agent stopping): a few small files
            self._clean(request, directory, ranks)

    async def _collect(
        self,
        request: TraceRequested,
        directory: Path,
        pending: list[int],
        alive: Callable[[], bool],
    ) -> list[int]:
        wait_s = min(self.wait_s, request.steps * SECONDS_PER_STEP)
        deadline = time.monotonic() + wait_s
        ended = False
        while True:
            for rank in list(pending):
                outcome = await asyncio.to_thread(read_done, directory, request.trace_id, rank)
                if outcome is not None:
                    pending.remove(rank)
                    await self._upload(request, directory, outcome)
            if not pending:
                return pending
            if ended:
                reason = "the workers ended before the trace was recorded"
                break
            if time.monotonic() >= deadline:
                reason = f"the worker recorded no trace within {wait_s:g} s"
                break
            ended = not alive()  # one more look after the end: the last done files
            await asyncio.sleep(self.poll_s)
        await self._fail_all(request, pending, reason)
        return []

    async def _fail_all(self, request: TraceRequested, ranks: Sequence[int], reason: str) -> None:
        for rank in ranks:
            await self._upload(request, None, RankTrace(rank, failed_reason=reason))

    async def _upload(
        self, request: TraceRequested, directory: Path | None, outcome: RankTrace
    ) -> bool:
        """Upload one rank's trace (or failure), retrying; remove its files. Whether the
        profiler took it."""
        log = _log.bind(
            trace_id=request.trace_id,
            job=request.job_id,
            attempt=request.attempt,
            rank=outcome.rank,
        )
        first = pb.UploadTraceRequest(
            trace_id=request.trace_id,
            job_id=request.job_id,
            attempt=request.attempt,
            rank=outcome.rank,
            node=self.node,
            first_step=outcome.first_step,
            steps=outcome.steps,
            failed_reason=outcome.failed_reason,
        )
        try:
            for retry, delay in enumerate((*self.retry_delays_s, None)):
                try:
                    reply = await self.link.upload(first, outcome.path)
                except grpc.aio.AioRpcError as exc:
                    error = f"{exc.code().name}: {exc.details()}"
                    if exc.code() not in _RETRYABLE or delay is None:
                        return self._gave_up(log, request, outcome.rank, retry + 1, error)
                except Unavailable as exc:  # no address yet: the profiler is (re)starting
                    error = exc.message
                    if delay is None:
                        return self._gave_up(log, request, outcome.rank, retry + 1, error)
                except Exception as exc:  # no token, an unreadable file...: not worth retrying
                    error = exc.message if isinstance(exc, GantryError) else repr(exc)
                    return self._gave_up(log, request, outcome.rank, retry + 1, error)
                else:
                    log.info(
                        "trace uploaded",
                        bytes=int(reply.bytes),
                        failed_reason=outcome.failed_reason,
                        tries=retry + 1,
                    )
                    return True
                log.warning("trace upload failed; retrying", error=error, retry_in_s=delay)
                self.retries += 1
                await asyncio.sleep(delay)
            return False  # not reached: the last try returns
        finally:  # uploaded or given up: the files are not kept (traces are large)
            if directory is not None:
                _remove_rank(directory, request.trace_id, outcome.rank)

    @staticmethod
    def _clean(request: TraceRequested, directory: Path, ranks: Sequence[int]) -> None:
        """Remove the request (unless a newer one replaced it) and what this node's ranks
        left: a restarted worker would otherwise record it again."""
        path = directory / REQUEST_FILE
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads(path.read_text()).get("trace_id") == request.trace_id:
                path.unlink()
        for rank in ranks:
            _remove_rank(directory, request.trace_id, rank)


def _remove_rank(directory: Path, trace_id: str, rank: int) -> None:
    for path in (trace_file(directory, trace_id, rank), done_file(directory, trace_id, rank)):
        with contextlib.suppress(OSError):
            path.unlink()


__all__ = [
    "CHUNK_BYTES",
    "PROFILER_SOURCE",
    "ProfilerLink",
    "RankTrace",
    "TraceRelay",
    "prepare_trace_dir",
    "read_done",
    "trace_dir",
    "write_request",
]
