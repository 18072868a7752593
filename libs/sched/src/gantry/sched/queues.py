"""Queues, guaranteed quotas, borrowing within a cohort, and fair share (DRF).

Each queue has a nominal quota (GPU, CPU, memory) it is guaranteed. Queues in the same cohort
lend each other what they leave idle, as Kueue's cohorts do: a queue may use more than its
quota while its cohort has unused quota, up to its borrowing limit, and what it borrowed can be
reclaimed (by preemption) when the lender needs it back. Across queues, fair share follows
Dominant Resource Fairness: the queue with the smallest weighted dominant share goes first.

Quotas come from YAML::

    queues:
      - {name: research, cohort: lab, quota: {gpus: 16, cpus: 256, memory: 2Ti}}
      - {name: prod, cohort: lab, quota: {gpus: 48}, borrowingLimit: {gpus: 8}, weight: 2}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gantry.core import InvalidInput, NotFound
from gantry.sched.spec import MILLI, parse_memory_mib

UNLIMITED = 1 << 62


@dataclass(frozen=True, slots=True)
class Amount:
    """An amount of the three scheduled resources: milli-GPU, milli-CPU and MiB of memory."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(
            self.gpu_milli + other.gpu_milli,
            self.cpu_milli + other.cpu_milli,
            self.memory_mib + other.memory_mib,
        )

    def __sub__(self, other: Amount) -> Amount:
        return Amount(
            self.gpu_milli - other.gpu_milli,
            self.cpu_milli - other.cpu_milli,
            self.memory_mib - other.memory_mib,
        )

    def fits_in(self, other: Amount) -> bool:
        """Whether every component is at most ``other``'s."""
        return (
            self.gpu_milli <= other.gpu_milli
            and self.cpu_milli <= other.cpu_milli
            and self.memory_mib <= other.memory_mib
        )

    def clip(self) -> Amount:
        """Negative components as zero."""
        return Amount(max(self.gpu_milli, 0), max(self.cpu_milli, 0), max(self.memory_mib, 0))

    def describe(self) -> str:
        """``2.5 GPU, 8 CPU, 32768 MiB``."""
        return (
            f"{self.gpu_milli / MILLI:g} GPU, {self.cpu_milli / MILLI:g} CPU, {self.memory_mib} MiB"
        )


ZERO = Amount()


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: float | None = Field(default=None, ge=0)
    cpus: float | None = Field(default=None, ge=0)
    memory: int | None = None

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int | None:
        return None if value is None else parse_memory_mib(value)

    def amount(self, missing: int) -> Amount:
        return Amount(
            missing if self.gpus is None else int(self.gpus * MILLI),
            missing if self.cpus is None else int(self.cpus * MILLI),
            missing if self.memory is None else self.memory,
        )


class _QueueDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    cohort: str = ""
    quota: _Quota = Field(default_factory=_Quota)
    borrowing_limit: _Quota | None = Field(default=None, alias="borrowingLimit")
    weight: float = Field(default=1.0, gt=0)


@dataclass(frozen=True)
class QueueConfig:
    """One queue: its guaranteed quota, cohort, borrowing limit and fair-share weight."""

    name: str
    quota: Amount
    cohort: str = ""
    borrowing_limit: Amount = Amount(UNLIMITED, UNLIMITED, UNLIMITED)
    weight: float = 1.0


@dataclass(frozen=True)
class Admission:
    """Whether a demand may start in a queue now, and how much of it is borrowed."""

    allowed: bool
    borrowed: Amount = ZERO
    reason: str = ""


@dataclass
class _Usage:
    used: Amount = ZERO
    jobs: set[str] = field(default_factory=set)


