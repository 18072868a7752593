"""Access-behaviour anomaly detection (domain): each principal's normal behaviour, learned from
the audit stream, and the accesses that depart from it — with the evidence, in words and
numbers.

The model is streaming and explainable: one :class:`Profile` per principal holds robust
statistics of what it did (rows read per active day — median and MAD —, the hours it is
active, the datasets it touched, the views it read, the addresses it called from, its recent
denials), and :meth:`BehaviourModel.observe` judges each audited event against the profile
*before* adding it. Six behaviours are flagged:

``bulk_read``
    the rows read today exceed ``median + k * 1.4826 * MAD`` of the principal's active days,
    and ``bulk_factor`` * the median, and ``bulk_min_rows``;
``first_sensitive_access``
    a principal's first read of a dataset classified ``pii`` or ``sensitive`` (reads through a
    job's grant are the job's, and are not judged here);
``denial_storm``
    ``denial_run`` denials in a row within ``denial_window_s``;
``unusual_hour``
    activity at an hour of the day (± 1 h) that held less than ``hour_min_share`` of the
    principal's past activity;
``unusual_place``
    a service identity calling from an address it was never seen at (humans move between
    networks, so they are not judged unless ``place_for_humans``);
``raw_view_read``
    an allowed raw-view read by a principal — or by a role — whose reads were de-identified
    (at most ``raw_share_max`` raw).

Nothing is judged before the principal has ``warmup_days`` of history (the first week is
learning), except denial storms and raw reads by a role whose reads are de-identified. One
alert per principal, behaviour and key (a dataset, an address, a day) per ``repeat_after_s``.
"""

from __future__ import annotations

import hashlib
import statistics
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, Field

from gantry.events import EventEnvelope
from gantry.security.principal import SERVICE_SUBJECTS

KINDS = (
    "bulk_read",
    "first_sensitive_access",
    "denial_storm",
    "unusual_hour",
    "unusual_place",
    "raw_view_read",
)
MAD_SCALE = 1.4826  # MAD * this estimates the standard deviation of normal data
_MAX_IDS = 20


class AnomalySettings(BaseModel):
    """Sensitivity and thresholds of the detector (``GANTRY_AUDIT__ANOMALY__*``)."""

    enabled: bool = Field(default=True, description="Judge the audit stream at all.")
    timezone: str = Field(
        default="UTC", description="Days and hours of activity are counted in this time zone."
    )
    warmup_days: float = Field(
        default=7.0, ge=0, description="History a principal needs before it is judged."
    )
    history_days: int = Field(
        default=30, ge=2, description="Active days kept per principal for its volume baseline."
    )
    bulk_mad_k: float = Field(
        default=6.0, gt=0, description="Rows today above median + k * 1.4826 * MAD ..."
    )
    bulk_factor: float = Field(default=5.0, ge=1, description="... and this * the median ...")
    bulk_min_rows: int = Field(default=10_000, ge=0, description="... and at least this many.")
    denial_run: int = Field(default=8, ge=2, description="Denials in a row that make a storm.")
    denial_window_s: float = Field(
        default=300.0, gt=0, description="... all within this many seconds."
    )
    hour_min_share: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="An hour (± 1 h) with less than this share of past activity is unusual.",
    )
    hour_min_events: int = Field(
        default=50, ge=1, description="Past events a principal needs before hours are judged."
    )
    raw_share_max: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="A raw read is unusual for a principal or role with at most this share "
        "of raw reads.",
    )
    raw_min_reads: int = Field(
        default=20, ge=1, description="Past reads a principal needs first (a role: 5 times)."
    )
    sensitive: tuple[str, ...] = Field(
        default=("pii", "sensitive"), description="Classifications whose first read is flagged."
    )
    place_for_humans: bool = Field(
        default=False, description="Also flag people calling from a new address."
    )
    repeat_after_s: float = Field(
        default=86_400.0, gt=0, description="One alert per principal, kind and key this often."
    )


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A departure from normal behaviour, explained."""

    id: str
    kind: str
    principal: str
    time_ms: int
    severity: float
    reason: str
    evidence: dict[str, Any]
    event_ids: tuple[str, ...]


@dataclass
class _Access:
    """What one audited event says about its principal's behaviour."""

    event_id: str
    time_ms: int
    principal: str
    roles: tuple[str, ...]
    read: bool
    dataset: str
    view: str
    rows: int
    denied: bool
    address: str
    job_id: str
    action: str = "read"


