"""What the client's tests share: a fake governance service, a way to serve any other fake
service, and a ``gantry`` command runner pointed at the fakes.

- :func:`governance`: a small in-memory governance service on a free port, to exercise the SDK
  and the CLI. It is no model of the real service's rules: it keeps what the client sends,
  checks the stream framing the protocol asks for (``start`` first, ``last=true`` at the end,
  one Arrow IPC stream per table upload) and answers in the protocol's shapes. Tokens:
  ``admin-token`` may do anything, ``viewer-token`` may not read the raw view.
- :func:`serve_fake`: a test's own fake servicer (of the workflows service, the scheduler, ...)
  on a free port, behind a bearer-token check, with every request it was sent kept in order
  (:class:`Served`), so tests can check what went over the wire.
- :func:`gantry_cli`: ``gantry ARGS`` run with typer's CliRunner, its data directory's run
  files pointing at served fakes the way the real services' do; no traceback may reach the
  user (:class:`CliResult`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pyarrow as pa
import pytest

from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc

TOKENS = {"admin-token": "admin", "viewer-token": "viewer"}


@dataclass
class StoredShard:
    id: str
    rows: int
    data: bytes  # an Arrow IPC stream (tables) or the file's bytes (files)
    path: str = ""


@dataclass
class FakeDataset:
    info: pb.Dataset
    versions: list[pb.Version] = field(default_factory=list)
    policy: pb.ViewPolicy | None = None


class FakeGovernance(pb_grpc.GovernanceServiceServicer):
    """What the fake keeps: datasets, uploads, shards, models; and what it saw on the wire."""

    def __init__(self) -> None:
        self.datasets: dict[str, FakeDataset] = {}
        self.uploads: dict[str, list[StoredShard]] = {}
        self.shards: dict[str, StoredShard] = {}
        self.models: list[tuple[pb.ModelVersion, bytes]] = []
        self.grants: list[pb.IssueGrantRequest] = []
        self.upload_messages: list[pb.UploadRequest] = []  # the last upload's messages
        self.uploaded_tables: list[pa.Table] = []
        self.upload_count = 0
        self.discarded = 0  # streams that ended without last=true
        self.inject_file_path = ""  # a path to send first in file reads (path-escape tests)
        self.break_download_after = -1  # abort a model download after this many data chunks
        self.wrong_digest = False

    # ------------------------------------------------------------------ helpers

    def _caller(self, context: grpc.ServicerContext) -> str:
        meta = dict(context.invocation_metadata())
        token = str(meta.get("authorization", "")).removeprefix("Bearer ")
        if token not in TOKENS:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        return TOKENS[token]

    def _dataset(self, name: str, context: grpc.ServicerContext) -> FakeDataset:
        self._caller(context)
        if name not in self.datasets:
            context.abort(grpc.StatusCode.NOT_FOUND, f"dataset {name!r} not found")
        return self.datasets[name]

    def _version(self, ds: FakeDataset, ref: str, context: grpc.ServicerContext) -> pb.Version:
        if not ref:
            if not ds.versions:
                context.abort(
                    grpc.StatusCode.NOT_FOUND, f"dataset {ds.info.name!r} has no versions"
                )
            return ds.versions[-1]
        found = [v for v in ds.versions if v.id.startswith(ref)]
        if len(found) != 1:
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"version {ref!r} of {ds.info.name!r} not found"
            )
        return found[0]

    # ------------------------------------------------------------------ datasets

    def CreateDataset(self, request: pb.CreateDatasetRequest, context: Any) -> pb.Dataset:
        owner = self._caller(context)
        if request.name in self.datasets:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"dataset {request.name!r} exists")
        info = pb.Dataset(
            name=request.name,
            owner=owner,
            format=request.format,
            columns=request.columns,
            description=request.description,
            created_ms=1_767_225_600_000,
        )
        self.datasets[request.name] = FakeDataset(info)
        return info

    def GetDataset(self, request: pb.GetDatasetRequest, context: Any) -> pb.Dataset:
        return self._dataset(request.name, context).info

    def ListDatasets(self, request: Any, context: Any) -> pb.ListDatasetsResponse:
        self._caller(context)
        return pb.ListDatasetsResponse(datasets=[d.info for d in self.datasets.values()])

    # ------------------------------------------------------------------ upload and commit

    def Upload(self, request_iterator: Iterator[pb.UploadRequest], context: Any) -> Any:
        self._caller(context)
        messages = list(request_iterator)
        self.upload_messages = messages
        if not messages or not messages[0].HasField("start"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be start")
        if not messages[-1].last or any(m.last for m in messages[:-1]):
            self.discarded += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stream ended without last=true")
        start = messages[0].start
        ds = self._dataset(start.dataset, context)
        self.upload_count += 1
        upload_id = f"up-{self.upload_count}"
        if start.source_format == "arrow":
            stream = b"".join(m.arrow_ipc for m in messages[1:])
            table = pa.ipc.open_stream(stream).read_all()
            declared = [c.name for c in ds.info.columns]
            if table.column_names != declared:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"columns {table.column_names} do not match the schema {declared}",
                )
            self.uploaded_tables.append(table)
            per_shard = max(1, start.shard_bytes // 100) if start.shard_bytes else table.num_rows
            shards = [
                _table_shard(table.slice(offset, per_shard))
                for offset in range(0, max(table.num_rows, 1), max(per_shard, 1))
            ]
            rows = table.num_rows
        else:
            files: dict[str, bytearray] = {}
            for m in messages[1:]:
                files.setdefault(m.file_chunk.path, bytearray()).extend(m.file_chunk.data)
            shards = [_file_shard(path, bytes(data)) for path, data in files.items()]
            rows = 0
        self.uploads[upload_id] = shards
        return pb.UploadResponse(
            upload_id=upload_id,
            rows=rows,
            bytes=sum(len(s.data) for s in shards),
            shards=len(shards),
            files=0 if start.source_format == "arrow" else len(shards),
        )

    def Commit(self, request: pb.CommitRequest, context: Any) -> pb.Version:
        author = self._caller(context)
        ds = self._dataset(request.dataset, context)
        head = ds.versions[-1] if ds.versions else None
        if request.parent and (head is None or not head.id.startswith(request.parent)):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the head moved")
        shards = list(head.shards) if head is not None and request.append else []
        for upload_id in request.upload_ids:
            if upload_id not in self.uploads:
                context.abort(grpc.StatusCode.NOT_FOUND, f"upload {upload_id!r} not found")
            for s in self.uploads.pop(upload_id):
                self.shards[s.id] = s
                shards.append(pb.Shard(id=s.id, rows=s.rows, bytes=len(s.data), path=s.path))
        return self._new_version(ds, shards, request.message, author)

    def _new_version(
        self,
        ds: FakeDataset,
        shards: list[pb.Shard],
        message: str,
        author: str,
        rollback_of: str = "",
    ) -> pb.Version:
        parents = [ds.versions[-1].id] if ds.versions else []
        manifest = "|".join([*parents, *(s.id for s in shards), message])
        version = pb.Version(
            id=hashlib.sha256(manifest.encode()).hexdigest(),
            dataset=ds.info.name,
            parents=parents,
            message=message,
            author=author,
            created_ms=1_767_225_600_000 + len(ds.versions) * 60_000,
            rows=sum(s.rows for s in shards),
            bytes=sum(s.bytes for s in shards),
            shards=shards,
            columns=ds.info.columns,
            rollback_of=rollback_of,
        )
        ds.versions.append(version)
        ds.info.head = version.id
        ds.info.versions = len(ds.versions)
        return version

    def Log(self, request: pb.LogRequest, context: Any) -> pb.LogResponse:
        ds = self._dataset(request.dataset, context)
        newest = list(reversed(ds.versions))
        return pb.LogResponse(versions=newest[: request.limit] if request.limit else newest)

    def GetVersion(self, request: pb.GetVersionRequest, context: Any) -> pb.Version:
        ds = self._dataset(request.dataset, context)
        return self._version(ds, request.version, context)

    def Diff(self, request: pb.DiffRequest, context: Any) -> pb.DiffResponse:
        ds = self._dataset(request.dataset, context)
        a = self._version(ds, request.from_version, context)
        b = self._version(ds, request.to_version, context)
        a_ids, b_ids = {s.id for s in a.shards}, {s.id for s in b.shards}
        added = [s for s in b.shards if s.id not in a_ids]
        removed = [s for s in a.shards if s.id not in b_ids]
        return pb.DiffResponse(
            from_version=a.id,
            to_version=b.id,
            added=added,
            removed=removed,
            rows_added=sum(s.rows for s in added),
            rows_removed=sum(s.rows for s in removed),
        )

    def Rollback(self, request: pb.RollbackRequest, context: Any) -> pb.Version:
        author = self._caller(context)
        ds = self._dataset(request.dataset, context)
        target = self._version(ds, request.to_version, context)
        return self._new_version(ds, list(target.shards), request.message, author, target.id)

    # ------------------------------------------------------------------ reading

    def Read(self, request: pb.ReadRequest, context: Any) -> Iterator[pb.ReadResponse]:
        caller = self._caller(context)
        ds = self._dataset(request.dataset, context)
        if request.view == "raw" and caller != "admin":
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"'{caller}' may not read_raw dataset/{ds.info.name}: no role grants it",
            )
        version = self._version(ds, request.version, context)
        if self.inject_file_path:
            yield pb.ReadResponse(
                shard="evil", file_chunk=pb.FileChunk(path=self.inject_file_path, data=b"x")
            )
        pii = [c.name for c in ds.info.columns if c.classification == "pii"]
        for s in version.shards:
            if request.shards and s.id not in request.shards:
                continue
            stored = self.shards[s.id]
            if ds.info.format == "files":
                for i in range(0, max(len(stored.data), 1), 4):
                    chunk = pb.FileChunk(path=stored.path, data=stored.data[i : i + 4])
                    yield pb.ReadResponse(shard=s.id, file_chunk=chunk)
                continue
            table = pa.ipc.open_stream(stored.data).read_all()
            if request.view == "deidentified":
                for name in pii:
                    hashed = [
                        None if v is None else hashlib.sha256(str(v).encode()).hexdigest()[:16]
                        for v in table.column(name).to_pylist()
                    ]
                    index = table.column_names.index(name)
                    table = table.set_column(index, name, pa.array(hashed, pa.string()))
            for offset in range(0, max(table.num_rows, 1), 40):  # big shards come in parts
                part = table.slice(offset, 40)
                yield pb.ReadResponse(shard=s.id, arrow_ipc=_ipc(part), rows=part.num_rows)

    def ListShards(self, request: pb.ListShardsRequest, context: Any) -> pb.ListShardsResponse:
        ds = self._dataset(request.dataset, context)
        version = self._version(ds, request.version, context)
        return pb.ListShardsResponse(
            version=version.id, view="deidentified", shards=version.shards, columns=version.columns
        )

    # ------------------------------------------------------------------ views, grants, lineage

    def SetViewPolicy(self, request: pb.SetViewPolicyRequest, context: Any) -> pb.ViewPolicy:
        author = self._caller(context)
        ds = self._dataset(request.dataset, context)
        version = (ds.policy.version if ds.policy else 0) + 1
        ds.policy = pb.ViewPolicy(
            dataset=ds.info.name, version=version, rules=request.rules, author=author,
            created_ms=1_767_225_600_000,
        )  # fmt: skip
        ds.info.policy_version = version
        return ds.policy

    def GetViewPolicy(self, request: pb.GetViewPolicyRequest, context: Any) -> pb.ViewPolicy:
        ds = self._dataset(request.dataset, context)
        return ds.policy or pb.ViewPolicy(dataset=ds.info.name)

    def IssueGrant(self, request: pb.IssueGrantRequest, context: Any) -> pb.Grant:
        issuer = self._caller(context)
        self.grants.append(request)
        return pb.Grant(
            id=f"grant-{len(self.grants)}",
            token=f"secret-grant-token-{len(self.grants)}",
            job_id=request.job_id,
            versions=request.versions,
            view=request.view,
            expires_ms=1_767_225_600_000 + request.ttl_s * 1000,
            issued_by=issuer,
        )

    def GetLineage(self, request: pb.LineageRequest, context: Any) -> pb.LineageResponse:
        self._caller(context)
        edges = []
        for grant in self.grants:
            for v in grant.versions:
                edge = pb.LineageEdge(
                    from_kind="dataset_version", from_id=f"{v.dataset}@{v.version}",
                    to_kind="job", to_id=grant.job_id, time_ms=1_767_225_600_000,
                )  # fmt: skip
                if (request.job_id and request.job_id == grant.job_id) or (
                    request.dataset == v.dataset and v.version.startswith(request.version)
                ):
                    edges.append(edge)
        return pb.LineageResponse(edges=edges)

    # ------------------------------------------------------------------ models

    def RegisterModel(self, request_iterator: Iterator[Any], context: Any) -> pb.ModelVersion:
        caller = self._caller(context)
        messages = list(request_iterator)
        if not messages or not messages[0].HasField("start") or not messages[-1].last:
            self.discarded += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad model stream framing")
        start = messages[0].start
        data = b"".join(m.data for m in messages[1:])
        version = 1 + sum(1 for m, _ in self.models if m.name == start.name)
        digest = hashlib.sha256(data).hexdigest()
        model = pb.ModelVersion(
            name=start.name, version=version,
            digest=("0" * 64) if self.wrong_digest else digest,
            bytes=len(data), framework=start.framework, job_id=start.job_id,
            metrics=start.metrics, signature_json=start.signature_json, registered_by=caller,
            created_ms=1_767_225_600_000, trained_on=start.trained_on,
            description=start.description, code_version=start.code_version,
        )  # fmt: skip
        self.models.append((model, data))
        return model

    def _model(self, request: pb.GetModelRequest, context: Any) -> tuple[pb.ModelVersion, bytes]:
        self._caller(context)
        found = [
            (m, d) for m, d in self.models
            if m.name == request.name and request.version in (0, m.version)
        ]  # fmt: skip
        if not found:
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.name!r} not found")
        return found[-1]

    def ListModels(self, request: pb.ListModelsRequest, context: Any) -> pb.ListModelsResponse:
        self._caller(context)
        found = [m for m, _ in self.models if request.name in ("", m.name)]
        return pb.ListModelsResponse(versions=found)

    def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.ModelVersion:
        return self._model(request, context)[0]

    def DownloadModel(self, request: pb.GetModelRequest, context: Any) -> Iterator[Any]:
        model, data = self._model(request, context)
        info = pb.ModelVersion()
        info.CopyFrom(model)
        if self.wrong_digest:
            info.digest = "f" * 64
        yield pb.DownloadModelResponse(info=info)
        for n, offset in enumerate(range(0, len(data), 1 << 20)):
            if n == self.break_download_after:
                context.abort(grpc.StatusCode.DATA_LOSS, "object store returned a short read")
            yield pb.DownloadModelResponse(data=data[offset : offset + (1 << 20)])


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _table_shard(table: pa.Table) -> StoredShard:
    data = _ipc(table)
    return StoredShard(hashlib.sha256(data).hexdigest(), table.num_rows, data)


def _file_shard(path: str, data: bytes) -> StoredShard:
    return StoredShard(hashlib.sha256(path.encode() + data).hexdigest(), 0, data, path)


@dataclass
class RunningFake:
    address: str
    service: FakeGovernance


@pytest.fixture
def governance() -> Iterator[RunningFake]:
    """A fresh fake governance service on a free local port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service = FakeGovernance()
    pb_grpc.add_GovernanceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield RunningFake(f"127.0.0.1:{port}", service)
    server.stop(None).wait()


