"""The tamper-evident log (domain): appends, signed checkpoints, proofs and verification.

An event row is ``live`` (its bytes are in the database), ``archived`` (its bytes are in an
object-store segment written by :mod:`gantry.audit.archive`) or ``purged`` (deleted by
:mod:`gantry.audit.retention`; only its leaf hash, position and a purge seal remain). Leaf
hashes are never removed, so the tree, every signed head and every proof stay valid; this
module reads archived bytes back from their segments wherever the log's bytes are needed.
"""

from __future__ import annotations

import base64
import bisect
import gzip
import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from gantry.audit.facets import facets_of
from gantry.audit.store import Store, StoredEvent, events, outbox, purged, segments
from gantry.core import (
    Clock,
    Conflict,
    IntegrityError,
    InvalidInput,
    NotFound,
    SystemClock,
    get_logger,
    new_id,
)
from gantry.events import AuditCheckpoint, EventEnvelope, Outbox
from gantry.security.keys import SigningKey, TrustStore
from gantry.security.merkle import MerkleTree, StreamingRoot, leaf_hash
from gantry.security.treehead import TreeHead
from gantry.storage import ObjectNotFound, ObjectStore

_log = get_logger("gantry.audit.ledger")

SOURCE = "gantry/audit"


#: The indexed columns a row's seal covers (what Query and AccessReport read).
SEALED_COLUMNS = (
    "event_id", "type", "source", "actor", "subject", "resource", "action", "decision",
    "correlation_id", "time_ms",
)  # fmt: skip


def sealed_columns(values: Sequence[object]) -> bytes:
    """The indexed column values, in :data:`SEALED_COLUMNS` order, as the bytes sealed."""
    return "\x1f".join("" if v is None else str(v) for v in values).encode()


def seal_of(key: bytes, position: int, leaf: bytes, columns: bytes = b"") -> bytes:
    """HMAC-SHA256 binding a leaf hash and its indexed columns to the leaf's position."""
    return hmac.new(key, position.to_bytes(8, "big") + leaf + columns, hashlib.sha256).digest()


def purge_sealed(purge_id: str) -> bytes:
    """What a purged row's seal covers besides its position and leaf: the purge's id."""
    return b"purged:" + purge_id.encode()


#: The first line of every segment object names its format (see :mod:`gantry.audit.archive`).
SEGMENT_FORMAT = "gantry-audit-segment/v1"


@dataclass(frozen=True)
class Segment:
    """An archived segment: the aligned complete subtree ``[first_seq, end_seq)`` of
    ``2**level`` events, kept as one encrypted object (fields of the ``Segment`` message, plus
    the level and the object's SHA-256). ``object_name`` is empty once every event of the
    segment was purged and the object deleted."""

    first_seq: int
    end_seq: int
    level: int
    object_name: str
    sha256: str  # hex SHA-256 of the object's (gzip) bytes
    segment_root: bytes
    tree_size: int
    from_ms: int
    to_ms: int
    archived_ms: int
    archived_by: str

    @classmethod
    def from_row(cls, row: Any) -> Segment:
        """A segment from its ``audit_segments`` row."""
        return cls(
            int(row.first_seq), int(row.end_seq), int(row.level), row.object_name, row.sha256,
            bytes(row.segment_root), int(row.tree_size), int(row.from_ms), int(row.to_ms),
            int(row.archived_ms), row.archived_by,
        )  # fmt: skip


@dataclass(frozen=True)
class SegmentLine:
    """One event of a segment object as written."""

    seq: int
    canonical: bytes | None  # None: the event had been purged before the segment was written
    leaf: bytes
    columns: dict[str, Any]  # the sealed columns, as stored when archived
    seal: bytes


@dataclass(frozen=True)
class SegmentObject:
    """A segment object's contents: its header (a dict, see :mod:`gantry.audit.archive`) and
    its events in seq order."""

    header: dict[str, Any]
    lines: list[SegmentLine]


