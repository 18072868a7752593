"""Archival: old events move to self-verifying segments; the log still verifies and proves them."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from gantry.audit.archive import Archiver, check_segment, segment_name
from gantry.audit.ledger import Ledger
from gantry.audit.retention import Retention
from gantry.audit.store import Store, connect, events, migrate, outbox, segments
from gantry.core import Conflict, IntegrityError, ManualClock
from gantry.events import EventEnvelope
from gantry.security import SigningKey, TrustStore
from gantry.security.merkle import MerkleTree, leaf_hash, verify_subtree_inclusion
from gantry.security.treehead import check_inclusion
from gantry.storage import ObjectStore, StorageSettings, open_store

pytestmark = pytest.mark.timeout(60)

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NOW_MS = int(NOW.timestamp() * 1000)
DAY_MS = 86_400_000
LEVEL = 3  # 8 events per segment


@dataclass
class Env:
    """A ledger with an object store, its archiver and retention, and how to check them."""

    ledger: Ledger
    engine: sa.Engine
    trust: TrustStore
    objects: ObjectStore
    archiver: Archiver
    retention: Retention
    db_file: Path | None  # the SQLite file, None on PostgreSQL


def make_env(tmp_path: Path, url: str | None = None) -> Env:
    db_file = None if url else tmp_path / "audit.db"
    engine = connect(url or f"sqlite:///{db_file}")
    migrate(engine)
    signer = SigningKey.generate(kid="svc-audit")
    trust = TrustStore({signer.kid: signer.public_key_bytes()})
    objects = open_store(StorageSettings(), data_dir=tmp_path)
    ledger = Ledger(
        Store(engine),
        seal_key=secrets.token_bytes(32),
        signer=signer,
        clock=ManualClock(NOW),
        objects=objects,
    )
    ledger.open()
    archiver = Archiver(ledger, level=LEVEL, archive_after_days=90)
    return Env(ledger, engine, trust, objects, archiver, Retention(ledger), db_file)


def event(
    i: int,
    *,
    days_ago: float,
    type_: str = "gantry.data.accessed",
    actor: str = "alice",
    **data: Any,
) -> EventEnvelope:
    """An event ``days_ago`` before NOW; data defaults to a read of ``customers``."""
    return EventEnvelope(
        type=type_,
        source="test/archive",
        actor=actor,
        subject=f"thing/{i}",
        time=NOW - dt.timedelta(days=days_ago),
        data=data or {"dataset": "customers", "rows": i, "decision": "allow"},
    )


def append(env: Env, evs: Sequence[EventEnvelope], *, checkpoint: bool = True) -> None:
    assert env.ledger.append([(e, e.canonical_bytes()) for e in evs]) == len(evs)
    if checkpoint:
        assert env.ledger.checkpoint() is not None


def rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(events).order_by(events.c.seq)))


def canonical(evs: Sequence[EventEnvelope]) -> list[bytes]:
    return [e.canonical_bytes() for e in evs]


def outbox_types(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        payloads = conn.execute(sa.select(outbox.c.payload)).scalars().all()
    return [EventEnvelope.from_bytes(bytes(p)).type for p in payloads]


def outbox_data(engine: sa.Engine, type_: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        payloads = conn.execute(sa.select(outbox.c.payload)).scalars().all()
    found = [EventEnvelope.from_bytes(bytes(p)) for p in payloads]
    return [e.data for e in found if e.type == type_]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(tmp_path)
    yield e
    e.engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """An Env on SQLite, then on PostgreSQL."""
    url = str(request.getfixturevalue("postgres_url")) if request.param == "postgres" else None
    e = make_env(tmp_path, url)
    yield e
    e.engine.dispose()


def test_a_complete_aligned_subtree_is_proven_by_its_outer_path() -> None:
    """For [a, a+2^k) inside a tree of n: PATH(a, n) = inner path in the subtree + outer path,
    and the outer path alone proves the subtree's root (sizes 1..300, levels 0..5)."""
    leaves = [leaf_hash(str(i).encode()) for i in range(300)]
    tree = MerkleTree.from_leaf_hashes(leaves)
    subtrees: dict[tuple[int, int], tuple[bytes, list[bytes]]] = {}
    for k in range(6):
        for a in range(0, 300 - (1 << k) + 1, 1 << k):
            sub = MerkleTree.from_leaf_hashes(leaves[a : a + (1 << k)])
            subtrees[a, k] = (sub.root(), sub.inclusion_proof(0))
            assert tree.subtree_root(a, k) == sub.root()
    checked = 0
    for n in range(1, 301):
        root = tree.root(n)
        for (a, k), (sub_root, inner) in subtrees.items():
            if a + (1 << k) > n:
                continue
            path = tree.inclusion_proof(a, n)
            assert path[:k] == inner, (n, a, k)
            assert verify_subtree_inclusion(sub_root, a, k, n, path[k:], root), (n, a, k)
            checked += 1
    assert checked > 80_000
    # and it proves nothing else: another root, place, size or path fails
    path = tree.inclusion_proof(8, 300)
    root = tree.root(300)
    sub_root = tree.subtree_root(8, 3)
    assert verify_subtree_inclusion(sub_root, 8, 3, 300, path[3:], root)
    assert not verify_subtree_inclusion(tree.subtree_root(16, 3), 8, 3, 300, path[3:], root)
    assert not verify_subtree_inclusion(sub_root, 16, 3, 300, path[3:], root)
    assert not verify_subtree_inclusion(sub_root, 4, 3, 300, path[3:], root)  # misaligned
    assert not verify_subtree_inclusion(sub_root, 296, 3, 300, path[3:], root)  # incomplete
    assert not verify_subtree_inclusion(sub_root, 8, 3, 300, path[4:], root)
    assert not verify_subtree_inclusion(sub_root, 8, 3, 300, path[3:], tree.root(299))
    with pytest.raises(ValueError, match="multiple"):
        tree.subtree_root(4, 3)
    with pytest.raises(ValueError, match="not complete"):
        tree.subtree_root(296, 3)


