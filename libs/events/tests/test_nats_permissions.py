"""Per-service NATS users against a real nats-server: NATS itself refuses what a user may not do.

The server runs with the authorization block written from the catalog (render_auth_conf), the
passwords from a credentials file made by ensure_credentials — the same path every deployment
takes.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import api

from gantry.core import ConfigError, NatsSettings
from gantry.events import Bus
from gantry.events.catalog import catalog
from gantry.events.nats_auth import ensure_credentials, password_of, render_auth_conf
from gantry.events.streams import STREAMS, stream_for_type
from gantry.events.topology import (
    CONSUMERS,
    PER_NODE,
    SERVICE_USERS,
    USERS,
    env_name,
    permissions,
    published_types,
    readable_streams,
)
from gantry.supervisor.nats_server import NatsServer


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NatsServer, dict[str, str]]]:
    root = tmp_path_factory.mktemp("secured")
    creds = ensure_credentials(root / "credentials.env")
    server = NatsServer(
        root / "nats", auth_conf=render_auth_conf(), env=creds, sync_always=True
    ).start()
    try:
        yield server, creds
    finally:
        server.stop()


async def _bus(server: NatsServer, creds: dict[str, str], user: str) -> Bus:
    settings = NatsSettings(
        url=server.url, user=user, password=password_of(creds, user), api_timeout_s=1.0
    )
    return await Bus.connect(settings, name=f"test-{user}")


@pytest.fixture
async def admin(secured: tuple[NatsServer, dict[str, str]]) -> AsyncIterator[Bus]:
    server, creds = secured
    bus = await _bus(server, creds, "admin")
    await bus.ensure_streams()
    yield bus
    await bus.close()


def _count(info: api.StreamInfo) -> int:
    return int(info.state.messages)


async def _refused(bus: Bus, subject: str, before: int) -> bool:
    """Whether the server reported a permissions violation naming ``subject`` since ``before``."""
    for _ in range(40):
        if any(subject.lower() in d.lower() for d in bus.denied[before:]):
            return True
        await asyncio.sleep(0.025)
    return False


def test_credentials_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "nats" / "credentials.env"
    first = ensure_credentials(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert set(first) == {env_name(u) for u in USERS}
    assert len(set(first.values())) == len(USERS)  # one password each
    assert ensure_credentials(path) == first  # kept, not regenerated
    text = path.read_text()
    path.write_text("\n".join(line for line in text.splitlines() if "AUDIT" not in line) + "\n")
    again = ensure_credentials(path)
    assert again[env_name("audit")] != first[env_name("audit")]  # the missing one is added
    assert again[env_name("scheduler")] == first[env_name("scheduler")]


def test_auth_conf_holds_no_password_and_names_every_user(tmp_path: Path) -> None:
    creds = ensure_credentials(tmp_path / "c.env")
    conf = render_auth_conf()
    for user in USERS:
        assert f'user: "{user}"' in conf
        assert f"password: ${env_name(user)}" in conf
    for secret in creds.values():
        assert secret not in conf


def test_every_catalog_type_has_a_publisher_and_a_stream() -> None:
    for spec in catalog():
        assert spec.publishers, spec.type
        assert set(spec.publishers) <= set(USERS), spec.type
        assert stream_for_type(spec.type)


def test_agent_permissions_are_narrow() -> None:
    perms = permissions("training-agent")
    assert perms is not None
    assert "gantry.job.scheduled" not in perms.publish
    assert "gantry.node.registered" in perms.publish
    assert readable_streams("training-agent") == ("JOBS",)
    assert not any(".DATA." in s for s in perms.publish if s.startswith("$JS.API.CONSUMER"))
    assert perms.subscribe == ("_INBOX_training-agent.>",)
    assert permissions("admin") is None


async def test_agent_cannot_forge_a_scheduling_decision(
    secured: tuple[NatsServer, dict[str, str]], admin: Bus
) -> None:
    server, creds = secured
    agent = await _bus(server, creds, "training-agent")
    try:
        before_jobs = _count(await admin.js.stream_info("JOBS"))
        mark = len(agent.denied)
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await agent.js.publish("gantry.job.scheduled", b'{"forged": true}', timeout=0.5)
        assert await _refused(agent, "gantry.job.scheduled", mark)
        assert _count(await admin.js.stream_info("JOBS")) == before_jobs  # nothing stored
        # What it owns goes through.
        ack = await agent.js.publish("gantry.node.registered", b"{}", timeout=5)
        assert ack.stream == "NODES"
    finally:
        await agent.close()


async def test_agent_cannot_read_the_data_stream(
    secured: tuple[NatsServer, dict[str, str]], admin: Bus
) -> None:
    server, creds = secured
    governance = await _bus(server, creds, "governance")
    agent = await _bus(server, creds, "training-agent")
    try:
        await governance.js.publish("gantry.data.version.committed", b'{"secret": 1}', timeout=5)
        mark = len(agent.denied)
        # A consumer on DATA: refused.
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await agent.js.add_consumer(
                "DATA", api.ConsumerConfig(durable_name="agent-x"), timeout=0.5
            )
        assert await _refused(agent, "DATA", mark)
        # Reading a stored message directly: refused.
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await agent.nc.request("$JS.API.STREAM.MSG.GET.DATA", b'{"seq": 1}', timeout=0.5)
        # Listening to the subjects, or to everyone's replies: refused.
        seen: list[bytes] = []

        async def keep(msg: object) -> None:
            seen.append(getattr(msg, "data", b""))

        mark = len(agent.denied)
        await agent.nc.subscribe("gantry.data.>", cb=keep)
        await agent.nc.subscribe("_INBOX.>", cb=keep)
        await agent.nc.flush()
        assert await _refused(agent, "gantry.data.>", mark)
        assert await _refused(agent, "_INBOX.>", mark)
        await governance.js.publish("gantry.data.version.committed", b'{"secret": 2}', timeout=5)
        await asyncio.sleep(0.2)
        assert seen == []
        # Its own consumer on JOBS works.
        await agent.js.add_consumer(
            "JOBS",
            api.ConsumerConfig(durable_name="agent-node-a", filter_subject="gantry.job.>"),
            timeout=5,
        )
    finally:
        await agent.close()
        await governance.close()


@pytest.mark.parametrize("user", SERVICE_USERS)
async def test_each_service_may_do_everything_it_is_declared_to(
    user: str, secured: tuple[NatsServer, dict[str, str]], admin: Bus
) -> None:
    server, creds = secured
    bus = await _bus(server, creds, user)
    try:
        await bus.ensure_streams()  # streams exist as defined: nothing to change, no error
        for type_ in published_types(user):
            ack = await bus.js.publish(type_, b"{}", timeout=5)
            assert ack.stream == stream_for_type(type_)
        for decl in (c for c in CONSUMERS if c.user == user):
            durable = "agent-node-b" if decl.durable == PER_NODE else decl.durable
            await bus.js.add_consumer(
                decl.stream,
                api.ConsumerConfig(durable_name=durable, filter_subject=decl.filter_subject),
                timeout=5,
            )
            sub = await bus.js.pull_subscribe_bind(durable=durable, stream=decl.stream)
            try:
                for msg in await sub.fetch(1, timeout=0.1):
                    await msg.ack()
            except nats.errors.TimeoutError:
                pass  # nothing to read is fine; being refused would not time out quietly
            assert not bus.denied, bus.denied
        assert not bus.denied, bus.denied
    finally:
        await bus.close()


async def test_a_service_may_not_create_or_change_streams(
    secured: tuple[NatsServer, dict[str, str]], admin: Bus
) -> None:
    server, creds = secured
    scheduler = await _bus(server, creds, "scheduler")
    try:
        changed = tuple(
            s if s.name != "LOGS" else type(s)(s.name, s.subjects, max_age_s=60.0) for s in STREAMS
        )
        with pytest.raises(ConfigError, match="gantry admin streams"):
            await scheduler.ensure_streams(changed)
        info = await admin.js.stream_info("LOGS")
        assert info.config.max_age != 60.0
    finally:
        await scheduler.close()


async def test_wrong_password_is_refused(secured: tuple[NatsServer, dict[str, str]]) -> None:
    server, _ = secured
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        assert (await reader.readline()).startswith(b"INFO ")
        writer.write(b'CONNECT {"user":"scheduler","pass":"guess","verbose":false}\r\nPING\r\n')
        await writer.drain()
        reply = await asyncio.wait_for(reader.readline(), timeout=5)
        assert b"Authorization Violation" in reply
    finally:
        writer.close()
        await writer.wait_closed()
