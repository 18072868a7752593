"""Data-subject reports (GDPR art. 15 and 17): what governance holds about one person, with the
audit entries that prove every link, signed by the audit service.

Governance finds, through the keyed hashes of its de-identified views, every dataset version
holding the identifier, the jobs that read those versions and the model versions they produced
(:class:`SubjectFinder`; it is asked *as the auditor asking*, so governance applies and audits
the auditor's own rights). Each finding names the audit event that recorded it; this module
adds the event's bytes and its inclusion proof against a signed tree head, and signs the whole
document (:mod:`gantry.security.documents`). The identifier travels in the report handed to
the auditor, never into the log: the request is audited with governance's keyed reference.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from gantry.audit.ledger import Ledger
from gantry.core import (
    Clock,
    GantryError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    SystemClock,
    TlsSettings,
    Unavailable,
    new_id,
)
from gantry.protos.v1 import governance_pb2 as gpb
from gantry.protos.v1 import governance_pb2_grpc as gpb_grpc
from gantry.security.documents import sign_document
from gantry.security.interceptor import ACT_AS_METADATA, ACT_AS_ROLES_METADATA
from gantry.security.keys import SigningKey
from gantry.security.tls import secure_or_insecure_channel

KIND = "gantry.subject-report"
MAX_IDENTIFIER = 512


class SubjectFinder(Protocol):
    """Asks governance for a subject's findings, on behalf of ``subject`` with ``roles``."""

    def find(self, identifier: str, *, subject: str, roles: Sequence[str]) -> gpb.SubjectFindings:
        """The findings, or a typed error (PermissionDenied, Unavailable, ...)."""
        ...


class GovernanceSubjects:
    """:class:`SubjectFinder` over governance's gRPC API, with the audit service's token
    (over TLS when ``tls`` is enabled)."""

    def __init__(
        self,
        address: Callable[[], str],
        token: Callable[[], str],
        *,
        timeout_s: float = 30.0,
        tls: TlsSettings | None = None,
    ) -> None:
        self._address = address
        self._token = token
        self._timeout = timeout_s
        self._tls = tls

    def find(self, identifier: str, *, subject: str, roles: Sequence[str]) -> gpb.SubjectFindings:
        address = self._address()
        metadata = (
            ("authorization", f"Bearer {self._token()}"),
            (ACT_AS_METADATA, subject),
            (ACT_AS_ROLES_METADATA, ",".join(roles)),
        )
        with secure_or_insecure_channel(address, self._tls) as channel:
            stub = gpb_grpc.GovernanceServiceStub(channel)
            try:
                found: gpb.SubjectFindings = stub.FindSubject(
                    gpb.FindSubjectRequest(identifier=identifier),
                    metadata=metadata,
                    timeout=self._timeout,
                )
            except grpc.RpcError as exc:
                raise _error(exc, address, subject) from None
        return found


