"""Token revocation: the list, the verifier's check, and the bucket on a real secured NATS."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gantry.core import ConfigError, ManualClock, NatsSettings, Unauthenticated
from gantry.events import Bus
from gantry.events.nats_auth import ensure_credentials, password_of, render_auth_conf
from gantry.security import SigningKey, TokenIssuer, TokenVerifier, TrustStore
from gantry.security.revocations import (
    Revocation,
    RevocationList,
    RevocationWatcher,
    list_revocations,
    revoke,
)
from gantry.supervisor.nats_server import NatsServer

START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def test_a_revoked_token_is_refused_even_when_its_signature_was_cached() -> None:
    clock = ManualClock(START)
    key = SigningKey.generate("issuer-1")
    revocations = RevocationList(clock)
    verifier = TokenVerifier(
        TrustStore({key.kid: key.public_key_bytes()}), clock, revocations=revocations
    )
    issuer = TokenIssuer(key, clock)
    token = issuer.issue("alice", ["ml-developer"], dt.timedelta(hours=1))
    other = issuer.issue("bob", ["ml-developer"], dt.timedelta(hours=1))
    principal = verifier.verify(token)  # cached from here on
    revocations.add(
        Revocation(principal.token_id, _ms(principal.expires_at), reason="laptop stolen")
    )
    with pytest.raises(Unauthenticated, match="revoked: laptop stolen"):
        verifier.verify(token)
    assert verifier.verify(other).subject == "bob"  # only that token


def test_entries_are_forgotten_once_the_token_expired() -> None:
    clock = ManualClock(START)
    revocations = RevocationList(clock)
    revocations.add(Revocation("a", _ms(START + dt.timedelta(minutes=5))))
    revocations.add(Revocation("b", _ms(START + dt.timedelta(hours=5))))
    assert len(revocations) == 2
    clock.advance(600)
    revocations.add(Revocation("c", _ms(START + dt.timedelta(hours=5))))
    assert revocations.revoked("a") is None
    assert revocations.revoked("b") is not None and len(revocations) == 2


def test_an_unreadable_entry_still_revokes() -> None:
    entry = Revocation.from_bytes("x", b"not json")
    assert entry.jti == "x" and entry.expires_ms > _ms(START)


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NatsServer, dict[str, str]]]:
    root = tmp_path_factory.mktemp("revocations")
    creds = ensure_credentials(root / "credentials.env")
    server = NatsServer(root / "nats", auth_conf=render_auth_conf(), env=creds).start()
    try:
        yield server, creds
    finally:
        server.stop()


async def _bus(server: NatsServer, creds: dict[str, str], user: str) -> Bus:
    return await Bus.connect(
        NatsSettings(
            url=server.url, user=user, password=password_of(creds, user), api_timeout_s=1.0
        ),
        name=f"t-{user}",
    )


@pytest.fixture
async def buses(secured: tuple[NatsServer, dict[str, str]]) -> AsyncIterator[dict[str, Bus]]:
    server, creds = secured
    out = {
        u: await _bus(server, creds, u) for u in ("admin", "audit", "scheduler", "training-agent")
    }
    await out["admin"].ensure_streams()  # streams and the bucket, as the set-up job does
    yield out
    for bus in out.values():
        await bus.close()


async def test_every_service_sees_a_revocation_written_by_audit(buses: dict[str, Bus]) -> None:
    far = _ms(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    await revoke(buses["audit"], Revocation("before-start", far, reason="old"))
    seen = RevocationList()
    watcher = RevocationWatcher(buses["scheduler"], seen)
    await watcher.start(timeout_s=5)
    try:
        assert seen.revoked("before-start") is not None  # read at start
        await revoke(buses["audit"], Revocation("while-running", far, reason="new"))
        for _ in range(100):
            if seen.revoked("while-running") is not None:
                break
            await asyncio.sleep(0.02)
        assert seen.revoked("while-running") is not None
        assert not buses["scheduler"].denied, buses["scheduler"].denied
        names = [r.jti for r in await list_revocations(buses["scheduler"])]
        assert {"before-start", "while-running"} <= set(names)
    finally:
        await watcher.stop()


async def test_only_audit_may_write_the_list(buses: dict[str, Bus]) -> None:
    far = _ms(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    for user in ("scheduler", "training-agent"):
        with pytest.raises((TimeoutError, asyncio.TimeoutError, Exception)):
            await asyncio.wait_for(revoke(buses[user], Revocation(f"by-{user}", far)), 2)
    names = [r.jti for r in await list_revocations(buses["audit"])]
    assert "by-scheduler" not in names and "by-training-agent" not in names


async def test_a_missing_bucket_is_a_clear_error(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "plain") as server:
        bus = await Bus.connect(NatsSettings(url=server.url), name="t")
        try:
            with pytest.raises(ConfigError, match="gantry admin streams"):
                await revoke(bus, Revocation("x", 0))
        finally:
            await bus.close()