# ---------------------------------------------------------------------- any fake service

_M = TypeVar("_M")


@dataclass
class Served:
    """A fake servicer on a free local port, and the requests it was sent, in order (those
    that got past its bearer check)."""

    service: Any
    port: int = 0
    requests: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def last(self, kind: type[_M]) -> _M:
        """The last request of type ``kind``."""
        return next(r for r in reversed(self.requests) if isinstance(r, kind))


class _Doorman(grpc.ServerInterceptor):
    """Refuses calls without ``Bearer <token>`` (when there is a token) and keeps the request
    of every other call; methods with a streamed request pass unchecked."""

    def __init__(self, served: Served, token: str | None) -> None:
        self.served = served
        self.token = token
        self.lock = threading.Lock()

    def admit(self, request: Any, context: grpc.ServicerContext) -> None:
        bearer = dict(context.invocation_metadata()).get("authorization")
        if self.token is not None and bearer != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        with self.lock:
            self.served.requests.append(request)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        wire = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            answer = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                self.admit(request, context)
                return answer(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **wire)
        answers = handler.unary_stream

        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            self.admit(request, context)
            yield from answers(request, context)

        return grpc.unary_stream_rpc_method_handler(stream, **wire)


ServeFake = Callable[..., Served]


@pytest.fixture
def serve_fake() -> Iterator[ServeFake]:
    """``serve_fake(servicer, add_to_server, token=None)``: serve a fake on a free local port
    until the test ends. With ``token``, a call without ``Bearer <token>`` is refused
    (UNAUTHENTICATED, "unknown token"); the others' requests are kept in
    :attr:`Served.requests`."""
    servers: list[grpc.Server] = []

    def serve(
        service: Any, add: Callable[[Any, grpc.Server], None], *, token: str | None = None
    ) -> Served:
        served = Served(service)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), interceptors=[_Doorman(served, token)]
        )
        add(service, server)
        served.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return served

    yield serve
    for server in servers:
        server.stop(None).wait()


