"""Signed compliance reports (domain): the figures of a day, week or month of the audit log,
signed, stored encrypted, announced, and verifiable later against the log itself.

A report is built from the latest *signed tree head*: it reads only the first ``tree_size``
events of the log, so the same figures can be recomputed at any later time, and the tree
head's consistency with the log of the day proves those events were never rewritten. The
signed original is JSON::

    {"report": {report_id, period, timezone, since_ms, until_ms, created_ms, created_by,
                tree_head: {tree_size, root_hash, timestamp_ms, key_id, signature},
                figures: {...}},
     "digest": "<sha256 hex of the canonical JSON of report>",
     "key_id": "svc-audit",
     "signature": "<base64 Ed25519 over b'gantry.audit.report.v1\\n' + digest>"}

CSV and PDF renderings are stored beside it; all three are encrypted by the object store.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
import sqlalchemy as sa
from pydantic import BaseModel, Field, field_validator

from gantry.audit.ledger import SOURCE
from gantry.audit.report_figures import compute_figures, summary_of
from gantry.audit.report_render import render_csv, render_pdf
from gantry.audit.report_verify import (
    SIGNATURE_DOMAIN,
    ConsistencySource,
    EventSource,
    ReportVerification,
    report_digest,
    signed_message,
    verify_report,
)
from gantry.audit.store import Store, checkpoints, events, outbox, reports
from gantry.core import (
    Clock,
    GantryError,
    InvalidInput,
    NotFound,
    SystemClock,
    get_logger,
    new_id,
)
from gantry.events import EventEnvelope, Outbox, canonical_json
from gantry.events.catalog import AuditReportReady
from gantry.security.keys import SigningKey, TrustStore
from gantry.security.treehead import TreeHead
from gantry.storage import ObjectStore

_log = get_logger("gantry.audit.reports")

OBJECT_PREFIX = "audit/reports/"
_CONTENT_TYPES = {"json": "application/json", "csv": "text/csv", "pdf": "application/pdf"}

Period = Literal["daily", "weekly", "monthly"]
Format = Literal["json", "csv", "pdf"]
PERIODS: tuple[Period, ...] = ("daily", "weekly", "monthly")
FORMATS: tuple[Format, ...] = ("json", "csv", "pdf")


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone ``name``, or :class:`InvalidInput` saying what to write instead."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"unknown time zone {name!r}",
            hint="use an IANA name such as UTC, Europe/Berlin or America/New_York",
        ) from None


class ReportSettings(BaseModel):
    """Scheduled compliance reports (``GANTRY_AUDIT__REPORTS__*``)."""

    enabled: bool = Field(
        default=True, description="Generate the scheduled reports at all (on-demand ones work "
        "either way)."
    )  # fmt: skip
    schedule: list[Period] = Field(
        default_factory=lambda: list(PERIODS),
        description="Periods reported on as each one ends: daily, weekly (ISO weeks, from "
        'Monday), monthly. JSON list, e.g. ["weekly","monthly"]; [] = on demand only.',
    )
    timezone: str = Field(
        default="UTC",
        description="IANA time zone whose midnights bound days, weeks and months (UTC).",
    )
    formats: list[Format] = Field(
        default_factory=lambda: list(FORMATS),
        description="Renderings stored per report: json (the signed original, always "
        "included), csv, pdf.",
    )
    check_every_s: float = Field(
        default=60.0, gt=0, description="Seconds between checks for a period that ended (60)."
    )
    delay_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds to wait after a period ends before reporting on it, so events "
        "still in flight are in the log and under a signed tree head (300).",
    )

    @field_validator("schedule", "formats", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):  # "daily,weekly" as well as a JSON list
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("schedule")
    @classmethod
    def _unique_periods(cls, value: list[Period]) -> list[Period]:
        return [p for p in PERIODS if p in value]

    @field_validator("formats")
    @classmethod
    def _json_first(cls, value: list[Format]) -> list[Format]:
        return ["json", *(f for f in FORMATS[1:] if f in value)]

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as UTC or Europe/Berlin"
            ) from None
        return value


def _ms(when: dt.datetime) -> int:
    return round(when.timestamp() * 1000)


def _midnight(day: dt.date, zone: dt.tzinfo) -> int:
    # zoneinfo resolves a midnight skipped by a DST change to the first instant of the day
    return _ms(dt.datetime.combine(day, dt.time(0), tzinfo=zone))


def period_bounds(period: str, now: dt.datetime, tz: str | dt.tzinfo) -> tuple[int, int]:
    """``(since_ms, until_ms)`` of the last whole day, ISO week (from Monday 00:00) or calendar
    month before ``now``, with midnights in ``tz`` (so a DST day is 23 or 25 hours long)."""
    zone = zone_of(tz) if isinstance(tz, str) else tz
    if now.tzinfo is None:
        raise InvalidInput("period_bounds needs an aware datetime", hint="pass datetime.now(UTC)")
    today = now.astimezone(zone).date()
    if period == "daily":
        end = today
        start = end - dt.timedelta(days=1)
    elif period == "weekly":
        end = today - dt.timedelta(days=today.weekday())
        start = end - dt.timedelta(days=7)
    elif period == "monthly":
        end = today.replace(day=1)
        start = (end - dt.timedelta(days=1)).replace(day=1)
    else:
        raise InvalidInput(
            f"unknown report period {period!r}",
            hint="use daily, weekly or monthly (or custom with since and until)",
        )
    return _midnight(start, zone), _midnight(end, zone)


def request_bounds(
    period: str, since_ms: int, until_ms: int, now: dt.datetime, tz: str | dt.tzinfo
) -> tuple[int, int]:
    """The range a GenerateReport request asks for: the last whole ``period``, or for
    ``custom`` the given ``[since_ms, until_ms)``, which must end by ``now``."""
    if period != "custom":
        return period_bounds(period, now, tz)
    if not 0 <= since_ms < until_ms:
        raise InvalidInput(
            f"a custom report needs 0 <= since_ms < until_ms, got {since_ms} and {until_ms}",
            hint="pass the start and end of the range in Unix milliseconds",
        )
    if until_ms > _ms(now):
        raise InvalidInput(
            "a custom report cannot end in the future",
            hint="reports cover the past only; pick an until_ms before now",
        )
    return since_ms, until_ms


def due_reports(
    now: dt.datetime,
    tz: str | dt.tzinfo,
    schedule: Iterable[str],
    existing: set[tuple[str, int]],
    *,
    delay_s: float = 0.0,
) -> list[tuple[str, int, int]]:
    """``(period, since_ms, until_ms)`` of each scheduled period that ended at least
    ``delay_s`` ago and has no report yet (``existing`` holds ``(period, since_ms)``).

    Only the latest whole period of each kind is due; a missed older one is not backfilled
    (generate it on demand with its bounds).
    """
    ref = now - dt.timedelta(seconds=delay_s)
    due: list[tuple[str, int, int]] = []
    for period in PERIODS:
        if period not in schedule:
            continue
        since, until = period_bounds(period, ref, tz)
        if (period, since) not in existing:
            due.append((period, since, until))
    return due


def tree_head_dict(head: TreeHead) -> dict[str, Any]:
    """A signed tree head as it appears in a report."""
    return {
        "tree_size": head.tree_size,
        "root_hash": head.root_hash.hex(),
        "timestamp_ms": head.timestamp_ms,
        "key_id": head.key_id,
        "signature": base64.b64encode(head.signature).decode(),
    }


@dataclass(frozen=True)
class ReportRecord:
    """A stored report, as the API shows it (``ComplianceReport``)."""

    report_id: str
    period: str
    since_ms: int
    until_ms: int
    created_ms: int
    created_by: str
    tree_head: TreeHead
    digest: str
    key_id: str
    signature: bytes
    formats: tuple[str, ...]
    summary_json: str

    @property
    def summary(self) -> dict[str, Any]:
        """The headline figures."""
        value: dict[str, Any] = orjson.loads(self.summary_json)
        return value


def parse_report(raw: bytes) -> dict[str, Any]:
    """A downloaded report's JSON, parsed; :class:`InvalidInput` if it is not one."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(
            f"the report is not JSON ({exc})",
            hint="pass the .json rendering of a report (the CSV and PDF are not signed)",
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput("the report JSON is not an object", hint="pass the report's .json")
    return doc


