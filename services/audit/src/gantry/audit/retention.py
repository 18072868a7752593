"""Retention rules, legal holds and the purge (domain): the only way anything leaves the log.

* A **retention rule** says how many days events of a type are kept: for an exact type, for a
  prefix ending in ``*`` (``gantry.authz.*``) or for every type (``*``). The most specific
  rule wins: the exact type, else the longest matching prefix, else ``*``. A type no rule
  covers is kept for ever.
* A **legal hold** keeps every event it matches, whatever the rules say, until it is
  released. It names principals (the event's actor), datasets (the event's resource is
  ``dataset/<name>``, or its data names the dataset) and/or a time range; an event matches
  when every criterion the hold names matches.
* The **purge** deletes the events whose rule expired and that no active hold matches. The row
  stays with its position, leaf hash, event id, type and time (so the Merkle tree, every
  signed head and every proof still verify, and a redelivered copy is not logged again); its
  bytes and the other indexed columns are blanked, and its seal becomes the purge seal. An
  archived event's bytes stay in its segment object until every event in the segment is
  purged; the object is deleted then.

Every change is recorded as an event (``gantry.audit.retention.changed``,
``gantry.audit.hold.changed``, ``gantry.audit.purged``) in the same transaction.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
from pydantic import BaseModel, Field

from gantry.audit.ledger import SOURCE, Ledger
from gantry.audit.store import events, holds, outbox, purged, retention_rules, segments
from gantry.core import AlreadyExists, Conflict, InvalidInput, NotFound, get_logger, new_id
from gantry.events import Outbox
from gantry.events.catalog import AuditHoldChanged, AuditPurged, AuditRetentionChanged
from gantry.events.envelope import TYPE_PATTERN

_log = get_logger("gantry.audit.retention")

DAY_MS = 86_400_000
MAX_KEEP_DAYS = 36_500
_PREFIX = re.compile(r"^[a-z0-9][a-z0-9._-]{0,126}\*$")
_HOLD_NAME = re.compile(r"^[a-z0-9._-]{1,128}$")
_BLANKED = ("source", "actor", "subject", "resource", "action", "decision", "correlation_id")


class RetentionSettings(BaseModel):
    """Archival and purging of the audit log (``GANTRY_AUDIT__RETENTION__*``)."""

    segment_level: int = Field(
        default=12,
        ge=4,
        le=20,
        description="Events per archived segment, as a power of two: 2**level (12 = 4096 "
        "events, a few MiB compressed: large enough to keep objects few, small enough to "
        "read one back quickly for a proof). Change it only before the first archival.",
    )
    archive_after_days: int = Field(
        default=90,
        ge=1,
        description="Days after which whole segments of events move to the object store "
        "(90: recent events, which queries and reports read most, stay in the database).",
    )
    auto: bool = Field(
        default=True,
        description="Archive due segments and purge expired events every `every_s` (true).",
    )
    every_s: float = Field(
        default=3600.0, gt=0, description="Seconds between automatic runs (3600: hourly)."
    )


@dataclass(frozen=True)
class RetentionRule:
    """How long events of a type are kept (the ``RetentionRule`` message)."""

    event_type: str  # a type, a prefix ending in '*', or '*'
    keep_days: int
    updated_by: str
    updated_ms: int


@dataclass(frozen=True)
class LegalHold:
    """A legal hold (the ``LegalHold`` message); ``0`` in since/until means unbounded."""

    hold_id: str
    name: str
    reason: str
    principals: tuple[str, ...]
    datasets: tuple[str, ...]
    since_ms: int
    until_ms: int
    state: str  # active | released
    created_by: str
    created_ms: int
    released_by: str = ""
    released_ms: int = 0
    release_note: str = ""

    def matches(
        self, actor: str, resource: str, time_ms: int, data: Callable[[], dict[str, Any] | None]
    ) -> bool:
        """Whether this hold covers an event: every criterion it names must match. ``data``
        gives the event's data when a dataset must be looked up there (None = unreadable,
        which counts as a match: a hold errs on the side of keeping)."""
        if self.since_ms and time_ms < self.since_ms:
            return False
        if self.until_ms and time_ms >= self.until_ms:
            return False
        if self.principals and actor not in self.principals:
            return False
        if not self.datasets:
            return True
        if resource.startswith("dataset/") and resource[8:] in self.datasets:
            return True
        doc = data()
        return doc is None or any(_names_dataset(doc, name) for name in self.datasets)


@dataclass(frozen=True)
class PurgeResult:
    """What a purge deleted, or on a dry run would delete (the ``PurgeResponse`` message, plus
    the deleted ranges and the segment objects removed)."""

    purge_id: str  # "" on a dry run or when nothing was deletable
    events: int
    held_back: int
    by_type: dict[str, int]
    dry_run: bool
    ranges: list[tuple[int, int]] = field(default_factory=list)  # [first, end) of seqs
    segments_deleted: list[str] = field(default_factory=list)


def check_pattern(event_type: str) -> str:
    """``event_type`` when it is a valid rule pattern, else InvalidInput saying why."""
    value = event_type.strip()
    if value == "*" or _PREFIX.match(value) or TYPE_PATTERN.match(value):
        return value
    raise InvalidInput(
        f"retention rule for {event_type!r}: not an event type, a prefix ending in '*', or '*'",
        hint="write an exact type (gantry.data.accessed), a prefix (gantry.authz.*) or * for "
        "every type; lower-case letters, digits, '.', '_' and '-' only",
    )


def rule_for(event_type: str, rules: Iterable[RetentionRule]) -> RetentionRule | None:
    """The rule that applies to ``event_type``: exact, else the longest prefix, else ``*``."""
    best: RetentionRule | None = None
    best_len = -1
    for rule in rules:
        if rule.event_type == event_type:
            return rule
        if rule.event_type.endswith("*"):
            prefix = rule.event_type[:-1]
            if event_type.startswith(prefix) and len(prefix) > best_len:
                best, best_len = rule, len(prefix)
    return best


class Retention:
    """Retention rules, legal holds and the purge of one audit log; safe to call from any
    thread (a purge and archival never run at once: both hold the ledger's maintenance lock).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        chunk: int = 5000,
        part_events: int = 20_000,
        part_ranges: int = 1000,
    ) -> None:
        """``part_events`` and ``part_ranges`` bound one transaction of a purge and its
        ``gantry.audit.purged`` event (a large purge is several, sharing one purge id)."""
        self.ledger = ledger
        self.engine = ledger.store.engine
        self._outbox = Outbox(outbox, source=SOURCE)
        self._chunk = chunk
        self._part = (part_events, part_ranges)

    # -- rules -----------------------------------------------------------------------------

    def set_rule(self, event_type: str, keep_days: int, by: str) -> RetentionRule:
        """Keep events of ``event_type`` (a type, ``prefix*`` or ``*``) for ``keep_days``
        (1..36500); 0 removes the rule. Returns the rule as now stored (keep_days 0 when
        removed)."""
        pattern = check_pattern(event_type)
        if isinstance(keep_days, bool) or not 0 <= keep_days <= MAX_KEEP_DAYS:
            raise InvalidInput(
                f"keep_days must be 1..{MAX_KEEP_DAYS} (or 0 to remove the rule), not {keep_days}",
                hint="give the number of days events of this type must be kept",
            )
        now = self.ledger.now_ms()
        rule = RetentionRule(pattern, keep_days, by, now)
        t = retention_rules
        with self.engine.begin() as conn:
            exists = conn.execute(
                sa.select(t.c.event_type).where(t.c.event_type == pattern)
            ).first()
            if keep_days == 0:
                if exists is None:
                    raise NotFound(
                        "retention rule",
                        pattern,
                        hint="list the rules with `gantry audit retention list`",
                    )
                conn.execute(t.delete().where(t.c.event_type == pattern))
            elif exists is None:
                conn.execute(t.insert().values(**vars(rule)))
            else:
                conn.execute(t.update().where(t.c.event_type == pattern).values(**vars(rule)))
            self._outbox.record(
                conn,
                "gantry.audit.retention.changed",
                AuditRetentionChanged(event_type=pattern, keep_days=keep_days, by=by),
                actor=by,
                subject=f"audit_retention/{pattern}",
            )
        _log.info("retention rule set", event_type=pattern, keep_days=keep_days, by=by)
        return rule

    def rules(self) -> list[RetentionRule]:
        """Every retention rule, by pattern."""
        t = retention_rules
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.event_type)).all()
        return [
            RetentionRule(r.event_type, int(r.keep_days), r.updated_by, int(r.updated_ms))
            for r in rows
        ]

    # -- legal holds -----------------------------------------------------------------------

    def place(
        self,
        name: str,
        reason: str,
        principals: Sequence[str] = (),
        datasets: Sequence[str] = (),
        since_ms: int = 0,
        until_ms: int = 0,
        *,
        by: str,
    ) -> LegalHold:
        """Place a legal hold; from when this returns, no purge deletes an event it matches."""
        hold = LegalHold(
            hold_id=new_id(),
            name=_check_hold_name(name),
            reason=_required(reason, "reason", "say why the events must be kept (case, order)"),
            principals=_names(principals, "principal"),
            datasets=_names(datasets, "dataset"),
            since_ms=since_ms,
            until_ms=until_ms,
            state="active",
            created_by=by,
            created_ms=self.ledger.now_ms(),
        )
        if since_ms < 0 or until_ms < 0:
            raise InvalidInput(
                f"legal hold {name!r}: times are Unix milliseconds >= 0, got {since_ms} and "
                f"{until_ms}",
                hint="use 0 for an unbounded side of the time range",
            )
        if since_ms and until_ms and since_ms >= until_ms:
            raise InvalidInput(
                f"legal hold {name!r}: since ({since_ms}) must be before until ({until_ms})",
                hint="events in [since, until) are held; swap them or leave one side 0",
            )
        if not (hold.principals or hold.datasets or since_ms or until_ms):
            raise InvalidInput(
                f"legal hold {name!r} names no principal, dataset or time range",
                hint="name at least one criterion: a hold on everything is a retention "
                "rule change, not a hold",
            )
        with self.ledger.maintenance_lock, self.engine.begin() as conn:
            taken = conn.execute(sa.select(holds.c.hold_id).where(holds.c.name == hold.name))
            if taken.first() is not None:
                raise AlreadyExists(
                    f"a legal hold named {hold.name!r} already exists",
                    hint="choose another name (released holds keep theirs, for the record)",
                )
            conn.execute(holds.insert().values(**_hold_row(hold)))
            self._record_hold(conn, hold, by)
        _log.info("legal hold placed", hold=hold.name, by=by)
        return hold

    def release(self, name: str, note: str, *, by: str) -> LegalHold:
        """Release an active legal hold; ``note`` (required) says why."""
        note = _required(note, "note", "say why the hold may end (case closed, order lifted)")
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(holds).where(holds.c.name == name)).first()
            if row is None:
                raise NotFound(
                    "legal hold", name, hint="list them with `gantry audit holds list --all`"
                )
            if int(row.released_ms):
                raise Conflict(
                    f"legal hold {name!r} was already released by {row.released_by} at "
                    f"{int(row.released_ms)} (Unix ms)",
                    hint="a released hold cannot be released again; place a new one if needed",
                )
            now = self.ledger.now_ms()
            conn.execute(
                holds.update()
                .where(holds.c.hold_id == row.hold_id)
                .values(released_by=by, released_ms=now, release_note=note)
            )
            hold = _hold_of(row, released=(by, now, note))
            self._record_hold(conn, hold, by)
        _log.info("legal hold released", hold=name, by=by)
        return hold

    def holds(self, include_released: bool = False) -> list[LegalHold]:
        """The active legal holds (and the released ones too when asked), oldest first."""
        stmt = sa.select(holds).order_by(holds.c.created_ms, holds.c.name)
        if not include_released:
            stmt = stmt.where(holds.c.released_ms == 0)
        with self.engine.connect() as conn:
            return [_hold_of(r) for r in conn.execute(stmt)]

    def _record_hold(self, conn: sa.Connection, hold: LegalHold, by: str) -> None:
        self._outbox.record(
            conn,
            "gantry.audit.hold.changed",
            AuditHoldChanged(
                hold_id=hold.hold_id,
                name=hold.name,
                state="active" if hold.state == "active" else "released",
                by=by,
                reason=hold.reason if hold.state == "active" else hold.release_note,
                principals=list(hold.principals),
                datasets=list(hold.datasets),
                since_ms=hold.since_ms,
                until_ms=hold.until_ms,
            ),
            actor=by,
            subject=f"audit_hold/{hold.name}",
        )

    # -- the purge -------------------------------------------------------------------------

    def purge(self, by: str, now_ms: int = 0, dry_run: bool = False) -> PurgeResult:
        """Delete every event whose retention expired before ``now_ms`` (0 = now) and that no
        active legal hold matches; on a dry run only count them. Nothing else deletes."""
        now = now_ms or self.ledger.now_ms()
        with self.ledger.maintenance_lock:
            rules = self.rules()
            active = self.holds()
            doomed: list[tuple[int, str, str, bytes]] = []  # seq, type, state, leaf
            held = 0
            for row in self._expired(rules, active, now):
                data = _data(self, row)
                if any(h.matches(row.actor, row.resource, int(row.time_ms), data) for h in active):
                    held += 1
                else:
                    doomed.append((int(row.seq), row.type, row.state, bytes(row.leaf_hash)))
            by_type = dict(sorted(Counter(t for _, t, _, _ in doomed).items()))
            ranges = _ranges(seq for seq, _, _, _ in doomed)
            if dry_run or not doomed:
                swept = [] if dry_run else self._sweep_segments()  # retry an interrupted one
                return PurgeResult("", len(doomed), held, by_type, dry_run, ranges, swept)
            purge_id = new_id()
            for number, part in enumerate(_parts(doomed, *self._part)):
                with self.engine.begin() as conn:
                    if conn.dialect.name == "sqlite":  # overwrite freed space, not just unlink
                        conn.exec_driver_sql("PRAGMA secure_delete=ON")
                    self._delete(conn, purge_id, part, now)
                    self._outbox.record(
                        conn,
                        "gantry.audit.purged",
                        AuditPurged(
                            purge_id=purge_id,
                            by=by,
                            events=len(part),
                            ranges=[list(r) for r in _ranges(seq for seq, _, _, _ in part)],
                            by_type=dict(sorted(Counter(t for _, t, _, _ in part).items())),
                            held_back=0 if number else held,
                        ),
                        actor=by,
                        subject="audit_log",
                    )
            self._flush_sqlite_wal()
            self.ledger.forget_segments()
            deleted = self._sweep_segments()
        _log.info("audit events purged", purge_id=purge_id, events=len(doomed), held_back=held)
        return PurgeResult(purge_id, len(doomed), held, by_type, False, ranges, deleted)

    def _expired(
        self, rules: list[RetentionRule], active: list[LegalHold], now: int
    ) -> Iterator[Any]:
        """Rows not yet purged whose rule expired before ``now``, in seq order."""
        if not rules:
            return
        c = events.c
        conds = []
        for rule in rules:
            cutoff = c.time_ms < now - rule.keep_days * DAY_MS
            if rule.event_type == "*":
                conds.append(cutoff)
            elif rule.event_type.endswith("*"):
                prefix = c.type.startswith(rule.event_type[:-1], autoescape=True)
                conds.append(sa.and_(prefix, cutoff))
            else:
                conds.append(sa.and_(c.type == rule.event_type, cutoff))
        cols = [c.seq, c.type, c.time_ms, c.actor, c.resource, c.state, c.leaf_hash]
        if any(h.datasets for h in active):
            cols.append(c.canonical)
        last = -1
        while True:
            stmt = (
                sa.select(*cols)
                .where(c.seq > last, c.state != "purged", sa.or_(*conds))
                .order_by(c.seq)
                .limit(self._chunk)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
            if not rows:
                return
            for row in rows:
                applies = rule_for(row.type, rules)
                if applies is not None and int(row.time_ms) < now - applies.keep_days * DAY_MS:
                    yield row
            last = int(rows[-1].seq)

    def _delete(
        self,
        conn: sa.Connection,
        purge_id: str,
        doomed: list[tuple[int, str, str, bytes]],
        now: int,
    ) -> None:
        """Blank the rows in ``conn``'s transaction; Conflict when one changed meanwhile."""
        c = events.c
        stmt = (
            events.update()
            .where(c.seq == sa.bindparam("b_seq"), c.state == sa.bindparam("b_state"))
            .values(
                canonical=b"",
                state="purged",
                seal=sa.bindparam("b_seal"),
                **dict.fromkeys(_BLANKED, ""),
            )
        )
        for start in range(0, len(doomed), self._chunk):
            part = doomed[start : start + self._chunk]
            conn.execute(
                stmt,
                [
                    {
                        "b_seq": seq,
                        "b_state": state,
                        "b_seal": self.ledger.purge_seal(seq, leaf, purge_id),
                    }
                    for seq, _, state, leaf in part
                ],
            )
            conn.execute(
                purged.insert(),
                [
                    {"seq": seq, "purge_id": purge_id, "event_type": type_, "purged_ms": now}
                    for seq, type_, _, _ in part
                ],
            )
        done = conn.execute(
            sa.select(sa.func.count())
            .select_from(events.join(purged, purged.c.seq == c.seq))
            .where(
                purged.c.purge_id == purge_id,
                c.state == "purged",
                c.seq >= doomed[0][0],
                c.seq <= doomed[-1][0],
            )
        ).scalar_one()
        if done != len(doomed):
            raise Conflict(
                f"{len(doomed) - done} of the {len(doomed)} events to purge changed meanwhile",
                hint="nothing was deleted; run the purge again",
            )

    def _flush_sqlite_wal(self) -> None:
        """On SQLite, copy the purge into the database file and empty the write-ahead log,
        whose older frames may still hold the deleted bytes (best effort: readers may hold
        it; the next purge retries)."""
        if self.engine.dialect.name != "sqlite":
            return
        with self.engine.connect() as conn:
            busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
        if busy is not None and busy[0]:
            _log.warning("write-ahead log not emptied after a purge: readers held it")

    def _sweep_segments(self) -> list[str]:
        """Delete the objects of archived segments whose every event is purged (after the
        purge committed; one interrupted here is deleted by the next purge)."""
        e, s = events.c, segments.c
        unpurged = (
            sa.select(e.seq)
            .where(e.seq >= s.first_seq, e.seq < s.end_seq, e.state != "purged")
            .exists()
        )
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(s.first_seq, s.object_name).where(s.object_name != "", ~unpurged)
            ).all()
        if rows and self.ledger.objects is None:
            _log.warning("purged segments kept: no object store", segments=len(rows))
            return []
        deleted = []
        for first, name in rows:
            self.ledger.require_objects("delete purged segments").delete(name)
            with self.engine.begin() as conn:
                conn.execute(segments.update().where(s.first_seq == first).values(object_name=""))
            deleted.append(name)
            _log.info("purged segment deleted", object=name)
        self.ledger.forget_segments()
        return deleted


