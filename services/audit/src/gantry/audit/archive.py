"""Archival (domain): old events move to the object store as segments that verify on their own.

A **segment** is an aligned complete subtree of the log: the ``2**level`` events
``[first_seq, end_seq)`` with ``first_seq`` a multiple of ``2**level``. It is archived when
every event in it is older than the cutoff and it lies inside the latest signed tree head.
Its events' bytes then live in one encrypted object and leave the database (the rows keep
their leaf hash, seal and indexed columns, so queries, proofs and Verify still work).

The object, ``audit/segments/<first:012d>-<end:012d>.jsonl.gz``, is gzip'd JSON lines:

* a header: ``format`` (``gantry-audit-segment/v1``), ``first_seq``, ``end_seq``, ``level``,
  ``events``, ``segment_root`` (hex), ``tree_head`` (the latest signed head when archived:
  ``tree_size``, ``root_hash`` hex, ``timestamp_ms``, ``key_id``, ``signature`` base64) and
  ``outer_path`` (hex): the RFC 6962 inclusion path of leaf ``first_seq`` in that tree
  without its first ``level`` entries;
* one line per event: ``seq``, ``leaf`` (hex), ``canonical`` (base64 of the event's bytes;
  null for an event purged before archival), ``columns`` (the sealed indexed columns as
  stored) and ``seal`` (hex).

For such a subtree, the inclusion path of leaf ``first_seq`` is the ``level`` siblings inside
the segment followed by ``outer_path`` — so :func:`check_segment` verifies a segment with the
audit service's public key alone: leaf hashes from the bytes, the segment root from the
leaves, then inclusion of leaf ``first_seq`` (inner + outer path) under the signed root.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.audit.ledger import (
    SEALED_COLUMNS,
    SEGMENT_FORMAT,
    SOURCE,
    Ledger,
    Segment,
    parse_segment,
)
from gantry.audit.store import events, outbox, segments
from gantry.core import Conflict, IntegrityError, InvalidInput, get_logger
from gantry.events import Outbox
from gantry.events.catalog import AuditArchived
from gantry.security.keys import TrustStore
from gantry.security.merkle import (
    MerkleTree,
    leaf_hash,
    verify_inclusion,
    verify_subtree_inclusion,
)
from gantry.security.treehead import TreeHead
from gantry.storage import ObjectNotFound

_log = get_logger("gantry.audit.archive")

DAY_MS = 86_400_000
_LINE_CHUNK = 1000


def segment_name(first_seq: int, end_seq: int) -> str:
    """The object name of the segment ``[first_seq, end_seq)``."""
    return f"audit/segments/{first_seq:012d}-{end_seq:012d}.jsonl.gz"


@dataclass(frozen=True)
class ArchiveResult:
    """What an archival run wrote, or on a dry run would write (``ArchiveResponse``)."""

    segments: list[Segment]
    events: int  # events whose bytes moved (or would move) to the object store
    dry_run: bool


@dataclass(frozen=True)
class SegmentVerification:
    """The outcome of checking one archived segment (``VerifySegmentResponse``)."""

    ok: bool
    detail: str
    segment: Segment
    tree_head: TreeHead | None  # the signed head the segment's proof leads to, when readable


@dataclass(frozen=True)
class SegmentCheck:
    """A segment object that verified on its own."""

    first_seq: int
    end_seq: int
    level: int
    segment_root: bytes
    tree_head: TreeHead
    leaves: list[bytes]
    purged: int  # events already purged when the segment was written (no bytes)


def check_segment(raw: bytes, trust: TrustStore) -> SegmentCheck:
    """Verify a segment object's bytes with nothing but ``trust`` (the audit public key);
    raise IntegrityError saying what does not hold."""
    found = parse_segment(raw)  # also: every event's bytes match its leaf hash
    h = found.header
    try:
        first, end, level = int(h["first_seq"]), int(h["end_seq"]), int(h["level"])
        root = bytes.fromhex(h["segment_root"])
        th = h["tree_head"]
        head = TreeHead(
            int(th["tree_size"]),
            bytes.fromhex(th["root_hash"]),
            int(th["timestamp_ms"]),
            str(th["key_id"]),
            base64.b64decode(th["signature"], validate=True),
        )
        outer = [bytes.fromhex(x) for x in h["outer_path"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"malformed audit segment header: {exc}") from None
    seqs = [line.seq for line in found.lines]
    if not 0 <= level <= 40 or first % (1 << level) or end != first + (1 << level):
        raise IntegrityError(
            f"segment [{first}, {end}) of level {level} is not an aligned complete subtree"
        )
    if seqs != list(range(first, end)):
        raise IntegrityError(f"the segment does not hold exactly the events {first}..{end - 1}")
    leaves = [line.leaf for line in found.lines]
    tree = MerkleTree.from_leaf_hashes(leaves)
    if tree.root() != root:
        raise IntegrityError("the segment's leaves do not hash to its segment root")
    head.check_signature(trust)
    path = tree.inclusion_proof(0) + outer
    if not verify_inclusion(leaves[0], first, head.tree_size, path, head.root_hash):
        raise IntegrityError(
            f"the segment is not part of the signed tree of size {head.tree_size}: its inclusion "
            "path does not lead to the signed root"
        )
    purged = sum(1 for line in found.lines if line.canonical is None)
    return SegmentCheck(first, end, level, root, head, leaves, purged)


class Archiver:
    """Moves whole segments of old events to the object store, and checks them."""

    def __init__(self, ledger: Ledger, *, level: int = 12, archive_after_days: int = 90) -> None:
        if not 0 <= level <= 30:
            raise InvalidInput(f"segment level must be 0..30, not {level}")
        self.ledger = ledger
        self.level = level
        self.archive_after_days = archive_after_days
        self._outbox = Outbox(outbox, source=SOURCE)

    def segments(self) -> list[Segment]:
        """Every archived segment, in log order."""
        return self.ledger.segments()

    def segment_events(self, first_seq: int) -> list[tuple[int, bytes | None]]:
        """(seq, bytes) of the events of the segment at ``first_seq`` (None: purged before it
        was archived); recently read segments are cached."""
        return self.ledger.segment_events(first_seq)

    def archive(self, by: str, older_than_ms: int = 0, dry_run: bool = False) -> ArchiveResult:
        """Archive every due segment: complete, inside the latest signed head, every event older
        than ``older_than_ms`` (0 = ``archive_after_days`` ago). A dry run only lists them."""
        if not dry_run:
            self.ledger.require_objects("archive audit events")
        cutoff = older_than_ms or self.ledger.now_ms() - self.archive_after_days * DAY_MS
        with self.ledger.maintenance_lock:
            latest = self.ledger.store.checkpoint()
            if latest is None:
                return ArchiveResult([], 0, dry_run)
            head = self.ledger.tree_head(int(latest.tree_size))
            if self.ledger.size < head.tree_size:
                raise Conflict(
                    f"the ledger holds {self.ledger.size} events in memory but the signed head "
                    f"covers {head.tree_size}",
                    hint="open the ledger (Ledger.open) before archiving",
                )
            done: list[Segment] = []
            moved = 0
            for first, from_ms, to_ms, live in self._due(head.tree_size, cutoff):
                end = first + (1 << self.level)
                if dry_run:
                    root = self.ledger.subtree_root(first, self.level)
                    name = segment_name(first, end)
                    planned = Segment(
                        first, end, self.level, name, "", root, head.tree_size,
                        from_ms, to_ms, 0, "",
                    )  # fmt: skip
                    done.append(planned)
                else:
                    done.append(self._archive_one(first, head, from_ms, to_ms, live, by))
                moved += live
        if not dry_run and done:
            _log.info("audit segments archived", segments=len(done), events=moved)
        return ArchiveResult(done, moved, dry_run)

    def _due(self, tree_size: int, cutoff: int) -> list[tuple[int, int, int, int]]:
        """(first_seq, from_ms, to_ms, live events) of each segment due for archival."""
        size = 1 << self.level
        c = events.c
        k = (c.seq // size).label("k")
        stmt = (
            sa.select(
                k,
                sa.func.count().label("n"),
                sa.func.min(c.time_ms).label("from_ms"),
                sa.func.max(c.time_ms).label("to_ms"),
                sa.func.sum(sa.case((c.state == "live", 1), else_=0)).label("live"),
                sa.func.sum(sa.case((c.state == "archived", 1), else_=0)).label("archived"),
            )
            .where(c.seq < tree_size // size * size)
            .group_by(k)
            .having(sa.func.max(c.time_ms) < cutoff)
            .order_by(k)
        )
        taken = [(s.first_seq, s.end_seq) for s in self.ledger.segments()]
        with self.ledger.store.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        due = []
        for row in rows:
            first = int(row.k) * size
            if any(a < first + size and first < b for a, b in taken) or int(row.archived):
                continue  # already archived (perhaps at another level)
            if int(row.n) != size:
                _log.warning("segment skipped: events missing", first_seq=first, found=row.n)
                continue
            if int(row.live) == 0:
                continue  # all purged: nothing left to move
            due.append((first, int(row.from_ms), int(row.to_ms), int(row.live)))
        return due

    def _archive_one(
        self, first: int, head: TreeHead, from_ms: int, to_ms: int, live: int, by: str
    ) -> Segment:
        """Write one segment object, then move its events' bytes out in one transaction."""
        objects = self.ledger.require_objects("archive audit events")
        end = first + (1 << self.level)
        c = events.c
        with self.ledger.store.engine.connect() as conn:
            leaves = [
                bytes(x)
                for x in conn.execute(
                    sa.select(c.leaf_hash).where(c.seq >= first, c.seq < end).order_by(c.seq)
                ).scalars()
            ]
        root = MerkleTree.from_leaf_hashes(leaves).root()
        if root != self.ledger.subtree_root(first, self.level):
            raise IntegrityError(
                f"the stored leaf hashes of events {first}..{end - 1} differ from the log's tree",
                hint="run Verify (gantry audit verify); nothing was archived",
            )
        outer = self.ledger.proof_path(first, head.tree_size)[self.level :]
        if not verify_subtree_inclusion(
            root, first, self.level, head.tree_size, outer, head.root_hash
        ):
            raise IntegrityError(
                f"events {first}..{end - 1} are not proven by the signed head of size "
                f"{head.tree_size}",
                hint="run Verify (gantry audit verify); nothing was archived",
            )
        name = segment_name(first, end)
        header = {
            "format": SEGMENT_FORMAT,
            "first_seq": first,
            "end_seq": end,
            "level": self.level,
            "events": end - first,
            "segment_root": root.hex(),
            "tree_head": {
                "tree_size": head.tree_size,
                "root_hash": head.root_hash.hex(),
                "timestamp_ms": head.timestamp_ms,
                "key_id": head.key_id,
                "signature": base64.b64encode(head.signature).decode(),
            },
            "outer_path": [p.hex() for p in outer],
        }
        digest = hashlib.sha256()
        gz = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip container
        with objects.writer(name, metadata={"content-type": "application/gzip"}) as writer:
            for doc in (header, *self._lines(first, end)):
                data = gz.compress(orjson.dumps(doc) + b"\n")
                digest.update(data)
                writer.write(data)
            data = gz.flush()
            digest.update(data)
            writer.write(data)
        now = self.ledger.now_ms()
        segment = Segment(
            first, end, self.level, name, digest.hexdigest(), root, head.tree_size,
            from_ms, to_ms, now, by,
        )  # fmt: skip
        try:
            with self.ledger.store.engine.begin() as conn:
                conn.execute(segments.insert().values(**vars(segment)))
                moved = conn.execute(
                    events.update()
                    .where(c.seq >= first, c.seq < end, c.state == "live")
                    .values(canonical=b"", state="archived")
                ).rowcount
                if moved != live:
                    raise Conflict(
                        f"events {first}..{end - 1} changed while being archived",
                        hint="nothing was archived; run the archival again",
                    )
                self._outbox.record(
                    conn,
                    "gantry.audit.archived",
                    AuditArchived(
                        first_seq=first,
                        end_seq=end,
                        events=live,
                        object=name,
                        segment_root=root.hex(),
                        tree_size=head.tree_size,
                    ),
                    actor=by,
                    subject=f"audit_segment/{first}",
                )
        except Exception:
            objects.delete(name)  # the rows keep their bytes; leave no copy behind
            raise
        return segment

    def _lines(self, first: int, end: int) -> Iterator[dict[str, Any]]:
        """The segment's event lines, read from the database in chunks."""
        c = events.c
        cols = [c.seq, c.state, c.canonical, c.leaf_hash, c.seal, *(c[n] for n in SEALED_COLUMNS)]
        last = first - 1
        while last < end - 1:
            with self.ledger.store.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(*cols)
                    .where(c.seq > last, c.seq < end)
                    .order_by(c.seq)
                    .limit(_LINE_CHUNK)
                ).all()
            if not rows:
                raise IntegrityError(f"events {last + 1}..{end - 1} are missing from the log")
            for row in rows:
                seq, leaf = int(row[0]), bytes(row[3])
                body = bytes(row[2]) if row[1] == "live" else None
                if body is not None and leaf_hash(body) != leaf:
                    raise IntegrityError(
                        f"event {seq}: its bytes do not match their leaf hash",
                        hint="run Verify (gantry audit verify); nothing was archived",
                    )
                yield {
                    "seq": seq,
                    "leaf": leaf.hex(),
                    "canonical": None if body is None else base64.b64encode(body).decode(),
                    "columns": dict(zip(SEALED_COLUMNS, row[5:], strict=True)),
                    "seal": bytes(row[4]).hex(),
                }
            last = int(rows[-1][0])

    def verify_segment(self, first_seq: int, trust: TrustStore) -> SegmentVerification:
        """Check the segment at ``first_seq``: its object is the one archived, verifies on its
        own against a trusted signed head, and its leaf hashes are the log's."""
        segment = self.ledger.segment(first_seq)
        first, end = segment.first_seq, segment.end_seq
        c = events.c
        with self.ledger.store.engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.seq, c.leaf_hash, c.state)
                .where(c.seq >= first, c.seq < end)
                .order_by(c.seq)
            ).all()
        if not segment.object_name:
            kept = [int(r.seq) for r in rows if r.state != "purged"]
            if kept or len(rows) != end - first:
                return SegmentVerification(
                    False,
                    f"the segment object was deleted, but events {kept[:5]} are not purged",
                    segment,
                    None,
                )
            return SegmentVerification(
                True,
                f"all {end - first} events were purged and the segment object deleted with "
                "them; their leaf hashes remain in the log (Verify checks them)",
                segment,
                None,
            )
        objects = self.ledger.require_objects("verify audit segments")
        try:
            raw = bytes(objects.get(segment.object_name))
            digest = hashlib.sha256(raw).hexdigest()
            if digest != segment.sha256:
                raise IntegrityError(
                    f"the object's SHA-256 is {digest}, not the {segment.sha256} archived"
                )
            check = check_segment(raw, trust)
        except ObjectNotFound:
            return SegmentVerification(
                False, f"segment object {segment.object_name} is missing", segment, None
            )
        except IntegrityError as exc:
            return SegmentVerification(False, exc.message, segment, None)
        problem = _mismatch(segment, check, rows)
        if problem is None:
            stored = self.ledger.store.checkpoint(check.tree_head.tree_size)
            if stored is not None and bytes(stored.root_hash) != check.tree_head.root_hash:
                problem = (
                    f"the segment's signed head of size {check.tree_head.tree_size} differs "
                    "from the stored checkpoint of that size"
                )
        if problem is not None:
            return SegmentVerification(False, problem, segment, check.tree_head)
        return SegmentVerification(
            True,
            f"{end - first} events ({check.purged} purged before archival) hash to the segment "
            f"root, which the signed tree head of size {check.tree_head.tree_size} includes",
            segment,
            check.tree_head,
        )


def _mismatch(segment: Segment, check: SegmentCheck, rows: Sequence[Any]) -> str | None:
    """What differs between a verified segment object and the log's rows, if anything."""
    if (check.first_seq, check.end_seq, check.level) != (
        segment.first_seq,
        segment.end_seq,
        segment.level,
    ):
        return "the object describes another segment than the one archived"
    if check.segment_root != segment.segment_root:
        return "the object's segment root differs from the one archived"
    if len(rows) != len(check.leaves):
        return f"the log holds {len(rows)} rows for the segment's {len(check.leaves)} events"
    for row, leaf in zip(rows, check.leaves, strict=True):
        if bytes(row.leaf_hash) != leaf:
            return f"event {int(row.seq)}: the log's leaf hash differs from the segment's"
        if row.state == "live":
            return f"event {int(row.seq)} is archived but its row is marked live"
    return None


__all__ = [
    "ArchiveResult",
    "Archiver",
    "SegmentCheck",
    "SegmentVerification",
    "check_segment",
    "segment_name",
]
