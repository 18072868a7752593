"""Rendering pages: the templates, the navigation a viewer may see, errors as pages.

Every page is a full HTML document extending ``base.html``; a request made by htmx
(``HX-Request``) for a fragment gets only that fragment's template. Errors from the services
(:class:`~gantry.core.GantryError`) become a page or fragment that says what went wrong and
what to do, with the HTTP status that matches (403 for a refusal, 404, 400, 503).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from gantry.console.viewer import Viewer
from gantry.core import (
    AlreadyExists,
    Conflict,
    GantryError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)


@dataclass(frozen=True)
class Section:
    """One entry of the navigation bar: shown when the viewer may do any of ``needs``."""

    key: str
    title: str
    href: str
    needs: tuple[tuple[str, str], ...]


#: The console's sections, in navigation order.
SECTIONS = (
    Section("cluster", "Cluster", "/cluster", (("list", "node"), ("list", "queue"))),
    Section("jobs", "Jobs", "/jobs", (("list", "job"),)),
    Section("data", "Data", "/data", (("list", "dataset"),)),
    Section("models", "Models", "/models", (("list", "model"),)),
    Section(
        "workflows",
        "Workflows",
        "/workflows",
        (("list", "pipeline"), ("list", "experiment"), ("list", "devsession")),
    ),
    Section("audit", "Audit", "/audit", (("query", "audit_log"),)),
)


def sections_for(viewer: Viewer) -> list[Section]:
    """The sections ``viewer`` may open."""
    return [s for s in SECTIONS if viewer.may_any(list(s.needs))]


def _when(value: Any) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` UTC ('' for none): a datetime, or Unix seconds
    or milliseconds (numbers above 10^11 are taken as milliseconds)."""
    if value is None or value == "" or value == 0:
        return ""
    when: dt.datetime
    if isinstance(value, (int, float)):
        seconds = value / 1000 if abs(value) > 1e11 else value
        when = dt.datetime.fromtimestamp(seconds, dt.UTC)
    elif isinstance(value, dt.datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    else:
        return str(value)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: Any) -> str:
    """Seconds as ``1h 02m``, ``3m 05s`` or ``4.2s``."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return ""
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gantry.console", "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    return env


templates = Jinja2Templates(env=_environment())


def is_htmx(request: Request) -> bool:
    """True for a request htmx made (it wants a fragment, not a page)."""
    return request.headers.get("hx-request") == "true"


def page(
    request: Request,
    viewer: Viewer | None,
    template: str,
    *,
    section: str = "",
    title: str = "",
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """Render ``template`` for ``viewer`` (its navigation included)."""
    return templates.TemplateResponse(
        request,
        template,
        {
            "viewer": viewer,
            "sections": sections_for(viewer) if viewer is not None else [],
            "section": section,
            "title": title,
            **context,
        },
        status_code=status_code,
    )


def status_of(error: GantryError) -> int:
    """The HTTP status that matches ``error``."""
    if isinstance(error, Unauthenticated):
        return 401
    if isinstance(error, PermissionDenied):
        return 403
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, (AlreadyExists, Conflict)):
        return 409
    if isinstance(error, InvalidInput):
        return 400
    if isinstance(error, Unavailable):
        return 503
    # a service's refusal or not-found arrives as the client's RemotePermissionDenied or
    # RemoteNotFound: known by its gRPC code, not its class
    return {"PERMISSION_DENIED": 403, "NOT_FOUND": 404}.get(error.grpc_code, 500)


def error_page(request: Request, viewer: Viewer | None, error: GantryError) -> HTMLResponse:
    """``error`` as a page (or, for htmx, a fragment) that says what to do."""
    status = status_of(error)
    template = "_error.html" if is_htmx(request) else "error.html"
    return page(
        request,
        viewer,
        template,
        title="Refused" if status == 403 else "Something went wrong",
        status_code=status,
        error=error,
        refused=status == 403,
    )


__all__ = ["SECTIONS", "Section", "error_page", "is_htmx", "page", "sections_for", "templates"]
