"""The compliance calls of the audit SDK: data-subject reports, signed compliance reports,
retention rules, legal holds, archival and purges (mixed into :class:`AuditClient`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from gantry.protos.v1 import audit_pb2 as pb


class ComplianceCalls:
    """Calls for compliance staff; ``_call`` and ``_stream`` come from the client."""

    def _call(self, method: str, request: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not make calls")

    def _stream(self, method: str, request: Any) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} does not stream")

    # -- data subjects ------------------------------------------------------------------------

    def subject_report(self, identifier: str, *, reason: str) -> dict[str, Any]:
        """The signed report of every dataset version, job and model holding ``identifier``,
        with the audit entries proving each link (check it with
        :func:`gantry.client.subject_report.check_subject_report`)."""
        resp = self._call(
            "SubjectReport", pb.SubjectReportRequest(identifier=identifier, reason=reason)
        )
        report: dict[str, Any] = json.loads(resp.report_json)
        return report

    # -- compliance reports -------------------------------------------------------------------

    def generate_report(
        self, period: str, *, since_ms: int = 0, until_ms: int = 0
    ) -> pb.ComplianceReport:
        """Generate, sign and store a report now: the last whole ``daily``/``weekly``/
        ``monthly`` period, or ``custom`` with since/until."""
        request = pb.GenerateReportRequest(period=period, since_ms=since_ms, until_ms=until_ms)
        result: pb.ComplianceReport = self._call("GenerateReport", request)
        return result

    def reports(self, *, period: str = "", limit: int = 50) -> list[pb.ComplianceReport]:
        """Stored reports, newest first."""
        return list(
            self._call("ListReports", pb.ListReportsRequest(period=period, limit=limit)).reports
        )

    def download_report(self, report_id: str, fmt: str = "pdf") -> bytes:
        """A stored report in ``json``, ``csv`` or ``pdf``."""
        request = pb.DownloadReportRequest(report_id=report_id, format=fmt)
        return b"".join(chunk.data for chunk in self._stream("DownloadReport", request))

    def verify_report(
        self, *, report_id: str = "", report_json: bytes = b""
    ) -> pb.VerifyReportResponse:
        """Have the service check a report's signatures and recompute its figures."""
        request = (
            pb.VerifyReportRequest(report_id=report_id)
            if report_id
            else pb.VerifyReportRequest(report_json=report_json)
        )
        result: pb.VerifyReportResponse = self._call("VerifyReport", request)
        return result

    # -- retention, holds, archive ------------------------------------------------------------

    def set_retention(self, event_type: str, keep_days: int) -> pb.RetentionRule:
        """Keep ``event_type`` (a type, ``prefix.*`` or ``*``) this many days; 0 removes it."""
        request = pb.SetRetentionRequest(event_type=event_type, keep_days=keep_days)
        result: pb.RetentionRule = self._call("SetRetention", request)
        return result

    def retention(self) -> list[pb.RetentionRule]:
        """Every retention rule."""
        return list(self._call("ListRetention", pb.ListRetentionRequest()).rules)

    def place_hold(
        self,
        name: str,
        *,
        reason: str,
        principals: Sequence[str] = (),
        datasets: Sequence[str] = (),
        since_ms: int = 0,
        until_ms: int = 0,
    ) -> pb.LegalHold:
        """Stop any deletion of the events a hold names until it is released."""
        request = pb.PlaceHoldRequest(
            name=name,
            reason=reason,
            principals=list(principals),
            datasets=list(datasets),
            since_ms=since_ms,
            until_ms=until_ms,
        )
        result: pb.LegalHold = self._call("PlaceHold", request)
        return result

    def release_hold(self, name: str, *, note: str) -> pb.LegalHold:
        """Release a legal hold (the note says why)."""
        result: pb.LegalHold = self._call(
            "ReleaseHold", pb.ReleaseHoldRequest(name=name, note=note)
        )
        return result

    def holds(self, *, include_released: bool = False) -> list[pb.LegalHold]:
        """Legal holds (active ones, or all)."""
        request = pb.ListHoldsRequest(include_released=include_released)
        return list(self._call("ListHolds", request).holds)

    def archive(self, *, older_than_ms: int = 0, dry_run: bool = False) -> pb.ArchiveResponse:
        """Move whole old segments of the log to the object store, with their proofs."""
        request = pb.ArchiveRequest(older_than_ms=older_than_ms, dry_run=dry_run)
        result: pb.ArchiveResponse = self._call("Archive", request)
        return result

    def segments(self) -> list[pb.Segment]:
        """Archived segments, oldest first."""
        return list(self._call("ListSegments", pb.ListSegmentsRequest()).segments)

    def verify_segment(self, first_seq: int) -> pb.VerifySegmentResponse:
        """Have the service check an archived segment against its signed tree head."""
        result: pb.VerifySegmentResponse = self._call(
            "VerifySegment", pb.VerifySegmentRequest(first_seq=first_seq)
        )
        return result

    def purge(self, *, dry_run: bool = False) -> pb.PurgeResponse:
        """Delete events past their retention that no legal hold covers (recorded)."""
        result: pb.PurgeResponse = self._call("Purge", pb.PurgeRequest(dry_run=dry_run))
        return result


__all__ = ["ComplianceCalls"]
