"""The compliance part of the audit gRPC API (handler): data-subject reports, signed compliance
reports, retention rules, legal holds, archival and purges.

:class:`ComplianceApi` is mixed into :class:`gantry.audit.api.AuditApi`; each method is
authorised by the interceptor from :data:`COMPLIANCE_RULES` before it runs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from gantry.audit.archive import Archiver
from gantry.audit.ledger import Ledger, Segment
from gantry.audit.reports import ReportRecord, Reports, parse_report
from gantry.audit.retention import LegalHold, Retention, RetentionRule
from gantry.audit.subject_reports import SubjectReports
from gantry.core import GantryError, InvalidInput, Unavailable
from gantry.protos.v1 import audit_pb2 as pb
from gantry.security import MethodRule, TrustStore, current_principal
from gantry.security.rpc_errors import rpc_errors
from gantry.security.treehead import TreeHead

SERVICE = "gantry.audit.v1.AuditService"

COMPLIANCE_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/SubjectReport": MethodRule("query", "subject"),
    f"/{SERVICE}/GenerateReport": MethodRule("create", "report"),
    f"/{SERVICE}/ListReports": MethodRule("list", "report"),
    f"/{SERVICE}/DownloadReport": MethodRule("read", "report"),
    f"/{SERVICE}/VerifyReport": MethodRule("verify", "report"),
    f"/{SERVICE}/SetRetention": MethodRule("update", "retention"),
    f"/{SERVICE}/ListRetention": MethodRule("list", "retention"),
    f"/{SERVICE}/PlaceHold": MethodRule("create", "hold"),
    f"/{SERVICE}/ReleaseHold": MethodRule("delete", "hold"),
    f"/{SERVICE}/ListHolds": MethodRule("list", "hold"),
    f"/{SERVICE}/Archive": MethodRule("archive", "audit_log"),
    f"/{SERVICE}/ListSegments": MethodRule("query", "audit_log"),
    f"/{SERVICE}/VerifySegment": MethodRule("verify", "audit_log"),
    f"/{SERVICE}/Purge": MethodRule("purge", "audit_log"),
}

CHUNK = 1 << 20


def _head_pb(head: TreeHead | None) -> pb.SignedTreeHead | None:
    if head is None:
        return None
    return pb.SignedTreeHead(
        tree_size=head.tree_size,
        root_hash=head.root_hash,
        timestamp_ms=head.timestamp_ms,
        key_id=head.key_id,
        signature=head.signature,
    )


def report_pb(r: ReportRecord) -> pb.ComplianceReport:
    """A stored report as a message."""
    return pb.ComplianceReport(
        report_id=r.report_id,
        period=r.period,
        since_ms=r.since_ms,
        until_ms=r.until_ms,
        created_ms=r.created_ms,
        created_by=r.created_by,
        tree_head=_head_pb(r.tree_head),
        digest=r.digest,
        key_id=r.key_id,
        signature=r.signature,
        formats=list(r.formats),
        summary_json=r.summary_json,
    )


def rule_pb(r: RetentionRule) -> pb.RetentionRule:
    """A retention rule as a message."""
    return pb.RetentionRule(
        event_type=r.event_type, keep_days=r.keep_days, updated_by=r.updated_by,
        updated_ms=r.updated_ms,
    )  # fmt: skip


def hold_pb(h: LegalHold) -> pb.LegalHold:
    """A legal hold as a message."""
    return pb.LegalHold(
        hold_id=h.hold_id, name=h.name, reason=h.reason, principals=list(h.principals),
        datasets=list(h.datasets), since_ms=h.since_ms, until_ms=h.until_ms, state=h.state,
        created_by=h.created_by, created_ms=h.created_ms, released_by=h.released_by,
        released_ms=h.released_ms, release_note=h.release_note,
    )  # fmt: skip


def segment_pb(s: Segment) -> pb.Segment:
    """An archived segment as a message."""
    return pb.Segment(
        first_seq=s.first_seq, end_seq=s.end_seq, object_name=s.object_name,
        segment_root=s.segment_root, tree_size=s.tree_size, from_ms=s.from_ms, to_ms=s.to_ms,
        archived_ms=s.archived_ms, archived_by=s.archived_by,
    )  # fmt: skip


class ComplianceApi:
    """Compliance handlers; the parts they use are set by :class:`~gantry.audit.api.AuditApi`."""

    _subjects: SubjectReports | None = None
    _reports: Reports | None = None
    _retention: Retention | None = None
    _archiver: Archiver | None = None
    _ledger: Ledger
    _trust: TrustStore
    _on_query: Callable[[], None]

    def _subject_reports(self) -> SubjectReports:
        if self._subjects is None:
            raise Unavailable("data-subject reports are not available in this audit service")
        return self._subjects

    def _report_store(self) -> Reports:
        if self._reports is None:
            raise Unavailable(
                "compliance reports are not available in this audit service",
                hint="the audit service needs its object store (GANTRY_STORAGE__*)",
            )
        return self._reports

    def _retention_rules(self) -> Retention:
        if self._retention is None:
            raise Unavailable("retention is not available in this audit service")
        return self._retention

    def _segments(self) -> Archiver:
        if self._archiver is None:
            raise Unavailable("archival is not available in this audit service")
        return self._archiver

    async def _record(self, query: str, filters: dict[str, Any], results: int) -> None:
        actor = current_principal().subject
        await asyncio.to_thread(self._ledger.record_query, actor, query, filters, results)
        self._on_query()

    @rpc_errors
    async def SubjectReport(
        self, request: pb.SubjectReportRequest, context: Any
    ) -> pb.SubjectReportResponse:
        who = current_principal()
        report = await asyncio.to_thread(
            self._subject_reports().report,
            request.identifier,
            reason=request.reason,
            subject=who.subject,
            roles=list(who.roles),
        )
        self._on_query()
        head = report.document["tree_head"]
        return pb.SubjectReportResponse(
            report_id=report.report_id,
            report_json=json.dumps(report.document, sort_keys=True, indent=1).encode(),
            tree_head=pb.SignedTreeHead(
                tree_size=head["tree_size"],
                root_hash=bytes.fromhex(head["root_hash"]),
                timestamp_ms=head["timestamp_ms"],
                key_id=head["key_id"],
                signature=base64.b64decode(head["signature"]),
            ),
        )

    # -- compliance reports -------------------------------------------------------------------

    @rpc_errors
    async def GenerateReport(
        self, request: pb.GenerateReportRequest, context: Any
    ) -> pb.ComplianceReport:
        reports = self._report_store()
        since_ms, until_ms = reports.bounds(
            request.period or "daily", request.since_ms, request.until_ms
        )
        record = await asyncio.to_thread(
            reports.generate,
            request.period or "daily",
            since_ms,
            until_ms,
            current_principal().subject,
        )
        self._on_query()
        return report_pb(record)

    @rpc_errors
    async def ListReports(
        self, request: pb.ListReportsRequest, context: Any
    ) -> pb.ListReportsResponse:
        found = await asyncio.to_thread(
            self._report_store().list, request.period, request.limit or 50
        )
        return pb.ListReportsResponse(reports=[report_pb(r) for r in found])

    async def DownloadReport(
        self, request: pb.DownloadReportRequest, context: Any
    ) -> AsyncIterator[pb.ReportChunk]:
        try:
            data = await asyncio.to_thread(
                self._report_store().download, request.report_id, request.format or "pdf"
            )
        except GantryError as exc:
            await context.abort(_status(exc), str(exc))
            return
        await self._record(
            "report_download",
            {"report_id": request.report_id, "format": request.format or "pdf"},
            len(data),
        )
        for start in range(0, len(data), CHUNK):
            yield pb.ReportChunk(data=data[start : start + CHUNK])

    @rpc_errors
    async def VerifyReport(
        self, request: pb.VerifyReportRequest, context: Any
    ) -> pb.VerifyReportResponse:
        reports = self._report_store()
        which = request.WhichOneof("report")
        if which is None:
            raise InvalidInput("give a stored report's id or a report's JSON")
        if which == "report_id":
            document = await asyncio.to_thread(reports.document, request.report_id)
        else:
            document = parse_report(request.report_json)
        result = await asyncio.to_thread(
            reports.verify,
            document,
            self._trust,
            self._ledger.events,
            self._ledger.consistency,
        )
        await self._record("report_verify", {"report_id": request.report_id, "ok": result.ok}, 1)
        return pb.VerifyReportResponse(
            ok=result.ok,
            signature_ok=result.signature_ok,
            consistent=result.consistent,
            figures_match=result.figures_match,
            problems=list(result.problems),
            tree_head=_head_pb(result.tree_head),
            digest=result.digest,
        )

    # -- retention, legal holds, archival, purges ---------------------------------------------

    @rpc_errors
    async def SetRetention(self, request: pb.SetRetentionRequest, context: Any) -> pb.RetentionRule:
        rule = await asyncio.to_thread(
            self._retention_rules().set_rule,
            request.event_type,
            request.keep_days,
            current_principal().subject,
        )
        self._on_query()
        return rule_pb(rule)

    @rpc_errors
    async def ListRetention(
        self, request: pb.ListRetentionRequest, context: Any
    ) -> pb.ListRetentionResponse:
        rules = await asyncio.to_thread(self._retention_rules().rules)
        return pb.ListRetentionResponse(rules=[rule_pb(r) for r in rules])

    @rpc_errors
    async def PlaceHold(self, request: pb.PlaceHoldRequest, context: Any) -> pb.LegalHold:
        hold = await asyncio.to_thread(
            self._retention_rules().place,
            request.name,
            request.reason,
            list(request.principals),
            list(request.datasets),
            request.since_ms,
            request.until_ms,
            by=current_principal().subject,
        )
        self._on_query()
        return hold_pb(hold)

    @rpc_errors
    async def ReleaseHold(self, request: pb.ReleaseHoldRequest, context: Any) -> pb.LegalHold:
        hold = await asyncio.to_thread(
            self._retention_rules().release,
            request.name,
            request.note,
            by=current_principal().subject,
        )
        self._on_query()
        return hold_pb(hold)

    @rpc_errors
    async def ListHolds(self, request: pb.ListHoldsRequest, context: Any) -> pb.ListHoldsResponse:
        holds = await asyncio.to_thread(self._retention_rules().holds, request.include_released)
        return pb.ListHoldsResponse(holds=[hold_pb(h) for h in holds])

    @rpc_errors
    async def Archive(self, request: pb.ArchiveRequest, context: Any) -> pb.ArchiveResponse:
        result = await asyncio.to_thread(
            self._segments().archive,
            current_principal().subject,
            request.older_than_ms,
            request.dry_run,
        )
        self._on_query()
        return pb.ArchiveResponse(
            segments=[segment_pb(s) for s in result.segments], events=result.events
        )

    @rpc_errors
    async def ListSegments(
        self, request: pb.ListSegmentsRequest, context: Any
    ) -> pb.ListSegmentsResponse:
        segments = await asyncio.to_thread(self._segments().segments)
        return pb.ListSegmentsResponse(segments=[segment_pb(s) for s in segments])

    @rpc_errors
    async def VerifySegment(
        self, request: pb.VerifySegmentRequest, context: Any
    ) -> pb.VerifySegmentResponse:
        result = await asyncio.to_thread(
            self._segments().verify_segment, request.first_seq, self._trust
        )
        await self._record("segment_verify", {"first_seq": request.first_seq}, 1)
        return pb.VerifySegmentResponse(
            ok=result.ok,
            detail=result.detail,
            segment=segment_pb(result.segment),
            tree_head=_head_pb(result.tree_head),
        )

    @rpc_errors
    async def Purge(self, request: pb.PurgeRequest, context: Any) -> pb.PurgeResponse:
        result = await asyncio.to_thread(
            self._retention_rules().purge,
            current_principal().subject,
            0,
            request.dry_run,
        )
        self._on_query()
        return pb.PurgeResponse(
            purge_id=result.purge_id,
            events=result.events,
            held_back=result.held_back,
            by_type=result.by_type,
            dry_run=result.dry_run,
        )


def _status(exc: GantryError) -> grpc.StatusCode:
    code: grpc.StatusCode = getattr(grpc.StatusCode, exc.grpc_code)
    return code


__all__ = ["COMPLIANCE_RULES", "ComplianceApi", "hold_pb", "report_pb", "rule_pb", "segment_pb"]
