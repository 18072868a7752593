"""Unit tests of the Ledger (no NATS): appends, checkpoints, reopening, proofs, verify, facets."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from gantry.audit.facets import Facets, facets_of
from gantry.audit.ledger import SEALED_COLUMNS, SOURCE, Ledger, seal_of, sealed_columns
from gantry.audit.store import Store, checkpoints, connect, events, migrate, outbox
from gantry.core import InvalidInput, NotFound
from gantry.events import EventEnvelope
from gantry.security import SigningKey, TrustStore
from gantry.security.merkle import MerkleTree, leaf_hash, verify_consistency, verify_inclusion
from gantry.security.treehead import check_consistency, check_inclusion

pytestmark = pytest.mark.timeout(60)


@dataclass
class Env:
    """A ledger on a fresh database, and what a test needs to re-open or check it."""

    ledger: Ledger
    engine: sa.Engine
    seal_key: bytes
    signer: SigningKey
    trust: TrustStore

    def reopen(self) -> Ledger:
        """A new Ledger object on the same database (as after a process restart)."""
        return Ledger(
            Store(self.engine), seal_key=self.seal_key, signer=self.signer, **LEDGER_OPTIONS
        )


LEDGER_OPTIONS = {"checkpoint_every_events": 100}


def make_env(database_url: str) -> Env:
    engine = connect(database_url)
    migrate(engine)
    seal_key = secrets.token_bytes(32)
    signer = SigningKey.generate(kid="svc-audit")
    trust = TrustStore({signer.kid: signer.public_key_bytes()})
    ledger = Ledger(Store(engine), seal_key=seal_key, signer=signer, **LEDGER_OPTIONS)
    ledger.open()
    return Env(ledger, engine, seal_key, signer, trust)


def read(i: int, *, dataset: str = "customers") -> EventEnvelope:
    """A ``gantry.data.accessed`` event; ``i`` makes it distinguishable (rows=i)."""
    return EventEnvelope(
        type="gantry.data.accessed",
        source="test/ledger",
        actor=f"user{i % 3}",
        data={"dataset": dataset, "rows": i, "decision": "deny" if i % 10 == 0 else "allow"},
    )


def items(evs: list[EventEnvelope]) -> list[tuple[EventEnvelope, bytes]]:
    return [(e, e.canonical_bytes()) for e in evs]


def fill(ledger: Ledger, n: int, *, checkpoint_every: int = 100) -> list[EventEnvelope]:
    """Append ``n`` events in batches, signing a checkpoint every ``checkpoint_every``."""
    evs = [read(i) for i in range(n)]
    for start in range(0, n, checkpoint_every):
        chunk = evs[start : start + checkpoint_every]
        assert ledger.append(items(chunk)) == len(chunk)
        assert ledger.checkpoint() is not None
    return evs


def stored(engine: sa.Engine) -> list[sa.Row[tuple[object, ...]]]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(events).order_by(events.c.seq)))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(f"sqlite:///{tmp_path / 'audit.db'}")
    yield e
    e.engine.dispose()


def test_append_dedupes_within_and_across_batches(env: Env) -> None:
    a, b, c, d = (read(i) for i in range(4))
    assert env.ledger.append(items([a, b, a, b, a])) == 2
    assert env.ledger.size == 2
    # a and b again (redelivery), c twice, d once
    assert env.ledger.append(items([b, c, a, c, d])) == 2
    assert env.ledger.append(items([a, b, c, d])) == 0
    assert env.ledger.append([]) == 0
    assert env.ledger.size == 4
    rows = stored(env.engine)
    assert [r.event_id for r in rows] == [a.id, b.id, c.id, d.id]
    assert [r.seq for r in rows] == [0, 1, 2, 3]
    assert env.ledger.store.size() == 4


def test_seq_is_contiguous_and_rows_carry_hash_seal_and_facets(env: Env) -> None:
    evs = [read(i) for i in range(257)]
    for start in range(0, len(evs), 50):  # uneven batches, some redelivered
        assert env.ledger.append(items(evs[max(0, start - 7) : start + 50])) == len(
            evs[start : start + 50]
        )
    rows = stored(env.engine)
    assert [r.seq for r in rows] == list(range(257))
    assert [r.event_id for r in rows] == [e.id for e in evs]
    for r, e in zip(rows, evs, strict=True):
        assert bytes(r.canonical) == e.canonical_bytes()
        assert bytes(r.leaf_hash) == leaf_hash(e.canonical_bytes())
        cols = sealed_columns([getattr(r, c) for c in SEALED_COLUMNS])
        assert r.position == r.seq
        assert bytes(r.seal) == seal_of(env.seal_key, r.seq, bytes(r.leaf_hash), cols)
        assert r.time_ms == int(e.time.timestamp() * 1000)
        assert (r.actor, r.resource, r.action) == (e.actor, "dataset/customers", "read")
        assert r.decision == e.data["decision"]
    # the seal binds the position: the same leaf at another index has another seal
    first = sealed_columns([getattr(rows[0], c) for c in SEALED_COLUMNS])
    assert seal_of(env.seal_key, 1, bytes(rows[0].leaf_hash), first) != bytes(rows[0].seal)
    assert (
        env.ledger.tree.root()
        == MerkleTree.from_leaf_hashes(leaf_hash(e.canonical_bytes()) for e in evs).root()
    )


def test_checkpoint_signs_the_merkle_root_and_stores_it(env: Env) -> None:
    assert env.ledger.checkpoint() is None  # nothing to sign in an empty log
    evs = [read(i) for i in range(150)]
    env.ledger.append(items(evs))
    assert env.ledger.checkpoint_due(elapsed_s=0.0, every_s=5.0)  # 150 >= 100 new events
    head = env.ledger.checkpoint()
    assert head is not None
    expected_root = MerkleTree.from_leaf_hashes(leaf_hash(e.canonical_bytes()) for e in evs).root()
    assert head.tree_size == 150 and head.root_hash == expected_root
    assert head.key_id == env.signer.kid
    head.check_signature(env.trust)  # raises if the signature is bad
    assert env.ledger.last_checkpoint_size == 150
    assert env.ledger.tree_head() == head
    assert env.ledger.tree_head(150) == head
    with env.engine.connect() as conn:
        (row,) = conn.execute(sa.select(checkpoints)).all()
        payloads = [bytes(p) for p in conn.execute(sa.select(outbox.c.payload)).scalars()]
    assert (row.tree_size, bytes(row.root_hash), bytes(row.signature)) == (
        150,
        expected_root,
        head.signature,
    )
    # the head also leaves as a gantry.audit.checkpoint event, through the outbox
    (payload,) = payloads
    event = EventEnvelope.from_bytes(payload)
    assert (event.type, event.source) == ("gantry.audit.checkpoint", SOURCE)
    assert event.data["tree_size"] == 150 and event.data["root_hash"] == expected_root.hex()
    # nothing new: no second head; a few new events: due only after the interval
    assert env.ledger.checkpoint() is None
    assert not env.ledger.checkpoint_due(elapsed_s=60.0, every_s=5.0)
    env.ledger.append(items([read(1000)]))
    assert not env.ledger.checkpoint_due(elapsed_s=1.0, every_s=5.0)
    assert env.ledger.checkpoint_due(elapsed_s=5.0, every_s=5.0)
    with pytest.raises(NotFound):
        env.ledger.tree_head(42)


def test_reopened_ledger_rebuilds_the_same_tree(env: Env) -> None:
    evs = fill(env.ledger, 250)
    env.ledger.append(items([read(i) for i in range(250, 260)]))  # 10 not yet checkpointed
    root = env.ledger.tree.root()
    fresh = env.reopen()
    assert fresh.size == 0  # nothing until opened
    fresh.open()
    assert fresh.size == 260
    assert fresh.tree.root() == root
    assert fresh.tree.root(200) == env.ledger.tree.root(200)
    assert fresh.last_checkpoint_size == 250
    # appending after the restart continues the sequence and skips what is already stored
    assert fresh.append(items([evs[5], read(260)])) == 1
    assert stored(env.engine)[-1].seq == 260
    assert fresh.verify(env.trust).ok


def test_inclusion_proofs_verify(env: Env) -> None:
    evs = fill(env.ledger, 300)
    env.ledger.append(items([read(300)]))  # past the latest checkpoint
    for i in (0, 1, 99, 100, 137, 255, 256, 299):
        index, path, leaf, raw, head = env.ledger.inclusion(index=i)
        assert index == i and head.tree_size == 300
        assert raw == evs[i].canonical_bytes() and leaf == leaf_hash(raw)
        assert verify_inclusion(leaf, index, head.tree_size, path, head.root_hash)
        check_inclusion(head, env.trust, leaf_hash=leaf, index=index, proof=path)
        # a proof for one leaf does not prove another
        assert not verify_inclusion(
            leaf_hash(b"forged"), index, head.tree_size, path, head.root_hash
        )
    index, path, leaf, _, head = env.ledger.inclusion(event_id=evs[42].id, tree_size=100)
    assert (index, head.tree_size) == (42, 100)
    assert verify_inclusion(leaf, 42, 100, path, env.ledger.tree_head(100).root_hash)
    with pytest.raises(InvalidInput, match="not yet covered"):
        env.ledger.inclusion(index=300)
    with pytest.raises(InvalidInput, match="not yet covered"):
        env.ledger.inclusion(index=150, tree_size=100)
    with pytest.raises(NotFound):
        env.ledger.inclusion(event_id="no-such-event")
    with pytest.raises(NotFound):
        env.ledger.inclusion(index=5, tree_size=150)  # no checkpoint of that size


def test_consistency_proofs_verify(env: Env) -> None:
    fill(env.ledger, 300)
    for first, second in [(100, 200), (100, 300), (200, 300), (300, 300)]:
        path, a, b = env.ledger.consistency(first, second)
        assert (a.tree_size, b.tree_size) == (first, second)
        assert verify_consistency(a.tree_size, b.tree_size, a.root_hash, b.root_hash, path)
        check_consistency(a, b, env.trust, path)
        if first != second:
            assert not verify_consistency(first, second, b"\x00" * 32, b.root_hash, path)
    path, a, b = env.ledger.consistency(100)  # second size 0: the latest head
    assert b.tree_size == 300
    assert verify_consistency(100, 300, a.root_hash, b.root_hash, path)
    with pytest.raises(InvalidInput, match="larger than"):
        env.ledger.consistency(300, 100)


def test_verify_passes_on_an_untampered_log(env: Env) -> None:
    fill(env.ledger, 300)
    env.ledger.append(items([read(i) for i in range(300, 342)]))
    report = env.ledger.verify(env.trust)
    assert report.ok, report.problems
    assert report.problems == [] and report.first_bad_index == -1
    assert report.events_checked == 342 and report.checkpoints_checked == 3
    assert report.latest == env.ledger.tree_head()
    assert report.latest is not None and report.latest.tree_size == 300
    # verify reads the database, not the in-memory tree: an unopened ledger checks it all
    assert env.reopen().verify(env.trust).events_checked == 342


def test_verify_needs_the_signing_key_to_be_trusted(env: Env) -> None:
    fill(env.ledger, 100)
    report = env.ledger.verify(TrustStore())
    assert not report.ok
    assert [(p.index, p.kind) for p in report.problems] == [(99, "checkpoint")]
    assert "invalid signature" in report.problems[0].detail


def test_verify_needs_the_seal_key(env: Env) -> None:
    fill(env.ledger, 5)
    other = Ledger(
        Store(env.engine), seal_key=secrets.token_bytes(32), signer=env.signer, **LEDGER_OPTIONS
    )
    report = other.verify(env.trust)
    assert [(p.index, p.kind) for p in report.problems] == [(i, "altered") for i in range(5)]


def test_facets_of_authz_decisions() -> None:
    def decision(**data: object) -> EventEnvelope:
        base = {
            "principal": "dave",
            "roles": ["ml-developer"],
            "action": "query",
            "resource_kind": "audit_log",
            "decision": "deny",
            "reason": "no rule",
        }
        return EventEnvelope(
            type="gantry.authz.decision",
            source="gantry/audit",
            actor="svc-audit",
            data={**base, **data},
        )

    assert facets_of(decision()) == Facets("dave", "audit_log", "query", "deny")
    assert facets_of(decision(resource_name="*")).resource == "audit_log"
    assert facets_of(decision(resource_kind="dataset", resource_name="customers")) == Facets(
        "dave", "dataset/customers", "query", "deny"
    )
    assert facets_of(decision(decision="allow")).decision == "allow"


def test_facets_of_data_accessed() -> None:
    ev = EventEnvelope(
        type="gantry.data.accessed",
        source="feature-store",
        actor="alice",
        subject="ignored",
        data={"dataset": "customers", "rows": 3},
    )
    assert facets_of(ev) == Facets("alice", "dataset/customers", "read", "allow")
    denied = ev.model_copy(update={"data": {"dataset": "payroll", "decision": "deny"}})
    assert facets_of(denied) == Facets("alice", "dataset/payroll", "read", "deny")


def test_facets_of_other_events() -> None:
    cancelled = EventEnvelope(
        type="gantry.job.cancelled", source="gantry/scheduler", actor="bob", subject="job/7"
    )
    assert facets_of(cancelled) == Facets("bob", "job/7", "cancelled", "allow")
    ext = EventEnvelope(type="ext.billing.invoice-sent", source="billing", actor="svc-billing")
    assert facets_of(ext) == Facets("svc-billing", "", "invoice-sent", "allow")


def test_appended_rows_are_indexed_by_their_facets(env: Env) -> None:
    ext = EventEnvelope(
        type="ext.crm.contact-exported",
        source="crm",
        actor="erin",
        subject="contact/9",
        data={"why": json.dumps({"ticket": 1})},
    )
    env.ledger.append(items([read(10), ext]))
    rows = stored(env.engine)
    assert [(r.type, r.actor, r.resource, r.action, r.decision) for r in rows] == [
        ("gantry.data.accessed", "user1", "dataset/customers", "read", "deny"),
        ("ext.crm.contact-exported", "erin", "contact/9", "contact-exported", "allow"),
    ]
    assert rows[1].subject == "contact/9" and rows[1].source == "crm"
    assert rows[1].correlation_id == ext.correlation_id