class Reports:
    """Generates, stores, lists, serves and verifies compliance reports.

    Synchronous (call it from a worker thread). ``tree_heads()`` gives the latest signed tree
    head; ``events(since_ms, until_ms, below_seq)`` the log's events (e.g.
    ``Store.live_events``, or a reader that also fetches archived events' bytes).
    """

    def __init__(
        self,
        engine: sa.Engine,
        store: Store,
        objects: ObjectStore,
        signer: SigningKey,
        tree_heads: Callable[[], TreeHead],
        events: EventSource,
        settings: ReportSettings | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.objects = objects
        self.settings = settings or ReportSettings()
        self._signer = signer
        self._tree_heads = tree_heads
        self._events = events
        self._clock = clock or SystemClock()
        self._outbox = Outbox(outbox)
        self.zone = zone_of(self.settings.timezone)

    # -- generating --------------------------------------------------------------------------

    def generate(self, period: str, since_ms: int, until_ms: int, by: str = "") -> ReportRecord:
        """Build, sign and store the report of ``[since_ms, until_ms)`` from the latest signed
        tree head; announce it (``gantry.audit.report.ready``). ``by`` is '' when scheduled.

        The objects are written first, then the row and the event in one transaction; if
        anything fails the objects are removed again, so nothing of the report is visible.
        """
        if period not in (*PERIODS, "custom"):
            raise InvalidInput(
                f"unknown report period {period!r}", hint="use daily, weekly, monthly or custom"
            )
        if not 0 <= since_ms < until_ms:
            raise InvalidInput(
                f"a report needs 0 <= since_ms < until_ms, got {since_ms} and {until_ms}"
            )
        head = self._tree_heads()
        figures = compute_figures(
            self._events(since_ms, until_ms, head.tree_size), since_ms, until_ms
        )
        report_id = new_id()
        document: dict[str, Any] = {
            "report_id": report_id,
            "period": period,
            "timezone": self.settings.timezone,
            "since_ms": since_ms,
            "until_ms": until_ms,
            "created_ms": _ms(self._clock.now()),
            "created_by": by,
            "tree_head": tree_head_dict(head),
            "figures": figures,
        }
        digest = report_digest(document)
        signature = self._signer.sign(signed_message(digest))
        signed = {
            "report": document,
            "digest": digest,
            "key_id": self._signer.kid,
            "signature": base64.b64encode(signature).decode(),
        }
        summary = canonical_json(summary_of(figures)).decode()
        names = self._put_objects(report_id, signed)
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    reports.insert().values(
                        report_id=report_id,
                        period=period,
                        since_ms=since_ms,
                        until_ms=until_ms,
                        created_ms=document["created_ms"],
                        created_by=by,
                        tree_size=head.tree_size,
                        root_hash=head.root_hash,
                        digest=digest,
                        key_id=self._signer.kid,
                        signature=signature,
                        objects_json=canonical_json(names).decode(),
                        summary_json=summary,
                    )
                )
                self._outbox.add(conn, self._ready_event(document, digest, list(names), by))
        except BaseException:
            self._remove_objects(names.values())
            raise
        _log.info(
            "compliance report stored",
            report_id=report_id,
            period=period,
            since_ms=since_ms,
            until_ms=until_ms,
            tree_size=head.tree_size,
        )
        return ReportRecord(
            report_id, period, since_ms, until_ms, document["created_ms"], by, head, digest,
            self._signer.kid, signature, tuple(names), summary,
        )  # fmt: skip

    def _put_objects(self, report_id: str, signed: dict[str, Any]) -> dict[str, str]:
        renderers: dict[str, Callable[[dict[str, Any]], bytes]] = {
            "json": canonical_json,
            "csv": render_csv,
            "pdf": render_pdf,
        }
        names: dict[str, str] = {}
        try:
            for fmt in self.settings.formats:
                name = f"{OBJECT_PREFIX}{report_id}.{fmt}"
                self.objects.put(
                    name, renderers[fmt](signed), metadata={"content-type": _CONTENT_TYPES[fmt]}
                )
                names[fmt] = name
        except BaseException:
            self._remove_objects(names.values())
            raise
        return names

    def _remove_objects(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                self.objects.delete(name)
            except (GantryError, OSError) as exc:  # sweep it later; the report is not listed
                _log.warning("could not remove a report object", object=name, error=str(exc))

    def _ready_event(
        self, document: dict[str, Any], digest: str, formats: list[str], by: str
    ) -> EventEnvelope:
        head = document["tree_head"]
        return EventEnvelope(
            type="gantry.audit.report.ready",
            source=SOURCE,
            actor=by or "svc-audit",
            subject=f"audit_report/{document['report_id']}",
            data=AuditReportReady(
                report_id=document["report_id"],
                period=document["period"],
                since_ms=document["since_ms"],
                until_ms=document["until_ms"],
                tree_size=head["tree_size"],
                root_hash=head["root_hash"],
                digest=digest,
                formats=formats,
                by=by,
            ).model_dump(mode="json"),
        )

    def _first_event_ms(self) -> int | None:
        with self.engine.connect() as conn:
            first = conn.execute(sa.select(sa.func.min(events.c.time_ms))).scalar()
        return None if first is None else int(first)

    def bounds(self, period: str, since_ms: int, until_ms: int) -> tuple[int, int]:
        """The range a request for ``period`` means now (see :func:`request_bounds`)."""
        return request_bounds(period, since_ms, until_ms, self._clock.now(), self.zone)

    def existing(self) -> set[tuple[str, int]]:
        """``(period, since_ms)`` of every stored scheduled report."""
        stmt = sa.select(reports.c.period, reports.c.since_ms).where(reports.c.period.in_(PERIODS))
        with self.engine.connect() as conn:
            return {(str(p), int(s)) for p, s in conn.execute(stmt)}

    def generate_due(self, now: dt.datetime | None = None) -> list[ReportRecord]:
        """Generate every scheduled report that is due (see :func:`due_reports`); the service
        loop calls this every ``check_every_s``. A failure is logged and retried next time."""
        if not self.settings.enabled or not self.settings.schedule:
            return []
        made = []
        due = due_reports(
            now or self._clock.now(),
            self.zone,
            self.settings.schedule,
            self.existing(),
            delay_s=self.settings.delay_s,
        )
        first = self._first_event_ms()
        for period, since_ms, until_ms in due:
            if first is None or first >= until_ms:
                continue  # the log began after this period: nothing to report on
            try:
                made.append(self.generate(period, since_ms, until_ms))
            except Exception as exc:  # the next check retries; other periods still run
                _log.warning("scheduled report failed", period=period, error=str(exc))
        return made

    # -- reading -----------------------------------------------------------------------------

    def list(self, period: str = "", limit: int = 50) -> list[ReportRecord]:
        """Stored reports, newest period first; ``period`` '' = any."""
        if period and period not in (*PERIODS, "custom"):
            raise InvalidInput(
                f"unknown report period {period!r}",
                hint="use daily, weekly, monthly, custom, or '' for all",
            )
        if not 0 <= limit <= 1000:
            raise InvalidInput(f"limit must be 0..1000, got {limit}", hint="0 means 50")
        stmt = _RECORDS.order_by(
            reports.c.since_ms.desc(), reports.c.created_ms.desc(), reports.c.report_id
        )
        if period:
            stmt = stmt.where(reports.c.period == period)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt.limit(limit or 50)).all()
        return [_record(r) for r in rows]

    def get(self, report_id: str) -> ReportRecord:
        """One stored report, or :class:`NotFound`."""
        return _record(self._row(report_id))

    def download(self, report_id: str, fmt: str) -> bytes:
        """A stored rendering of a report (decrypted and authenticated by the object store)."""
        if fmt not in FORMATS:
            raise InvalidInput(f"unknown report format {fmt!r}", hint="use json, csv or pdf")
        names: dict[str, str] = orjson.loads(self._row(report_id).objects_json)
        name = names.get(fmt)
        if name is None:
            raise NotFound(
                "report rendering",
                f"{report_id}.{fmt}",
                hint=f"this report was stored as {', '.join(f for f in FORMATS if f in names)}; "
                "GANTRY_AUDIT__REPORTS__FORMATS chooses the renderings of new reports",
            )
        return bytes(self.objects.get(name))

    def document(self, report_id: str) -> dict[str, Any]:
        """A stored report's signed JSON, parsed (what :meth:`verify` takes)."""
        return parse_report(self.download(report_id, "json"))

    def _row(self, report_id: str) -> Any:
        with self.engine.connect() as conn:
            row = conn.execute(_RECORDS.where(reports.c.report_id == report_id)).first()
        if row is None:
            raise NotFound(
                "report", report_id, hint="list the reports with `gantry audit reports list`"
            )
        return row

    # -- verifying ---------------------------------------------------------------------------

    def verify(
        self,
        document: dict[str, Any],
        trust: TrustStore,
        current_events: EventSource,
        consistency: ConsistencySource,
    ) -> ReportVerification:
        """Check a signed report; see :func:`verify_report`."""
        return verify_report(
            document, trust=trust, current_events=current_events, consistency=consistency
        )