def _error(exc: grpc.RpcError, address: str, subject: str) -> GantryError:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(subject, "query", "subject", reason=f"governance: {detail}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidInput(f"governance: {detail}")
    return Unavailable(
        f"governance at {address} did not answer the subject query ({code}: {detail})",
        hint="check that the governance service runs (gantry up) and try again",
    )


@dataclass(frozen=True)
class SubjectReport:
    """A signed report and its headline figures."""

    report_id: str
    document: dict[str, Any]
    versions: int
    jobs: int
    models: int
    unproven: int


def findings_to_dict(f: gpb.SubjectFindings) -> dict[str, Any]:
    """The findings as plain JSON (every field, so the signed report is self-describing)."""

    def version(v: gpb.SubjectVersion) -> dict[str, Any]:
        return {
            "dataset": v.dataset,
            "version": v.version,
            "rows": v.rows,
            "columns": list(v.columns),
            "created_ms": v.created_ms,
            "author": v.author,
            "event_id": v.event_id,
            "is_head": v.is_head,
            "erasure_id": v.erasure_id,
        }

    return {
        "subject_ref": f.subject_ref,
        "versions": [version(v) for v in f.versions],
        "links": [
            {
                "from_kind": link.from_kind,
                "from_id": link.from_id,
                "to_kind": link.to_kind,
                "to_id": link.to_id,
                "time_ms": link.time_ms,
                "event_id": link.event_id,
                "event_type": link.event_type,
            }
            for link in f.links
        ],
        "jobs": list(f.jobs),
        "models": list(f.models),
        "datasets_searched": list(f.datasets_searched),
        "datasets_not_searchable": list(f.datasets_not_searchable),
        "erasures": [
            {
                "erasure_id": e.erasure_id,
                "requested_by": e.requested_by,
                "requested_ms": e.requested_ms,
                "reason": e.reason,
                "new_versions": [version(v) for v in e.new_versions],
                "rows_removed": list(e.rows_removed),
                "models_to_retrain": list(e.models_to_retrain),
                "event_id": e.event_id,
            }
            for e in f.erasures
        ],
        "searched_ms": f.searched_ms,
    }


def cited_events(findings: dict[str, Any]) -> list[str]:
    """Every audit event id the findings rest on, in the order they are cited."""
    ids: list[str] = []
    for v in findings["versions"]:
        ids.append(v["event_id"])
    for link in findings["links"]:
        ids.append(link["event_id"])
    for e in findings["erasures"]:
        ids.append(e["event_id"])
    return list(dict.fromkeys(i for i in ids if i))


class SubjectReports:
    """Builds signed data-subject reports."""

    def __init__(
        self,
        ledger: Ledger,
        finder: SubjectFinder,
        signer: SigningKey,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._ledger = ledger
        self._finder = finder
        self._signer = signer
        self._clock = clock or SystemClock()

    def report(
        self, identifier: str, *, reason: str, subject: str, roles: Sequence[str]
    ) -> SubjectReport:
        """Find, prove and sign; audit the request (with the keyed reference only)."""
        identifier = identifier.strip()
        if not identifier:
            raise InvalidInput(
                "no identifier given",
                hint="pass the data subject's e-mail address or customer id",
            )
        if len(identifier) > MAX_IDENTIFIER:
            raise InvalidInput(f"the identifier is longer than {MAX_IDENTIFIER} characters")
        if not reason.strip():
            raise InvalidInput(
                "a data-subject report needs a reason",
                hint="say why it is asked, e.g. the request's ticket: --reason 'DSAR-2041'",
            )
        findings = findings_to_dict(self._finder.find(identifier, subject=subject, roles=roles))
        self._ledger.checkpoint()  # cover the newest events, if any arrived since the last one
        head = self._ledger.tree_head()
        proofs: dict[str, Any] = {}
        unproven: dict[str, str] = {}
        for event_id in cited_events(findings):
            try:
                index, path, leaf, raw, _ = self._ledger.inclusion(
                    event_id=event_id, tree_size=head.tree_size
                )
            except NotFound:
                unproven[event_id] = "not in the audit log yet (still on its way)"
                continue
            except InvalidInput:
                unproven[event_id] = "logged after the report's signed tree head"
                continue
            proofs[event_id] = {
                "index": index,
                "leaf_hash": leaf.hex(),
                "event": base64.b64encode(raw).decode(),
                "path": [p.hex() for p in path],
            }
        report_id = new_id()
        doc = sign_document(
            {
                "report_id": report_id,
                "created_ms": int(self._clock.now().timestamp() * 1000),
                "requested_by": subject,
                "reason": reason.strip(),
                "identifier": identifier,
                "findings": findings,
                "proofs": proofs,
                "unproven": unproven,
                "tree_head": {
                    "tree_size": head.tree_size,
                    "root_hash": head.root_hash.hex(),
                    "timestamp_ms": head.timestamp_ms,
                    "key_id": head.key_id,
                    "signature": base64.b64encode(head.signature).decode(),
                },
            },
            self._signer,
            kind=KIND,
        )
        self._ledger.record_query(
            subject,
            "subject_report",
            {
                "subject_ref": findings["subject_ref"],
                "reason": reason.strip(),
                "report_id": report_id,
                "digest": doc["signature"]["digest"],
            },
            len(findings["versions"]),
        )
        return SubjectReport(
            report_id,
            doc,
            versions=len(findings["versions"]),
            jobs=len(findings["jobs"]),
            models=len(findings["models"]),
            unproven=len(unproven),
        )


__all__ = [
    "KIND",
    "GovernanceSubjects",
    "SubjectFinder",
    "SubjectReport",
    "SubjectReports",
    "cited_events",
    "findings_to_dict",
]