# ---------------------------------------------------------------------- the gantry command


@dataclass
class CliResult:
    """What a ``gantry`` command did: its exit status, stdout and stderr."""

    code: int
    out: str
    err: str

    def cells(self, first: str) -> list[str]:
        """The cells of the table row on stdout whose first cell is ``first``."""
        for line in self.out.splitlines():
            cells = [c.strip() for c in line.split("│")[1:-1]]
            if cells and cells[0] == first:
                return cells
        raise AssertionError(f"no row {first!r} in:\n{self.out}")

    def fields(self) -> dict[str, str]:
        """The ``label  value`` lines of a grid on stdout, by label."""
        found = {}
        for line in self.out.splitlines():
            label, sep, value = line.partition("  ")
            if sep and label and not label.startswith(" ") and "│" not in line:
                found[label] = value.strip()
        return found


Gantry = Callable[..., CliResult]


@pytest.fixture
def gantry_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Gantry]:
    """``gantry_cli(token, workflows=served, ...)``: a function running ``gantry ARGS`` with
    typer's CliRunner, whose data directory (``tmp_path``) has a run file for each fake named
    (found there like the real services), with ``token`` as ``GANTRY_TOKEN``. A traceback that
    reaches the user fails the test; an unexpected exception is raised."""
    from typer.testing import CliRunner

    from gantry.client import cli
    from gantry.core.runfile import write_run_file

    def make(token: str, **services: Served) -> Gantry:
        for name, served in services.items():
            write_run_file(tmp_path, name, host="127.0.0.1", grpc_port=served.port, metrics_port=0)
            monkeypatch.delenv(f"GANTRY_{name.upper()}_ADDR", raising=False)
        monkeypatch.setenv("GANTRY_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("GANTRY_TOKEN", token)
        monkeypatch.setenv("COLUMNS", "250")
        runner = CliRunner()

        def run(*args: str | Path) -> CliResult:
            result = runner.invoke(cli.app, [str(a) for a in args])
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            assert "Traceback" not in result.output
            return CliResult(result.exit_code, result.stdout, result.stderr)

        return run

    return make