def parse_segment(raw: bytes) -> SegmentObject:
    """Decode a segment object's bytes (gzip JSON lines); IntegrityError when malformed.

    This checks the format and that each event's bytes match the leaf hash written beside them;
    the proof in the header is checked by :func:`gantry.audit.archive.check_segment`.
    """
    try:
        text = gzip.decompress(raw)
        docs = [orjson.loads(line) for line in text.splitlines() if line]
        header = docs[0]
        if not isinstance(header, dict) or header.get("format") != SEGMENT_FORMAT:
            raise ValueError(f"the first line does not name the format {SEGMENT_FORMAT}")
        lines = []
        for doc in docs[1:]:
            body = doc["canonical"]
            line = SegmentLine(
                int(doc["seq"]),
                None if body is None else base64.b64decode(body, validate=True),
                bytes.fromhex(doc["leaf"]),
                dict(doc["columns"]),
                bytes.fromhex(doc["seal"]),
            )
            if line.canonical is not None and leaf_hash(line.canonical) != line.leaf:
                raise ValueError(f"the bytes of event {line.seq} do not match their leaf hash")
            lines.append(line)
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise IntegrityError(
            f"malformed audit segment: {exc}",
            hint="the object was altered or is not an audit segment; run Verify on the log",
        ) from None
    return SegmentObject(header, lines)


@dataclass(frozen=True)
class Problem:
    """One thing verification found wrong."""

    index: int
    kind: str  # altered | deleted | reordered | checkpoint
    detail: str


@dataclass
class VerifyReport:
    """The outcome of recomputing the log from its stored events."""

    events_checked: int = 0
    checkpoints_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    latest: TreeHead | None = None

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems

    @property
    def first_bad_index(self) -> int:
        """The lowest index with a problem, or -1."""
        return min((p.index for p in self.problems), default=-1)