def test_archive_moves_old_segments_and_everything_still_verifies(any_env: Env) -> None:
    env = any_env
    old = [event(i, days_ago=200 - i / 10) for i in range(32)]
    new = [event(i, days_ago=1) for i in range(32, 44)]
    append(env, old + new)
    before = rows(env.engine)

    plan = env.archiver.archive("carol", dry_run=True)
    assert [s.first_seq for s in plan.segments] == [0, 8, 16, 24] and plan.events == 32
    assert rows(env.engine) == before and not list(env.objects.names("audit/"))

    done = env.archiver.archive("carol")
    assert [(s.first_seq, s.end_seq) for s in done.segments] == [(i, i + 8) for i in (0, 8, 16, 24)]
    assert done.events == 32 and not done.dry_run
    assert [s.first_seq for s in env.archiver.segments()] == [0, 8, 16, 24]
    seg = env.archiver.segments()[1]
    assert seg.object_name == "audit/segments/000000000008-000000000016.jsonl.gz"
    assert (seg.level, seg.tree_size, seg.archived_by) == (LEVEL, 44, "carol")
    assert seg.from_ms == int(old[8].time.timestamp() * 1000)
    assert seg.to_ms == int(old[15].time.timestamp() * 1000)
    assert seg.segment_root == env.ledger.tree.subtree_root(8, LEVEL)
    after = rows(env.engine)
    for r, b in zip(after, before, strict=True):
        archived = r.seq < 32
        assert r.state == ("archived" if archived else "live")
        assert bytes(r.canonical) == (b"" if archived else bytes(b.canonical))
        assert (r.leaf_hash, r.seal, r.actor) == (b.leaf_hash, b.seal, b.actor)

    report = env.ledger.verify(env.trust)
    assert report.ok, report.problems
    assert report.events_checked == 44 and report.checkpoints_checked == 1

    # an inclusion proof of an archived event: its original bytes, proven by the signed head
    for i in (0, 13, 31):
        index, path, leaf, raw, head = env.ledger.inclusion(index=i)
        assert raw == old[i].canonical_bytes() and leaf == leaf_hash(raw)
        check_inclusion(head, env.trust, leaf_hash=leaf, index=index, proof=path)
    assert [b for _, b in env.archiver.segment_events(8)] == [
        e.canonical_bytes() for e in old[8:16]
    ]

    # Query rows: their bytes come back through the ledger
    assert [env.ledger.event_bytes(r) for r in rows(env.engine)] == canonical(old + new)

    # reports read archived events' bytes back from their segments
    read = list(env.ledger.events(0, NOW_MS + DAY_MS, 1000))
    assert [e.canonical for e in read] == [e.canonical_bytes() for e in old + new]
    assert [e.state for e in read[30:34]] == ["archived", "archived", "live", "live"]

    # each segment verifies, with the log and on its own with the public key alone
    for s in env.archiver.segments():
        result = env.archiver.verify_segment(s.first_seq, env.trust)
        assert result.ok, result.detail
        assert result.tree_head is not None and result.tree_head.tree_size == 44
        raw_obj = bytes(env.objects.get(s.object_name))
        assert hashlib.sha256(raw_obj).hexdigest() == s.sha256
        check = check_segment(raw_obj, env.trust)
        assert (check.first_seq, check.end_seq) == (s.first_seq, s.end_seq)
        assert check.segment_root == s.segment_root

    # nothing more is due; the event of each segment is in the outbox
    assert env.archiver.archive("carol").segments == []
    archived = outbox_data(env.engine, "gantry.audit.archived")
    assert [d["first_seq"] for d in archived] == [0, 8, 16, 24]
    assert archived[0] == {
        "first_seq": 0,
        "end_seq": 8,
        "events": 8,
        "object": segment_name(0, 8),
        "segment_root": env.ledger.tree.subtree_root(0, LEVEL).hex(),
        "tree_size": 44,
    }


