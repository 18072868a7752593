"""GovernanceShardSource against an in-process governance servicer on port 0."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow as pa
import pytest

from gantry.core import ConfigError, PermissionDenied, Unauthenticated, Unavailable
from gantry.dataload import (
    CachedShardSource,
    DataSettings,
    GovernanceShardSource,
    GovernedDataset,
    GrantRefused,
    decode_shard,
    encode_shard,
    loader,
)
from gantry.dataload._errors import map_rpc_error
from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc

SERVICE_TOKEN = "svc-token"
GRANT = "grant-ok"
VERSION = "v" * 64


@dataclass
class FakeGovernance(pb_grpc.GovernanceServiceServicer):  # type: ignore[misc]
    """Serves pre-made de-identified shards to the right token and grant, like the service."""

    shards: dict[str, pa.Table]
    view: str = "deidentified"
    slice_rows: int = 0  # > 0: send each shard in row slices of this size, as big shards are
    fail_reads: int = 0  # answer this many Reads with UNAVAILABLE first
    requests: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _check(self, request: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append(request)
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") != f"Bearer {SERVICE_TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "token signature is not valid")
        if request.grant != GRANT:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "'job j-1' may not read dataset: grant g-7 covers only other@1234",
            )

    def ListShards(self, request: pb.ListShardsRequest, context: Any) -> pb.ListShardsResponse:
        self._check(request, context)
        first = next(iter(self.shards.values()))
        return pb.ListShardsResponse(
            version=VERSION,
            view=self.view,
            shards=[
                pb.Shard(id=k, rows=t.num_rows, bytes=t.nbytes) for k, t in self.shards.items()
            ],
            columns=[
                pb.Column(name=n, type=str(first.schema.field(n).type)) for n in first.column_names
            ],
        )

    def Read(self, request: pb.ReadRequest, context: Any) -> Iterator[pb.ReadResponse]:
        self._check(request, context)
        with self.lock:
            if self.fail_reads:
                self.fail_reads -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "governance is restarting")
        for shard_id in request.shards:
            table = self.shards[shard_id]
            step = self.slice_rows or max(table.num_rows, 1)
            for start in range(0, table.num_rows, step):
                part = table.slice(start, step)
                yield pb.ReadResponse(
                    shard=shard_id, arrow_ipc=encode_shard(part), rows=part.num_rows
                )


@dataclass
class Server:
    address: str
    servicer: FakeGovernance

    def source(
        self, grant: str = GRANT, token: str = SERVICE_TOKEN, **kw: Any
    ) -> GovernanceShardSource:
        return GovernanceShardSource(self.address, token, "patients", "", grant, **kw)


@pytest.fixture
def server(make_shard: Callable[[int, int], pa.Table]) -> Iterator[Server]:
    shards = {
        f"sha-{i:02d}": make_shard(i, rows) for i, rows in enumerate([30, 45, 20, 33, 41, 27])
    }
    servicer = FakeGovernance(shards)
    executor = futures.ThreadPoolExecutor(4)
    grpc_server = grpc.server(executor)
    pb_grpc.add_GovernanceServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield Server(f"127.0.0.1:{port}", servicer)
    finally:
        grpc_server.stop(None).wait()
        executor.shutdown()


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


def test_lists_and_reads_shards_with_the_grant_and_service_token(server: Server) -> None:
    source = server.source()
    refs = source.list_shards()
    assert [r.id for r in refs] == sorted(server.servicer.shards)
    assert (source.version, source.view) == (VERSION, "deidentified")
    table = decode_shard(source.fetch("sha-01"))
    assert table.equals(server.servicer.shards["sha-01"])
    read = server.servicer.requests[-1]
    assert (read.dataset, read.version, read.view, list(read.shards)) == (
        "patients",
        VERSION,
        "deidentified",
        ["sha-01"],
    )
    assert (read.grant, read.purpose) == (GRANT, "training")
    source.close()


def test_row_slices_of_a_big_shard_come_back_as_one_stream(server: Server) -> None:
    server.servicer.slice_rows = 7
    source = server.source()
    source.list_shards()
    table = decode_shard(source.fetch("sha-01"))
    assert table.num_rows == 45
    assert table.combine_chunks().equals(server.servicer.shards["sha-01"].combine_chunks())


def test_refused_grant_is_permission_denied_with_the_servers_message(server: Server) -> None:
    with pytest.raises(PermissionDenied) as info:
        GovernedDataset(server.source(grant="grant-expired"), 8)
    assert isinstance(info.value, GrantRefused)
    assert str(info.value).startswith(
        "governance refused to serve dataset 'patients' version 'head': "
        "'job j-1' may not read dataset: grant g-7 covers only other@1234 — "
    )
    assert info.value.reason == "'job j-1' may not read dataset: grant g-7 covers only other@1234"
    assert "GANTRY_DATA_GRANT" in str(info.value)


def test_refused_service_token_is_unauthenticated(server: Server) -> None:
    with pytest.raises(Unauthenticated, match="token signature is not valid"):
        server.source(token="forged").list_shards()


def test_a_view_other_than_the_grants_is_refused(server: Server) -> None:
    with pytest.raises(GrantRefused, match="the grant is for the deidentified view, not raw"):
        server.source(view="raw").list_shards()


def test_unavailable_reads_are_retried_then_reported(server: Server) -> None:
    source = server.source(retries=2, retry_backoff_s=0.01)
    source.list_shards()
    server.servicer.fail_reads = 2
    assert decode_shard(source.fetch("sha-00")).num_rows == 30
    server.servicer.fail_reads = 3
    with pytest.raises(Unavailable, match="governance is restarting"):
        source.fetch("sha-00")


def test_source_pickles_without_its_channel_and_reconnects(server: Server) -> None:
    source = server.source()
    source.list_shards()
    copy = pickle.loads(pickle.dumps(source))
    assert copy.version == VERSION and copy._channel is None
    assert decode_shard(copy.fetch("sha-02")).num_rows == 20
    assert SERVICE_TOKEN not in repr(copy) and GRANT not in repr(copy)


def test_dataset_reads_through_the_service_in_spawned_workers(server: Server) -> None:
    ds = GovernedDataset(server.source(), 8, rank=0, world_size=1, shuffle=False)
    got = ids(
        loader(ds, num_workers=2, multiprocessing_context="forkserver", persistent_workers=False)
    )
    expected = [int(i) for t in server.servicer.shards.values() for i in t.column("id").to_pylist()]
    assert sorted(got) == sorted(expected)


def test_from_env_builds_a_cached_governed_dataset(server: Server, memory_cache: Any) -> None:
    settings = DataSettings(governance_addr=server.address, token=SERVICE_TOKEN, data_grant=GRANT)
    ds = GovernedDataset.from_env(
        "patients", 16, settings=settings, cache=memory_cache, rank=0, world_size=1
    )
    assert isinstance(ds.source, CachedShardSource)
    first = ids(ds)
    reads = sum(isinstance(r, pb.ReadRequest) for r in server.servicer.requests)
    ds.set_epoch(1)
    assert sorted(ids(ds)) == sorted(first)
    assert sum(isinstance(r, pb.ReadRequest) for r in server.servicer.requests) == reads == 6
    key = next(iter(memory_cache.entries))
    assert key.startswith(f"dataload/gantry/patients/{VERSION}/deidentified/")


def test_from_env_names_what_the_environment_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GANTRY_GOVERNANCE_ADDR", "GANTRY_TOKEN", "GANTRY_DATA_GRANT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GANTRY_TOKEN", "t")
    with pytest.raises(ConfigError, match="lacks GANTRY_GOVERNANCE_ADDR, GANTRY_DATA_GRANT"):
        GovernedDataset.from_env("patients", 16)


class _Refusal(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_errors_rebuild_from_their_message_in_the_parent_process() -> None:
    # DataLoader re-raises a worker's error as type(message): it must stay the same type.
    refused = map_rpc_error(
        _Refusal(grpc.StatusCode.PERMISSION_DENIED, "grant revoked"), address="a", resource="r"
    )
    assert isinstance(type(refused)(str(refused)), GrantRefused)
    # The service's message usually carries its own hint; it is not buried under a second one.
    hinted = map_rpc_error(
        _Refusal(grpc.StatusCode.PERMISSION_DENIED, "grant expired — get a new grant"),
        address="a", resource="r",
    )  # fmt: skip
    assert str(hinted) == "governance refused to serve r: grant expired — get a new grant"
    unauth = map_rpc_error(
        _Refusal(grpc.StatusCode.UNAUTHENTICATED, "expired"), address="a", resource="r"
    )
    assert isinstance(type(unauth)(str(unauth)), Unauthenticated)


def test_a_grant_renewed_in_its_file_is_sent_from_the_next_call(
    server: Server, tmp_path: Any
) -> None:
    """The node agent rewrites the grant file when it renews a job's grant; reads use the new
    token from the next call on, and an unreadable file keeps the last token."""
    path = tmp_path / "grant"
    path.write_text("expired-grant")
    source = server.source(grant="expired-grant", grant_file=str(path))
    with pytest.raises(PermissionDenied):
        source.list_shards()
    path.write_text(GRANT + "\n")
    refs = source.list_shards()  # the renewed grant, read from the file
    assert refs and server.servicer.requests[-1].grant == GRANT
    path.unlink()
    source.fetch(refs[0].id)
    assert server.servicer.requests[-1].grant == GRANT
    source.close()
