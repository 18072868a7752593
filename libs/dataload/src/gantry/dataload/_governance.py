"""Shards read through the data-governance service under a job's grant.

The service checks the grant on every call and sends each shard already transformed into the
granted view, so a worker never holds data its job may not see. The object is picklable and
opens its gRPC channel lazily in each process: DataLoader workers (forked or spawned) each get
their own channel instead of sharing one across a fork.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pyarrow as pa

from gantry.core import GantryError, IntegrityError, InvalidInput, TlsSettings
from gantry.dataload._errors import GrantRefused, map_rpc_error
from gantry.dataload._process import process_lock
from gantry.dataload._sources import ShardRef
from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc
from gantry.security.tls import secure_or_insecure_channel

T = TypeVar("T")

#: Shards can be far larger than gRPC's default 4 MiB message limit.
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


class GovernanceShardSource:
    """The shards of ``dataset@version`` in the view the job's ``grant`` allows.

    ``token`` is the node agent's service token (sent as ``authorization: Bearer``); ``grant``
    is the job's grant token (sent in each request). ``version`` ``""`` means the head at the
    time of :meth:`list_shards`, which then pins the resolved version so every later read (in
    any worker) sees the same data. ``view`` ``""`` means the grant's view; an explicit view
    must equal it. ``timeout_s`` bounds each call; calls that fail with UNAVAILABLE are tried
    ``retries`` more times, waiting ``retry_backoff_s`` then doubling. ``tls`` (the job's
    ``GANTRY_TLS__*``, inherited from its node agent) makes the channel TLS when enabled; each
    process reads the certificate files when it opens its channel.
    """

    def __init__(
        self,
        address: str,
        token: str,
        dataset: str,
        version: str,
        grant: str,
        *,
        view: str = "",
        purpose: str = "training",
        timeout_s: float = 300.0,
        retries: int = 3,
        retry_backoff_s: float = 0.5,
        grant_file: str = "",
        tls: TlsSettings | None = None,
    ) -> None:
        if not address:
            raise InvalidInput("no governance address", hint="set GANTRY_GOVERNANCE_ADDR")
        if not dataset:
            raise InvalidInput("no dataset name given")
        if not grant:
            raise InvalidInput("no grant token given", hint="set GANTRY_DATA_GRANT")
        if timeout_s <= 0 or retries < 0 or retry_backoff_s < 0:
            raise InvalidInput(
                "timeout_s must be > 0, retries and retry_backoff_s >= 0",
                hint="e.g. timeout_s=300, retries=3, retry_backoff_s=0.5",
            )
        self.address = address
        self.dataset = dataset
        self.version = version
        self.view = view
        self.purpose = purpose
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self._token = token
        self._grant = grant
        self.grant_file = grant_file
        self.tls = tls
        self._grant_mtime: tuple[int, int, int] = (0, 0, 0)
        self._columns: list[pb.Column] | None = None
        self._policy_version = 0
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._pid = 0

    # ---------------------------------------------------------------- the channel, per process

    def _client(self) -> Any:
        with process_lock():
            if self._stub is None or self._pid != os.getpid():
                # After a fork the parent's channel must not be used (gRPC does not support
                # it); drop the reference without closing it, the parent still owns it.
                self._channel = secure_or_insecure_channel(self.address, self.tls, _CHANNEL_OPTIONS)
                self._stub = pb_grpc.GovernanceServiceStub(self._channel)
                self._pid = os.getpid()
            return self._stub

    def close(self) -> None:
        """Close this process's channel (a later call opens a new one)."""
        with process_lock():
            if self._channel is not None and self._pid == os.getpid():
                self._channel.close()
            self._channel = None
            self._stub = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_channel=None, _stub=None, _pid=0)
        return state

    def __repr__(self) -> str:
        return (
            f"GovernanceShardSource({self.address!r}, dataset={self.dataset!r}, "
            f"version={self.version!r}, view={self.view!r})"
        )

    def _current_grant(self) -> str:
        """The grant to send: ``grant_file``'s content when the node agent renewed it there."""
        if self.grant_file:
            try:
                info = os.stat(self.grant_file)
                mtime = (info.st_mtime_ns, info.st_size, info.st_ino)
                if mtime != self._grant_mtime:
                    with open(self.grant_file, encoding="utf-8") as fh:
                        token = fh.read().strip()
                    if token:
                        self._grant, self._grant_mtime = token, mtime
            except OSError:
                pass  # the agent rewrites it atomically; the last token read stays valid
        return self._grant

    def _resource(self) -> str:
        return f"dataset {self.dataset!r} version {self.version[:12] or 'head'!r}"

    def _call(self, attempt: Callable[[], T]) -> T:
        delay = self.retry_backoff_s
        for tries_left in range(self.retries, -1, -1):
            try:
                return attempt()
            except grpc.RpcError as exc:
                error: GantryError = map_rpc_error(
                    exc, address=self.address, resource=self._resource()
                )
                if not error.temporary or tries_left == 0:
                    raise error from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    # ---------------------------------------------------------------- the ShardSource protocol

    def list_shards(self) -> list[ShardRef]:
        """The version's shards; pins the resolved version and view for later reads."""
        request = pb.ListShardsRequest(
            dataset=self.dataset, version=self.version, grant=self._current_grant()
        )
        metadata = self._metadata()
        reply = self._call(
            lambda: self._client().ListShards(request, metadata=metadata, timeout=self.timeout_s)
        )
        if self.view and reply.view and reply.view != self.view:
            raise GrantRefused(
                f"the grant is for the {reply.view} view, not {self.view}",
                resource=self._resource(),
                hint=f"drop view= (the grant's view is used) or ask for a {self.view} grant",
            )
        self.version = reply.version or self.version
        self.view = reply.view or self.view
        self._columns = list(reply.columns)
        self._policy_version = int(reply.policy_version)
        return [ShardRef(s.id, int(s.rows), int(s.bytes)) for s in reply.shards]

    def fetch(self, shard_id: str) -> bytes:
        """The shard's rows in the view, as the service's Arrow IPC stream."""
        request = pb.ReadRequest(
            dataset=self.dataset,
            version=self.version,
            view=self.view,
            shards=[shard_id],
            grant=self._current_grant(),
            purpose=self.purpose,
        )
        metadata = self._metadata()

        def read() -> list[bytes]:
            stream = self._client().Read(request, metadata=metadata, timeout=self.timeout_s)
            return [m.arrow_ipc for m in stream if m.shard in ("", shard_id) and m.arrow_ipc]

        parts = self._call(read)
        if not parts:
            raise IntegrityError(
                f"the governance service sent no data for shard {shard_id} of {self._resource()}"
            )
        # A shard larger than one gRPC message arrives as several row slices, each a complete
        # IPC stream; callers (and the cache) get one stream.
        return parts[0] if len(parts) == 1 else join_streams(parts)

    # ---------------------------------------------------------------- what the listing said

    def column_names(self) -> list[str] | None:
        """The view's columns, once :meth:`list_shards` has run."""
        return None if self._columns is None else [c.name for c in self._columns]

    def cache_scope(self) -> str:
        """``<dataset>/<version>/<view>/<policy digest>``, for cache keys.

        The digest covers the view policy's version and the view's columns (names, types,
        classifications), so a policy change — even one that keeps the same columns — never
        lets the cache serve an older view's rows.
        """
        if self._columns is None or not self.version or not self.view:
            raise InvalidInput(
                "the source has no resolved version and view yet",
                hint="call list_shards() before fetch() (GovernedDataset does)",
            )
        described = f"policy {self._policy_version}\n" + "\n".join(
            f"{c.name}:{c.type}:{c.classification}" for c in self._columns
        )
        digest = hashlib.sha256(described.encode()).hexdigest()[:16]
        return f"{self.dataset}/{self.version}/{self.view}/{digest}"

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),)


def join_streams(parts: list[bytes]) -> bytes:
    """Several Arrow IPC streams of the same schema as one stream (their batches in order)."""
    try:
        readers = [pa.ipc.open_stream(pa.py_buffer(part)) for part in parts]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, readers[0].schema) as writer:
            for reader in readers:
                for batch in reader:
                    writer.write_batch(batch)
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise IntegrityError(f"the row slices of a shard do not form one table: {exc}") from None
    return bytes(sink.getvalue().to_pybytes())


__all__ = ["GovernanceShardSource", "join_streams"]