class Ledger:
    """Owns the Merkle tree and the only writer of the log tables.

    ``append`` is synchronous (call it from a worker thread) and serialised by a lock; the
    in-memory tree is updated only after the transaction committed. ``objects`` is where
    archived segments live; without it archived events cannot be read (nor archived).
    Archival and purges hold :attr:`maintenance_lock` so they never change the same rows at
    once.
    """

    def __init__(
        self,
        store: Store,
        *,
        seal_key: bytes,
        signer: SigningKey,
        clock: Clock | None = None,
        checkpoint_every_events: int = 1000,
        objects: ObjectStore | None = None,
        segment_cache: int = 4,
    ) -> None:
        self.store = store
        self.objects = objects
        self._seal_key = seal_key
        self._signer = signer
        self._clock = clock or SystemClock()
        self._every = checkpoint_every_events
        self._outbox = Outbox(outbox)
        self._lock = threading.Lock()
        self.maintenance_lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, str], dict[int, bytes | None]] = OrderedDict()
        self._cache_size = max(segment_cache, 0)
        self._cache_lock = threading.Lock()
        self.tree = MerkleTree()
        self.last_checkpoint_size = 0

    @property
    def clock(self) -> Clock:
        """The clock that timestamps checkpoints (and archival and purges)."""
        return self._clock

    def now_ms(self) -> int:
        """The clock's time, Unix milliseconds."""
        return int(self._clock.now().timestamp() * 1000)

    def purge_seal(self, seq: int, leaf: bytes, purge_id: str) -> bytes:
        """The seal a row carries once purge ``purge_id`` deleted it."""
        return seal_of(self._seal_key, seq, leaf, purge_sealed(purge_id))

    def proof_path(self, index: int, tree_size: int) -> list[bytes]:
        """The inclusion path of leaf ``index`` in the tree of ``tree_size`` (thread-safe)."""
        with self._lock:
            return self.tree.inclusion_proof(index, tree_size)

    def subtree_root(self, first: int, level: int) -> bytes:
        """The root of the aligned complete subtree of ``2**level`` leaves at ``first``."""
        with self._lock:
            return self.tree.subtree_root(first, level)

    def open(self) -> None:
        """Rebuild the in-memory tree from the stored leaf hashes."""
        with self._lock:
            self.tree = MerkleTree.from_leaf_hashes(
                bytes(r[1]) for r in self.store.iter_rows(["seq", "leaf_hash"])
            )
            latest = self.store.checkpoint()
            self.last_checkpoint_size = int(latest.tree_size) if latest else 0
        _log.info("ledger opened", size=self.tree.size, checkpoint=self.last_checkpoint_size)

    @property
    def size(self) -> int:
        """Events in the log."""
        return self.tree.size

    def append(self, batch: Sequence[tuple[EventEnvelope, bytes]]) -> int:
        """Append events not yet in the log, durably; return how many were new."""
        return len(self.append_new(batch))

    def append_new(self, batch: Sequence[tuple[EventEnvelope, bytes]]) -> list[EventEnvelope]:
        """Append events not yet in the log, durably; the ones that were new, in order."""
        with self._lock:
            return self._append_locked(batch)

    def _append_locked(self, batch: Sequence[tuple[EventEnvelope, bytes]]) -> list[EventEnvelope]:
        new: list[EventEnvelope] = []
        rows = []
        leaves = []
        seen: set[str] = set()
        with self.store.engine.begin() as conn:
            stored = self.store.existing_ids(conn, [e.id for e, _ in batch])
            seq = self.tree.size
            for event, canonical in batch:
                if event.id in stored or event.id in seen:
                    continue
                seen.add(event.id)
                leaf = leaf_hash(canonical)
                f = facets_of(event)
                rows.append(
                    {
                        "seq": seq,
                        "event_id": event.id,
                        "type": event.type,
                        "source": event.source,
                        "actor": f.actor[:256],
                        "subject": event.subject,
                        "resource": f.resource[:512],
                        "action": f.action[:64],
                        "decision": f.decision[:8],
                        "correlation_id": event.correlation_id,
                        "time_ms": int(event.time.timestamp() * 1000),
                        "canonical": canonical,
                        "leaf_hash": leaf,
                        "position": seq,
                        "state": "live",
                    }
                )
                row = rows[-1]
                row["seal"] = seal_of(
                    self._seal_key,
                    seq,
                    leaf,
                    sealed_columns([row[c] for c in SEALED_COLUMNS]),
                )
                leaves.append(leaf)
                new.append(event)
                seq += 1
            self.store.insert(conn, rows)
        self.tree.extend(leaves)
        return new

    def checkpoint_due(self, *, elapsed_s: float, every_s: float) -> bool:
        """Whether enough events or time have passed since the last signed tree head."""
        new = self.tree.size - self.last_checkpoint_size
        return new >= self._every or (new > 0 and elapsed_s >= every_s)

    def checkpoint(self) -> TreeHead | None:
        """Sign and store a tree head for the current size, with its event (outbox)."""
        with self._lock:
            size = self.tree.size
            if size == self.last_checkpoint_size:
                return None
            head = TreeHead(
                size, self.tree.root(size), int(self._clock.now().timestamp() * 1000)
            ).signed(self._signer)
            event = EventEnvelope(
                type="gantry.audit.checkpoint",
                source=SOURCE,
                actor="svc-audit",
                subject=f"audit_log/{size}",
                data=AuditCheckpoint(
                    tree_size=size,
                    root_hash=head.root_hash.hex(),
                    timestamp_ms=head.timestamp_ms,
                    key_id=head.key_id,
                    signature=_b64(head.signature),
                ).model_dump(),
            )
            with self.store.engine.begin() as conn:
                self.store.add_checkpoint(
                    conn,
                    {
                        "tree_size": size,
                        "root_hash": head.root_hash,
                        "timestamp_ms": head.timestamp_ms,
                        "key_id": head.key_id,
                        "signature": head.signature,
                    },
                )
                self._outbox.add(conn, event)
            self.last_checkpoint_size = size
            return head

    def record_query(
        self, actor: str, query: str, filters: dict[str, object], results: int
    ) -> None:
        """Queue a ``gantry.audit.queried`` event: compliance queries are audited too."""
        with self.store.engine.begin() as conn:
            self._outbox.add(conn, query_event(actor, query, filters, results))

    def tree_head(self, tree_size: int = 0) -> TreeHead:
        """A stored signed tree head (the latest when ``tree_size`` is 0)."""
        row = self.store.checkpoint(tree_size or None)
        if row is None:
            raise NotFound(
                "checkpoint",
                str(tree_size or "latest"),
                hint="checkpoints are signed every few seconds; list them or retry shortly",
            )
        return TreeHead(
            int(row.tree_size),
            bytes(row.root_hash),
            int(row.timestamp_ms),
            row.key_id,
            bytes(row.signature),
        )

    def inclusion(
        self, *, index: int | None = None, event_id: str | None = None, tree_size: int = 0
    ) -> tuple[int, list[bytes], bytes, bytes, TreeHead]:
        """(index, path, leaf hash, event bytes, signed head) for one event."""
        row = self.store.row(index=index, event_id=event_id)
        if row is None:
            raise NotFound("event", str(event_id if event_id is not None else index))
        head = self.tree_head(tree_size)
        if int(row.seq) >= head.tree_size:
            raise InvalidInput(
                f"event {row.seq} is not yet covered by the signed tree of size {head.tree_size}",
                hint="wait for the next checkpoint (a few seconds) and ask again",
            )
        seq = int(row.seq)
        path = self.proof_path(seq, head.tree_size)
        return seq, path, bytes(row.leaf_hash), self.event_bytes(row), head

    def event_bytes(self, row: Any) -> bytes:
        """The event bytes of a stored ``audit_events`` row (anything with ``seq``, ``state``
        and ``canonical``): its own when live, read from its segment when archived (cached),
        empty when purged (its leaf hash alone still proves its place)."""
        if row.state != "archived":
            return bytes(row.canonical) if row.state != "purged" else b""
        seq = int(row.seq)
        body = self.segment_events_of(seq).get(seq)
        if body is None:
            raise IntegrityError(
                f"archived event {seq} is missing from its segment",
                hint="run Verify (gantry audit verify) to see what was altered",
            )
        return body

    def consistency(self, first: int, second: int = 0) -> tuple[list[bytes], TreeHead, TreeHead]:
        """A consistency proof between two signed tree heads (``second`` 0 = the latest)."""
        if first <= 0:
            raise InvalidInput(
                f"first_size must be the size of a signed checkpoint (> 0), not {first}"
            )
        a = self.tree_head(first)
        b = self.tree_head(second)
        if a.tree_size > b.tree_size:
            raise InvalidInput(f"first size {first} is larger than second size {b.tree_size}")
        return self.tree.consistency_proof(a.tree_size, b.tree_size), a, b

    # -- archived segments ----------------------------------------------------------------

    def require_objects(self, what: str) -> ObjectStore:
        """The object store, or a Conflict saying that ``what`` needs one."""
        if self.objects is None:
            raise Conflict(
                f"cannot {what}: this audit log has no object store for archived segments",
                hint="configure the audit service's object store (GANTRY_STORAGE__*) and pass "
                "it to the Ledger (objects=...)",
            )
        return self.objects

    def segments(self) -> list[Segment]:
        """Every archived segment, in log order."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(sa.select(segments).order_by(segments.c.first_seq)).all()
        return [Segment.from_row(r) for r in rows]

    def segment(self, first_seq: int) -> Segment:
        """The archived segment that starts at event ``first_seq``."""
        with self.store.engine.connect() as conn:
            row = conn.execute(sa.select(segments).where(segments.c.first_seq == first_seq)).first()
        if row is None:
            raise NotFound(
                "audit segment",
                str(first_seq),
                hint="segments start at a multiple of their size; list them with "
                "`gantry audit segments list`",
            )
        return Segment.from_row(row)

    def read_segment(self, segment: Segment) -> SegmentObject:
        """Fetch and decode a segment's object, uncached, checking that it is the object that
        was archived (its SHA-256) and holds exactly the segment's events.

        Raises ObjectNotFound when the object is gone, IntegrityError when it was altered.
        """
        objects = self.require_objects("read archived audit events")
        if not segment.object_name:
            raise ObjectNotFound(
                f"audit segment {segment.first_seq}",
                hint="every event of the segment was purged, so its object was deleted",
            )
        raw = bytes(objects.get(segment.object_name))
        digest = hashlib.sha256(raw).hexdigest()
        if digest != segment.sha256:
            raise IntegrityError(
                f"segment object {segment.object_name} has SHA-256 {digest}, but "
                f"{segment.sha256} was archived",
                hint="the object was replaced or altered; restore it from a backup",
            )
        found = parse_segment(raw)
        seqs = [line.seq for line in found.lines]
        if seqs != list(range(segment.first_seq, segment.end_seq)):
            raise IntegrityError(
                f"segment object {segment.object_name} does not hold exactly the events "
                f"{segment.first_seq}..{segment.end_seq - 1}"
            )
        return found

    def segment_events(self, first_seq: int) -> list[tuple[int, bytes | None]]:
        """(seq, canonical bytes) of every event of the segment at ``first_seq`` (None for an
        event purged before it was archived); recently read segments are cached."""
        return sorted(self._segment_bytes(self.segment(first_seq)).items())

    def segment_events_of(self, seq: int) -> dict[int, bytes | None]:
        """The events (seq -> bytes) of the archived segment holding event ``seq`` (cached)."""
        with self.store.engine.connect() as conn:
            row = conn.execute(
                sa.select(segments).where(segments.c.first_seq <= seq, segments.c.end_seq > seq)
            ).first()
        if row is None:
            raise IntegrityError(
                f"event {seq} is marked archived but no segment covers it",
                hint="run Verify (gantry audit verify) to see what was altered",
            )
        return self._segment_bytes(Segment.from_row(row))

    def forget_segments(self) -> None:
        """Drop the segment cache (after segment objects were deleted)."""
        with self._cache_lock:
            self._cache.clear()

    def _segment_bytes(self, segment: Segment) -> dict[int, bytes | None]:
        key = (segment.first_seq, segment.sha256)
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            read = self.read_segment(segment)
        except ObjectNotFound:
            raise IntegrityError(
                f"the segment object of archived events {segment.first_seq}.."
                f"{segment.end_seq - 1} is missing",
                hint="restore audit/segments/ from a backup; Verify lists what is affected",
            ) from None
        found = {line.seq: line.canonical for line in read.lines}
        if self._cache_size:
            with self._cache_lock:
                self._cache[key] = found
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return found

    def events(self, since_ms: int, until_ms: int, below_seq: int) -> Iterator[StoredEvent]:
        """Events with ``since_ms <= time < until_ms`` and ``seq < below_seq`` in seq order,
        with their bytes: an archived event's are read from its segment, a purged event has
        none (``canonical`` None). Raises IntegrityError when a segment is missing or altered.
        """
        index = _SegmentIndex(self.segments())
        for event in self.store.live_events(since_ms, until_ms, below_seq):
            if event.state == "archived":
                segment = index.find(event.seq)
                body = None if segment is None else self._segment_bytes(segment).get(event.seq)
                if body is None:
                    raise IntegrityError(
                        f"archived event {event.seq} cannot be read from its segment",
                        hint="run Verify (gantry audit verify) to see what was altered",
                    )
                event = StoredEvent(
                    event.seq, event.event_id, event.type, event.actor, event.resource,
                    event.action, event.decision, event.time_ms, event.state, body,
                )  # fmt: skip
            yield event

    # -- verification ----------------------------------------------------------------------

    def verify(self, trust: TrustStore, *, max_problems: int = 100) -> VerifyReport:
        """Recompute the log from the stored events and check every signed checkpoint.

        Archived events are read back from their segments, one segment at a time; a purged
        event counts with its stored leaf hash when it carries the seal of the purge that
        deleted it.
        """
        report = VerifyReport()
        heads = {int(r.tree_size): r for r in self.store.all_checkpoints()}
        stream = StreamingRoot()
        expected = 0
        checked: set[int] = set()
        problems = report.problems
        archive = _SegmentStream(self, self.segments())
        for row in self._verify_rows():
            seq = int(row[0])
            if seq != expected and len(problems) < max_problems:
                problems.append(
                    Problem(expected, "deleted", f"events {expected}..{seq - 1} are missing")
                )
            leaf, problem = self._check_row(seq, row, archive)
            if problem is not None and len(problems) < max_problems:
                problems.append(problem)
            stream.add(leaf)
            expected = seq + 1
            report.events_checked += 1
            head = heads.get(stream.size)
            if head is not None:
                checked.add(stream.size)
                self._check_head(head, stream.root(), trust, report)
        for size, head in heads.items():
            if size in checked:
                continue
            report.problems.append(
                Problem(
                    min(size, expected),
                    "deleted" if size > stream.size else "checkpoint",
                    f"the signed checkpoint of size {size} cannot be recomputed: only "
                    f"{stream.size} events are stored",
                )
            )
            self._check_head(head, None, trust, report)
        report.problems.sort(key=lambda p: p.index)
        del report.problems[max_problems:]
        if heads:
            last = heads[max(heads)]
            report.latest = TreeHead(
                int(last.tree_size),
                bytes(last.root_hash),
                int(last.timestamp_ms),
                last.key_id,
                bytes(last.signature),
            )
        return report

    def _verify_rows(self, chunk: int = 20_000) -> Iterator[Any]:
        """(seq, position, canonical, leaf_hash, seal, state, purge_id, *sealed columns) of
        every row in seq order, fetched in chunks."""
        c = events.c
        cols = [c.seq, c.position, c.canonical, c.leaf_hash, c.seal, c.state, purged.c.purge_id]
        cols += [c[name] for name in SEALED_COLUMNS]
        joined = events.outerjoin(purged, purged.c.seq == c.seq)
        last = -1
        while True:
            stmt = sa.select(*cols).select_from(joined).where(c.seq > last).order_by(c.seq)
            with self.store.engine.connect() as conn:
                rows = conn.execute(stmt.limit(chunk)).all()
            if not rows:
                return
            yield from rows
            last = int(rows[-1][0])

    def _check_row(
        self, seq: int, row: Sequence[Any], archive: _SegmentStream
    ) -> tuple[bytes, Problem | None]:
        """The leaf hash that row ``seq`` adds to the tree, and what is wrong with it, if any."""
        position, state, purge_id = row[1], row[5], row[6]
        stored, seal = _as_bytes(row[3]), _as_bytes(row[4])
        if state == "purged":
            if purge_id is None:
                return stored, Problem(seq, "altered", "the row is marked purged by no purge")
            return stored, self._check_seal(
                seq, position, stored, seal, purge_sealed(purge_id), "its purge seal"
            )
        sealed = sealed_columns(row[7:])
        where = ""
        if state == "archived":
            body, problem = archive.bytes_of(seq)
            if body is None:  # unreadable: carry on with the stored leaf, still sealed
                return stored, problem or self._check_seal(seq, position, stored, seal, sealed)
            where = f" in segment {archive.name}"
        else:
            body = _as_bytes(row[2])
            if state != "live":
                return leaf_hash(body), Problem(seq, "altered", f"unknown row state {state!r}")
        leaf = leaf_hash(body)
        if leaf != stored:
            return leaf, Problem(seq, "altered", f"event bytes{where} do not match their leaf hash")
        return leaf, self._check_seal(seq, position, leaf, seal, sealed)

    def _check_head(
        self, head: object, root: bytes | None, trust: TrustStore, report: VerifyReport
    ) -> None:
        th = TreeHead(
            int(head.tree_size),  # type: ignore[attr-defined]
            bytes(head.root_hash),  # type: ignore[attr-defined]
            int(head.timestamp_ms),  # type: ignore[attr-defined]
            head.key_id,  # type: ignore[attr-defined]
            bytes(head.signature),  # type: ignore[attr-defined]
        )
        report.checkpoints_checked += 1
        try:
            th.check_signature(trust)
        except Exception as exc:
            report.problems.append(Problem(th.tree_size - 1, "checkpoint", str(exc)))
            return
        if root is not None and root != th.root_hash:
            report.problems.append(
                Problem(
                    th.tree_size - 1,
                    "checkpoint",
                    f"recomputed root of the first {th.tree_size} events differs from the "
                    "signed tree head",
                )
            )

    def _check_seal(
        self,
        seq: int,
        position: object,
        leaf: bytes,
        seal: bytes,
        sealed: bytes,
        what: str = "its seal (event or indexed columns changed)",
    ) -> Problem | None:
        """None when the row carries the seal of its place, else what is wrong with it."""
        if hmac.compare_digest(seal_of(self._seal_key, seq, leaf, sealed), seal):
            if position == seq:
                return None
            return Problem(seq, "altered", f"the row's position column says {position}")
        if (
            isinstance(position, int)
            and position != seq
            and hmac.compare_digest(seal_of(self._seal_key, position, leaf, sealed), seal)
        ):
            return Problem(seq, "reordered", f"this event belongs at index {position}")
        return Problem(seq, "altered", f"the row does not carry {what}")


class _SegmentIndex:
    """Finds the archived segment holding a seq (segments do not overlap)."""

    def __init__(self, found: Sequence[Segment]) -> None:
        self._segments = sorted(found, key=lambda s: s.first_seq)
        self._firsts = [s.first_seq for s in self._segments]

    def find(self, seq: int) -> Segment | None:
        i = bisect.bisect_right(self._firsts, seq) - 1
        if i >= 0 and seq < self._segments[i].end_seq:
            return self._segments[i]
        return None


class _SegmentStream:
    """Archived events' bytes for a pass over the log in seq order: one segment in memory at a
    time, read uncached; a segment that cannot be read is reported once."""

    def __init__(self, ledger: Ledger, found: Sequence[Segment]) -> None:
        self._ledger = ledger
        self._index = _SegmentIndex(found)
        self._current: Segment | None = None
        self._events: dict[int, bytes | None] = {}
        self._failure: Problem | None = None

    @property
    def name(self) -> str:
        """The object name of the segment read last."""
        return self._current.object_name if self._current else ""

    def bytes_of(self, seq: int) -> tuple[bytes | None, Problem | None]:
        """The bytes of archived event ``seq``, or None and (the first time) the problem."""
        segment = self._index.find(seq)
        if segment is None:
            return None, Problem(
                seq, "altered", "the row is marked archived but no segment holds it"
            )
        if segment is not self._current:
            self._current, self._events, self._failure = segment, {}, None
            try:
                read = self._ledger.read_segment(segment)
                self._events = {line.seq: line.canonical for line in read.lines}
            except ObjectNotFound:
                self._failure = Problem(
                    seq,
                    "deleted",
                    f"segment object {segment.object_name or '(deleted after a purge)'} of "
                    f"events {segment.first_seq}..{segment.end_seq - 1} is missing",
                )
                return None, self._failure
            except IntegrityError as exc:
                self._failure = Problem(
                    seq,
                    "altered",
                    f"segment object {segment.object_name} of events {segment.first_seq}.."
                    f"{segment.end_seq - 1} was altered: {exc.message}",
                )
                return None, self._failure
        if self._failure is not None:
            return None, None
        body = self._events.get(seq)
        if body is None:
            return None, Problem(seq, "altered", f"the event is not in segment {self.name}")
        return body, None


def _as_bytes(value: object) -> bytes:
    """A stored blob as bytes (a tampered row may hold text or NULL instead)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return b"" if value is None else str(value).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def query_event(actor: str, query: str, filters: dict[str, object], results: int) -> EventEnvelope:
    """The ``gantry.audit.queried`` event recording a compliance query."""
    return EventEnvelope(
        type="gantry.audit.queried",
        source=SOURCE,
        actor=actor,
        subject="audit_log",
        correlation_id=new_id(),
        data={"query": query, "filters": filters, "results": results},
    )


__all__ = [
    "SEALED_COLUMNS",
    "SEGMENT_FORMAT",
    "SOURCE",
    "Ledger",
    "Problem",
    "Segment",
    "SegmentLine",
    "SegmentObject",
    "VerifyReport",
    "parse_segment",
    "purge_sealed",
    "query_event",
    "seal_of",
    "sealed_columns",
]
