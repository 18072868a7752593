"""The console's own behaviour: login, sections by role, same-origin writes, headers, errors."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from fastapi.testclient import TestClient

from gantry.client.admin import create_token
from gantry.client.scheduler import NodeInfo, QueueInfo, Resources
from gantry.core import PermissionDenied, Unavailable
from gantry.testing.console import ORIGIN, Closing, FakeApis


def test_pages_need_a_login_and_say_why(console: tuple[TestClient, FakeApis, object]) -> None:
    client, _apis, _login = console
    reply = client.get("/cluster")
    assert reply.status_code == 303
    assert reply.headers["location"].startswith("/login?next=/cluster")
    htmx = client.get("/cluster", headers={"hx-request": "true"})
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"].startswith("/login")


def test_a_bad_token_is_refused_with_the_reason(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, _apis, _login = console
    reply = client.post("/login", data={"token": "not-a-token"}, headers={"origin": ORIGIN})
    assert reply.status_code == 401
    assert "gantry_console" not in reply.cookies
    assert "Log in" in reply.text


def test_an_expired_token_sends_the_viewer_back_to_login(
    console: tuple[TestClient, FakeApis, object], data_dir: Path
) -> None:
    client, _apis, _login = console
    from gantry.client.admin import keyring
    from gantry.core.clock import ManualClock
    from gantry.security.tokens import TokenIssuer

    yesterday = ManualClock(dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    old = TokenIssuer(keyring(data_dir).issuer(), clock=yesterday).issue(
        "ada", ["platform-admin"], dt.timedelta(hours=1)
    )
    reply = client.post("/login", data={"token": old}, headers={"origin": ORIGIN})
    assert reply.status_code == 401
    assert "expired" in reply.text.lower()


def test_each_role_sees_only_its_sections(console: tuple[TestClient, FakeApis, object]) -> None:
    client, _apis, login = console
    expected = {
        "auditor": {"audit"},
        "ml-developer": {"cluster", "jobs", "data", "models", "workflows"},
        "data-steward": {"data"},
        "platform-admin": {"cluster", "jobs", "data", "models", "workflows", "audit"},
    }
    for role, sections in expected.items():
        login(f"user-{role}", role)
        me = client.get("/me")
        assert me.status_code == 200
        assert f"user-{role}" in me.text
        shown = {k for k in expected["platform-admin"] if f'data-section="{k}"' in me.text}
        assert shown == sections, (role, shown)
    login("model-app", "model-consumer")
    home = client.get("/")
    assert home.status_code == 200 and "Nothing to show" in home.text


def test_a_write_from_another_site_is_refused(console: tuple[TestClient, FakeApis, object]) -> None:
    client, apis, login = console
    login("ada", "platform-admin")
    apis.factories["profiler"] = lambda viewer: Closing(object())
    for headers in ({"origin": "http://evil.example"}, {}):
        reply = client.post(
            "/cluster/nodes/n1/health", data={"degraded": "true", "reason": "x"}, headers=headers
        )
        assert reply.status_code == 403
        assert "did not come from a page of the console" in reply.text
    assert apis.calls == []


def test_security_headers_and_an_http_only_strict_cookie(
    console: tuple[TestClient, FakeApis, object], data_dir: Path
) -> None:
    client, _apis, _login = console
    token = create_token(data_dir, "ada", ["auditor"], dt.timedelta(hours=1))
    reply = client.post("/login", data={"token": token}, headers={"origin": ORIGIN})
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/login")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"


def test_login_never_redirects_to_another_site(
    console: tuple[TestClient, FakeApis, object], data_dir: Path
) -> None:
    client, _apis, _login = console
    token = create_token(data_dir, "ada", ["auditor"], dt.timedelta(hours=1))
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil"):
        reply = client.post(
            "/login", data={"token": token, "next": target}, headers={"origin": ORIGIN}
        )
        assert reply.headers["location"] == "/"


def test_a_service_identity_cannot_log_in(
    console: tuple[TestClient, FakeApis, object], data_dir: Path
) -> None:
    from gantry.client.admin import create_service_account

    client, _apis, _login = console
    token, _key = create_service_account(data_dir, "feature-store")
    reply = client.post("/login", data={"token": token}, headers={"origin": ORIGIN})
    assert reply.status_code == 401


class _Sched:
    def __init__(self) -> None:
        self.nodes_called = 0

    def nodes(self) -> list[NodeInfo]:
        self.nodes_called += 1
        return [
            NodeInfo(
                name="n1",
                pool="default",
                state="ready",
                cpu_milli=4000,
                cpu_free_milli=1000,
                memory_mib=1000,
                memory_free_mib=500,
            )
        ]

    def queues(self) -> list[QueueInfo]:
        return [
            QueueInfo(
                name="research",
                quota=Resources(4, 8, 1000),
                used=Resources(1, 2, 100),
                running=1,
                pending=2,
                dominant_share=0.25,
            )
        ]


class _Prof:
    def nodes(self) -> tuple[list[object], object]:
        raise Unavailable("the profiler is not reachable", hint="start it")

    def set_node_health(self, node: str, *, degraded: bool, reason: str) -> object:
        raise PermissionDenied("dev", "update", f"node {node}", reason="the stand-in refuses")


def test_the_cluster_page_shows_nodes_and_queues_and_survives_a_missing_profiler(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, apis, login = console
    apis.factories["scheduler"] = lambda viewer: Closing(_Sched())
    apis.factories["profiler"] = lambda viewer: Closing(_Prof())
    login("dev", "ml-developer")
    page = client.get("/cluster")
    assert page.status_code == 200
    assert 'data-node="n1"' in page.text and 'data-queue="research"' in page.text
    assert "the profiler is not reachable" in page.text  # shown, not a failed page
    assert "Mark degraded" not in page.text  # an ml-developer may not update nodes


def test_a_refused_action_is_a_403_page_not_a_traceback(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, apis, login = console
    apis.factories["profiler"] = lambda viewer: Closing(_Prof())
    login("dev", "ml-developer")
    reply = client.post(
        "/cluster/nodes/n1/health",
        data={"degraded": "true", "reason": "x"},
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 403
    assert "Refused" in reply.text and "Traceback" not in reply.text
    login("ada", "platform-admin")
    reply = client.post(
        "/cluster/nodes/n1/health",
        data={"degraded": "true", "reason": "x"},
        headers={"origin": ORIGIN},
    )
    assert reply.status_code == 403  # the service refused it (here: the stand-in)


def test_the_cluster_page_is_refused_to_a_role_that_may_not_see_nodes(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, apis, login = console
    apis.factories["scheduler"] = lambda viewer: Closing(_Sched())
    login("ida", "auditor")
    reply = client.get("/cluster")
    assert reply.status_code == 403 and "Refused" in reply.text
    assert apis.calls == []


def test_an_unknown_page_and_bad_input_are_pages_that_say_so(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, _apis, login = console
    login("ada", "platform-admin")
    missing = client.get("/no/such/page")
    assert missing.status_code == 404
    assert "page &#39;/no/such/page&#39; not found" in missing.text and "<html" in missing.text
    wrong = client.get("/logout")  # only POST logs out
    assert wrong.status_code == 405 and "<html" in wrong.text


class _Revoked:
    def nodes(self) -> list[NodeInfo]:
        from gantry.core import Unauthenticated

        raise Unauthenticated("token 01ab was revoked: laptop stolen")

    queues = nodes


def test_a_token_the_services_refuse_ends_the_login_with_the_reason(
    console: tuple[TestClient, FakeApis, object],
) -> None:
    client, apis, login = console
    apis.factories["scheduler"] = lambda viewer: Closing(_Revoked())
    apis.factories["profiler"] = lambda viewer: Closing(_Prof())
    login("dev", "ml-developer")
    reply = client.get("/cluster")
    assert reply.status_code == 303
    assert reply.headers["location"].startswith("/login?next=/cluster&why=")
    assert "revoked" in reply.headers["location"]
    assert 'gantry_console=""' in reply.headers["set-cookie"]  # the cookie is dropped
    htmx = client.get("/cluster", headers={"hx-request": "true"})
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"].startswith("/login")