def _data(retention: Retention, row: Any) -> Callable[[], dict[str, Any] | None]:
    """A lazy reader of an expired row's event data (None when it cannot be read)."""

    def read() -> dict[str, Any] | None:
        try:
            if row.state == "archived":
                body = retention.ledger.segment_events_of(int(row.seq)).get(int(row.seq))
            else:
                body = bytes(row.canonical)
            data = orjson.loads(body or b"")["data"]
        except Exception as exc:  # a hold errs on the side of keeping the event
            _log.warning("event data unreadable; kept", seq=int(row.seq), error=str(exc))
            return None
        return data if isinstance(data, dict) else {}

    return read


def _names_dataset(data: dict[str, Any], name: str) -> bool:
    """Whether event data names dataset ``name`` (``dataset`` or ``dataset_version``)."""
    if data.get("dataset") == name:
        return True
    version = data.get("dataset_version")
    return isinstance(version, str) and version.startswith(name + "@")


def _parts(
    doomed: list[tuple[int, str, str, bytes]], max_events: int, max_ranges: int
) -> Iterator[list[tuple[int, str, str, bytes]]]:
    """The events to delete in parts of bounded size: each part is one transaction and one
    ``gantry.audit.purged`` event, which must stay well under the event size limit."""
    start, ranges = 0, 0
    for i, (seq, _, _, _) in enumerate(doomed):
        if i > start and doomed[i - 1][0] + 1 != seq:
            ranges += 1
        if i - start >= max_events or ranges >= max_ranges:
            yield doomed[start:i]
            start, ranges = i, 0
    if start < len(doomed):
        yield doomed[start:]


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending seqs as [first, end) ranges of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for seq in seqs:
        if out and out[-1][1] == seq:
            out[-1] = (out[-1][0], seq + 1)
        else:
            out.append((seq, seq + 1))
    return out