#: Report rows with the signed tree head each was read from (kept in audit_checkpoints).
_RECORDS = sa.select(
    reports,
    checkpoints.c.timestamp_ms.label("head_timestamp_ms"),
    checkpoints.c.key_id.label("head_key_id"),
    checkpoints.c.signature.label("head_signature"),
).select_from(reports.outerjoin(checkpoints, checkpoints.c.tree_size == reports.c.tree_size))


def _record(row: Any) -> ReportRecord:
    head = TreeHead(
        int(row.tree_size),
        bytes(row.root_hash),
        int(row.head_timestamp_ms or 0),
        row.head_key_id or "",
        bytes(row.head_signature or b""),
    )
    return ReportRecord(
        report_id=row.report_id,
        period=row.period,
        since_ms=int(row.since_ms),
        until_ms=int(row.until_ms),
        created_ms=int(row.created_ms),
        created_by=row.created_by,
        tree_head=head,
        digest=row.digest,
        key_id=row.key_id,
        signature=bytes(row.signature),
        formats=tuple(f for f in FORMATS if f in orjson.loads(row.objects_json)),
        summary_json=row.summary_json,
    )


# -- verification -------------------------------------------------------------------------------


__all__ = [
    "FORMATS",
    "OBJECT_PREFIX",
    "PERIODS",
    "SIGNATURE_DOMAIN",
    "ConsistencySource",
    "EventSource",
    "ReportRecord",
    "ReportSettings",
    "ReportVerification",
    "Reports",
    "due_reports",
    "parse_report",
    "period_bounds",
    "report_digest",
    "request_bounds",
    "signed_message",
    "tree_head_dict",
    "verify_report",
]
