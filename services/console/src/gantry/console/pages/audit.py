"""Audit: search the tamper-evident log with every filter the API has (and export what was
found), who accessed a resource, and the log's integrity — the signed tree head, the server's
recomputation of the whole log, and inclusion proofs checked here, in the console, against the
audit service's public key (nothing the server says about a proof is taken on trust).

Anomalies, data-subject reports and compliance reports are in
:mod:`gantry.console.pages.audit_compliance`; the helpers both share (the sub-navigation, time
windows) are here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from gantry.client.audit import Filter, head_from_pb
from gantry.client.errors import RemoteNotFound
from gantry.console import charts
from gantry.console.apis import Apis
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.render import is_htmx, page
from gantry.console.viewer import Viewer
from gantry.core import GantryError, IntegrityError, InvalidInput
from gantry.events.catalog import catalog
from gantry.security.keyring import AUDIT_KID, Keyring
from gantry.security.keys import TrustStore
from gantry.security.merkle import leaf_hash, verify_inclusion
from gantry.security.treehead import TreeHead

router = APIRouter()

#: Rows per page of the search (the default, and the choices offered).
PAGE_SIZES = (50, 100, 200, 500)
DEFAULT_PAGE_SIZE = 100
#: Actors drawn in the access report's chart.
CHART_ACTORS = 20
_RELATIVE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class Tab:
    """One tab of the audit section: shown when the viewer may do any of ``needs``."""

    key: str
    title: str
    href: str
    needs: tuple[tuple[str, str], ...]


#: The audit section's tabs, in order.
TABS = (
    Tab("search", "Search", "/audit", (("query", "audit_log"),)),
    Tab("access", "Access report", "/audit/access", (("report", "audit_log"),)),
    Tab(
        "integrity",
        "Integrity",
        "/audit/integrity",
        (("checkpoint", "audit_log"), ("verify", "audit_log"), ("prove", "audit_log")),
    ),
    Tab("anomalies", "Anomalies", "/audit/anomalies", (("list", "anomaly"),)),
    Tab("subjects", "Subjects", "/audit/subjects", (("query", "subject"),)),
    Tab("reports", "Reports", "/audit/reports", (("list", "report"),)),
)


def tabs_for(viewer: Viewer) -> list[Tab]:
    """The tabs ``viewer`` may open."""
    return [t for t in TABS if viewer.may_any(list(t.needs))]


def audit_page(
    request: Request,
    viewer: Viewer,
    template: str,
    *,
    tab: str,
    title: str,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """A page of the audit section, with its tabs."""
    return page(
        request,
        viewer,
        template,
        section="audit",
        title=title,
        status_code=status_code,
        tabs=tabs_for(viewer),
        tab=tab,
        **context,
    )


# ----------------------------------------------------------------------------- input


def parse_time(text: str, what: str, *, now: dt.datetime | None = None) -> int:
    """Unix milliseconds for an ISO 8601 time (naive = UTC) or a span ago (``30m``, ``1h``,
    ``7d``, ``2w``); 0 for an empty field; :class:`InvalidInput` naming the field otherwise."""
    text = text.strip()
    if not text:
        return 0
    match = _RELATIVE.match(text)
    if match:
        current = now or dt.datetime.now(dt.UTC)
        delta = dt.timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])
        return int((current - delta).timestamp() * 1000)
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"{what}: {text!r} is not a time",
            hint="write an ISO 8601 time like 2026-01-31T12:00:00Z (UTC when no zone is given), "
            "or a span ago like 30m, 1h, 7d",
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def time_window(since: str, until: str) -> tuple[int, int]:
    """The ``since`` / ``until`` fields as Unix milliseconds (0 where empty), checked."""
    since_ms = parse_time(since, "from")
    until_ms = parse_time(until, "until")
    if since_ms and until_ms and since_ms >= until_ms:
        raise InvalidInput(
            f"the window is empty: from ({since}) is not before until ({until})",
            hint="pick a 'from' time earlier than the 'until' time",
        )
    return since_ms, until_ms


def iso(ms: int) -> str:
    """Unix milliseconds as ISO 8601 UTC (as the time fields accept it); '' for 0."""
    if not ms:
        return ""
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _values(params: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """A repeatable field: every value given, each split at commas and spaces, in order."""
    getlist = getattr(params, "getlist", None)
    raw: list[str] = list(getlist(name)) if getlist else [str(params.get(name, ""))]
    found = [v for text in raw for v in _SPLIT.split(text) if v]
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Search:
    """The search form: every filter of the audit API, as typed into the form."""

    types: tuple[str, ...] = ()
    actors: tuple[str, ...] = ()
    resource: str = ""
    action: str = ""
    decision: str = ""
    correlation_id: str = ""
    since: str = ""
    until: str = ""
    page_size: int = DEFAULT_PAGE_SIZE
    page: str = ""

    @classmethod
    def from_query(cls, params: Mapping[str, Any]) -> Search:
        """The form from a query string (nothing checked yet: see :meth:`to_filter`)."""

        def one(name: str) -> str:
            return str(params.get(name) or "").strip()

        size_text = one("page_size") or str(DEFAULT_PAGE_SIZE)
        try:
            size = int(size_text)
        except ValueError:
            size = -1
        return cls(
            types=_values(params, "type"),
            actors=_values(params, "actor"),
            resource=one("resource"),
            action=one("action"),
            decision=one("decision"),
            correlation_id=one("correlation_id"),
            since=one("since"),
            until=one("until"),
            page_size=size,
            page=one("page"),
        )

    def to_filter(self) -> Filter:
        """The audit API's filter; :class:`InvalidInput` saying which field is wrong."""
        if self.decision not in ("", "allow", "deny"):
            raise InvalidInput(
                f"outcome must be allow or deny, not {self.decision!r}",
                hint="pick 'any', 'allow' or 'deny'",
            )
        if self.page_size not in PAGE_SIZES:
            raise InvalidInput(
                "rows per page must be one of " + ", ".join(str(s) for s in PAGE_SIZES),
                hint="pick a page size from the list",
            )
        since_ms, until_ms = time_window(self.since, self.until)
        return Filter(
            actors=self.actors,
            types=self.types,
            resource=self.resource,
            action=self.action,
            decision=self.decision,
            correlation_id=self.correlation_id,
            since_ms=since_ms,
            until_ms=until_ms,
        )

    @property
    def filtered(self) -> bool:
        """Whether any filter is set."""
        return bool(
            self.types
            or self.actors
            or self.resource
            or self.action
            or self.decision
            or self.correlation_id
            or self.since
            or self.until
        )

    def query(self, **changes: Any) -> str:
        """The query string of this search (with ``changes``), empty fields left out;
        ``page_size`` and ``page`` only when they differ from the first page's."""
        values: dict[str, Any] = {
            "type": ",".join(self.types),
            "actor": ",".join(self.actors),
            "resource": self.resource,
            "action": self.action,
            "decision": self.decision,
            "correlation_id": self.correlation_id,
            "since": self.since,
            "until": self.until,
            "page_size": self.page_size,
            "page": self.page,
        }
        values.update(changes)
        if values["page_size"] == DEFAULT_PAGE_SIZE:
            values["page_size"] = ""
        return urlencode({k: v for k, v in values.items() if v not in ("", None)})

    def filters_query(self) -> str:
        """The query string of the filters alone (for an export: every page)."""
        return self.query(page_size="", page="")