def test_the_segment_object_format(env: Env) -> None:
    evs = [event(i, days_ago=100) for i in range(8)]
    append(env, evs)
    (seg,) = env.archiver.archive("carol").segments
    lines = gzip.decompress(bytes(env.objects.get(seg.object_name))).splitlines()
    header = orjson.loads(lines[0])
    assert header["format"] == "gantry-audit-segment/v1"
    assert (header["first_seq"], header["end_seq"], header["level"]) == (0, 8, 3)
    assert header["segment_root"] == seg.segment_root.hex()
    assert header["tree_head"]["tree_size"] == 8 and header["outer_path"] == []
    first = orjson.loads(lines[1])
    assert first["seq"] == 0 and first["leaf"] == leaf_hash(evs[0].canonical_bytes()).hex()
    assert first["columns"]["actor"] == "alice"
    assert first["columns"]["resource"] == "dataset/customers"
    assert len(lines) == 9


def test_only_complete_segments_old_enough_and_signed_are_archived(env: Env) -> None:
    # 20 old events, then one recent in the third segment; the head covers 12 only
    append(env, [event(i, days_ago=120) for i in range(12)])
    append(env, [event(i, days_ago=120) for i in range(12, 20)], checkpoint=False)
    assert [s.first_seq for s in env.archiver.archive("carol").segments] == [0]
    env.ledger.checkpoint()  # now 20: [8, 16) is complete and signed, [16, 24) is not complete
    append(env, [event(20, days_ago=120), event(21, days_ago=1), event(22, days_ago=120)])
    append(env, [event(23, days_ago=120)])
    assert [s.first_seq for s in env.archiver.archive("carol").segments] == [8]
    # the cutoff can be given: everything before tomorrow
    done = env.archiver.archive("carol", older_than_ms=NOW_MS + DAY_MS)
    assert [s.first_seq for s in done.segments] == [16]
    assert env.ledger.verify(env.trust).ok


