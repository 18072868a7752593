"""A month of audit events, made up but realistic, for testing and benchmarking the
access-behaviour anomaly detector — with known anomalies injected, or none.

:func:`simulate_month` builds, from one seed and nothing else (``random.Random(seed)``, ids
included), what the audit log of a small ML platform would hold over ``days`` days:

* twelve datasets (3 ``pii``, 2 ``sensitive``, the rest ``internal`` or ``public``), created
  on the first morning by the two data stewards (``gantry.data.dataset.created``);
* eleven ml-developers reading de-identified views through governance (an authz decision and a
  ``gantry.data.accessed`` per read, from their own laptop's address) in their own working
  hours (about 07:30-19:00 UTC), sometimes 20-21 h, seldom or never at weekends; daily rows are
  lognormal around a per-person scale with a few 2-3x days; each reads a habitual set of 2-4
  datasets and, about once a month, another ``internal`` or ``public`` one; they submit
  training jobs (directly, or by running a pipeline through ``workflows``); a few mistype a
  dataset name or try a raw view once (both refused);
* two data stewards (raw and de-identified, any dataset; commits of new versions), one
  annotator (raw, two datasets, many small reads), one auditor (``query audit_log`` only);
* the ``training-agent`` service reading de-identified data through the jobs' grants (job id
  and grant set) from four node addresses (``10.0.1.11``-``14``), round the clock (nightly
  pipelines run at fixed hours); ``serving`` listing and downloading models every ~10 minutes
  from its two replicas; ``workflows`` acting as developers for pipeline runs.

With ``inject=True`` the last ten days also hold known anomalies, each listed in
:attr:`Month.injected` with the exact ids of the events that make it up (see
:data:`INJECTED_KINDS`). Normal behaviour does not depend on ``inject``: the month with
injections is the month without them plus the injected events.
"""

from __future__ import annotations

import bisect
import math
import statistics
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from random import Random
from types import MappingProxyType
from typing import Any

from gantry.events import EventEnvelope

#: What :attr:`Injected.kind` may be.
INJECTED_KINDS = (
    "bulk_read",
    "unusual_hour",
    "denial_storm",
    "raw_view_read",
    "first_sensitive_access",
    "unusual_place",
)

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000

#: The datasets of the month and their classification.
DATASETS: tuple[tuple[str, str], ...] = (
    ("patients", "pii"),
    ("claims", "pii"),
    ("customer-profiles", "pii"),
    ("genomics-variants", "sensitive"),
    ("clinical-notes", "sensitive"),
    ("clickstream", "internal"),
    ("support-tickets", "internal"),
    ("sensor-telemetry", "internal"),
    ("product-catalog", "internal"),
    ("model-eval-results", "internal"),
    ("wiki-corpus", "public"),
    ("imagenet-subset", "public"),
)
DEVELOPERS = (
    "alice",
    "bob",
    "chen",
    "dmitri",
    "elena",
    "farid",
    "grace",
    "hiro",
    "ines",
    "jonas",
    "kemi",
)
STEWARDS = ("sofia", "marco")
ANNOTATOR = "nina"
AUDITOR = "oliver"
ANNOTATED = ("support-tickets", "patients")
TRAINING_AGENT = "training-agent"
SERVING = "serving"
WORKFLOWS = "workflows"
#: The training agents' node addresses, the serving replicas' and the workflows service's.
NODES = ("10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.14")
SERVING_ADDRESSES = ("10.0.2.21", "10.0.2.22")
WORKFLOWS_ADDRESS = "10.0.3.31"
#: Where the injected ``unusual_place`` reads of the training agent come from.
UNUSUAL_ADDRESS = "203.0.113.7"
MODELS = ("churn-model", "triage-bert", "demand-forecast")
INJECT_DAYS = 10