def _check_hold_name(name: str) -> str:
    if not _HOLD_NAME.match(name):
        raise InvalidInput(
            f"legal hold name {name!r} is not 1-128 characters of a-z, 0-9, '.', '_' and '-'",
            hint="name it after the case, e.g. case-2026-017",
        )
    return name


def _required(text: str, what: str, hint: str) -> str:
    value = text.strip()
    if not value:
        raise InvalidInput(f"a {what} is required", hint=hint)
    return value


def _names(values: Sequence[str], what: str) -> tuple[str, ...]:
    """Distinct, stripped, sorted names; InvalidInput for an empty or over-long one."""
    out = set()
    for value in values:
        name = value.strip()
        if not name or len(name) > 256:
            raise InvalidInput(
                f"{what} {value!r} must be 1-256 characters",
                hint=f"give each {what} by its name, e.g. alice or customers",
            )
        out.add(name)
    return tuple(sorted(out))


def _hold_row(hold: LegalHold) -> dict[str, Any]:
    return {
        "hold_id": hold.hold_id,
        "name": hold.name,
        "reason": hold.reason,
        "principals_json": orjson.dumps(list(hold.principals)).decode(),
        "datasets_json": orjson.dumps(list(hold.datasets)).decode(),
        "since_ms": hold.since_ms,
        "until_ms": hold.until_ms,
        "created_by": hold.created_by,
        "created_ms": hold.created_ms,
        "released_by": "",
        "released_ms": 0,
        "release_note": "",
    }


def _hold_of(row: Any, released: tuple[str, int, str] | None = None) -> LegalHold:
    by, ms, note = released or (row.released_by, int(row.released_ms), row.release_note)
    return LegalHold(
        hold_id=row.hold_id,
        name=row.name,
        reason=row.reason,
        principals=tuple(orjson.loads(row.principals_json)),
        datasets=tuple(orjson.loads(row.datasets_json)),
        since_ms=int(row.since_ms),
        until_ms=int(row.until_ms),
        state="released" if ms else "active",
        created_by=row.created_by,
        created_ms=int(row.created_ms),
        released_by=by,
        released_ms=ms,
        release_note=note,
    )


__all__ = [
    "DAY_MS",
    "MAX_KEEP_DAYS",
    "LegalHold",
    "PurgeResult",
    "Retention",
    "RetentionRule",
    "RetentionSettings",
    "check_pattern",
    "rule_for",
]