def event_types() -> list[str]:
    """Event types known to the catalog (suggestions for the type field)."""
    return [spec.type for spec in catalog()]


# ----------------------------------------------------------------------------- search


@router.get("/audit", response_class=HTMLResponse)
def search(request: Request, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """Search the audit log: the filters, one page of records, the way to the next."""
    form = Search.from_query(request.query_params)
    records: list[Any] = []
    next_page = ""
    problem: GantryError | None = None
    try:
        flt = form.to_filter()
        with apis.audit(viewer) as audit:
            found = audit.page(flt, page_size=form.page_size, page_token=form.page)
    except InvalidInput as exc:  # a field, or the service on a filter or page token
        problem = exc
    else:
        records = list(found.records)
        next_page = found.next_page_token
    return audit_page(
        request,
        viewer,
        "audit.html",
        tab="search",
        title="Audit log",
        status_code=400 if problem else 200,
        form=form,
        records=records,
        next_page=next_page,
        problem=problem,
        page_sizes=PAGE_SIZES,
        types=event_types(),
        may_export=viewer.may("export", "audit_log"),
        may_prove=viewer.may("prove", "audit_log"),
    )


_EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def _export_stream(apis: Apis, viewer: Viewer, flt: Filter, fmt: str) -> Iterator[bytes]:
    """The export's chunks; the first is fetched before this returns, so a refusal or a bad
    filter is a page with its status rather than a broken download."""
    stack = contextlib.ExitStack()
    try:
        audit = stack.enter_context(apis.audit(viewer))
        chunks = iter(audit.export(flt, fmt=fmt))
        first = next(chunks, b"")
    except BaseException:
        stack.close()
        raise

    def body() -> Iterator[bytes]:
        with stack:
            if first:
                yield first
            yield from chunks

    return body()


@router.get("/audit/export.{fmt}")
def export(fmt: str, request: Request, viewer: ViewerDep, apis: ApisDep) -> Response:
    """The matching records (every page) as a CSV or JSON-lines download."""
    viewer.require("export", "audit_log")
    if fmt not in _EXPORT_TYPES:
        raise InvalidInput(
            f"cannot export as {fmt!r}", hint="use /audit/export.csv or /audit/export.jsonl"
        )
    flt = Search.from_query(request.query_params).to_filter()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return StreamingResponse(
        _export_stream(apis, viewer, flt, fmt),
        media_type=_EXPORT_TYPES[fmt],
        headers={"Content-Disposition": f'attachment; filename="audit-{stamp}.{fmt}"'},
    )


# ----------------------------------------------------------------------------- access report


@dataclass(frozen=True)
class ActorAccess:
    """One actor's accesses to the resource, over every action."""

    actor: str
    allowed: int
    denied: int


def access_chart(rows: list[Any]) -> Any:
    """Allowed and denied accesses per actor (the busiest :data:`CHART_ACTORS`)."""
    totals: dict[str, list[int]] = {}
    for r in rows:
        t = totals.setdefault(r.actor, [0, 0])
        t[0] += r.allowed
        t[1] += r.denied
    actors = sorted(totals, key=lambda a: (-sum(totals[a]), a))[:CHART_ACTORS]
    return charts.stacked_bars(
        actors,
        ["allowed", "denied"],
        [[float(v) for v in totals[a]] for a in actors],
        title="Accesses per actor",
        unit="",
        marked=[a for a in actors if totals[a][1]],
    )


@router.get("/audit/access", response_class=HTMLResponse)
def access(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    resource: str = "",
    since: str = "",
    until: str = "",
) -> HTMLResponse:
    """Who accessed a resource in a time window, how, how often allowed and denied."""
    resource, since, until = resource.strip(), since.strip(), until.strip()
    report = None
    chart = None
    problem: GantryError | None = None
    try:
        since_ms, until_ms = time_window(since, until)
    except InvalidInput as exc:
        problem = exc
    else:
        if resource:
            with apis.audit(viewer) as audit:
                report = audit.access_report(resource, since_ms, until_ms)
            chart = access_chart(list(report.rows)) if report.rows else None
    return audit_page(
        request,
        viewer,
        "audit_access.html",
        tab="access",
        title=f"Access to {resource}" if resource else "Access report",
        status_code=400 if problem else 200,
        resource=resource,
        since=since,
        until=until,
        report=report,
        chart=chart,
        problem=problem,
        may_query=viewer.may("query", "audit_log"),
    )


# ----------------------------------------------------------------------------- integrity


def audit_trust(apis: Apis) -> TrustStore:
    """The audit service's public key alone (``keys/trusted/svc-audit.pub``): tree heads and
    signed reports are checked against it, never against keys that only sign events."""
    return Keyring(apis.settings.keys_dir).tree_head_trust()


@dataclass
class Check:
    """One step of checking a proof: what was checked, whether it held, and why not."""

    what: str
    ok: bool
    detail: str = ""


@dataclass
class HeadView:
    """A signed tree head and whether its signature checked out here."""

    head: TreeHead
    signature_ok: bool
    problem: str = ""


@dataclass
class ProofView:
    """An inclusion proof as the server sent it, and each local check of it."""

    asked: str
    index: int
    head: TreeHead
    leaf: str
    path: list[str]
    event: dict[str, Any]
    event_text: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check held."""
        return all(c.ok for c in self.checks)


def check_head(head: TreeHead, trust: TrustStore) -> HeadView:
    """``head`` with its signature checked against the audit service's key."""
    try:
        head.check_signature(trust)
    except IntegrityError as exc:
        problem = exc.message
        if AUDIT_KID not in trust:
            problem += (
                f" (the console has no {AUDIT_KID}.pub in its keys/trusted directory: copy it "
                "there from the platform's data directory)"
            )
        return HeadView(head, False, problem)
    return HeadView(head, True)


def check_proof(
    proof: Any, trust: TrustStore, *, index: int | None, event_id: str | None
) -> ProofView:
    """Check an ``InclusionProofResponse`` here, step by step, trusting nothing the server
    said: the head's signature, the event's bytes against their leaf hash, the audit path
    against the signed root, and that the proven entry is the one asked for."""
    head = head_from_pb(proof.tree_head)
    raw = bytes(proof.event_json)
    try:
        event = json.loads(raw)
        if not isinstance(event, dict):
            raise ValueError("not a JSON object")
        text = json.dumps(event, indent=2, sort_keys=True)
    except ValueError as exc:
        event, text = {}, f"(the event bytes are not a JSON object: {exc})"
    path = [bytes(p) for p in proof.path]
    view = ProofView(
        asked=f"entry {index}" if index is not None else f"event {event_id}",
        index=proof.index,
        head=head,
        leaf=bytes(proof.leaf_hash).hex(),
        path=[p.hex() for p in path],
        event=event,
        event_text=text,
    )
    signed = check_head(head, trust)
    view.checks.append(
        Check(
            f"the tree head of size {head.tree_size} is signed by the audit service's key",
            signed.signature_ok,
            signed.problem,
        )
    )
    computed = leaf_hash(raw).hex()
    view.checks.append(
        Check(
            "the event's bytes hash to the proven leaf",
            computed == view.leaf,
            "" if computed == view.leaf else f"they hash to {computed}, not {view.leaf}",
        )
    )
    included = verify_inclusion(
        bytes(proof.leaf_hash), proof.index, head.tree_size, path, head.root_hash
    )
    view.checks.append(
        Check(
            f"the audit path ({len(path)} hashes) leads from leaf {proof.index} to the signed root",
            included,
            "" if included else "the path does not recompute the signed root hash",
        )
    )
    if index is not None:
        same = proof.index == index
        why = "" if same else f"asked for entry {index}, the server proved entry {proof.index}"
    else:
        same = event.get("id") == event_id
        why = "" if same else f"asked for event {event_id}, the proven event is {event.get('id')}"
    view.checks.append(Check("the proven entry is the one asked for", same, why))
    return view


def _proof_target(index: str, event_id: str) -> tuple[int | None, str | None]:
    """Which entry to prove: an index (a whole number) or an event id; (None, None) for none."""
    index, event_id = index.strip(), event_id.strip()
    if index:
        if not index.isdigit():
            raise InvalidInput(
                f"entry {index!r} is not an index", hint="give the entry's index: 0, 1, 2, ..."
            )
        return int(index), None
    if event_id:
        return None, event_id
    return None, None


def integrity_context(
    viewer: Viewer, apis: Apis, *, index: str = "", event_id: str = ""
) -> dict[str, Any]:
    """What the integrity page shows: the signed head (checked), and a proof when asked."""
    trust = audit_trust(apis)
    head: HeadView | None = None
    head_error: GantryError | None = None
    proof: ProofView | None = None
    proof_error: GantryError | None = None
    want_index, want_event = None, None
    try:
        want_index, want_event = _proof_target(index, event_id)
    except InvalidInput as exc:
        proof_error = exc
    with apis.audit(viewer) as audit:
        if viewer.may("checkpoint", "audit_log"):
            try:
                head = check_head(audit.checkpoint(), trust)
            except RemoteNotFound:
                head = None  # no checkpoint yet: the page says so
            except GantryError as exc:
                head_error = exc
        if want_index is not None or want_event is not None:
            try:
                raw = audit.inclusion_proof(index=want_index, event_id=want_event)
                proof = check_proof(raw, trust, index=want_index, event_id=want_event)
            except GantryError as exc:
                proof_error = exc
    return {
        "head": head,
        "head_error": head_error,
        "proof": proof,
        "proof_error": proof_error,
        "index": index.strip(),
        "event_id": event_id.strip(),
        "may_verify": viewer.may("verify", "audit_log"),
        "may_prove": viewer.may("prove", "audit_log"),
        "may_checkpoint": viewer.may("checkpoint", "audit_log"),
        "may_query": viewer.may("query", "audit_log"),
    }


@router.get("/audit/integrity", response_class=HTMLResponse)
def integrity(
    request: Request,
    viewer: ViewerDep,
    apis: ApisDep,
    index: str = "",
    event_id: str = "",
) -> HTMLResponse:
    """The signed tree head, the button to verify the whole log, an entry's inclusion proof."""
    ctx = integrity_context(viewer, apis, index=index, event_id=event_id)
    bad_input = isinstance(ctx["proof_error"], InvalidInput)
    return audit_page(
        request,
        viewer,
        "audit_integrity.html",
        tab="integrity",
        title="Integrity of the audit log",
        status_code=400 if bad_input else 200,
        verify=None,
        latest=None,
        **ctx,
    )


@router.post("/audit/verify", response_class=HTMLResponse)
def verify(request: Request, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """Have the service recompute the whole log from its stored events; show what it found
    (a fragment for htmx, else the integrity page with the result)."""
    viewer.require("verify", "audit_log")
    with apis.audit(viewer) as audit:
        result = audit.verify()
    latest = (
        check_head(head_from_pb(result.latest), audit_trust(apis))
        if result.latest.tree_size
        else None
    )
    if is_htmx(request):
        return page(request, viewer, "_audit_verify.html", verify=result, latest=latest)
    ctx = integrity_context(viewer, apis)
    return audit_page(
        request,
        viewer,
        "audit_integrity.html",
        tab="integrity",
        title="Integrity of the audit log",
        verify=result,
        latest=latest,
        **ctx,
    )


__all__ = [
    "TABS",
    "Check",
    "HeadView",
    "ProofView",
    "Search",
    "Tab",
    "audit_page",
    "audit_trust",
    "check_head",
    "check_proof",
    "iso",
    "parse_time",
    "router",
    "tabs_for",
    "time_window",
]