_GOVERNANCE = "/gantry.governance.v1.GovernanceService/"
_SCHEDULER = "/gantry.scheduler.v1.SchedulerService/"
_AUDIT = "/gantry.audit.v1.AuditService/"
_WORKFLOWS = "/gantry.workflows.v1.WorkflowService/"
_DEV_ROLES = ("ml-developer",)
_STEWARD_ROLES = ("data-steward",)
_SERVICE_ROLES = ("service",)
_WORKFLOWS_ROLES = ("service", "orchestrator")
_RAW_REFUSED = "condition view in [deidentified] not met (role ml-developer)"


@dataclass(frozen=True)
class Injected:
    """One injected anomaly: what, by whom, when it starts and the events that make it up."""

    kind: str
    principal: str
    time_ms: int
    event_ids: tuple[str, ...]


@dataclass(frozen=True)
class Month:
    """A simulated month of audit events (sorted by time) and what was injected into it."""

    events: tuple[EventEnvelope, ...]
    injected: tuple[Injected, ...]
    days: int
    start: datetime
    principals: Mapping[str, tuple[str, ...]]
    datasets: Mapping[str, str]


@dataclass(slots=True)
class _Rec:
    """An event before it is an envelope (cheap to make and to sort)."""

    ms: int
    seq: int
    type: str
    source: str
    subject: str
    actor: str
    data: dict[str, Any]
    id: str
    correlation_id: str


@dataclass
class _Dev:
    """One ml-developer's habits."""

    name: str
    address: str
    start_h: float
    end_h: float
    late_prob: float
    weekend_prob: float
    scale: float  # median rows per working day
    reads: float  # reads per working day
    habit: list[str]
    weights: list[float]
    burst_days: set[int] = field(default_factory=set)
    off_days: set[int] = field(default_factory=set)
    raw_try_day: int = -1