@dataclass
class Profile:
    """One principal's behaviour so far."""

    principal: str
    first_ms: int
    roles: tuple[str, ...] = ()
    rows_by_day: dict[int, int] = field(default_factory=dict)
    today_ids: deque[str] = field(default_factory=lambda: deque(maxlen=_MAX_IDS))
    today: int = -1
    hours: list[int] = field(default_factory=lambda: [0] * 24)
    events: int = 0
    datasets: set[str] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    reads: int = 0
    raw_reads: int = 0
    denials: deque[tuple[int, str]] = field(default_factory=deque)
    denied_action: str = ""
    alerted: dict[tuple[str, str], int] = field(default_factory=dict)

    def days_known(self, now_ms: int) -> float:
        return (now_ms - self.first_ms) / 86_400_000

    def service(self) -> bool:
        return self.principal in SERVICE_SUBJECTS or "service" in self.roles


class BehaviourModel:
    """Every principal's profile; :meth:`observe` judges an event, then learns from it."""

    def __init__(self, settings: AnomalySettings | None = None) -> None:
        self.settings = settings or AnomalySettings()
        self.zone = ZoneInfo(self.settings.timezone)
        self.profiles: dict[str, Profile] = {}
        self.sensitivity: dict[str, str] = {}
        self.role_reads: dict[str, list[int]] = {}  # role -> [reads, raw reads]

    def observe_all(self, events: Iterable[EventEnvelope]) -> list[Anomaly]:
        out: list[Anomaly] = []
        for event in events:
            out += self.observe(event)
        return out

    def observe(self, event: EventEnvelope) -> list[Anomaly]:
        """The anomalies ``event`` shows (none for most), learning from it afterwards."""
        if not self.settings.enabled:
            return []
        if event.type == "gantry.data.dataset.created":
            name = str(event.data.get("dataset", ""))
            self.sensitivity[name] = str(event.data.get("sensitivity", "internal"))
            return []
        access = _access_of(event)
        if access is None:
            return []
        profile = self.profiles.get(access.principal)
        if profile is None:
            profile = self.profiles[access.principal] = Profile(access.principal, access.time_ms)
        if access.roles:
            profile.roles = access.roles
        found = [a for a, key in self._judge(profile, access) if self._fresh(profile, a, key)]
        self._learn(profile, access)
        return found

    # -- judging ------------------------------------------------------------------------------

    def _judge(self, p: Profile, a: _Access) -> list[tuple[Anomaly, str]]:
        s = self.settings
        warm = p.days_known(a.time_ms) >= s.warmup_days
        out: list[tuple[Anomaly, str]] = []
        if a.denied:
            storm = self._storm(p, a)
            if storm is not None:
                out.append((storm, ""))
            return out
        if a.read:
            day = self._day(a.time_ms)
            if warm:
                bulk = self._bulk(p, a, day)
                if bulk is not None:
                    out.append((bulk, str(day)))
                if (
                    not a.job_id
                    and a.dataset not in p.datasets
                    and self.sensitivity.get(a.dataset, "") in s.sensitive
                ):
                    level = self.sensitivity[a.dataset]
                    out.append(
                        (
                            self._anomaly(
                                "first_sensitive_access",
                                a,
                                1.0,
                                f"{a.principal} read {a.dataset} ({level}) for the first time "
                                f"in {p.days_known(a.time_ms):.0f} days of history; it had "
                                f"read {len(p.datasets)} other dataset(s): "
                                f"{', '.join(sorted(p.datasets)[:6]) or 'none'}",
                                {
                                    "dataset": a.dataset,
                                    "sensitivity": level,
                                    "datasets_before": sorted(p.datasets),
                                    "rows": a.rows,
                                    "view": a.view,
                                },
                            ),
                            a.dataset,
                        )
                    )
            if a.view == "raw":
                raw = self._raw(p, a)
                if raw is not None:
                    out.append((raw, a.dataset))
        if warm:
            hour = self._hour(p, a)
            if hour is not None:
                out.append((hour, str(self._day(a.time_ms))))
            if (
                a.address
                and a.address not in p.addresses
                and p.addresses
                and (p.service() or s.place_for_humans)
            ):
                out.append(
                    (
                        self._anomaly(
                            "unusual_place",
                            a,
                            1.0,
                            f"{'service identity ' if p.service() else ''}{a.principal} called "
                            f"from {a.address}, an address it was never seen at in "
                            f"{p.days_known(a.time_ms):.0f} days (seen at: "
                            f"{', '.join(sorted(p.addresses)[:6])})",
                            {"address": a.address, "known": sorted(p.addresses)},
                        ),
                        a.address,
                    )
                )
        return out

    def _bulk(self, p: Profile, a: _Access, day: int) -> Anomaly | None:
        s = self.settings
        past = [rows for d, rows in p.rows_by_day.items() if d != day and rows > 0]
        if len(past) < 3:
            return None
        today = p.rows_by_day.get(day, 0) + a.rows
        median = statistics.median(past)
        mad = statistics.median(abs(r - median) for r in past)
        threshold = max(median + s.bulk_mad_k * MAD_SCALE * mad, s.bulk_factor * median)
        threshold = max(threshold, float(s.bulk_min_rows))
        if today <= threshold:
            return None
        ids = (*p.today_ids, a.event_id) if p.today == day else (a.event_id,)
        return self._anomaly(
            "bulk_read",
            a,
            today / threshold,
            f"{a.principal} read {today:,} rows today, {today / max(median, 1):.1f} times "
            f"its median of {median:,.0f} rows per active day (MAD {mad:,.0f}, "
            f"{len(past)} days); the threshold is {threshold:,.0f}",
            {
                "rows_today": today,
                "median_rows_per_day": median,
                "mad": mad,
                "threshold": threshold,
                "days": len(past),
                "dataset": a.dataset,
            },
            ids=ids,
        )

    def _storm(self, p: Profile, a: _Access) -> Anomaly | None:
        s = self.settings
        run = p.denials
        run.append((a.time_ms, a.event_id))
        p.denied_action = a.action
        while run and a.time_ms - run[0][0] > s.denial_window_s * 1000:
            run.popleft()
        if len(run) < s.denial_run:
            return None
        span_s = max(0.0, (a.time_ms - min(t for t, _ in run)) / 1000)
        return self._anomaly(
            "denial_storm",
            a,
            len(run) / s.denial_run,
            f"{a.principal} was denied {len(run)} times in a row within {span_s:.0f} s "
            f"(a storm is {s.denial_run} within {s.denial_window_s:.0f} s)",
            {"denials": len(run), "seconds": span_s},
            ids=tuple(i for _, i in run)[-_MAX_IDS:],
        )

    def _raw(self, p: Profile, a: _Access) -> Anomaly | None:
        s = self.settings
        if p.reads >= s.raw_min_reads and p.raw_reads <= s.raw_share_max * p.reads:
            share = p.raw_reads / p.reads
            return self._anomaly(
                "raw_view_read",
                a,
                1.0,
                f"{a.principal} read the raw view of {a.dataset}; {share:.1%} of its "
                f"{p.reads} earlier reads were raw",
                {"dataset": a.dataset, "reads": p.reads, "raw_share": share, "rows": a.rows},
            )
        for role in p.roles:
            reads, raw = self.role_reads.get(role, [0, 0])
            if reads >= 5 * s.raw_min_reads and raw <= s.raw_share_max * reads:
                return self._anomaly(
                    "raw_view_read",
                    a,
                    1.0,
                    f"{a.principal} (role {role}) read the raw view of {a.dataset}; "
                    f"{raw / reads:.1%} of the {reads} reads by {role}s were raw",
                    {"dataset": a.dataset, "role": role, "role_reads": reads, "rows": a.rows},
                )
        return None

    def _hour(self, p: Profile, a: _Access) -> Anomaly | None:
        s = self.settings
        if p.events < s.hour_min_events:
            return None
        h = self._local(a.time_ms).hour
        near = sum(p.hours[(h + d) % 24] for d in (-1, 0, 1))
        share = near / p.events
        if share >= s.hour_min_share:
            return None
        busiest = [i for i in sorted(range(24), key=lambda i: -p.hours[i]) if p.hours[i]][:3]
        return self._anomaly(
            "unusual_hour",
            a,
            1.0 if share == 0 else min(s.hour_min_share / share, 10.0),
            f"{a.principal} was active at {h:02d}:00 ({s.timezone}); {share:.1%} of its "
            f"{p.events} past actions fell within an hour of that (usual hours: "
            f"{', '.join(f'{b:02d}:00' for b in sorted(busiest))})",
            {"hour": h, "share": share, "events": p.events, "usual_hours": sorted(busiest)},
        )

    # -- learning -----------------------------------------------------------------------------

    def _learn(self, p: Profile, a: _Access) -> None:
        p.events += 1
        p.hours[self._local(a.time_ms).hour] += 1
        if a.address:
            p.addresses.add(a.address)
        if a.denied:
            return
        # An allowed action ends a run of denials — one that happened after the run's last
        # denial: events of other streams (a read's data.accessed) may be ingested later than
        # the denials that followed them.
        # Only an allowed action of the kind denied ends it: listing what one then may not read
        # is part of a storm of refused reads, not the end of it.
        if not p.denials or (a.time_ms > p.denials[-1][0] and a.action == p.denied_action):
            p.denials.clear()
        if not a.read:
            return
        day = self._day(a.time_ms)
        if p.today != day:
            p.today, p.today_ids = day, deque(maxlen=_MAX_IDS)
        p.today_ids.append(a.event_id)
        p.rows_by_day[day] = p.rows_by_day.get(day, 0) + a.rows
        if len(p.rows_by_day) > self.settings.history_days:
            del p.rows_by_day[min(p.rows_by_day)]
        p.datasets.add(a.dataset)
        p.reads += 1
        raw = a.view == "raw"
        p.raw_reads += raw
        for role in p.roles:
            counts = self.role_reads.setdefault(role, [0, 0])
            counts[0] += 1
            counts[1] += raw

    # -- helpers ------------------------------------------------------------------------------

    def _local(self, time_ms: int) -> datetime:
        return datetime.fromtimestamp(time_ms / 1000, self.zone)

    def _day(self, time_ms: int) -> int:
        return self._local(time_ms).date().toordinal()

    def _fresh(self, p: Profile, anomaly: Anomaly, key: str) -> bool:
        last = p.alerted.get((anomaly.kind, key))
        if last is not None and anomaly.time_ms - last < self.settings.repeat_after_s * 1000:
            return False
        p.alerted[(anomaly.kind, key)] = anomaly.time_ms
        return True

    def _anomaly(
        self,
        kind: str,
        a: _Access,
        severity: float,
        reason: str,
        evidence: dict[str, Any],
        *,
        ids: tuple[str, ...] = (),
    ) -> Anomaly:
        digest = hashlib.sha256(f"{kind}|{a.principal}|{a.event_id}".encode()).digest()
        return Anomaly(
            id=str(uuid.UUID(bytes=digest[:16], version=4)),
            kind=kind,
            principal=a.principal,
            time_ms=a.time_ms,
            severity=round(float(severity), 3),
            reason=reason,
            evidence=evidence,
            event_ids=ids or (a.event_id,),
        )


