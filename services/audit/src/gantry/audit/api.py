"""The audit gRPC API (handler): compliance queries, export, reports, proofs, verification."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from gantry.audit.anomalies import AnomalyRecord, AnomalyWatch
from gantry.audit.archive import Archiver
from gantry.audit.compliance_api import COMPLIANCE_RULES, ComplianceApi
from gantry.audit.ledger import Ledger
from gantry.audit.reports import Reports
from gantry.audit.retention import Retention
from gantry.audit.store import RecordFilter
from gantry.audit.subject_reports import SubjectReports
from gantry.audit.token_revocations import TokenRevocations
from gantry.audit.tokens_api import TOKEN_RULES, TokensApi
from gantry.core import GantryError, InvalidInput, Unavailable
from gantry.protos.v1 import audit_pb2 as pb
from gantry.protos.v1 import audit_pb2_grpc as pb_grpc
from gantry.security import MethodRule, TrustStore, current_principal
from gantry.security.rpc_errors import rpc_errors
from gantry.security.treehead import TreeHead

SERVICE = "gantry.audit.v1.AuditService"

#: What each method means to the RBAC policy (methods not listed are denied).
METHOD_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/Query": MethodRule("query", "audit_log"),
    f"/{SERVICE}/Export": MethodRule("export", "audit_log"),
    f"/{SERVICE}/AccessReport": MethodRule("report", "audit_log"),
    f"/{SERVICE}/GetInclusionProof": MethodRule("prove", "audit_log"),
    f"/{SERVICE}/GetConsistencyProof": MethodRule("prove", "audit_log"),
    f"/{SERVICE}/GetCheckpoint": MethodRule("checkpoint", "audit_log"),
    f"/{SERVICE}/Verify": MethodRule("verify", "audit_log"),
    f"/{SERVICE}/ListAnomalies": MethodRule("list", "anomaly"),
    f"/{SERVICE}/ResolveAnomaly": MethodRule("resolve", "anomaly"),
    **COMPLIANCE_RULES,
    **TOKEN_RULES,
}

MAX_PAGE = 1000
CSV_COLUMNS = [
    "index", "event_id", "time_ms", "type", "actor", "resource", "action", "decision",
    "correlation_id", "subject", "source",
]  # fmt: skip

_CSV_ATTR = {"index": "seq"}


def filter_from_pb(f: pb.EventFilter) -> RecordFilter:
    """A store filter from the request message, checked."""
    if f.decision and f.decision not in ("allow", "deny"):
        raise InvalidInput(f"decision must be 'allow' or 'deny', not {f.decision!r}")
    if f.since_ms and f.until_ms and f.since_ms >= f.until_ms:
        raise InvalidInput("since must be before until")
    return RecordFilter(
        actors=tuple(f.actors),
        types=tuple(f.types),
        resource=f.resource,
        action=f.action,
        decision=f.decision,
        correlation_id=f.correlation_id,
        since_ms=f.since_ms,
        until_ms=f.until_ms,
    )


def record_pb(row: Any, event_json: bytes) -> pb.AuditRecord:
    """One stored row as a message, with its event bytes (``Ledger.event_bytes``)."""
    return pb.AuditRecord(
        index=row.seq,
        event_id=row.event_id,
        type=row.type,
        actor=row.actor,
        subject=row.subject or "",
        resource=row.resource,
        action=row.action,
        decision=row.decision,
        correlation_id=row.correlation_id,
        time_ms=row.time_ms,
        event_json=event_json,
        leaf_hash=bytes(row.leaf_hash),
        state=row.state,
    )


def head_pb(head: TreeHead) -> pb.SignedTreeHead:
    """A signed tree head as a message."""
    return pb.SignedTreeHead(
        tree_size=head.tree_size,
        root_hash=head.root_hash,
        timestamp_ms=head.timestamp_ms,
        key_id=head.key_id,
        signature=head.signature,
    )


def _page_after(token: str) -> int:
    if not token:
        return -1
    if not token.startswith("s") or not token[1:].isdigit():
        raise InvalidInput(
            f"bad page token {token!r}", hint="pass the next_page_token of the previous page"
        )
    return int(token[1:])


class AuditApi(ComplianceApi, TokensApi, pb_grpc.AuditServiceServicer):  # type: ignore[misc]
    """Serves the audit log; every call is authorised by the interceptor, queries are audited."""

    def __init__(
        self,
        ledger: Ledger,
        trust: TrustStore,
        *,
        on_query: Callable[[], None],
        anomalies: AnomalyWatch | None = None,
        subjects: SubjectReports | None = None,
        reports: Reports | None = None,
        retention: Retention | None = None,
        archiver: Archiver | None = None,
        tokens: TokenRevocations | None = None,
    ) -> None:
        self._ledger = ledger
        self._tokens = tokens
        self._trust = trust
        self._on_query = on_query
        self._anomalies = anomalies
        self._subjects = subjects
        self._reports = reports
        self._retention = retention
        self._archiver = archiver

    async def _audited(self, query: str, filters: dict[str, Any], results: int) -> None:
        actor = current_principal().subject
        await asyncio.to_thread(self._ledger.record_query, actor, query, filters, results)
        self._on_query()

    @rpc_errors
    async def Query(self, request: pb.QueryRequest, context: Any) -> pb.QueryResponse:
        flt = filter_from_pb(request.filter)
        size = request.page_size or 100
        if not 1 <= size <= MAX_PAGE:
            raise InvalidInput(f"page_size must be between 1 and {MAX_PAGE}, not {size}")
        rows = await asyncio.to_thread(
            self._ledger.store.query, flt, _page_after(request.page_token), size + 1
        )
        more = len(rows) > size
        rows = rows[:size]
        bodies = await asyncio.to_thread(lambda: [self._ledger.event_bytes(r) for r in rows])
        await self._audited("query", flt.as_dict(), len(rows))
        return pb.QueryResponse(
            records=[record_pb(r, b) for r, b in zip(rows, bodies, strict=True)],
            next_page_token=f"s{rows[-1].seq}" if more and rows else "",
        )

    async def Export(
        self, request: pb.ExportRequest, context: Any
    ) -> AsyncIterator[pb.ExportChunk]:
        try:
            flt = filter_from_pb(request.filter)
        except GantryError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.grpc_code), str(exc))
            return
        as_csv = request.format == pb.EXPORT_FORMAT_CSV
        after, total, done = -1, 0, False
        try:
            if as_csv:
                yield pb.ExportChunk(data=(",".join(CSV_COLUMNS) + "\r\n").encode())
            while True:
                rows = await asyncio.to_thread(self._ledger.store.query, flt, after, 2000)
                if not rows:
                    break
                if as_csv:
                    data = _csv(rows)
                else:
                    data = await asyncio.to_thread(_jsonl, rows, self._ledger.event_bytes)
                yield pb.ExportChunk(data=data)
                after = rows[-1].seq
                total += len(rows)
            done = True
        finally:
            # recorded even when the client goes away part-way (then marked incomplete)
            filters = {**flt.as_dict(), "format": "csv" if as_csv else "jsonl", "complete": done}
            await asyncio.shield(self._audited("export", filters, total))

    @rpc_errors
    async def AccessReport(
        self, request: pb.AccessReportRequest, context: Any
    ) -> pb.AccessReportResponse:
        if not request.resource:
            raise InvalidInput("resource is required", hint="e.g. dataset/customers")
        rows = await asyncio.to_thread(
            self._ledger.store.access_report, request.resource, request.since_ms, request.until_ms
        )
        out = [
            pb.AccessReportRow(
                actor=r.actor,
                action=r.action,
                allowed=int(r.allowed or 0),
                denied=int(r.denied or 0),
                first_ms=int(r.first_ms),
                last_ms=int(r.last_ms),
            )
            for r in rows
        ]
        total = sum(r.allowed + r.denied for r in out)
        await self._audited(
            "access_report",
            {
                "resource": request.resource,
                "since_ms": request.since_ms,
                "until_ms": request.until_ms,
            },
            total,
        )
        return pb.AccessReportResponse(resource=request.resource, rows=out, total=total)

    @rpc_errors
    async def GetInclusionProof(
        self, request: pb.InclusionProofRequest, context: Any
    ) -> pb.InclusionProofResponse:
        which = request.WhichOneof("leaf")
        if which is None:
            raise InvalidInput("give the event's index or event_id")
        index, path, leaf, raw, head = await asyncio.to_thread(
            self._ledger.inclusion,
            index=request.index if which == "index" else None,
            event_id=request.event_id if which == "event_id" else None,
            tree_size=request.tree_size,
        )
        return pb.InclusionProofResponse(
            index=index, path=path, leaf_hash=leaf, event_json=raw, tree_head=head_pb(head)
        )

    @rpc_errors
    async def GetConsistencyProof(
        self, request: pb.ConsistencyProofRequest, context: Any
    ) -> pb.ConsistencyProofResponse:
        path, first, second = await asyncio.to_thread(
            self._ledger.consistency, request.first_size, request.second_size
        )
        return pb.ConsistencyProofResponse(path=path, first=head_pb(first), second=head_pb(second))

    @rpc_errors
    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: Any
    ) -> pb.SignedTreeHead:
        return head_pb(await asyncio.to_thread(self._ledger.tree_head, request.tree_size))

    @rpc_errors
    async def Verify(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        report = await asyncio.to_thread(self._ledger.verify, self._trust)
        await self._audited("verify", {}, report.events_checked)
        return pb.VerifyResponse(
            ok=report.ok,
            events_checked=report.events_checked,
            checkpoints_checked=report.checkpoints_checked,
            first_bad_index=report.first_bad_index,
            problems=[
                pb.VerifyProblem(index=p.index, kind=p.kind, detail=p.detail)
                for p in report.problems
            ],
            latest=head_pb(report.latest) if report.latest else None,
        )

    def _watch(self) -> AnomalyWatch:
        if self._anomalies is None:
            raise Unavailable("anomaly detection is not running in this audit service")
        return self._anomalies

    @rpc_errors
    async def ListAnomalies(
        self, request: pb.ListAnomaliesRequest, context: Any
    ) -> pb.ListAnomaliesResponse:
        limit = request.limit or 100
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}, not {limit}")
        found = await asyncio.to_thread(
            self._watch().list,
            state=request.state,
            principal=request.principal,
            kind=request.kind,
            since_ms=request.since_ms,
            until_ms=request.until_ms,
            limit=limit,
        )
        filters = {
            k: v
            for k, v in (
                ("state", request.state),
                ("principal", request.principal),
                ("kind", request.kind),
            )
            if v
        }
        await self._audited("anomalies", filters, len(found))
        return pb.ListAnomaliesResponse(anomalies=[anomaly_pb(a) for a in found])

    @rpc_errors
    async def ResolveAnomaly(self, request: pb.ResolveAnomalyRequest, context: Any) -> pb.Anomaly:
        by = current_principal().subject
        record = await asyncio.to_thread(
            self._watch().resolve, request.anomaly_id, request.state, by=by, note=request.note
        )
        return anomaly_pb(record)


def anomaly_pb(a: AnomalyRecord) -> pb.Anomaly:
    """A stored anomaly as a message."""
    return pb.Anomaly(
        anomaly_id=a.anomaly_id,
        kind=a.kind,
        principal=a.principal,
        state=a.state,
        severity=a.severity,
        reason=a.reason,
        evidence_json=json.dumps(a.evidence, sort_keys=True),
        event_ids=list(a.event_ids),
        time_ms=a.time_ms,
        updated_ms=a.updated_ms,
        by=a.by,
        note=a.note,
    )


def _jsonl(rows: list[Any], body: Callable[[Any], bytes]) -> bytes:
    """Each row as ``{"index", "event"}`` (a purged event is ``null``: its bytes are gone)."""
    return b"".join(b'{"index":%d,"event":%s}\n' % (r.seq, body(r) or b"null") for r in rows)


def _csv(rows: list[Any]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)
    for r in rows:
        writer.writerow(
            [
                r.seq,
                r.event_id,
                r.time_ms,
                r.type,
                r.actor,
                r.resource,
                r.action,
                r.decision,
                r.correlation_id,
                r.subject or "",
                r.source,
            ]
        )
    return buf.getvalue().encode()


__all__ = [
    "METHOD_RULES",
    "SERVICE",
    "AuditApi",
    "anomaly_pb",
    "filter_from_pb",
    "head_pb",
    "record_pb",
]