class _World:
    """Everything the month is made of, and the events made so far."""

    def __init__(self, rng: Random, start: datetime, days: int) -> None:
        self.rng = rng
        self.start = start
        self.start_ms = round(start.timestamp() * 1000)
        self.days = days
        self.end_ms = self.start_ms + days * DAY_MS
        self.recs: list[_Rec] = []
        self.sensitivity = dict(DATASETS)
        self.versions: dict[str, tuple[list[int], list[str]]] = {}
        self.addresses: dict[str, str] = {}
        self.devs: list[_Dev] = []

    # -- primitives -------------------------------------------------------------------------

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def hex(self, digits: int) -> str:
        return f"{self.rng.getrandbits(4 * digits):0{digits}x}"

    def at(self, day: int, hour: float) -> int:
        """Unix ms of ``hour`` (fractional) on ``day`` of the month, jittered to the ms."""
        return self.start_ms + day * DAY_MS + int(hour * HOUR_MS) + self.rng.randrange(1000)

    def weekend(self, day: int) -> bool:
        return (self.start + timedelta(days=day)).weekday() >= 5

    def add(
        self,
        ms: int,
        type_: str,
        source: str,
        subject: str,
        actor: str,
        data: dict[str, Any],
        correlation_id: str = "",
    ) -> str:
        event_id = self.uid()
        self.recs.append(
            _Rec(
                ms, len(self.recs), type_, source, subject, actor, data, event_id,
                correlation_id or event_id,
            )
        )  # fmt: skip
        return event_id

    def authz(
        self,
        ms: int,
        principal: str,
        roles: Sequence[str],
        action: str,
        kind: str,
        name: str,
        *,
        allow: bool,
        reason: str,
        service: str,
        method: str,
        address: str,
        via: str = "",
        correlation_id: str = "",
    ) -> str:
        data: dict[str, Any] = {
            "principal": principal,
            "roles": list(roles),
            "action": action,
            "resource_kind": kind,
            "resource_name": name,
            "decision": "allow" if allow else "deny",
            "reason": reason,
            "service": service,
            "method": method,
            "via": via,
            "address": address,
        }
        subject = kind if name in ("", "*") else f"{kind}/{name}"
        return self.add(
            ms, "gantry.authz.decision", f"gantry/{service}", subject, principal, data,
            correlation_id,
        )  # fmt: skip

    def accessed(
        self,
        ms: int,
        reader: str,
        dataset: str,
        view: str,
        rows: int,
        *,
        allow: bool,
        address: str,
        reason: str = "",
        job_id: str = "",
        grant: str = "",
        purpose: str = "",
        correlation_id: str = "",
    ) -> str:
        data: dict[str, Any] = {
            "dataset": dataset,
            "version": self.version_at(dataset, ms),
            "view": view,
            "rows": rows if allow else 0,
            "decision": "allow" if allow else "deny",
            "purpose": purpose,
            "grant": grant,
            "job_id": job_id,
            "policy_version": 1 if view == "deidentified" and allow else 0,
            "reason": reason,
            "address": address,
        }
        return self.add(
            ms, "gantry.data.accessed", "gantry/governance", f"dataset/{dataset}", reader, data,
            correlation_id,
        )  # fmt: skip

    def read(
        self,
        ms: int,
        who: str,
        roles: Sequence[str],
        dataset: str,
        view: str,
        rows: int,
        *,
        purpose: str = "",
        allow: bool = True,
        reason: str = "",
        read_allowed: bool | None = None,
    ) -> list[str]:
        """A person's read through governance: the authz decision, then the read record.

        ``read_allowed`` (default: ``allow``) is the read's own outcome, for reads the policy
        allows that fail later (an unknown dataset).
        """
        corr = self.uid()
        address = self.addresses[who]
        role = roles[0] if roles else "none"
        decided = self.authz(
            ms, who, roles, "read", "dataset", dataset, allow=allow,
            reason=(f"allowed by role {role}" if allow else reason), service="governance",
            method=_GOVERNANCE + "Read", address=address, correlation_id=corr,
        )  # fmt: skip
        done = allow if read_allowed is None else read_allowed
        ms += 40 + self.rng.randrange(900) + rows // 200
        recorded = self.accessed(
            ms, who, dataset, view, rows, allow=done, address=address,
            reason="" if done else reason, purpose=purpose, correlation_id=corr,
        )  # fmt: skip
        return [decided, recorded]

    def version_at(self, dataset: str, ms: int) -> str:
        known = self.versions.get(dataset)
        if known is None:
            return ""
        times, ids = known
        return ids[max(0, bisect.bisect_right(times, ms) - 1)]

    # -- building blocks ----------------------------------------------------------------------

    def split(self, total: float, n: int) -> list[int]:
        """``total`` rows over ``n`` reads of uneven sizes (each at least 1)."""
        weights = [self.rng.expovariate(1.0) + 0.05 for _ in range(n)]
        whole = sum(weights)
        return [max(1, int(total * w / whole)) for w in weights]

    def times(self, day: int, begin_h: float, end_h: float, n: int) -> list[int]:
        return sorted(self.at(day, self.rng.uniform(begin_h, end_h)) for _ in range(n))

    def job(
        self, ms: int, datasets: Sequence[str], *, address: str = "", hours: float = 0.0
    ) -> str:
        """A training job's reads by the training agent, from its nodes or ``address``."""
        rng = self.rng
        job_id = "j-" + self.hex(12)
        grant = self.uid()
        workers = rng.choice((1, 1, 2, 2, 4))
        nodes = [address] if address else rng.sample(NODES, min(workers, 2))
        hours = hours or min(14.0, rng.lognormvariate(math.log(2.5), 0.7))
        n = workers * (3 + int(5 * hours))
        begin = ms + rng.randrange(MINUTE_MS, 20 * MINUTE_MS)
        span = int(hours * HOUR_MS)
        for offset in sorted(rng.randrange(span) for _ in range(n)):
            at = begin + offset
            if at >= self.end_ms:
                break
            self.accessed(
                at, TRAINING_AGENT, rng.choice(datasets), "deidentified",
                int(rng.lognormvariate(math.log(6000), 0.5)), allow=True,
                address=rng.choice(nodes), job_id=job_id, grant=grant, purpose="training",
            )  # fmt: skip
        return job_id


