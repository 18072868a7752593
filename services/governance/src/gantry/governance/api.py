"""The governance gRPC API (handler): datasets, uploads, versions, reads, views, grants, models,
data subjects.

Every method is mapped to an RBAC action in :data:`METHOD_RULES` (the interceptor checks it);
what depends on the request — the view, the grant — is checked here through
:class:`~gantry.governance.access.Access`. Blocking work (encryption, Parquet, the database)
runs in worker threads so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from gantry.core import GantryError, InvalidInput, PermissionDenied, get_logger
from gantry.governance.access import Access
from gantry.governance.catalog import Catalog
from gantry.governance.deid import rules_from_pb
from gantry.governance.erasures import Erasures
from gantry.governance.findings import SubjectFinder
from gantry.governance.grants import Grants
from gantry.governance.lineage import Lineage, model_node, model_nodes
from gantry.governance.maintenance import Maintenance
from gantry.governance.messages import (
    dataset_pb,
    diff_pb,
    edge_pb,
    erasure_pb,
    findings_pb,
    grant_pb,
    model_pb,
    policy_pb,
    shard_pb,
    version_pb,
)
from gantry.governance.registry import ModelMeta, Registry
from gantry.governance.schema import columns_from_pb, columns_to_pb
from gantry.governance.tables import ipc_to_table, table_to_ipc
from gantry.governance.uploads import FileUpload, TableUpload, Uploads
from gantry.governance.views import Views
from gantry.protos.v1 import governance_pb2 as pb
from gantry.protos.v1 import governance_pb2_grpc as pb_grpc
from gantry.security import MethodRule, Principal, current_principal
from gantry.security.rpc_errors import abort_with, rpc_errors, stream_rpc_errors

SERVICE = "gantry.governance.v1.GovernanceService"
_log = get_logger("gantry.governance.api")


def _rule(action: str, kind: str) -> MethodRule:
    return MethodRule(action, kind)


#: What each method means to the RBAC policy (methods not listed are denied). Reads are gated
#: on ``list dataset`` here and decided per view (or per grant) in the handler; RegisterModel
#: is gated on ``list model`` and decided in the handler: ``register model`` for a user, for a
#: service the owner of the scheduled job it registers for. Upload and Commit likewise: gated
#: on ``list dataset``, decided in the handler as ``update dataset`` for a user, or for the
#: owner of the scheduled job a service writes the job's output for. DownloadModel by a
#: service for a job is decided in the handler too, for the job's owner.
METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/{name}": rule
    for name, rule in {
        "CreateDataset": _rule("create", "dataset"),
        "GetDataset": _rule("list", "dataset"),
        "ListDatasets": _rule("list", "dataset"),
        "Upload": _rule("list", "dataset"),
        "Commit": _rule("list", "dataset"),
        "Log": _rule("list", "dataset"),
        "GetVersion": _rule("list", "dataset"),
        "Diff": _rule("list", "dataset"),
        "Rollback": _rule("update", "dataset"),
        "Read": _rule("list", "dataset"),
        "ListShards": _rule("list", "dataset"),
        "SetViewPolicy": _rule("update", "dataset"),
        "GetViewPolicy": _rule("list", "dataset"),
        "IssueGrant": _rule("create", "grant"),
        "RevokeGrant": _rule("revoke", "grant"),
        "ListGrants": _rule("list", "grant"),
        "GetLineage": _rule("list", "dataset"),
        "RegisterModel": _rule("list", "model"),
        "ListModels": _rule("list", "model"),
        "GetModel": _rule("list", "model"),
        "DownloadModel": _rule("read", "model"),
        "RotateKeys": _rule("rotate", "key"),
        "CollectGarbage": _rule("delete", "dataset"),
        "FindSubject": _rule("query", "subject"),
        "EraseSubject": _rule("erase", "subject"),
        "ListErasures": _rule("list", "subject"),
    }.items()
}

#: Largest Arrow IPC message one ReadResponse carries; bigger shards go in row slices.
READ_MESSAGE_BYTES = 8 << 20
_FILE_CHUNK = 1 << 20


def _correlation(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "x-correlation-id" and isinstance(value, str) and value:
            return value[:128]
    return None


@dataclass
class Domain:
    """Everything the API works with."""

    catalog: Catalog
    uploads: Uploads
    views: Views
    grants: Grants
    lineage: Lineage
    registry: Registry
    maintenance: Maintenance
    access: Access
    subjects: SubjectFinder
    erasures: Erasures
    shard_bytes: int
    max_shard_bytes: int


def _slices(data: bytes, rows: int) -> list[tuple[bytes, int]]:
    """One Arrow IPC stream, split into row slices that fit a message."""
    if len(data) <= READ_MESSAGE_BYTES or rows <= 1:
        return [(data, rows)]
    table = ipc_to_table(data)
    parts = -(-len(data) // READ_MESSAGE_BYTES)
    step = -(-rows // parts)
    return [
        (table_to_ipc(table.slice(start, step)), min(step, rows - start))
        for start in range(0, rows, step)
    ]


class GovernanceApi(pb_grpc.GovernanceServiceServicer):  # type: ignore[misc]
    """The servicer."""

    def __init__(self, domain: Domain) -> None:
        self.d = domain

    # ------------------------------------------------------------------ datasets

    @rpc_errors
    async def CreateDataset(self, request: pb.CreateDatasetRequest, context: Any) -> pb.Dataset:
        """Register a dataset with its schema and column classifications."""
        principal = current_principal()
        columns = columns_from_pb(request.columns)
        ds = await asyncio.to_thread(
            self.d.catalog.create_dataset,
            request.name,
            request.format or "table",
            columns,
            owner=principal.subject,
            description=request.description,
            correlation_id=_correlation(context),
        )
        await asyncio.to_thread(self.d.views.keys, ds.name)
        return dataset_pb(ds)

    @rpc_errors
    async def GetDataset(self, request: pb.GetDatasetRequest, context: Any) -> pb.Dataset:
        """One dataset."""
        return dataset_pb(await asyncio.to_thread(self.d.catalog.get_dataset, request.name))

    @rpc_errors
    async def ListDatasets(
        self, request: pb.ListDatasetsRequest, context: Any
    ) -> pb.ListDatasetsResponse:
        """Every dataset."""
        found = await asyncio.to_thread(self.d.catalog.list_datasets)
        return pb.ListDatasetsResponse(datasets=[dataset_pb(d) for d in found])

    # ------------------------------------------------------------------ upload and commit

    async def Upload(
        self, request_iterator: AsyncIterator[pb.UploadRequest], context: grpc.aio.ServicerContext
    ) -> pb.UploadResponse:
        """Receive a stream of rows or files into a new upload (committable once finished)."""
        principal = current_principal()
        upload: TableUpload | FileUpload | None = None
        finished = False
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None or first.WhichOneof("part") != "start":
                raise InvalidInput(
                    "an upload stream must start with an UploadStart message",
                    hint="use the SDK's DataClient.upload_table / upload_files",
                )
            start = first.start
            shard_bytes = start.shard_bytes or self.d.shard_bytes
            if not 64 << 10 <= shard_bytes <= self.d.max_shard_bytes:
                raise InvalidInput(
                    f"shard size {shard_bytes} bytes is out of range",
                    hint=f"use 64 KiB .. {self.d.max_shard_bytes >> 20} MiB",
                )
            writer, _job = await asyncio.to_thread(
                self.d.access.dataset_writer, principal, start.dataset, start.job_id,
                method=f"/{SERVICE}/Upload",
            )  # fmt: skip
            upload = await asyncio.to_thread(
                self.d.uploads.begin, start.dataset, writer, start.source_format, shard_bytes
            )
            last = first.last
            async for message in request_iterator:
                if last:
                    raise InvalidInput("the upload continued after its last message")
                part = message.WhichOneof("part")
                if part == "arrow_ipc" and not isinstance(upload, FileUpload):
                    await asyncio.to_thread(upload.feed, message.arrow_ipc)
                elif part == "file_chunk" and isinstance(upload, FileUpload):
                    chunk = message.file_chunk
                    await asyncio.to_thread(upload.feed, chunk.path, chunk.data)
                elif part is not None:
                    raise InvalidInput(
                        f"an upload to this dataset cannot carry {part}",
                        hint="send arrow_ipc to table datasets and file_chunk to files datasets",
                    )
                last = message.last
            if not last:
                raise InvalidInput(
                    "the upload stream ended without its last message, so it was discarded",
                    hint="the client was probably interrupted; upload again",
                )
            totals = await asyncio.to_thread(upload.finish)
            finished = True
            _log.info(
                "upload finished",
                dataset=start.dataset,
                upload=totals.upload_id,
                rows=totals.rows,
                shards=totals.shards,
                rows_erased=totals.rows_erased,
            )
            return pb.UploadResponse(
                upload_id=totals.upload_id,
                rows=totals.rows,
                bytes=totals.bytes,
                shards=totals.shards,
                files=totals.files,
                rows_erased=totals.rows_erased,
            )
        except GantryError as exc:
            await self._discard(upload)  # before the caller hears of the failure
            upload = None
            await abort_with(context, exc)
            raise
        finally:
            if not finished:
                await self._discard(upload)

    async def _discard(self, upload: TableUpload | FileUpload | None) -> None:
        if upload is None:
            return
        if isinstance(upload, FileUpload):
            await asyncio.to_thread(upload.abort)
        await asyncio.to_thread(self.d.uploads.abort, upload.totals.upload_id)

    @rpc_errors
    async def Commit(self, request: pb.CommitRequest, context: Any) -> pb.Version:
        """Make finished uploads a new immutable version.

        A user commits as themself; a service only a scheduled job's output, as the job's
        owner (see :meth:`Access.dataset_writer`): the message then names the job, and lineage
        links the versions the job's grant covered to the job and the job to the new version.
        """
        principal = current_principal()
        author, job = await asyncio.to_thread(
            self.d.access.dataset_writer, principal, request.dataset, request.job_id,
            method=f"/{SERVICE}/Commit",
        )  # fmt: skip
        message = request.message
        inputs: list[tuple[str, str]] = []
        if job is not None:
            if job.job_id not in message:
                message = f"{message.strip() or 'output'} (job {job.job_id})"
            inputs = await asyncio.to_thread(self._job_inputs, job.job_id)
        version = await asyncio.to_thread(
            functools.partial(
                self.d.catalog.commit,
                request.dataset,
                list(request.upload_ids),
                author=author,
                message=message,
                parent=request.parent,
                append=request.append,
                correlation_id=_correlation(context),
                produced_by=job.job_id if job is not None else "",
                inputs=inputs,
            )
        )
        return version_pb(version)

    def _job_inputs(self, job_id: str) -> list[tuple[str, str]]:
        """The dataset versions (full ids) the job's latest grant covered: what it read."""
        grants = self.d.grants.list(job_id, include_expired=True)
        if not grants:
            return []
        latest = max(grants, key=lambda g: g.created_ms)
        return list(latest.versions)

    @rpc_errors
    async def Log(self, request: pb.LogRequest, context: Any) -> pb.LogResponse:
        """Newest versions first."""
        found = await asyncio.to_thread(self.d.catalog.log, request.dataset, request.limit or 50)
        return pb.LogResponse(versions=[version_pb(v, with_shards=False) for v in found])

    @rpc_errors
    async def GetVersion(self, request: pb.GetVersionRequest, context: Any) -> pb.Version:
        """One version with its shards."""
        v = await asyncio.to_thread(self.d.catalog.get_version, request.dataset, request.version)
        return version_pb(v)

    @rpc_errors
    async def Diff(self, request: pb.DiffRequest, context: Any) -> pb.DiffResponse:
        """What changed between two versions."""
        a, b, d = await asyncio.to_thread(
            self.d.catalog.diff, request.dataset, request.from_version, request.to_version
        )
        return diff_pb(a, b, d)

    @rpc_errors
    async def Rollback(self, request: pb.RollbackRequest, context: Any) -> pb.Version:
        """A new version with an older one's content."""
        principal = current_principal()
        v = await asyncio.to_thread(
            self.d.catalog.rollback,
            request.dataset,
            request.to_version,
            author=principal.subject,
            message=request.message,
            correlation_id=_correlation(context),
        )
        return version_pb(v)

    # ------------------------------------------------------------------ reads

    async def _permit(
        self, principal: Principal, dataset: str, ref: str, view: str, grant: str, method: str,
        purpose: str, context: Any,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        ds = await asyncio.to_thread(self.d.catalog.get_dataset, dataset)
        version = await asyncio.to_thread(self.d.catalog.get_version, dataset, ref)
        view = view or "deidentified"
        try:
            permit = await asyncio.to_thread(
                self.d.access.permit_read, principal, dataset, version.id, view, grant,
                method=method,
            )  # fmt: skip
            self.d.views.check_files_view(ds, view)
        except (PermissionDenied, InvalidInput) as exc:
            if isinstance(exc, PermissionDenied) or grant:
                await asyncio.to_thread(
                    self.d.access.record_read, principal, dataset, version.id, view,
                    allowed=False, reason=str(exc), purpose=purpose,
                    correlation_id=_correlation(context),
                )  # fmt: skip
            raise
        return ds, version, permit

    @stream_rpc_errors
    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        """Stream a version's shards in the allowed view; the read is audited."""
        principal = current_principal()
        ds, version, permit = await self._permit(
            principal, request.dataset, request.version, request.view, request.grant,
            f"/{SERVICE}/Read", request.purpose, context,
        )  # fmt: skip
        shards = list(version.manifest.shards)
        if request.shards:
            wanted = set(request.shards)
            unknown = wanted - {s.id for s in shards}
            if unknown:
                raise InvalidInput(
                    f"version {version.id[:12]} has no shard {sorted(unknown)[0]}",
                    hint="list the version's shards with ListShards",
                )
            shards = [s for s in shards if s.id in wanted]
        rows = 0
        policy_version = 0
        served: list[str] = []
        try:
            for shard in shards:
                if ds.format == "table":
                    data, n, policy_version = await asyncio.to_thread(
                        self.d.views.table_shard, ds, version.manifest, shard, permit.view
                    )
                    for part, part_rows in await asyncio.to_thread(_slices, data, n):
                        yield pb.ReadResponse(shard=shard.id, arrow_ipc=part, rows=part_rows)
                    rows += n
                else:
                    chunks = self.d.views.file_chunks(shard)
                    while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                        yield pb.ReadResponse(
                            shard=shard.id, file_chunk=pb.FileChunk(path=shard.path, data=chunk)
                        )
                    rows += 1
                served.append(shard.id)
        finally:
            await asyncio.to_thread(
                self.d.access.record_read, principal, ds.name, version.id, permit.view,
                shards=served, rows=rows, allowed=True, purpose=request.purpose, permit=permit,
                policy_version=policy_version, correlation_id=_correlation(context),
            )  # fmt: skip

    @rpc_errors
    async def ListShards(
        self, request: pb.ListShardsRequest, context: Any
    ) -> pb.ListShardsResponse:
        """A version's shards and the columns the caller's view shows (for loaders)."""
        principal = current_principal()
        view = "deidentified"
        if request.grant:
            grant = await asyncio.to_thread(self.d.grants.lookup, request.grant)
            view = grant.view
        ds, version, permit = await self._permit(
            principal, request.dataset, request.version, view, request.grant,
            f"/{SERVICE}/ListShards", "list shards", context,
        )  # fmt: skip
        columns = await asyncio.to_thread(self.d.views.columns, ds, version.manifest, permit.view)
        policy_version = 0
        if permit.view != "raw" and ds.format == "table":
            policy_version = (await asyncio.to_thread(self.d.views.policy, ds.name)).version
        return pb.ListShardsResponse(
            version=version.id,
            view=permit.view,
            policy_version=policy_version,
            shards=[shard_pb(s) for s in version.manifest.shards],
            columns=columns_to_pb(columns) if ds.format == "table" else [],
        )

    # ------------------------------------------------------------------ views

    @rpc_errors
    async def SetViewPolicy(self, request: pb.SetViewPolicyRequest, context: Any) -> pb.ViewPolicy:
        """Store a new version of a dataset's de-identification policy."""
        principal = current_principal()
        rules = rules_from_pb(request.rules)
        record = await asyncio.to_thread(
            self.d.views.set_policy, request.dataset, rules, author=principal.subject,
            correlation_id=_correlation(context),
        )  # fmt: skip
        return policy_pb(record)

    @rpc_errors
    async def GetViewPolicy(self, request: pb.GetViewPolicyRequest, context: Any) -> pb.ViewPolicy:
        """The current policy."""
        return policy_pb(await asyncio.to_thread(self.d.views.policy, request.dataset))

    # ------------------------------------------------------------------ grants and lineage

    @rpc_errors
    async def IssueGrant(self, request: pb.IssueGrantRequest, context: Any) -> pb.Grant:
        """A job's read grant: services get what the scheduler placed; stewards name versions."""
        principal = current_principal()
        versions = [(v.dataset, v.version) for v in request.versions]
        view = request.view
        if principal.kind == "service":
            job = await asyncio.to_thread(self.d.grants.scheduled_job, request.job_id)
            if not job.datasets:
                raise InvalidInput(f"job {job.job_id} reads no datasets, so it needs no grant")
            views = {v for _, _, v in job.datasets}
            if len(views) != 1:
                raise InvalidInput(
                    f"job {job.job_id} asks for several views ({', '.join(sorted(views))})",
                    hint="a job reads all its datasets in one view",
                )
            view = views.pop()
            for dataset, _version, _view in job.datasets:
                owner = Principal(job.owner, job.owner_roles, "", principal.expires_at)
                self.d.access.check(
                    owner, "read", "dataset", dataset, {"view": view},
                    method=f"/{SERVICE}/IssueGrant",
                )  # fmt: skip
            versions = [(d, v) for d, v, _ in job.datasets]
        else:
            for dataset, _version in versions:
                self.d.access.check(
                    principal, "grant", "dataset", dataset, {"view": view},
                    method=f"/{SERVICE}/IssueGrant",
                )  # fmt: skip
        grant, token = await asyncio.to_thread(
            self.d.grants.issue, request.job_id, versions, view, issued_by=principal.subject,
            ttl_s=request.ttl_s, correlation_id=_correlation(context),
        )  # fmt: skip
        return grant_pb(grant, token)

    @rpc_errors
    async def RevokeGrant(self, request: pb.RevokeGrantRequest, context: Any) -> pb.Grant:
        """Revoke a grant before it expires."""
        principal = current_principal()
        grant = await asyncio.to_thread(
            functools.partial(
                self.d.grants.revoke,
                request.grant_id,
                actor=principal.subject,
                reason=request.reason,
                correlation_id=_correlation(context),
            )
        )
        return grant_pb(grant)

    @rpc_errors
    async def ListGrants(
        self, request: pb.ListGrantsRequest, context: Any
    ) -> pb.ListGrantsResponse:
        """Grants, without their tokens."""
        found = await asyncio.to_thread(
            functools.partial(
                self.d.grants.list, request.job_id, include_expired=request.include_expired
            )
        )
        return pb.ListGrantsResponse(grants=[grant_pb(g) for g in found])

    @rpc_errors
    async def GetLineage(self, request: pb.LineageRequest, context: Any) -> pb.LineageResponse:
        """Lineage around a dataset version, a job or a model version, with those model versions."""
        version = request.version
        if request.dataset and version:
            version = (
                await asyncio.to_thread(self.d.catalog.get_version, request.dataset, version)
            ).id
        model_version = 0
        if request.model_version:
            try:
                model_version = int(request.model_version)
            except ValueError:
                raise InvalidInput(
                    f"model version {request.model_version!r} is not a number"
                ) from None
        edges = await asyncio.to_thread(
            functools.partial(
                self.d.lineage.query,
                dataset=request.dataset, version=version, job_id=request.job_id,
                model=request.model, model_version=model_version,
            )
        )  # fmt: skip
        nodes = [model_node(request.model, model_version)] if request.model else []
        nodes += model_nodes(edges)
        if not self.d.access.may(current_principal(), "list", "model"):
            nodes = []  # the edges name the models; their metadata is for who may list models
        models = await asyncio.to_thread(self.d.registry.versions, nodes)
        return pb.LineageResponse(
            edges=[edge_pb(e) for e in edges], models=[model_pb(m) for m in models]
        )

    # ------------------------------------------------------------------ models

    async def RegisterModel(
        self,
        request_iterator: AsyncIterator[pb.RegisterModelRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.ModelVersion:
        """Stream a model artifact in and register it as the model's next version.

        A user registers as themself; a service only for a scheduled job, as the job's owner
        (see :meth:`Access.model_registrant`).
        """
        principal = current_principal()
        upload: Any = None
        done = False
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None or first.WhichOneof("part") != "start":
                raise InvalidInput("a model upload must start with a ModelStart message")
            s = first.start
            registrant, job = await asyncio.to_thread(
                self.d.access.model_registrant, principal, s.name, s.job_id,
                method=f"/{SERVICE}/RegisterModel",
            )  # fmt: skip
            trained_on = []
            for v in s.trained_on:
                found = await asyncio.to_thread(self.d.catalog.get_version, v.dataset, v.version)
                trained_on.append((v.dataset, found.id))
            if job is not None:
                await asyncio.to_thread(self.d.access.check_trained_on, job, trained_on)
            meta = ModelMeta(
                name=s.name,
                framework=s.framework,
                job_id=s.job_id,
                metrics=dict(s.metrics),
                signature_json=s.signature_json,
                description=s.description,
                trained_on=trained_on,
                code_version=s.code_version,
            )
            upload = await asyncio.to_thread(
                self.d.registry.begin, meta, registrant, actor=principal.subject
            )
            last = first.last
            async for message in request_iterator:
                if last:
                    raise InvalidInput("the model upload continued after its last message")
                if message.WhichOneof("part") == "data":
                    await asyncio.to_thread(upload.write, message.data)
                last = message.last
            if not last:
                raise InvalidInput(
                    "the model upload ended without its last message, so it was discarded",
                    hint="the client was probably interrupted; register again",
                )
            record = await asyncio.to_thread(upload.finish, _correlation(context))
            done = True
            return model_pb(record)
        except GantryError as exc:
            if upload is not None:
                await asyncio.to_thread(upload.abort)
                upload = None
            await abort_with(context, exc)
            raise
        finally:
            if upload is not None and not done:
                await asyncio.to_thread(upload.abort)

    @rpc_errors
    async def ListModels(
        self, request: pb.ListModelsRequest, context: Any
    ) -> pb.ListModelsResponse:
        """Model versions."""
        found = await asyncio.to_thread(self.d.registry.list, request.name)
        return pb.ListModelsResponse(versions=[model_pb(m) for m in found])

    @rpc_errors
    async def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.ModelVersion:
        """One model version (latest when version is 0)."""
        return model_pb(await asyncio.to_thread(self.d.registry.get, request.name, request.version))

    @stream_rpc_errors
    async def DownloadModel(
        self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DownloadModelResponse]:
        """Stream a model version's artifact (decrypted and verified).

        A service naming a job downloads only the version the job's ``spec.model`` names, and
        only when the job's owner may read models (:meth:`Access.model_reader`)."""
        record = await asyncio.to_thread(self.d.registry.get, request.name, request.version)
        await asyncio.to_thread(
            self.d.access.model_reader, current_principal(), record.name, record.version,
            request.job_id, method=f"/{SERVICE}/DownloadModel",
        )  # fmt: skip
        reader = await asyncio.to_thread(self.d.registry.open, record)
        yield pb.DownloadModelResponse(info=model_pb(record))
        with reader:
            iterator = iter(reader)
            while (chunk := await asyncio.to_thread(next, iterator, None)) is not None:
                for start in range(0, len(chunk), _FILE_CHUNK):
                    yield pb.DownloadModelResponse(data=chunk[start : start + _FILE_CHUNK])

    # ------------------------------------------------------------------ operations

    @rpc_errors
    async def RotateKeys(
        self, request: pb.RotateKeysRequest, context: Any
    ) -> pb.RotateKeysResponse:
        """Rotate the storage key-encryption key and re-wrap every data key."""
        principal = current_principal()
        report = await asyncio.to_thread(
            functools.partial(
                self.d.maintenance.rotate_keys,
                actor=principal.subject,
                retire_previous=request.retire_previous,
            )
        )
        return pb.RotateKeysResponse(
            active_version=report.active_version,
            rewrapped=report.rewrapped,
            retired=list(report.retired),
        )

    @rpc_errors
    async def CollectGarbage(
        self, request: pb.CollectGarbageRequest, context: Any
    ) -> pb.CollectGarbageResponse:
        """Remove content nothing references."""
        principal = current_principal()
        report = await asyncio.to_thread(
            functools.partial(
                self.d.maintenance.collect_garbage, actor=principal.subject, dry_run=request.dry_run
            )
        )
        return pb.CollectGarbageResponse(
            removed_objects=report.removed_objects,
            removed_bytes=report.removed_bytes,
            kept_objects=report.kept_objects,
        )

    # ------------------------------------------------------------------ data subjects

    @rpc_errors
    async def FindSubject(self, request: pb.FindSubjectRequest, context: Any) -> pb.SubjectFindings:
        """Every version holding an identifier, the jobs and models linked to them, and the
        erasures made for the subject (the identifier is neither stored nor logged)."""
        found = await asyncio.to_thread(self.d.subjects.find, request.identifier)
        _log.info(
            "subject searched",
            subject_ref=found.subject_ref,
            versions=len(found.versions),
            by=current_principal().subject,
        )
        return findings_pb(found)

    @rpc_errors
    async def EraseSubject(self, request: pb.EraseSubjectRequest, context: Any) -> pb.Erasure:
        """Commit new versions of the datasets whose head holds the subject, without their
        rows; name the models to retrain (``dry_run``: report it, change nothing)."""
        principal = current_principal()
        erasure = await asyncio.to_thread(
            functools.partial(
                self.d.erasures.erase,
                request.identifier,
                request.reason,
                requested_by=principal.subject,
                dry_run=request.dry_run,
                correlation_id=_correlation(context),
            )
        )
        _log.info(
            "subject erased" if not request.dry_run else "subject erasure planned",
            erasure=erasure.erasure_id,
            subject_ref=erasure.subject_ref,
            versions=len(erasure.new_versions),
            rows=sum(erasure.rows_removed),
            by=principal.subject,
        )
        return erasure_pb(erasure)

    @rpc_errors
    async def ListErasures(
        self, request: pb.ListErasuresRequest, context: Any
    ) -> pb.ListErasuresResponse:
        """Erasures made, newest first."""
        if request.limit < 0:
            raise InvalidInput(f"limit must be 0 or more, not {request.limit}")
        found = await asyncio.to_thread(self.d.erasures.list, request.limit or 50)
        return pb.ListErasuresResponse(erasures=[erasure_pb(e) for e in found])


__all__ = ["METHOD_RULES", "READ_MESSAGE_BYTES", "SERVICE", "Domain", "GovernanceApi"]
