"""Audit, for compliance staff: access-behaviour anomalies (acknowledge or dismiss them),
data-subject reports (every dataset version, job and model holding a person's identifier, each
link proven and checked here against the audit service's key), and the signed compliance
reports to download and verify.

The identifier of a data subject is personal data: it is only ever sent in a POST body (never
in a URL, so it stays out of logs, history and referrers) and never stored by the console.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gantry.client.audit import head_from_pb
from gantry.client.subject_report import check_subject_report
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.pages.audit import audit_page, audit_trust, check_head, iso, time_window
from gantry.console.render import is_htmx, page
from gantry.core import GantryError, InvalidInput

router = APIRouter()

#: The most anomalies listed at once.
ANOMALY_LIMIT = 200
ANOMALY_STATES = ("raised", "acknowledged", "dismissed")
ANOMALY_KINDS = (
    "bulk_read",
    "first_sensitive_access",
    "denial_storm",
    "unusual_hour",
    "unusual_place",
    "raw_view_read",
)
#: Events of an anomaly linked one by one (the rest are counted).
EVENTS_SHOWN = 5
#: How far before an anomaly the "events around it" link searches.
AROUND_MS = 3_600_000
REPORT_LIMIT = 50
REPORT_PERIODS = ("daily", "weekly", "monthly", "custom")
#: Download formats of a compliance report and their content types.
REPORT_TYPES = {
    "pdf": "application/pdf",
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}
#: Headline figures of a report shown in the list (the rest are in its details).
HEADLINES = ("events", "reads_allowed", "reads_denied", "denials", "anomalies", "anomalies_open")


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object from a message field ({} when empty or not an object)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


# ----------------------------------------------------------------------------- anomalies


def _around(a: Any) -> str:
    """The search of the principal's events in the hour up to the anomaly."""
    return urlencode(
        {
            "actor": a.principal,
            "since": iso(max(a.time_ms - AROUND_MS, 1)),
            "until": iso(a.time_ms + 1000),
        }
    )


@router.get("/audit/anomalies", response_class=HTMLResponse)
def anomalies(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    state: str = "",
    principal: str = "",
    kind: str = "",
    since: str = "",
    until: str = "",
) -> HTMLResponse:
    """Access-behaviour anomalies, newest first, with the way to acknowledge or dismiss them."""
    state, principal, kind = state.strip(), principal.strip(), kind.strip()
    found: list[Any] = []
    problem: GantryError | None = None
    try:
        if state and state not in ANOMALY_STATES:
            raise InvalidInput(
                f"no anomaly state {state!r}", hint="pick raised, acknowledged or dismissed"
            )
        since_ms, until_ms = time_window(since, until)
    except InvalidInput as exc:
        problem = exc
    else:
        with apis.audit(viewer) as audit:
            found = audit.anomalies(
                state=state,
                principal=principal,
                kind=kind,
                since_ms=since_ms,
                until_ms=until_ms,
                limit=ANOMALY_LIMIT + 1,
            )
    rows = [
        {"a": a, "evidence": _json_object(a.evidence_json), "around": _around(a)}
        for a in found[:ANOMALY_LIMIT]
    ]
    back = "/audit/anomalies" + (f"?{request.url.query}" if request.url.query else "")
    return audit_page(
        request,
        viewer,
        "audit_anomalies.html",
        tab="anomalies",
        title="Anomalies",
        status_code=400 if problem else 200,
        rows=rows,
        more=len(found) > ANOMALY_LIMIT,
        limit=ANOMALY_LIMIT,
        state=state,
        principal=principal,
        kind=kind,
        since=since.strip(),
        until=until.strip(),
        states=ANOMALY_STATES,
        kinds=ANOMALY_KINDS,
        events_shown=EVENTS_SHOWN,
        back=back,
        problem=problem,
        may_resolve=viewer.may("resolve", "anomaly"),
        may_query=viewer.may("query", "audit_log"),
        may_prove=viewer.may("prove", "audit_log"),
    )


def _safe_back(back: str) -> str:
    """Back to the anomalies list (with its filters), never anywhere else."""
    if back.startswith("/audit/anomalies") and "//" not in back and "\\" not in back:
        return back
    return "/audit/anomalies"


@router.post("/audit/anomalies/{anomaly_id}")
def resolve(
    anomaly_id: str,
    viewer: ViewerDep,
    apis: ApisDep,
    state: str = Form(default=""),
    note: str = Form(default=""),
    back: str = Form(default=""),
) -> Response:
    """Acknowledge an anomaly (real, being handled) or dismiss it (not a problem: say why)."""
    viewer.require("resolve", "anomaly", anomaly_id)
    if state not in ("acknowledged", "dismissed"):
        raise InvalidInput(
            f"an anomaly can be acknowledged or dismissed, not {state!r}",
            hint="use the Acknowledge or Dismiss button",
        )
    if state == "dismissed" and not note.strip():
        raise InvalidInput(
            "say why the anomaly is dismissed",
            hint="write a note (it is kept with the anomaly and in the audit log)",
        )
    with apis.audit(viewer) as audit:
        audit.resolve_anomaly(anomaly_id, state, note.strip())
    return RedirectResponse(_safe_back(back), status_code=303)


# ----------------------------------------------------------------------------- data subjects


@router.get("/audit/subjects", response_class=HTMLResponse)
def subjects(request: Request, viewer: ViewerDep) -> HTMLResponse:
    """The data-subject report form (the identifier is sent by POST only)."""
    return audit_page(
        request,
        viewer,
        "audit_subjects.html",
        tab="subjects",
        title="Data subjects",
        doc=None,
        findings={},
        proofs={},
        check=None,
        problem=None,
        identifier="",
        reason="",
        may_report=viewer.may("query", "subject"),
        may_prove=viewer.may("prove", "audit_log"),
    )


