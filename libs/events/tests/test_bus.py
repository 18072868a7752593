"""Integration tests of the event bus against a real nats-server (port 0)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence

import pytest
import sqlalchemy as sa

from gantry.core import InvalidInput, NatsSettings, Unavailable
from gantry.events import (
    DEAD_REASON_HEADER,
    SIGNATURE_HEADER,
    Bus,
    ConsumerRunner,
    ConsumerSpec,
    Delivery,
    Emitter,
    EventEnvelope,
    Outbox,
    OutboxRelay,
    PermanentError,
    Publisher,
    SignaturePool,
    TemporaryError,
    outbox_table,
)
from gantry.security.keys import SigningKey, TrustStore
from gantry.supervisor import NatsServer


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(NatsSettings(url=nats_url), name="test")
    await b.ensure_streams()
    yield b
    await b.close()


def ext_event(i: int = 0) -> EventEnvelope:
    return EventEnvelope(type="ext.test.ping", source="test", actor="tester", data={"i": i})


async def run_until(runner: ConsumerRunner, cond: object, timeout: float = 15.0) -> None:
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(timeout):
            while not cond():  # type: ignore[operator]
                await asyncio.sleep(0.05)
    finally:
        runner.stop()
        await task


async def dead_letters(bus: Bus, durable: str) -> list[tuple[bytes, str]]:
    sub = await bus.js.pull_subscribe(f"gantry.deadletter.{durable}", stream="DEADLETTER")
    try:
        msgs = await sub.fetch(100, timeout=1)
    except Exception:
        return []
    return [(m.data, (m.headers or {})[DEAD_REASON_HEADER]) for m in msgs]


async def test_streams_are_idempotent(bus: Bus) -> None:
    await bus.ensure_streams()
    info = await bus.js.stream_info("AUTHZ")
    assert info.config.subjects == ["gantry.authz.>"]


async def test_duplicate_publish_is_stored_once(bus: Bus) -> None:
    pub = Publisher(bus)
    event = ext_event()
    first = await pub.publish(event)
    second = await pub.publish(event)
    assert second.duplicate and not first.duplicate
    assert (await bus.js.stream_info("EXTERNAL")).state.messages == 1


async def test_publisher_refuses_bad_events_locally(bus: Bus) -> None:
    pub = Publisher(bus, max_event_bytes=1000)
    with pytest.raises(InvalidInput, match="unknown event type"):
        await pub.publish(EventEnvelope(type="gantry.job.nope", source="s", actor="a"))
    with pytest.raises(PermanentError, match="exceeds the maximum of 1000 bytes"):
        await pub.publish(
            EventEnvelope(type="ext.t.big", source="s", actor="a", data={"x": "y" * 2000})
        )


async def test_consume_ack_and_resume_without_repeats(bus: Bus) -> None:
    pub = Publisher(bus)
    await pub.publish_many([ext_event(i) for i in range(50)])
    seen: list[int] = []

    async def handler(batch: Sequence[Delivery]) -> None:
        seen.extend(d.event.data["i"] for d in batch)

    spec = ConsumerSpec(durable="t1", stream="EXTERNAL", batch_size=20)
    runner = ConsumerRunner(bus, spec, handler, publisher=pub)
    await run_until(runner, lambda: len(seen) >= 50)
    assert sorted(seen) == list(range(50))
    await pub.publish_many([ext_event(i) for i in range(50, 60)])
    runner2 = ConsumerRunner(bus, spec, handler, publisher=pub)
    await run_until(runner2, lambda: len(seen) >= 60)
    await asyncio.sleep(0.3)
    assert sorted(seen) == list(range(60)), "acked events must not come back"


@pytest.mark.parametrize("in_workers", [False, True], ids=["inline", "signature-pool"])
async def test_bad_events_are_dead_lettered_and_consumer_keeps_going(
    bus: Bus, in_workers: bool
) -> None:
    pub = Publisher(bus)
    key, other = SigningKey.generate("k1"), SigningKey.generate("k2")
    trust = TrustStore()
    trust.add("k1", key.public_key_bytes())
    pool = (
        SignaturePool(functools.partial(TrustStore, {"k1": key.public_key_bytes()}))
        if in_workers
        else None
    )
    signed = Publisher(bus, signer=key)
    wrong = Publisher(bus, signer=other)
    await bus.js.publish("ext.t.bad", b"{not json", headers={"Nats-Msg-Id": "m1"})
    await bus.js.publish(
        "gantry.authz.decision",
        EventEnvelope(
            type="gantry.authz.decision", source="s", actor="a", data={"x": 1}
        ).canonical_bytes(),
        headers={"Nats-Msg-Id": "m2"},
    )
    await bus.js.publish("ext.t.big", b"x" * 5000, headers={"Nats-Msg-Id": "m3"})
    await wrong.publish(ext_event(1))
    await pub.publish(ext_event(2))  # unsigned
    good = ext_event(3)
    await signed.publish(good)
    await signed.publish(
        EventEnvelope(type="ext.test.ping", source="gantry/audit", actor="a", data={"i": 9})
    )
    tampered = ext_event(4)
    payload, headers = signed.encode(tampered)
    await bus.js.publish("ext.test.ping", payload.replace(b'"i":4', b'"i":5'), headers=headers)

    got: list[str] = []

    async def handler(batch: Sequence[Delivery]) -> None:
        got.extend(d.event.id for d in batch)

    runner = ConsumerRunner(
        bus,
        ConsumerSpec(durable="dl", stream="EXTERNAL"),
        handler,
        publisher=pub,
        verifier=trust,
        signature_pool=pool,
        max_event_bytes=4096,
    )
    runner2 = ConsumerRunner(
        bus, ConsumerSpec(durable="dl", stream="AUTHZ"), handler, publisher=pub, verifier=trust
    )
    t2 = asyncio.create_task(runner2.run())
    await run_until(runner, lambda: runner.dead_lettered >= 6 and got)
    while runner2.dead_lettered < 1:
        await asyncio.sleep(0.05)
    runner2.stop()
    await t2
    if pool is not None:
        pool.close()
    assert got == [good.id]
    reasons = " | ".join(r for _, r in await dead_letters(bus, "dl"))
    assert "malformed event envelope" in reasons
    assert "data.principal" in reasons
    assert "exceeds the maximum of 4096 bytes" in reasons
    assert "unknown key id" in reasons or "unknown" in reasons
    assert "not signed" in reasons
    assert "bad signature" in reasons or "bad event signature" in reasons
    assert "claims the platform source 'gantry/audit'" in reasons


async def test_temporary_errors_retry_then_dead_letter(bus: Bus) -> None:
    pub = Publisher(bus)
    await pub.publish(ext_event(1))
    await pub.publish(ext_event(2))
    attempts: dict[int, set[int]] = {1: set(), 2: set()}

    async def handler(batch: Sequence[Delivery]) -> None:
        for d in batch:
            i = d.event.data["i"]
            attempts[i].add(d.num_delivered)
            if i == 1:
                raise TemporaryError("database busy", delay_s=0.05)
            if d.num_delivered < 2:
                raise TemporaryError("flaky", delay_s=0.05)

    spec = ConsumerSpec(durable="retry", stream="EXTERNAL", max_deliver=3)
    runner = ConsumerRunner(bus, spec, handler, publisher=pub)
    await run_until(runner, lambda: runner.dead_lettered == 1 and runner.handled == 1)
    assert attempts[1] == {1, 2, 3}
    assert attempts[2] == {1, 2}
    letters = await dead_letters(bus, "retry")
    assert len(letters) == 1
    assert "gave up after 3 deliveries: database busy" in letters[0][1]


async def test_nats_restart_loses_nothing(nats_server: NatsServer) -> None:
    bus = await Bus.connect(NatsSettings(url=nats_server.url, reconnect_wait_s=0.1), name="t")
    await bus.ensure_streams()
    pub = Publisher(bus, retry_for_s=30)
    seen: set[int] = set()

    async def handler(batch: Sequence[Delivery]) -> None:
        seen.update(d.event.data["i"] for d in batch)

    runner = ConsumerRunner(
        bus, ConsumerSpec(durable="rs", stream="EXTERNAL", batch_size=50), handler, publisher=pub
    )
    task = asyncio.create_task(runner.run())

    async def produce() -> None:
        for i in range(400):
            await pub.publish(ext_event(i))
            if i == 150:
                await asyncio.to_thread(nats_server.restart)

    await produce()
    async with asyncio.timeout(30):
        while len(seen) < 400:
            await asyncio.sleep(0.05)
    runner.stop()
    await task
    assert seen == set(range(400))
    assert (await bus.js.stream_info("EXTERNAL")).state.messages == 400
    await bus.close()


async def test_connect_failure_is_clear() -> None:
    with pytest.raises(Unavailable, match="cannot connect to NATS"):
        await Bus.connect(
            NatsSettings(url="nats://127.0.0.1:1", connect_timeout_s=0.5, initial_wait_s=1.0),
            name="t",
        )


async def test_outbox_relay_publishes_committed_rows_only(bus: Bus, tmp_path: object) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/o.db")
    md = sa.MetaData()
    table = outbox_table(md)
    md.create_all(engine)
    outbox = Outbox(table)
    kept, rolled_back = ext_event(1), ext_event(2)
    with engine.begin() as conn:
        outbox.add(conn, kept)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        outbox.add(conn, rolled_back)
        raise RuntimeError("change failed")
    relay = OutboxRelay(engine, table, Publisher(bus))
    assert await relay.flush() == 1
    assert await relay.flush() == 0
    sub = await bus.js.pull_subscribe("ext.test.ping", stream="EXTERNAL")
    msgs = await sub.fetch(10, timeout=1)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [kept.id]  # type: ignore[index]
    engine.dispose()


async def test_emitter_signs_and_checks(nats_url: str) -> None:
    key = SigningKey.generate("shop")
    async with await Emitter.connect(
        nats_url, source="shop", actor="svc-shop", signer=key, ensure_streams=True
    ) as em:
        ack = await em.emit("ext.shop.sale", {"amount": 3}, subject="order/1")
        assert ack.stream == "EXTERNAL"
        with pytest.raises(InvalidInput):
            await em.emit("gantry.data.accessed", {"rows": -1})
        sub = await em._bus.js.pull_subscribe("ext.shop.sale", stream="EXTERNAL")
        (msg,) = await sub.fetch(1, timeout=1)
        assert msg.headers[SIGNATURE_HEADER].startswith("shop:")  # type: ignore[index]