def test_a_deleted_or_altered_segment_object_is_reported(env: Env) -> None:
    evs = [event(i, days_ago=100) for i in range(24)]
    append(env, evs)
    env.archiver.archive("carol")
    s0, s1, s2 = env.archiver.segments()

    # deleted: Verify names the segment's first index, VerifySegment says it is missing
    env.objects.delete(s1.object_name)
    env.ledger.forget_segments()
    report = env.ledger.verify(env.trust)
    assert [(p.index, p.kind) for p in report.problems] == [(8, "deleted")]
    assert s1.object_name in report.problems[0].detail
    result = env.archiver.verify_segment(8, env.trust)
    assert not result.ok and "missing" in result.detail
    with pytest.raises(IntegrityError):
        list(env.ledger.events(0, NOW_MS, 100))

    # altered: one event's bytes changed, its leaf recomputed, the object re-encrypted and the
    # recorded SHA-256 replaced too (an attacker with the storage key and the database)
    lines = gzip.decompress(bytes(env.objects.get(s2.object_name))).splitlines()
    doc = orjson.loads(lines[3])
    forged = evs[18].model_copy(update={"actor": "mallory"}).canonical_bytes()
    doc["canonical"] = base64.b64encode(forged).decode()
    doc["leaf"] = leaf_hash(forged).hex()
    lines[3] = orjson.dumps(doc)
    raw = gzip.compress(b"\n".join(lines) + b"\n")
    env.objects.put(s2.object_name, raw)
    with env.engine.begin() as conn:
        conn.execute(
            segments.update()
            .where(segments.c.first_seq == 16)
            .values(sha256=hashlib.sha256(raw).hexdigest())
        )
    env.ledger.forget_segments()
    report = env.ledger.verify(env.trust)
    kinds = [(p.index, p.kind) for p in report.problems]
    assert (8, "deleted") in kinds and (18, "altered") in kinds
    assert "leaf hash" in next(p.detail for p in report.problems if p.index == 18)
    assert any(k == "checkpoint" for _, k in kinds)  # the recomputed root no longer matches
    result = env.archiver.verify_segment(16, env.trust)
    assert not result.ok and "segment root" in result.detail
    with pytest.raises(IntegrityError):
        check_segment(raw, env.trust)

    # swapped: a valid object of another segment put in its place breaks the SHA-256 check
    env.objects.put(s2.object_name, bytes(env.objects.get(s0.object_name)))
    env.ledger.forget_segments()
    result = env.archiver.verify_segment(16, env.trust)
    assert not result.ok and "SHA-256" in result.detail
    assert env.archiver.verify_segment(0, env.trust).ok


def test_a_segment_from_another_key_or_with_a_forged_path_fails_alone(env: Env) -> None:
    append(env, [event(i, days_ago=100) for i in range(16)])
    env.archiver.archive("carol")
    raw = bytes(env.objects.get(segment_name(8, 16)))
    stranger = SigningKey.generate(kid="svc-audit")
    with pytest.raises(IntegrityError, match="signature"):
        check_segment(raw, TrustStore({stranger.kid: stranger.public_key_bytes()}))
    lines = gzip.decompress(raw).splitlines()
    header = orjson.loads(lines[0])
    header["outer_path"] = [leaf_hash(b"x").hex()]
    lines[0] = orjson.dumps(header)
    with pytest.raises(IntegrityError, match="signed root"):
        check_segment(gzip.compress(b"\n".join(lines)), env.trust)
    with pytest.raises(IntegrityError, match="malformed"):
        check_segment(b"not gzip", env.trust)


def test_archival_needs_an_object_store(env: Env) -> None:
    append(env, [event(i, days_ago=100) for i in range(8)])
    bare = Ledger(env.ledger.store, seal_key=b"k" * 32, signer=SigningKey.generate(kid="x"))
    bare.open()
    with pytest.raises(Conflict, match="object store"):
        Archiver(bare, level=LEVEL).archive("carol")
    assert Archiver(bare, level=LEVEL).archive("carol", dry_run=True).events == 8
    env.archiver.archive("carol")
    with pytest.raises(Conflict, match="object store"):
        bare.inclusion(index=3)