# -- normal behaviour -------------------------------------------------------------------------


def _datasets(w: _World) -> None:
    """Created on the first morning by the stewards; new versions now and then."""
    rng = w.rng
    for i, (name, level) in enumerate(DATASETS):
        owner = STEWARDS[i % 2]
        ms = w.at(0, 6.5 + i * 0.035)
        corr = w.uid()
        w.authz(
            ms, owner, _STEWARD_ROLES, "create", "dataset", name, allow=True,
            reason="allowed by role data-steward", service="governance",
            method=_GOVERNANCE + "CreateDataset", address=w.addresses[owner], correlation_id=corr,
        )  # fmt: skip
        columns = [
            {"name": "id", "type": "int64", "classification": "internal"},
            {"name": "payload", "type": "string", "classification": level},
        ]
        data = {
            "dataset": name,
            "format": "table",
            "owner": owner,
            "columns": columns,
            "sensitivity": level,
        }
        w.add(ms + 30, "gantry.data.dataset.created", "gantry/governance", f"dataset/{name}",
              owner, data, corr)  # fmt: skip
        times, ids = [ms], [w.hex(64)]
        for day in range(1, w.days):
            if not w.weekend(day) and rng.random() < 0.08:
                at = w.at(day, rng.uniform(9.0, 17.0))
                w.authz(
                    at, owner, _STEWARD_ROLES, "update", "dataset", name, allow=True,
                    reason="allowed by role data-steward", service="governance",
                    method=_GOVERNANCE + "Commit", address=w.addresses[owner],
                )  # fmt: skip
                times.append(at)
                ids.append(w.hex(64))
        w.versions[name] = (times, ids)


def _make_devs(w: _World) -> None:
    rng = w.rng
    ordinary = [n for n, level in DATASETS if level in ("pii", "internal", "public")]
    sensitive = [n for n, level in DATASETS if level == "sensitive"]
    with_sensitive = set(rng.sample(range(len(DEVELOPERS)), 2))
    for i, name in enumerate(DEVELOPERS):
        habit = rng.sample(ordinary, rng.randint(2, 4))
        if i in with_sensitive:
            habit[-1] = rng.choice(sensitive)
        weights = sorted((rng.uniform(0.3, 1.0) for _ in habit), reverse=True)
        dev = _Dev(
            name=name,
            address=w.addresses[name],
            start_h=rng.uniform(7.6, 9.8),
            end_h=rng.uniform(16.3, 18.8),
            late_prob=rng.choice((0.0, 0.0, 0.03, 0.06, 0.1)),
            weekend_prob=rng.choice((0.0, 0.0, 0.05, 0.12, 0.25)),
            scale=rng.lognormvariate(math.log(40_000), 0.7),
            reads=rng.uniform(7, 20),
            habit=habit,
            weights=weights,
        )
        dev.burst_days = {rng.randrange(1, w.days) for _ in range(rng.randint(1, 3))}
        if rng.random() < 0.35:  # a few days off
            first = rng.randrange(3, max(4, w.days - 3))
            dev.off_days = set(range(first, first + rng.randint(2, 4)))
        if rng.random() < 0.4:  # tries a raw view once (refused)
            dev.raw_try_day = rng.randrange(1, w.days)
        w.devs.append(dev)


