"""Transport security on the whole embedded platform: token revocation reaches every service,
and the services' NATS users cannot forge each other's events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats.errors
import pytest

from gantry.client import cli
from gantry.client.audit import AuditClient, Filter
from gantry.client.errors import RemotePermissionDenied
from gantry.client.governance import GovernanceClient
from gantry.client.profiler import ProfilerClient
from gantry.client.scheduler import SchedulerClient
from gantry.client.serving import ServingClient
from gantry.client.workflows import WorkflowsClient
from gantry.core import NatsSettings, Unauthenticated
from gantry.events import Bus
from gantry.events.nats_auth import password_of, read_credentials
from gantry.supervisor.platform import Platform
from tests.conftest import token_for

pytestmark = pytest.mark.timeout(180)


def _once(client: Any, method: str) -> Any:
    with client as c:
        return getattr(c, method)()


def _calls(platform: Platform, token: str) -> dict[str, Callable[[], Any]]:
    """One authenticated read per service."""
    a = platform.address
    return {
        "scheduler": lambda: _once(SchedulerClient(a("scheduler"), token), "list"),
        "governance": lambda: _once(GovernanceClient(a("governance"), token), "list_datasets"),
        "serving": lambda: _once(ServingClient(a("serving"), token), "list"),
        "profiler": lambda: _once(ProfilerClient(a("profiler"), token), "nodes"),
        "workflows": lambda: _once(WorkflowsClient(a("workflows"), token), "list"),
    }


def test_a_revoked_token_is_refused_by_every_service(
    platform: Platform, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = token_for(platform, "rita-revoked", ["platform-admin"])
    other = token_for(platform, "otto-other", ["platform-admin"])
    for call in _calls(platform, dev).values():
        call()  # works before

    admin = token_for(platform, "ada-admin", ["platform-admin"])
    capsys.readouterr()
    code = cli.main(
        ["admin", "token", "revoke", dev, "--reason", "laptop stolen",
         "--data-dir", str(platform.data_dir), "--token", admin]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "rita-revoked" in out.out and "revoked" in out.out

    deadline = time.monotonic() + 5
    refused: dict[str, str] = {}
    while time.monotonic() < deadline and len(refused) < 5:
        for name, call in _calls(platform, dev).items():
            if name in refused:
                continue
            try:
                call()
            except Unauthenticated as exc:
                refused[name] = str(exc)
        time.sleep(0.1)
    assert set(refused) == {"scheduler", "governance", "serving", "profiler", "workflows"}
    assert all("laptop stolen" in why for why in refused.values()), refused
    with AuditClient(platform.address("audit"), dev) as client, pytest.raises(Unauthenticated):
        list(client.query(Filter(types=["gantry.authz.token.revoked"])))
    for call in _calls(platform, other).values():
        call()  # other tokens are untouched

    with AuditClient(platform.address("audit"), admin) as client:
        listed = [r.subject for r in client.revoked_tokens()]
        assert "rita-revoked" in listed
        deadline = time.monotonic() + 10
        recorded: list[Any] = []
        while not recorded and time.monotonic() < deadline:
            recorded = list(client.query(Filter(types=["gantry.authz.token.revoked"])))
            time.sleep(0.2)
        assert recorded, "the revocation is in the audit log"


def test_only_platform_admins_may_revoke(platform: Platform) -> None:
    auditor = token_for(platform, "aud-itor", ["auditor"])
    victim = token_for(platform, "vic-tim", ["ml-developer"])
    with (
        AuditClient(platform.address("audit"), auditor) as client,
        pytest.raises(RemotePermissionDenied),
    ):
        client.revoke_token(token=victim, reason="not mine to revoke")
    _once(SchedulerClient(platform.address("scheduler"), victim), "list")  # still valid


def test_a_node_agent_cannot_forge_a_scheduling_decision_on_the_platform(
    platform: Platform,
) -> None:
    creds = read_credentials(platform.data_dir / "nats" / "credentials.env")

    async def forge() -> tuple[bool, list[str]]:
        bus = await Bus.connect(
            NatsSettings(
                url=platform.nats_url,
                user="training-agent",
                password=password_of(creds, "training-agent"),
                api_timeout_s=1.0,
            ),
            name="forger",
        )
        try:
            try:
                await bus.js.publish("gantry.job.scheduled", b"{}", timeout=1.0)
                stored = True
            except (nats.errors.TimeoutError, TimeoutError):
                stored = False
            await asyncio.sleep(0.2)
            return stored, list(bus.denied)
        finally:
            await bus.close()

    stored, denied = asyncio.run(forge())
    assert not stored
    assert any("gantry.job.scheduled" in d for d in denied), denied
    admin = token_for(platform, "ada-admin", ["platform-admin"])
    _once(SchedulerClient(platform.address("scheduler"), admin), "list")  # carries on