def load_queues(text: str) -> list[QueueConfig]:
    """Queues from the YAML format in the module docstring.

    A resource a quota does not name is not limited (``quota: {gpus: 16}`` caps GPUs only).
    """
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidInput(f"the queues file is not valid YAML: {exc}") from None
    items = doc.get("queues") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise InvalidInput("a queues file needs a 'queues:' list", hint="see docs/queues.md")
    out = []
    for i, item in enumerate(items):
        try:
            q = _QueueDoc.model_validate(item)
        except ValidationError as exc:
            where = "; ".join(
                f"queues[{i}].{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidInput(f"bad queue definition: {where}") from None
        limit = q.borrowing_limit.amount(UNLIMITED) if q.borrowing_limit else None
        out.append(
            QueueConfig(
                q.name,
                q.quota.amount(UNLIMITED),
                q.cohort,
                limit or Amount(UNLIMITED, UNLIMITED, UNLIMITED),
                q.weight,
            )
        )
    names = [q.name for q in out]
    if len(set(names)) != len(names):
        raise InvalidInput("a queue is defined twice", hint=", ".join(sorted(names)))
    return out


class QueueBook:
    """Quota accounting for every queue: admission, borrowing, reclaiming and fair share.

    ``capacity`` is the cluster's total (the denominators of the dominant shares).
    """

    def __init__(self, queues: Iterable[QueueConfig], capacity: Amount) -> None:
        self.queues: dict[str, QueueConfig] = {q.name: q for q in queues}
        self.capacity = capacity
        self._usage: dict[str, _Usage] = {name: _Usage() for name in self.queues}
        self._held: dict[str, tuple[str, Amount]] = {}

    def copy(self) -> QueueBook:
        """An independent copy (for what-if checks)."""
        clone = QueueBook(self.queues.values(), self.capacity)
        for name, usage in self._usage.items():
            clone._usage[name] = _Usage(usage.used, set(usage.jobs))
        clone._held = dict(self._held)
        return clone

    def set_queue(self, config: QueueConfig) -> None:
        """Add a queue or change one's quota, cohort, limit or weight (usage is kept)."""
        self.queues[config.name] = config
        self._usage.setdefault(config.name, _Usage())

    def queue(self, name: str) -> QueueConfig:
        """The queue called ``name``; :class:`NotFound` lists the known ones."""
        try:
            return self.queues[name]
        except KeyError:
            known = ", ".join(sorted(self.queues)) or "none"
            raise NotFound("queue", name, hint=f"known queues: {known}") from None

    def used(self, name: str) -> Amount:
        """What the queue's running jobs hold."""
        return self._usage[self.queue(name).name].used

    def _cohort(self, cohort: str) -> list[QueueConfig]:
        return [q for q in self.queues.values() if cohort and q.cohort == cohort]

    def idle_in_cohort(self, name: str) -> Amount:
        """The cohort's quota nobody uses: its members' quotas minus their usage (borrowers
        included), which is what any member may still start beyond its own quota."""
        members = self._cohort(self.queue(name).cohort)
        total_quota = sum((m.quota for m in members), ZERO)
        total_used = sum((self._usage[m.name].used for m in members), ZERO)
        return (total_quota - total_used).clip()

    def borrowed(self, name: str) -> Amount:
        """How far the queue is above its own quota."""
        return (self.used(name) - self.queue(name).quota).clip()

    def check(self, name: str, demand: Amount) -> Admission:
        """May ``demand`` start in queue ``name`` now? Within quota, or by borrowing."""
        q = self.queue(name)
        after = self._usage[name].used + demand
        if after.fits_in(q.quota):
            return Admission(True)
        over = (after - q.quota).clip()
        if not over.fits_in(q.borrowing_limit):
            return Admission(
                False,
                reason=f"queue {name} would use {after.describe()}, more than its quota "
                f"{q.quota.describe()} plus its borrowing limit",
            )
        idle = self.idle_in_cohort(name) if q.cohort else ZERO
        if not q.cohort or not demand.fits_in(idle):
            return Admission(
                False,
                reason=f"queue {name} is over its quota ({self.used(name).describe()} of "
                f"{q.quota.describe()} in use) and its cohort has {idle.describe()} idle; "
                "the job is admitted when capacity frees",
            )
        return Admission(True, borrowed=over)

    def admit(self, name: str, job: str, demand: Amount) -> Admission:
        """Charge ``demand`` to the queue if :meth:`check` allows it."""
        decision = self.check(name, demand)
        if decision.allowed:
            self.charge(name, job, demand)
        return decision

    def charge(self, name: str, job: str, demand: Amount) -> None:
        """Record a running job's usage (also on recovery, without an admission check)."""
        if job in self._held:
            raise InvalidInput(f"job {job} is already charged to queue {self._held[job][0]}")
        usage = self._usage[self.queue(name).name]
        usage.used = usage.used + demand
        usage.jobs.add(job)
        self._held[job] = (name, demand)

    def release(self, job: str) -> None:
        """The job stopped: give its usage back (idempotent)."""
        held = self._held.pop(job, None)
        if held is None:
            return
        name, demand = held
        usage = self._usage[name]
        usage.used = usage.used - demand
        usage.jobs.discard(job)

    def lenders_short(self, name: str) -> Amount:
        """How much quota queue ``name`` is owed: its unmet quota that others borrowed."""
        q = self.queue(name)
        own_free = (q.quota - self.used(name)).clip()
        borrowed_by_others = ZERO
        for other in self._cohort(q.cohort):
            if other.name != name:
                borrowed_by_others = borrowed_by_others + self.borrowed(other.name)
        return Amount(
            min(own_free.gpu_milli, borrowed_by_others.gpu_milli),
            min(own_free.cpu_milli, borrowed_by_others.cpu_milli),
            min(own_free.memory_mib, borrowed_by_others.memory_mib),
        )

    def dominant_share(self, name: str, extra: Amount = ZERO) -> float:
        """The queue's DRF dominant share (of the cluster), divided by its weight."""
        used = self.used(name) + extra
        cap = self.capacity
        shares = [
            used.gpu_milli / cap.gpu_milli if cap.gpu_milli else 0.0,
            used.cpu_milli / cap.cpu_milli if cap.cpu_milli else 0.0,
            used.memory_mib / cap.memory_mib if cap.memory_mib else 0.0,
        ]
        return max(shares) / self.queue(name).weight

    def fair_order(self, names: Iterable[str]) -> list[str]:
        """Queues by ascending weighted dominant share (ties by name): who goes next."""
        return sorted(set(names), key=lambda n: (self.dominant_share(n), n))

    def snapshot(self) -> Mapping[str, Amount]:
        """Usage per queue."""
        return {name: u.used for name, u in self._usage.items()}


__all__ = [
    "UNLIMITED",
    "ZERO",
    "Admission",
    "Amount",
    "QueueBook",
    "QueueConfig",
    "load_queues",
]
