"""The console's web application: login, the sections' pages, static assets, health.

Security: the token lives only in an HttpOnly, SameSite=Strict cookie (Secure behind https);
every state-changing request must come from the console's own origin (the ``Origin`` or
``Referer`` header is checked), pages forbid framing and any script not served by the console
(Content-Security-Policy), and htmx runs with ``eval`` off.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Awaitable, Callable
from importlib import resources
from urllib.parse import quote, urlsplit

from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.base import BaseHTTPMiddleware

from gantry.console.apis import Apis
from gantry.console.deps import LoginRequired, ViewerDep
from gantry.console.render import error_page, is_htmx, page, sections_for
from gantry.console.viewer import COOKIE, Gatekeeper
from gantry.core import GantryError, InvalidInput, NotFound, Unauthenticated
from gantry.core.logging import get_logger

_log = get_logger(__name__)

#: The page modules (``gantry.console.pages.<name>``), each with a ``router``.
PAGES = ("cluster", "jobs", "data", "models", "workflows", "audit", "audit_compliance")

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'; object-src 'none'"
)
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _same_origin(request: Request) -> bool:
    """True when a state-changing request comes from a page of this console."""
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    if not source:
        return False
    host = request.headers.get("host", "")
    return urlsplit(source).netloc == host


class Guard(BaseHTTPMiddleware):
    """Same-origin check on writes; security headers on every answer."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.method in _UNSAFE and not _same_origin(request):
            _log.warning("cross-origin write refused", path=request.url.path)
            return PlainTextResponse(
                "refused: this request did not come from a page of the console "
                "(reload the console and try again)",
                status_code=403,
            )
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Cache-Control", "no-store")
        return response


def _safe_next(target: str) -> str:
    """Only a path on this console (never another site) after login."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def create_app(gatekeeper: Gatekeeper, apis: Apis, *, secure_cookie: bool = False) -> FastAPI:
    """The console as an ASGI application."""
    app = FastAPI(title="Gantry console", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gatekeeper = gatekeeper
    app.state.apis = apis
    app.state.ready = True
    app.add_middleware(Guard)
    static = resources.files("gantry.console") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    def _to_login(request: Request, reason: str, *, forget: bool) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        where = f"/login?next={quote(target)}&why={quote(reason)}"
        response: Response
        if is_htmx(request):
            response = Response(status_code=401, headers={"HX-Redirect": where})
        else:
            response = RedirectResponse(where, status_code=303)
        if forget:
            response.delete_cookie(COOKIE, path="/")
        return response

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> Response:
        return _to_login(request, exc.reason, forget=False)

    @app.exception_handler(GantryError)
    async def _gantry(request: Request, exc: GantryError) -> Response:
        if isinstance(exc, Unauthenticated):  # a service refused the token (e.g. revoked)
            _log.info("a service refused the viewer's token", reason=exc.message)
            return _to_login(
                request, f"the platform refused your token: {exc.message}", forget=True
            )
        return error_page(request, getattr(request.state, "viewer", None), exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        viewer = getattr(request.state, "viewer", None)
        if exc.status_code == 404:
            error: GantryError = NotFound(
                "page", request.url.path, hint="there is no such page: use the navigation"
            )
        else:
            error = InvalidInput(f"{request.method} {request.url.path}: {exc.detail}")
        response = error_page(request, viewer, error)
        response.status_code = exc.status_code
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'input'}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        error = InvalidInput(
            f"this request has bad input: {problems}", hint="correct it and send it again"
        )
        return error_page(request, getattr(request.state, "viewer", None), error)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        ok = bool(app.state.ready)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/", why: str = "") -> HTMLResponse:
        return page(request, None, "login.html", title="Log in", next=_safe_next(next), why=why)

    @app.post("/login", response_class=HTMLResponse)
    def login(
        request: Request, token: str = Form(default=""), next: str = Form(default="/")
    ) -> Response:
        try:
            viewer = gatekeeper.viewer(token)
        except Unauthenticated as exc:
            _log.info("console login refused", reason=exc.message)
            return page(
                request,
                None,
                "login.html",
                title="Log in",
                next=_safe_next(next),
                why=str(exc),
                status_code=401,
            )
        _log.info("console login", subject=viewer.subject, roles=list(viewer.roles))
        response = RedirectResponse(_safe_next(next), status_code=303)
        left = (viewer.expires_at - dt.datetime.now(dt.UTC)).total_seconds()
        response.set_cookie(
            COOKIE,
            viewer.token,
            max_age=max(1, int(min(left, apis.settings.console.session_hours * 3600))),
            httponly=True,
            samesite="strict",
            secure=secure_cookie,
            path="/",
        )
        return response

    @app.post("/logout")
    def logout() -> Response:
        response = RedirectResponse("/login?why=logged+out", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request, viewer: ViewerDep) -> Response:
        allowed = sections_for(viewer)
        if allowed:
            return RedirectResponse(allowed[0].href, status_code=303)
        return page(request, viewer, "empty.html", title="Nothing to show")

    @app.get("/me", response_class=HTMLResponse)
    def me(request: Request, viewer: ViewerDep) -> HTMLResponse:
        return page(request, viewer, "me.html", title="Your login")

    for name in PAGES:
        module = importlib.import_module(f"gantry.console.pages.{name}")
        app.include_router(module.router)
    return app


__all__ = ["PAGES", "create_app"]