def _access_of(event: EventEnvelope) -> _Access | None:
    """The behaviour an audited event shows: a read, an authorization decision, or nothing."""
    data = event.data
    time_ms = int(event.time.timestamp() * 1000)
    if event.type == "gantry.data.accessed":
        return _Access(
            event_id=event.id,
            time_ms=time_ms,
            principal=event.actor,
            roles=(),
            read=data.get("decision", "allow") == "allow",
            dataset=str(data.get("dataset", "")),
            view=str(data.get("view", "deidentified")),
            rows=int(data.get("rows", 0) or 0),
            denied=data.get("decision", "allow") == "deny",
            address=str(data.get("address", "")),
            job_id=str(data.get("job_id", "")),
        )
    if event.type == "gantry.authz.decision":
        return _Access(
            event_id=event.id,
            time_ms=time_ms,
            principal=str(data.get("principal", event.actor)),
            roles=tuple(str(r) for r in data.get("roles", ()) or ()),
            read=False,
            dataset="",
            view="",
            rows=0,
            denied=data.get("decision") == "deny",
            address=str(data.get("address", "")),
            job_id="",
            action=str(data.get("action", "")),
        )
    return None


__all__ = ["KINDS", "Anomaly", "AnomalySettings", "BehaviourModel", "Profile"]
