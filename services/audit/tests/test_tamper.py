"""Tampering with the log's database behind the service's back is found, at the right index.

The attacker here has full write access to the database (SQL UPDATE/DELETE) but not to the
seal key (a key file outside the database) nor to the audit service's signing key.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gantry.audit import ledger as ledger_module
from gantry.audit.ledger import VerifyReport, seal_of
from gantry.audit.store import checkpoints, events
from gantry.events import Emitter, EventEnvelope, canonical_json
from gantry.security import SigningKey
from gantry.security.merkle import leaf_hash
from gantry.security.treehead import TreeHead

from .conftest import Running, wait_for
from .test_ledger import Env, fill, make_env

pytestmark = pytest.mark.timeout(90)

N = 300  # events in the log; checkpoints at 100, 200 and 300


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    e = make_env(url)
    fill(e.ledger, N, checkpoint_every=100)
    assert e.ledger.verify(e.trust).ok
    yield e
    e.engine.dispose()


def row(engine: sa.Engine, seq: int) -> Any:
    with engine.connect() as conn:
        found = conn.execute(sa.select(events).where(events.c.seq == seq)).first()
    assert found is not None, f"no row {seq}"
    return found


def update(engine: sa.Engine, seq: int, **values: Any) -> None:
    with engine.begin() as conn:
        assert (
            conn.execute(events.update().where(events.c.seq == seq).values(**values)).rowcount == 1
        )


def edited(canonical: bytes) -> bytes:
    """The event JSON with its data changed (a 'deny' becomes an 'allow', rows are hidden)."""
    doc = json.loads(canonical)
    doc["data"]["decision"] = "allow"
    doc["data"]["rows"] = 0
    doc["actor"] = "nobody"
    out = canonical_json(doc)
    assert out != bytes(canonical)
    return out


def kinds(report: VerifyReport) -> list[tuple[int, str]]:
    return [(p.index, p.kind) for p in report.problems]


def test_altered_event_bytes_are_found_at_their_index(env: Env) -> None:
    update(env.engine, 137, canonical=edited(row(env.engine, 137).canonical), actor="nobody")
    report = env.ledger.verify(env.trust)
    assert not report.ok
    assert report.first_bad_index == 137
    assert kinds(report)[0] == (137, "altered")
    assert "leaf hash" in report.problems[0].detail
    # the recomputed roots no longer match the signed heads that cover index 137
    assert (199, "checkpoint") in kinds(report) and (299, "checkpoint") in kinds(report)
    assert (99, "checkpoint") not in kinds(report)
    assert report.events_checked == N and report.checkpoints_checked == 3


def test_altered_bytes_with_a_recomputed_leaf_hash_break_the_seal(env: Env) -> None:
    forged = edited(row(env.engine, 42).canonical)
    update(env.engine, 42, canonical=forged, leaf_hash=leaf_hash(forged))
    report = env.ledger.verify(env.trust)
    assert report.first_bad_index == 42
    assert kinds(report)[0] == (42, "altered")
    assert "seal" in report.problems[0].detail
    assert [i for i, k in kinds(report) if k != "checkpoint"] == [42]


def test_a_deleted_event_is_found_at_its_index(env: Env) -> None:
    with env.engine.begin() as conn:
        assert conn.execute(events.delete().where(events.c.seq == 200)).rowcount == 1
    report = env.ledger.verify(env.trust)
    assert report.first_bad_index == 200
    assert kinds(report)[0] == (200, "deleted")
    assert "200..200" in report.problems[0].detail
    assert report.events_checked == N - 1
    # the head of 200 still checks out; the head of 300 cannot be matched any more
    assert (199, "checkpoint") not in kinds(report)
    assert any(p.index >= 299 and "300" in p.detail for p in report.problems[1:])
    assert all(p.index >= 200 for p in report.problems)


def test_a_truncated_tail_is_found(env: Env) -> None:
    with env.engine.begin() as conn:
        assert conn.execute(events.delete().where(events.c.seq >= 250)).rowcount == 50
    report = env.ledger.verify(env.trust)
    assert report.first_bad_index == 250
    assert kinds(report)[0] == (250, "deleted")
    detail = report.problems[0].detail
    assert "300" in detail and "250" in detail, detail


def test_the_head_right_after_a_deleted_row_is_still_checked(env: Env) -> None:
    with env.engine.begin() as conn:
        conn.execute(events.delete().where(events.c.seq == 199))
        conn.execute(
            checkpoints.update().where(checkpoints.c.tree_size == 200).values(root_hash=b"\1" * 32)
        )
    report = env.ledger.verify(env.trust)
    assert kinds(report)[0] == (199, "deleted")
    assert report.checkpoints_checked == 3
    assert any(p.index == 199 and "invalid signature" in p.detail for p in report.problems)


def test_swapped_events_are_reported_as_reordered(env: Env) -> None:
    cols = [c.name for c in events.columns if c.name != "seq"]
    r10, r20 = row(env.engine, 10), row(env.engine, 20)
    # event_id is unique: park row 10's id while the two rows trade places
    update(env.engine, 10, event_id="parked")
    update(env.engine, 20, **{c: getattr(r10, c) for c in cols})
    update(env.engine, 10, **{c: getattr(r20, c) for c in cols})
    assert row(env.engine, 10).event_id == r20.event_id
    report = env.ledger.verify(env.trust)
    assert report.first_bad_index == 10
    problems = {p.index: p for p in report.problems if p.kind != "checkpoint"}
    assert set(problems) == {10, 20}
    assert problems[10].kind == problems[20].kind == "reordered"
    assert "belongs at index 20" in problems[10].detail
    assert "belongs at index 10" in problems[20].detail
    assert (99, "checkpoint") in kinds(report)


def test_an_altered_checkpoint_is_found(env: Env) -> None:
    with env.engine.begin() as conn:
        conn.execute(
            checkpoints.update()
            .where(checkpoints.c.tree_size == 200)
            .values(root_hash=b"\x13" * 32)
        )
    report = env.ledger.verify(env.trust)
    assert kinds(report) == [(199, "checkpoint")]
    assert "invalid signature" in report.problems[0].detail
    assert report.first_bad_index == 199


def test_a_re_signed_checkpoint_needs_a_trusted_key(env: Env) -> None:
    # the attacker rewrites event 150 consistently and signs new heads with their own key
    forged = edited(row(env.engine, 150).canonical)
    update(env.engine, 150, canonical=forged, leaf_hash=leaf_hash(forged))
    fresh = env.reopen()
    fresh.open()
    mallory = SigningKey.generate(kid="svc-audit")  # even under the audit key's id
    with env.engine.begin() as conn:
        for size in (200, 300):
            head = TreeHead(size, fresh.tree.root(size), 1).signed(mallory)
            conn.execute(
                checkpoints.update()
                .where(checkpoints.c.tree_size == size)
                .values(root_hash=head.root_hash, signature=head.signature)
            )
    report = env.ledger.verify(env.trust)
    assert kinds(report) == [(150, "altered"), (199, "checkpoint"), (299, "checkpoint")]
    assert "invalid signature" in report.problems[1].detail


def test_an_untampered_log_still_verifies_after_reopening(env: Env) -> None:
    fresh = env.reopen()
    fresh.open()
    report = fresh.verify(env.trust)
    assert report.ok and report.events_checked == N and report.checkpoints_checked == 3


# -- through the running service and the offline command -------------------------------------


async def test_service_verify_rpc_and_offline_verify_name_the_altered_row(audit: Running) -> None:
    key = audit.keyring.service_key("feature-store")
    async with await Emitter.connect(
        audit.settings.nats.url, source="feature-store", actor="svc-fs", signer=key
    ) as em:
        await em.emit_many(
            [
                em.build("gantry.data.accessed", {"dataset": "customers", "rows": i})
                for i in range(N)
            ]
        )
    ledger = audit.service.ledger
    await wait_for(lambda: ledger.size >= N and ledger.last_checkpoint_size >= N)
    with audit.client() as client:
        assert (await asyncio.to_thread(client.verify)).ok
        engine = ledger.store.engine
        update(engine, 137, canonical=edited(row(engine, 137).canonical))
        report = await asyncio.to_thread(client.verify)
    assert not report.ok
    assert report.first_bad_index == 137
    assert (report.problems[0].index, report.problems[0].kind) == (137, "altered")
    assert report.events_checked >= N and report.checkpoints_checked >= 1

    if audit.settings.audit.database_url is not None:
        return  # the offline command is checked on SQLite only
    audit.service.stop()
    run_file = audit.settings.data_dir / "run" / "audit.json"
    await wait_for(lambda: not run_file.exists(), timeout=30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env |= {"GANTRY_DATA_DIR": str(audit.settings.data_dir), "GANTRY_LOG_JSON": "false"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gantry.audit",
        "verify",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    stdout = out.decode()
    assert proc.returncode == 1, (stdout, err.decode())
    assert "index 137: altered" in stdout
    assert stdout.strip().splitlines()[-1].startswith("FAILED:")


async def test_events_cannot_hide_as_the_audit_services_own_checkpoints(
    audit: Running,
) -> None:
    """Only heads signed by the audit key are skipped (they are stored as checkpoints)."""

    def checkpoint_claim(actor: str) -> EventEnvelope:
        return EventEnvelope(
            type="gantry.audit.checkpoint",
            source="gantry/audit",
            actor=actor,
            data={
                "tree_size": 1,
                "root_hash": "00" * 32,
                "timestamp_ms": 1,
                "key_id": "svc-audit",
                "signature": "AA==",
                "smuggled": "anything at all",
            },
        )

    # another platform service may use a gantry/ source, but it is not the audit service
    by_service = checkpoint_claim("svc-producer")
    # an outside service account may not claim a gantry/ source at all
    by_account = checkpoint_claim("sa-crm")
    marker = EventEnvelope(
        type="gantry.data.accessed", source="producer", actor="svc-producer", data={"dataset": "m"}
    )
    for event, key in [
        (by_service, audit.keyring.service_key("producer")),
        (by_account, audit.keyring.account_key("crm")),
        (marker, audit.keyring.service_key("producer")),
    ]:
        async with await Emitter.connect(
            audit.settings.nats.url, source=event.source, actor=event.actor, signer=key
        ) as em:
            await em.emit_many([event])
    store = audit.service.ledger.store
    await wait_for(lambda: store.row(event_id=marker.id) is not None)
    logged = store.row(event_id=by_service.id)
    assert logged is not None and bytes(logged.canonical) == by_service.canonical_bytes()
    assert store.row(event_id=by_account.id) is None  # dead-lettered: platform source, sa- key


# -- gaps found by review, now fixed (kept as regression tests) ---------------------------------


def test_rewritten_index_columns_are_found(env: Env) -> None:
    update(env.engine, 30, actor="somebody-else", decision="allow", resource="dataset/other")
    report = env.ledger.verify(env.trust)
    assert report.first_bad_index == 30
    assert kinds(report)[0] == (30, "altered")


def test_verifying_a_renumbered_log_costs_a_linear_number_of_seals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = make_env(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        n = 200
        fill(e.ledger, n, checkpoint_every=n)
        # delete the first event and shift every later one down to hide the gap
        with e.engine.begin() as conn:
            conn.execute(events.delete().where(events.c.seq == 0))
            for seq in range(1, n):
                conn.execute(events.update().where(events.c.seq == seq).values(seq=seq - 1))
        calls = [0]

        def counting_seal_of(key: bytes, seq: int, leaf: bytes, columns: bytes = b"") -> bytes:
            calls[0] += 1
            return seal_of(key, seq, leaf, columns)

        monkeypatch.setattr(ledger_module, "seal_of", counting_seal_of)
        report = e.ledger.verify(e.trust)
        assert report.first_bad_index == 0 and not report.ok
        assert calls[0] <= 10 * n, f"{calls[0]} seal computations to verify {n} rows"
    finally:
        e.engine.dispose()
