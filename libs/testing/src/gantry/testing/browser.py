"""Real headless Chromium for the console's browser tests, driven by Playwright.

Chromium is the system's (Debian's ``chromium`` package; ``make test`` installs it), started by
Playwright through ``executable_path``: nothing is downloaded at test time. :class:`ConsoleTab`
is one logged-in tab: it records every console error and failed request of the pages it opens,
times each navigation and saves screenshots for review under a git-ignored folder.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright

#: Where the screenshots of the browser tests go (git-ignored).
SCREENSHOTS = Path(os.environ.get("GANTRY_SCREENSHOTS", "test-artifacts/console"))

#: Chromium's flags for a closed network and no screen (no background connections, no GPU).
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
)


class NoBrowser(RuntimeError):
    """Chromium is not installed."""


def chromium_path() -> str:
    """The system Chromium (``GANTRY_CHROMIUM`` overrides); :class:`NoBrowser` when absent."""
    configured = os.environ.get("GANTRY_CHROMIUM", "")
    for candidate in (configured, "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    raise NoBrowser(
        "no Chromium on this machine: install Debian's 'chromium' package "
        "('make test' does: apt-get install -y chromium) or set GANTRY_CHROMIUM"
    )


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium for the duration of the block."""
    path = chromium_path()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class ConsoleTab:
    """One browser tab on the console, logged in as one viewer."""

    page: Page
    base_url: str
    name: str
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("requestfailed", self._failed)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            text = message.text
            # a refusal or rejected input the page shows on purpose is not a broken page; a
            # missing asset (404) or a server error is
            if any(f"status of {code}" in text for code in (400, 401, 403, 409)):
                return
            where = message.location.get("url", "") if message.location else ""
            self.errors.append(f"console error on {self.page.url}: {text} ({where})")

    def _failed(self, request: Request) -> None:
        failure = request.failure or ""
        if "ERR_ABORTED" in failure:  # navigations that replaced a pending fragment
            return
        self.errors.append(f"request failed: {request.url} {failure}")

    def login(self, token: str) -> None:
        """Log in through the login form with ``token``."""
        self.page.goto(f"{self.base_url}/login")
        self.page.fill("#token", token)
        with self.page.expect_navigation():
            self.page.click("button[type=submit]")

    def open(self, path: str, *, key: str = "") -> float:
        """Open ``path``; return (and remember under ``key``) the seconds until it loaded."""
        started = time.perf_counter()
        response = self.page.goto(f"{self.base_url}{path}", wait_until="load")
        elapsed = time.perf_counter() - started
        if response is not None and response.status >= 500:
            self.errors.append(f"{path}: HTTP {response.status}")
        self.timings[key or path] = elapsed
        return elapsed

    def status(self, path: str) -> int:
        """The HTTP status of opening ``path`` (no timing)."""
        response = self.page.goto(f"{self.base_url}{path}", wait_until="load")
        return response.status if response is not None else 0

    def shot(self, name: str) -> Path:
        """Save a full-page screenshot ``<viewer>-<name>.png``; return its path."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.name}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@contextmanager
def console_tab(browser: Browser, base_url: str, name: str, token: str) -> Iterator[ConsoleTab]:
    """A fresh browser context (its own cookies) logged in with ``token``."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        tab = ConsoleTab(context.new_page(), base_url.rstrip("/"), name)
        tab.login(token)
        yield tab
    finally:
        context.close()


__all__ = [
    "CHROMIUM_ARGS",
    "SCREENSHOTS",
    "ConsoleTab",
    "NoBrowser",
    "chromium",
    "chromium_path",
    "console_tab",
]
