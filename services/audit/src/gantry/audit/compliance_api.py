"""The compliance part of the audit gRPC API (handler): data-subject reports, signed compliance
reports, retention rules, legal holds, archival and purges.

:class:`ComplianceApi` is mixed into :class:`gantry.audit.api.AuditApi`; each method is
authorised by the interceptor from :data:`COMPLIANCE_RULES` before it runs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

from gantry.audit.subject_reports import SubjectReports
from gantry.core import Unavailable
from gantry.protos.v1 import audit_pb2 as pb
from gantry.security import MethodRule, current_principal
from gantry.security.rpc_errors import rpc_errors

SERVICE = "gantry.audit.v1.AuditService"

COMPLIANCE_RULES: dict[str, MethodRule] = {
    f"/{SERVICE}/SubjectReport": MethodRule("query", "subject"),
}


class ComplianceApi:
    """Compliance handlers; the parts they use are set by :class:`~gantry.audit.api.AuditApi`."""

    _subjects: SubjectReports | None = None
    _on_query: Callable[[], None]

    def _subject_reports(self) -> SubjectReports:
        if self._subjects is None:
            raise Unavailable("data-subject reports are not available in this audit service")
        return self._subjects

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


__all__ = ["COMPLIANCE_RULES", "ComplianceApi"]