def _developers(w: _World, pipelines: list[tuple[str, float, list[str]]]) -> None:
    rng = w.rng
    ordinary = [n for n, level in DATASETS if level in ("internal", "public")]
    for dev in w.devs:
        first = True
        others = [n for n in ordinary if n not in dev.habit]
        for day in range(w.days):
            weekend = w.weekend(day)
            if day in dev.off_days:
                continue
            if weekend and rng.random() >= dev.weekend_prob:
                continue
            if not weekend and not first and rng.random() < 0.04:
                continue
            noise = math.exp(max(-0.6, min(0.6, rng.gauss(0.0, 0.3))))
            factor = 1.0
            if day in dev.burst_days:
                factor, noise = rng.uniform(2.0, 3.0), min(noise, 1.2)
            n = max(1, round(dev.reads * rng.uniform(0.6, 1.4) * (1.5 if factor > 1 else 1)))
            if weekend:
                factor, n = factor * 0.35, max(1, n // 4)
            begin, end = dev.start_h + rng.uniform(-0.4, 0.4), dev.end_h + rng.uniform(-0.5, 0.5)
            if weekend:
                begin, end = max(begin, 10.0), min(end, 16.0)
            if first:
                n = max(n, len(dev.habit))
            times = w.times(day, begin, end, n)
            if not weekend and rng.random() < dev.late_prob:
                times += w.times(day, 20.0, 21.9, rng.randint(1, 3))
            names = rng.choices(dev.habit, dev.weights, k=len(times))
            if first:
                names[: len(dev.habit)] = rng.sample(dev.habit, len(dev.habit))
                first = False
            if others and not weekend and rng.random() < 1 / 21:
                names[rng.randrange(len(names))] = rng.choice(others)
            purpose = rng.choice(("exploration", "feature engineering", "evaluation"))
            sizes = w.split(dev.scale * noise * factor, len(times))
            for ms, name, rows in zip(times, names, sizes, strict=True):
                w.read(ms, dev.name, _DEV_ROLES, name, "deidentified", rows, purpose=purpose)
            if rng.random() < 0.025:  # a mistyped dataset name
                name = rng.choice(dev.habit)
                cut = rng.randrange(1, len(name) - 1)
                typo = name[:cut] + name[cut + 1 :]
                w.read(
                    w.at(day, rng.uniform(begin, end)), dev.name, _DEV_ROLES, typo,
                    "deidentified", 0, reason=f"dataset {typo!r} not found", read_allowed=False,
                )  # fmt: skip
            if day == dev.raw_try_day and not weekend:
                w.read(
                    w.at(day, rng.uniform(begin, end)), dev.name, _DEV_ROLES,
                    rng.choice(dev.habit), "raw", 0, allow=False, reason=_RAW_REFUSED,
                )  # fmt: skip
            if weekend:
                continue
            for _ in range(rng.choices((0, 1, 2, 3), (0.3, 0.35, 0.25, 0.1))[0]):
                _submit(w, dev, w.at(day, rng.uniform(begin, end - 0.2)))
        for _ in range(rng.choice((0, 1, 1, 2))):  # nightly pipelines of theirs, 19:00-07:00
            pipelines.append((dev.name, (19.0 + rng.uniform(0.0, 12.0)) % 24, dev.habit))


def _submit(w: _World, dev: _Dev, ms: int) -> None:
    """A developer starts a training job: directly, or by running a pipeline (workflows)."""
    rng = w.rng
    corr = w.uid()
    datasets = rng.sample(dev.habit, rng.randint(1, min(2, len(dev.habit))))
    if rng.random() < 0.3:
        pipeline = f"{dev.name}-train"
        w.authz(
            ms, dev.name, _DEV_ROLES, "run", "pipeline", pipeline, allow=True,
            reason="allowed by role ml-developer", service="workflows",
            method=_WORKFLOWS + "RunPipeline", address=dev.address, correlation_id=corr,
        )  # fmt: skip
        ms += rng.randrange(2000, 30_000)
        w.authz(
            ms, WORKFLOWS, _WORKFLOWS_ROLES, "impersonate", "principal", dev.name, allow=True,
            reason="allowed by role orchestrator", service="scheduler",
            method=_SCHEDULER + "SubmitJob", address=WORKFLOWS_ADDRESS, correlation_id=corr,
        )  # fmt: skip
    else:
        w.authz(
            ms, dev.name, _DEV_ROLES, "create", "job", "*", allow=True,
            reason="allowed by role ml-developer", service="scheduler",
            method=_SCHEDULER + "SubmitJob", address=dev.address, correlation_id=corr,
        )  # fmt: skip
    w.job(ms, datasets)


def _pipelines(w: _World, pipelines: list[tuple[str, float, list[str]]]) -> None:
    """Nightly pipelines: workflows acts for their owner, the job reads round the clock."""
    rng = w.rng
    for owner, hour, datasets in pipelines:
        for day in range(1, w.days):
            ms = w.at(day, hour + rng.uniform(0.0, 0.05))
            w.authz(
                ms, WORKFLOWS, _WORKFLOWS_ROLES, "impersonate", "principal", owner, allow=True,
                reason="allowed by role orchestrator", service="scheduler",
                method=_SCHEDULER + "SubmitJob", address=WORKFLOWS_ADDRESS,
            )  # fmt: skip
            w.job(ms, datasets[:2])


def _stewards(w: _World) -> None:
    rng = w.rng
    names = [n for n, _ in DATASETS]
    for who in STEWARDS:
        scale = rng.lognormvariate(math.log(20_000), 0.4)
        for day in range(w.days):
            if w.weekend(day) or (day > 0 and rng.random() < 0.1):
                continue
            if day == 0:  # a first look at every dataset
                picks = rng.sample(names, len(names))
            else:
                picks = rng.choices(names, k=rng.randint(3, 8))
            times = w.times(day, 8.3 if day else 7.2, 17.5, len(picks))
            noise = math.exp(max(-0.6, min(0.6, rng.gauss(0.0, 0.3))))
            sizes = w.split(scale * noise, len(picks))
            for ms, name, rows in zip(times, picks, sizes, strict=True):
                view = "raw" if rng.random() < 0.6 else "deidentified"
                w.read(ms, who, _STEWARD_ROLES, name, view, rows, purpose="quality check")
            for _ in range(rng.randint(0, 2)):
                action, method = rng.choice(
                    (("create", "IssueGrant"), ("list", "ListGrants"), ("revoke", "RevokeGrant"))
                )
                w.authz(
                    w.at(day, rng.uniform(8.5, 17.5)), who, _STEWARD_ROLES, action, "grant", "*",
                    allow=True, reason="allowed by role data-steward", service="governance",
                    method=_GOVERNANCE + method, address=w.addresses[who],
                )  # fmt: skip


def _annotator(w: _World) -> None:
    rng = w.rng
    for day in range(w.days):
        if w.weekend(day) or (day > 0 and rng.random() < 0.1):
            continue
        n = rng.randint(10, 25)
        picks = rng.choices(ANNOTATED, (0.7, 0.3), k=n)
        if day == 0:
            picks[:2] = list(ANNOTATED)
        for ms, name in zip(w.times(day, 9.0, 17.0, n), picks, strict=True):
            w.read(
                ms, ANNOTATOR, ("annotator",), name, "raw", rng.randint(100, 1500),
                purpose="labelling",
            )  # fmt: skip


def _auditor(w: _World) -> None:
    rng = w.rng
    for day in range(w.days):
        if w.weekend(day) or rng.random() < 0.3:
            continue
        for ms in w.times(day, 9.0, 16.5, rng.randint(2, 6)):
            w.authz(
                ms, AUDITOR, ("auditor",), "query", "audit_log", "*", allow=True,
                reason="allowed by role auditor", service="audit", method=_AUDIT + "Query",
                address=w.addresses[AUDITOR],
            )  # fmt: skip


def _serving(w: _World) -> None:
    """Serving polls the model registry and downloads models, round the clock."""
    rng = w.rng
    ms = w.start_ms + rng.randrange(10 * MINUTE_MS)
    while ms < w.end_ms:
        action, method = ("list", "ListModels") if rng.random() < 0.7 else ("read", "DownloadModel")
        w.authz(
            ms, SERVING, _SERVICE_ROLES, action, "model", rng.choice(MODELS), allow=True,
            reason="allowed by role service", service="governance", method=_GOVERNANCE + method,
            address=rng.choice(SERVING_ADDRESSES),
        )  # fmt: skip
        ms += rng.randrange(7 * MINUTE_MS, 13 * MINUTE_MS)


# -- injections -------------------------------------------------------------------------------


def _inject(w: _World) -> list[Injected]:
    rng = w.rng
    window = [d for d in range(max(1, w.days - INJECT_DAYS), w.days) if not w.weekend(d)]
    window = window or list(range(max(1, w.days - INJECT_DAYS), w.days))
    devs = list(w.devs)
    rng.shuffle(devs)
    sensitive = [n for n, level in DATASETS if level == "sensitive"]

    def take(ok: Callable[[_Dev], bool] | None = None) -> _Dev:
        for dev in devs:
            if ok is None or ok(dev):
                devs.remove(dev)
                return dev
        return devs.pop(0)

    naive = take(lambda d: not any(n in sensitive for n in d.habit))
    raw_reader = take(lambda d: any(w.sensitivity[n] == "pii" for n in d.habit))
    night = take()
    bulky = [take(), take()]
    stormy = take()
    out: list[Injected] = []

    def found(kind: str, who: str, ids: list[str]) -> None:
        by_id = {r.id: r.ms for r in w.recs[-len(ids) :]}
        ordered = sorted(ids, key=lambda i: by_id[i])
        out.append(Injected(kind, who, by_id[ordered[0]], tuple(ordered)))

    for dev in bulky:
        day = rng.choice(window)
        daily: dict[int, int] = {}
        for r in w.recs:
            if (
                r.type == "gantry.data.accessed"
                and r.actor == dev.name
                and r.data["decision"] == "allow"
                and r.ms < w.start_ms + day * DAY_MS
            ):
                d = (r.ms - w.start_ms) // DAY_MS
                daily[d] = daily.get(d, 0) + int(r.data["rows"])
        median = statistics.median(daily.values()) if daily else dev.scale
        total = median * rng.uniform(30.0, 50.0)
        n = rng.randint(8, 14)
        hour = rng.uniform(dev.start_h + 1.0, max(dev.start_h + 1.5, dev.end_h - 1.5))
        begin = w.at(day, hour)
        ids: list[str] = []
        times = sorted(begin + rng.randrange(50 * MINUTE_MS) for _ in range(n))
        for ms, rows in zip(times, w.split(total, n), strict=True):
            ids += w.read(ms, dev.name, _DEV_ROLES, rng.choice(dev.habit), "deidentified", rows)
        found("bulk_read", dev.name, ids)

    day = rng.choice(window)
    ids = []
    begin = w.at(day, rng.uniform(2.8, 3.2))
    for ms in sorted(begin + rng.randrange(40 * MINUTE_MS) for _ in range(rng.randint(2, 4))):
        rows = int(night.scale / max(night.reads, 1.0) * rng.uniform(0.5, 1.5))
        ids += w.read(ms, night.name, _DEV_ROLES, rng.choice(night.habit), "deidentified", rows)
    found("unusual_hour", night.name, ids)

    names = [n for n, _ in DATASETS]
    for who, roles, action, method in (
        (stormy.name, _DEV_ROLES, "create", "IssueGrant"),
        (ANNOTATOR, ("annotator",), "update", "Commit"),
    ):
        day = rng.choice(window)
        ms = w.at(day, rng.uniform(10.0, 16.0))
        ids = []
        kind = "grant" if action == "create" else "dataset"
        for i in range(rng.randint(13, 18)):
            ms += rng.randrange(2000, 9000) if i else 0
            denied = w.authz(
                ms, who, roles, action, kind, names[i % len(names)], allow=False,
                reason=f"no role of {who!r} ({roles[0]}) allows {action} on {kind}",
                service="governance", method=_GOVERNANCE + method, address=w.addresses[who],
            )  # fmt: skip
            ids.append(denied)
        found("denial_storm", who, ids)

    day = rng.choice(window)
    pii = [n for n in raw_reader.habit if w.sensitivity[n] == "pii"] or raw_reader.habit
    ids = []
    for ms in w.times(day, raw_reader.start_h + 0.5, raw_reader.end_h - 0.5, rng.randint(1, 2)):
        ids += w.read(
            ms, raw_reader.name, _DEV_ROLES, rng.choice(pii), "raw",
            int(raw_reader.scale / max(raw_reader.reads, 1.0) * rng.uniform(0.5, 2.0)),
        )  # fmt: skip
    found("raw_view_read", raw_reader.name, ids)

    day = rng.choice(window)
    target = rng.choice(sensitive)
    ids = []
    for ms in w.times(day, naive.start_h + 0.5, naive.end_h - 0.5, rng.randint(1, 3)):
        ids += w.read(
            ms, naive.name, _DEV_ROLES, target, "deidentified",
            int(naive.scale / max(naive.reads, 1.0) * rng.uniform(0.5, 2.0)),
        )  # fmt: skip
    found("first_sensitive_access", naive.name, ids)

    day = rng.choice(window)
    before = len(w.recs)
    owner = rng.choice(w.devs)
    at = w.at(day, rng.uniform(0.0, 20.0))
    w.job(at, owner.habit[:2], address=UNUSUAL_ADDRESS, hours=rng.uniform(0.3, 1.0))
    found("unusual_place", TRAINING_AGENT, [r.id for r in w.recs[before:]])
    return sorted(out, key=lambda i: (i.time_ms, i.kind))


# -- the month --------------------------------------------------------------------------------


def simulate_month(
    seed: int = 0,
    days: int = 30,
    *,
    inject: bool = True,
    start: datetime = datetime(2026, 3, 2, tzinfo=UTC),
) -> Month:
    """A deterministic month of audit events (same seed, same events and ids).

    The month begins at midnight UTC of ``start``'s day (a naive ``start`` is taken as UTC).
    With ``inject`` the last ten days hold the anomalies listed in :attr:`Month.injected`;
    that needs ``days >= 14`` (a week of normal history first).
    """
    if days < 1:
        raise ValueError("days must be at least 1")
    if inject and days < 14:
        raise ValueError("injected anomalies need days >= 14 (a week of history first)")
    start = start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)
    start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    rng = Random(seed)
    w = _World(rng, start, days)
    people = [*DEVELOPERS, *STEWARDS, ANNOTATOR, AUDITOR]
    for i, who in enumerate(people):
        w.addresses[who] = f"192.168.{10 + i}.{rng.randint(2, 250)}"
    _datasets(w)
    _make_devs(w)
    pipelines: list[tuple[str, float, list[str]]] = []
    _developers(w, pipelines)
    _pipelines(w, pipelines)
    _stewards(w)
    _annotator(w)
    _auditor(w)
    _serving(w)
    injected = _inject(w) if inject else []

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    events = tuple(
        EventEnvelope(
            id=r.id,
            type=r.type,
            source=r.source,
            subject=r.subject,
            time=epoch + timedelta(milliseconds=r.ms),
            actor=r.actor,
            correlation_id=r.correlation_id,
            data=r.data,
        )
        for r in sorted(w.recs, key=lambda r: (r.ms, r.seq))
    )
    principals: dict[str, tuple[str, ...]] = dict.fromkeys(DEVELOPERS, _DEV_ROLES)
    principals.update(dict.fromkeys(STEWARDS, _STEWARD_ROLES))
    principals[ANNOTATOR] = ("annotator",)
    principals[AUDITOR] = ("auditor",)
    principals[TRAINING_AGENT] = _SERVICE_ROLES
    principals[SERVING] = _SERVICE_ROLES
    principals[WORKFLOWS] = _WORKFLOWS_ROLES
    return Month(
        events=events,
        injected=tuple(injected),
        days=days,
        start=start,
        principals=MappingProxyType(principals),
        datasets=MappingProxyType(dict(DATASETS)),
    )


__all__ = [
    "DATASETS",
    "INJECTED_KINDS",
    "NODES",
    "UNUSUAL_ADDRESS",
    "Injected",
    "Month",
    "simulate_month",
]
