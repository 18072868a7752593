"""Fixtures of the console's unit tests: a data dir with keys, tokens per role, and the console
application served in process (TestClient) over APIs the test provides (plain objects standing
in for the services; the browser tests in tests/console/ run the real platform)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gantry.client.admin import create_token, init
from gantry.console.app import build_app
from gantry.console.settings import ConsoleOptions, ConsoleSettings
from gantry.testing.console import ORIGIN, FakeApis


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    init(d)
    return d


@pytest.fixture
def console(data_dir: Path) -> Iterator[tuple[TestClient, FakeApis, Callable[..., str]]]:
    """``(client, apis, login)``: ``login("who", "role", ...)`` logs the client in."""
    settings = ConsoleSettings(data_dir=data_dir, console=ConsoleOptions())
    app = build_app(settings)
    apis = FakeApis(settings)
    app.state.apis = apis
    client = TestClient(app, base_url=ORIGIN, follow_redirects=False)

    def login(who: str, *roles: str) -> str:
        token = create_token(data_dir, who, list(roles), dt.timedelta(hours=1))
        reply = client.post(
            "/login", data={"token": token, "next": "/"}, headers={"origin": ORIGIN}
        )
        assert reply.status_code == 303, reply.text
        return token

    with client:
        yield client, apis, login