@router.post("/audit/subjects", response_class=HTMLResponse)
def subject_report(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    identifier: str = Form(default=""),
    reason: str = Form(default=""),
    download: str = Form(default=""),
) -> Response:
    """The signed report of everything holding ``identifier``, checked here against the audit
    service's key; shown, or (``download=json``) saved as the signed JSON document."""
    viewer.require("query", "subject")
    identifier, reason = identifier.strip(), reason.strip()
    problem: InvalidInput | None = None
    if not identifier:
        problem = InvalidInput(
            "give the data subject's identifier",
            hint="the e-mail address or customer id as stored in a pii column",
        )
    elif not reason:
        problem = InvalidInput(
            "say why the report is asked for",
            hint="e.g. the request's ticket: DSAR-2041 (the reason is recorded in the audit log)",
        )
    doc: dict[str, Any] | None = None
    check = None
    if problem is None:
        with apis.audit(viewer) as audit:
            doc = audit.subject_report(identifier, reason=reason)
        check = check_subject_report(doc, audit_trust(apis))
        if download == "json":
            name = f"subject-report-{str(doc.get('report_id', 'x'))[:8]}.json"
            return Response(
                json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n",
                media_type="application/json",
                headers={"Content-Disposition": f'attachment; filename="{name}"'},
            )
    return audit_page(
        request,
        viewer,
        "audit_subjects.html",
        tab="subjects",
        title="Data-subject report",
        status_code=400 if problem else 200,
        doc=doc,
        findings=(doc or {}).get("findings", {}),
        proofs=(doc or {}).get("proofs", {}),
        check=check,
        problem=problem,
        identifier=identifier,
        reason=reason,
        may_report=True,
        may_prove=viewer.may("prove", "audit_log"),
    )


# ----------------------------------------------------------------------------- reports


@router.get("/audit/reports", response_class=HTMLResponse)
def reports(request: Request, viewer: ViewerDep, apis: ApisDep, period: str = "") -> HTMLResponse:
    """Stored compliance reports, newest first, to download in each format."""
    period = period.strip()
    if period and period not in REPORT_PERIODS:
        raise InvalidInput(f"no report period {period!r}", hint="daily, weekly, monthly or custom")
    with apis.audit(viewer) as audit:
        found = audit.reports(period=period, limit=REPORT_LIMIT)
    trust = audit_trust(apis)
    rows = [
        {
            "r": r,
            "summary": _json_object(r.summary_json),
            "head": check_head(head_from_pb(r.tree_head), trust),
        }
        for r in found
    ]
    return audit_page(
        request,
        viewer,
        "audit_reports.html",
        tab="reports",
        title="Compliance reports",
        rows=rows,
        period=period,
        periods=REPORT_PERIODS,
        headlines=HEADLINES,
        limit=REPORT_LIMIT,
        may_download=viewer.may("read", "report"),
        may_verify=viewer.may("verify", "report"),
        may_generate=viewer.may("create", "report"),
    )


@router.get("/audit/reports/{report_id}/download.{fmt}")
def download(report_id: str, fmt: str, viewer: ViewerDep, apis: ApisDep) -> Response:
    """A stored report's file (PDF, CSV or JSON) as a download."""
    viewer.require("read", "report", report_id)
    if fmt not in REPORT_TYPES:
        raise InvalidInput(f"no report format {fmt!r}", hint="pdf, csv or json")
    with apis.audit(viewer) as audit:
        data = audit.download_report(report_id, fmt)
    return Response(
        data,
        media_type=REPORT_TYPES[fmt],
        headers={"Content-Disposition": f'attachment; filename="report-{report_id[:8]}.{fmt}"'},
    )


@router.post("/audit/reports/{report_id}/verify", response_class=HTMLResponse)
def verify_report(
    report_id: str, request: Request, viewer: ViewerDep, apis: ApisDep
) -> HTMLResponse:
    """Have the service check a report's signatures, its tree head against today's log and
    its figures recomputed (a fragment for htmx, else a page)."""
    viewer.require("verify", "report", report_id)
    with apis.audit(viewer) as audit:
        result = audit.verify_report(report_id=report_id)
    if is_htmx(request):
        return page(
            request, viewer, "_audit_report_verify.html", result=result, report_id=report_id
        )
    return audit_page(
        request,
        viewer,
        "audit_report_verify.html",
        tab="reports",
        title=f"Report {report_id[:8]} verified" if result.ok else "Report NOT verified",
        result=result,
        report_id=report_id,
    )


@router.post("/audit/reports")
def generate(
    viewer: ViewerDep,
    apis: ApisDep,
    period: str = Form(default="daily"),
    since: str = Form(default=""),
    until: str = Form(default=""),
) -> Response:
    """Generate, sign and store a report now (scheduled ones are made on their own)."""
    viewer.require("create", "report")
    if period not in REPORT_PERIODS:
        raise InvalidInput(f"no report period {period!r}", hint="daily, weekly, monthly or custom")
    since_ms, until_ms = time_window(since, until)
    if period != "custom" and (since_ms or until_ms):
        raise InvalidInput(
            "from and until go with a custom period",
            hint="clear them, or pick the custom period",
        )
    if period == "custom" and not since_ms:
        raise InvalidInput(
            "a custom report needs a 'from' time", hint="e.g. 7d, or 2026-01-31T00:00:00Z"
        )
    if period == "custom" and not until_ms:
        until_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)  # up to now
    with apis.audit(viewer) as audit:
        audit.generate_report(period, since_ms=since_ms, until_ms=until_ms)
    return RedirectResponse("/audit/reports", status_code=303)


__all__ = ["router"]
