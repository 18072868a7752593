"""The tamper-evident log (domain): appends, signed checkpoints, proofs and verification."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from gantry.audit.facets import facets_of
from gantry.audit.store import Store, outbox
from gantry.core import Clock, InvalidInput, NotFound, SystemClock, get_logger, new_id
from gantry.events import AuditCheckpoint, EventEnvelope, Outbox
from gantry.security.keys import SigningKey, TrustStore
from gantry.security.merkle import MerkleTree, StreamingRoot, leaf_hash
from gantry.security.treehead import TreeHead

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
    in-memory tree is updated only after the transaction committed.
    """

    def __init__(
        self,
        store: Store,
        *,
        seal_key: bytes,
        signer: SigningKey,
        clock: Clock | None = None,
        checkpoint_every_events: int = 1000,
    ) -> None:
        self.store = store
        self._seal_key = seal_key
        self._signer = signer
        self._clock = clock or SystemClock()
        self._every = checkpoint_every_events
        self._outbox = Outbox(outbox)
        self._lock = threading.Lock()
        self.tree = MerkleTree()
        self.last_checkpoint_size = 0

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
        path = self.tree.inclusion_proof(int(row.seq), head.tree_size)
        return int(row.seq), path, bytes(row.leaf_hash), bytes(row.canonical), head

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

    def verify(self, trust: TrustStore, *, max_problems: int = 100) -> VerifyReport:
        """Recompute the log from the stored events and check every signed checkpoint."""
        report = VerifyReport()
        heads = {int(r.tree_size): r for r in self.store.all_checkpoints()}
        stream = StreamingRoot()
        expected = 0
        checked: set[int] = set()
        problems = report.problems
        columns = ["seq", "position", "canonical", "leaf_hash", "seal", *SEALED_COLUMNS]
        for row in self.store.iter_rows(columns):
            seq = int(row[0])
            if seq != expected and len(problems) < max_problems:
                problems.append(
                    Problem(expected, "deleted", f"events {expected}..{seq - 1} are missing")
                )
            leaf = leaf_hash(_as_bytes(row[2]))
            if leaf != _as_bytes(row[3]):
                if len(problems) < max_problems:
                    problems.append(
                        Problem(seq, "altered", "event bytes do not match their leaf hash")
                    )
            else:
                problem = self._check_seal(seq, row[1], leaf, _as_bytes(row[4]), row[5:])
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
        self, seq: int, position: object, leaf: bytes, seal: bytes, columns: Sequence[object]
    ) -> Problem | None:
        """None when the row carries the seal of its place, else what is wrong with it."""
        sealed = sealed_columns(columns)
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
        return Problem(
            seq, "altered", "the row does not carry its seal (event or indexed columns changed)"
        )


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


__all__ = ["SOURCE", "Ledger", "Problem", "VerifyReport", "query_event", "seal_of"]
