"""Deployments (domain): which registered model versions serve an endpoint, with what share of
the traffic, and the state of a canary rollout — pure data and its transitions, no I/O.

A :class:`Deployment` holds at most one *stable* version, at most one *canary* and at most one
*shadow*. The stable and canary weights add up to 100 (per cent of the requests routed by
weight); a shadow receives a copy of ``shadow_percent`` of the requests, whose answers are
discarded. Manual A/B splits (:meth:`Deployment.set_traffic`) may give any number of versions
weights that add up to 100. Every transition returns the :class:`Change` it made, which the
service records in the history, publishes as ``gantry.serving.deployment.changed`` and shows in
``gantry serve status``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from gantry.core import Conflict, InvalidInput

Role = Literal["stable", "canary", "shadow"]
Phase = Literal["", "progressing", "promoted", "rolled_back"]

#: Deployment names are endpoint names: /v2/models/<name>.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HEADER = re.compile(r"[A-Za-z0-9-]{1,64}")
ENVIRONMENTS = ("staging", "production")
#: History entries kept per deployment (the audit log keeps them all).
MAX_HISTORY = 200


def check_name(name: str, what: str = "deployment") -> str:
    """``name`` if it can be an endpoint name, else a clear :class:`InvalidInput`."""
    if not _NAME.fullmatch(name):
        raise InvalidInput(
            f"{what} name {name!r} is not allowed",
            hint="use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    return name


@dataclass(frozen=True)
class CanaryPolicy:
    """How a canary is analysed (defaults in Flagger's spirit)."""

    step_percent: int = 10
    max_percent: int = 50
    interval_s: float = 60.0
    failure_threshold: int = 5
    min_success_rate: float = 0.99
    max_p99_ms: float = 500.0
    min_requests: int = 10

    def check(self) -> CanaryPolicy:
        """Itself, or :class:`InvalidInput` naming the bad field."""
        if not 1 <= self.step_percent <= 100:
            raise InvalidInput(f"canary step_percent {self.step_percent} must be 1..100")
        if not 1 <= self.max_percent <= 100:
            raise InvalidInput(f"canary max_percent {self.max_percent} must be 1..100")
        if self.interval_s <= 0:
            raise InvalidInput(f"canary interval_s {self.interval_s} must be > 0")
        if self.failure_threshold < 1:
            raise InvalidInput(f"canary failure_threshold {self.failure_threshold} must be >= 1")
        if not 0 <= self.min_success_rate <= 1:
            raise InvalidInput(
                f"canary min_success_rate {self.min_success_rate} must be a fraction 0..1",
                hint="e.g. 0.99 for 99%",
            )
        if self.max_p99_ms <= 0:
            raise InvalidInput(f"canary max_p99_ms {self.max_p99_ms} must be > 0")
        if self.min_requests < 0:
            raise InvalidInput(f"canary min_requests {self.min_requests} must be >= 0")
        return self


@dataclass(frozen=True)
class ServingSpec:
    """How every version of a deployment is served (0 = the service's default)."""

    max_batch_size: int = 0
    max_queue_delay_us: int = -1  #: -1 = default (0 is a valid "no waiting")
    queue_capacity: int = 0
    timeout_ms: int = 0
    min_instances: int = 0
    max_instances: int = 0
    quantize: bool = False
    device: str = "cpu"
    anonymous: bool = False
    environment: str = "staging"
    sticky_header: str = ""
    shadow_percent: int = 0
    auto_canary_percent: int = 0  #: > 0: new registered versions start a canary at this weight

    def check(self) -> ServingSpec:
        """Itself, or :class:`InvalidInput` naming the bad field."""
        for key in ("max_batch_size", "queue_capacity", "timeout_ms", "min_instances"):
            if getattr(self, key) < 0:
                raise InvalidInput(f"{key} {getattr(self, key)} must be >= 0 (0 = default)")
        if self.max_queue_delay_us < -1:
            raise InvalidInput(f"max_queue_delay_us {self.max_queue_delay_us} must be >= 0")
        if self.max_instances and self.min_instances > self.max_instances:
            raise InvalidInput(
                f"min_instances {self.min_instances} is above max_instances {self.max_instances}"
            )
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise InvalidInput(
                f"device {self.device!r} is not one of cpu, cuda, cuda:<n>",
                hint="serve on the CPU with device: cpu, or on a GPU with device: cuda:0",
            )
        if self.environment not in ENVIRONMENTS:
            raise InvalidInput(
                f"environment {self.environment!r} is not one of {', '.join(ENVIRONMENTS)}"
            )
        if self.sticky_header and not _HEADER.fullmatch(self.sticky_header):
            raise InvalidInput(
                f"sticky header {self.sticky_header!r} is not a valid header name",
                hint="use letters, digits and '-', e.g. x-user-id",
            )
        if not 0 <= self.shadow_percent <= 100:
            raise InvalidInput(f"shadow_percent {self.shadow_percent} must be 0..100")
        if not 0 <= self.auto_canary_percent <= 99:
            raise InvalidInput(
                f"auto_canary_percent {self.auto_canary_percent} must be 0..99 (0 = off)"
            )
        return self


@dataclass(frozen=True)
class Slot:
    """One version of the deployment and its share of the traffic."""

    version: int
    weight: int
    role: Role = "stable"


@dataclass(frozen=True)
class CanaryState:
    """Where a canary rollout stands."""

    phase: Phase = ""
    canary_version: int = 0
    stable_version: int = 0
    weight: int = 0
    failed_checks: int = 0
    passed_checks: int = 0
    last_check: str = ""
    started_ms: int = 0
    updated_ms: int = 0


@dataclass(frozen=True)
class Change:
    """What one transition did, for the history, the event and the audit."""

    action: str
    detail: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    added: tuple[int, ...] = ()  #: versions that must be loaded
    removed: tuple[int, ...] = ()  #: versions to drain and unload


@dataclass(frozen=True)
class HistoryEntry:
    """A change as ``gantry serve status`` lists it."""

    at_ms: int
    action: str
    detail: str
    actor: str


@dataclass
class Deployment:
    """An endpoint and the versions behind it."""

    name: str
    model: str
    spec: ServingSpec = field(default_factory=ServingSpec)
    canary_policy: CanaryPolicy = field(default_factory=CanaryPolicy)
    slots: list[Slot] = field(default_factory=list)
    canary: CanaryState = field(default_factory=CanaryState)
    history: list[HistoryEntry] = field(default_factory=list)
    created_ms: int = 0
    updated_ms: int = 0

    # -- reading -----------------------------------------------------------------------------

    def versions(self) -> tuple[int, ...]:
        """Every version the deployment holds, in slot order."""
        return tuple(s.version for s in self.slots)

    def slot(self, version: int) -> Slot | None:
        """The slot of ``version``, if the deployment holds it."""
        return next((s for s in self.slots if s.version == version), None)

    def role(self, role: Role) -> Slot | None:
        """The first slot with ``role``."""
        return next((s for s in self.slots if s.role == role), None)

    def routed(self) -> tuple[Slot, ...]:
        """The slots that take routed traffic (weight > 0, not shadow)."""
        return tuple(s for s in self.slots if s.role != "shadow" and s.weight > 0)

    def stable_version(self) -> int:
        """The stable version (0 when there is none)."""
        slot = self.role("stable")
        return slot.version if slot else 0

    def canary_active(self) -> bool:
        """A canary rollout is in progress."""
        return self.canary.phase == "progressing"

    # -- transitions -------------------------------------------------------------------------

    def deploy(self, version: int) -> Change:
        """Serve ``version`` alone (the first deploy, or a hot swap of the stable version)."""
        self._no_canary("replace the serving version")
        if self.slots and [s.version for s in self.routed()] == [version]:
            raise Conflict(
                f"deployment {self.name} already serves {self.model} v{version}",
                hint="deploy another version, or use --canary to roll one out gradually",
            )
        removed = tuple(
            s.version for s in self.slots if s.version != version and s.role != "shadow"
        )
        added = () if self.slot(version) else (version,)
        shadows = [s for s in self.slots if s.role == "shadow" and s.version != version]
        self.slots = [Slot(version, 100, "stable"), *shadows]
        action = "deployed" if not removed else "swapped"
        detail = (
            f"{self.model} v{version} serves 100%"
            if not removed
            else f"{self.model} v{version} replaces v{', v'.join(map(str, removed))} (100%)"
        )
        return Change(action, detail, added=added, removed=removed)

    def start_canary(self, version: int, percent: int, now_ms: int) -> Change:
        """Route ``percent`` of the traffic to ``version`` and start the analysis."""
        self._no_canary("start another canary")
        stable = self.role("stable")
        if stable is None:
            raise Conflict(
                f"deployment {self.name} has no stable version to compare a canary with",
                hint="deploy a first version without --canary",
            )
        if version == stable.version:
            raise Conflict(f"v{version} is already the stable version of {self.name}")
        if not 1 <= percent <= 99:
            raise InvalidInput(f"canary weight {percent}% must be 1..99")
        if (
            any(s.role == "stable" and s is not stable for s in self.slots)
            or len(self.routed()) > 1
        ):
            raise Conflict(
                f"deployment {self.name} splits traffic between several versions",
                hint="set one version to 100% with `gantry serve traffic` first",
            )
        added = () if self.slot(version) else (version,)
        others = [s for s in self.slots if s.version not in (stable.version, version)]
        self.slots = [
            Slot(stable.version, 100 - percent, "stable"),
            Slot(version, percent, "canary"),
            *others,
        ]
        self.canary = CanaryState(
            phase="progressing",
            canary_version=version,
            stable_version=stable.version,
            weight=percent,
            started_ms=now_ms,
            updated_ms=now_ms,
        )
        return Change(
            "canary.started",
            f"canary {self.model} v{version} gets {percent}%, v{stable.version} keeps "
            f"{100 - percent}%",
            added=added,
        )

    def canary_passed(self, summary: str, evidence: Mapping[str, Any], now_ms: int) -> Change:
        """A check passed: step the weight up, or promote after passing at the top weight."""
        self._need_canary()
        c = self.canary
        if c.weight >= self.canary_policy.max_percent:
            return self.promote(now_ms, reason=f"passed at {c.weight}%: {summary}")
        weight = min(self.canary_policy.max_percent, c.weight + self.canary_policy.step_percent)
        self._set_canary_weight(weight)
        self.canary = replace(
            c, weight=weight, passed_checks=c.passed_checks + 1, last_check=summary,
            updated_ms=now_ms,
        )  # fmt: skip
        return Change(
            "canary.step",
            f"canary v{c.canary_version} passed ({summary}); weight {c.weight}% -> {weight}%",
            evidence,
        )

    def canary_failed(self, summary: str, evidence: Mapping[str, Any], now_ms: int) -> Change:
        """A check failed: count it, and roll back at the threshold."""
        self._need_canary()
        c = self.canary
        failed = c.failed_checks + 1
        self.canary = replace(c, failed_checks=failed, last_check=summary, updated_ms=now_ms)
        if failed >= self.canary_policy.failure_threshold:
            return self.rollback(
                now_ms,
                reason=f"{failed} failed checks (threshold {self.canary_policy.failure_threshold})"
                f", last: {summary}",
                evidence=evidence,
            )
        return Change(
            "canary.check_failed",
            f"canary v{c.canary_version} failed a check ({failed}/"
            f"{self.canary_policy.failure_threshold}): {summary}",
            evidence,
        )

    def canary_skipped(self, summary: str, now_ms: int) -> None:
        """Too few requests to judge: nothing changes but the note."""
        self._need_canary()
        self.canary = replace(self.canary, last_check=summary, updated_ms=now_ms)

    def promote(self, now_ms: int, *, reason: str = "promoted by hand") -> Change:
        """The canary becomes the stable version at 100%; the old stable version is removed."""
        self._need_canary()
        c = self.canary
        others = [s for s in self.slots if s.version not in (c.canary_version, c.stable_version)]
        self.slots = [Slot(c.canary_version, 100, "stable"), *others]
        self.canary = replace(c, phase="promoted", weight=100, updated_ms=now_ms)
        return Change(
            "promoted",
            f"v{c.canary_version} promoted to 100% ({reason}); v{c.stable_version} removed",
            removed=(c.stable_version,),
        )

    def rollback(
        self, now_ms: int, *, reason: str, evidence: Mapping[str, Any] | None = None
    ) -> Change:
        """Remove the canary; the stable version takes all traffic again."""
        self._need_canary()
        c = self.canary
        others = [s for s in self.slots if s.version not in (c.canary_version, c.stable_version)]
        self.slots = [Slot(c.stable_version, 100, "stable"), *others]
        self.canary = replace(c, phase="rolled_back", weight=0, updated_ms=now_ms)
        return Change(
            "rolled_back",
            f"canary v{c.canary_version} rolled back: {reason}; v{c.stable_version} serves 100%",
            evidence or {},
            removed=(c.canary_version,),
        )

    def set_traffic(self, weights: Mapping[int, int]) -> Change:
        """A manual split over versions the deployment already holds (weights sum to 100).

        During a canary it takes over: the analysis stops and the split stays as given (this is
        how a canary's version gets into an A/B split)."""
        if not weights:
            raise InvalidInput("give at least one version=weight pair, e.g. 1=90 2=10")
        for version, weight in weights.items():
            slot = self.slot(version)
            if slot is None:
                held = ", ".join(f"v{s.version}" for s in self.slots)
                raise InvalidInput(
                    f"v{version} is not a version of {self.name} (it holds {held})",
                    hint="deploy it first (e.g. with --canary or --shadow) before giving it "
                    "traffic",
                )
            if not 0 <= weight <= 100:
                raise InvalidInput(f"weight {weight} of v{version} must be 0..100")
        if sum(weights.values()) != 100:
            raise InvalidInput(
                f"weights add up to {sum(weights.values())}, not 100",
                hint="e.g. 1=90 2=10",
            )
        top = max(weights, key=lambda v: weights[v])
        new = [Slot(v, w, "stable" if v == top else "canary") for v, w in weights.items()]
        dropped = tuple(
            s.version for s in self.slots if s.role != "shadow" and s.version not in weights
        )
        # a shadow named in the split takes routed traffic from now on (and mirrors no more)
        shadows = [s for s in self.slots if s.role == "shadow" and s.version not in weights]
        if not shadows:
            self.spec = replace(self.spec, shadow_percent=0)
        self.slots = [*new, *shadows]
        split = ", ".join(f"v{v}={w}%" for v, w in weights.items())
        note = ""
        if self.canary_active():
            note = f"; canary v{self.canary.canary_version} stopped (manual split)"
            self.canary = replace(self.canary, phase="")
        return Change("traffic", f"traffic split {split}{note}", removed=dropped)

    def set_shadow(self, version: int, percent: int) -> Change:
        """Mirror ``percent`` of the requests to ``version`` (0 removes the shadow)."""
        current = self.role("shadow")
        if percent == 0:
            if current is None:
                raise Conflict(f"deployment {self.name} has no shadow version")
            self.slots = [s for s in self.slots if s.role != "shadow"]
            self.spec = replace(self.spec, shadow_percent=0)
            return Change("shadow.removed", f"shadow v{current.version} removed",
                          removed=(current.version,))  # fmt: skip
        if not 1 <= percent <= 100:
            raise InvalidInput(f"shadow share {percent}% must be 1..100")
        existing = self.slot(version)
        if existing is not None and existing.role != "shadow":
            raise Conflict(f"v{version} already takes routed traffic in {self.name}")
        removed = (current.version,) if current and current.version != version else ()
        self.slots = [s for s in self.slots if s.role != "shadow"] + [Slot(version, 0, "shadow")]
        self.spec = replace(self.spec, shadow_percent=percent)
        return Change(
            "shadow",
            f"v{version} mirrors {percent}% of the requests (answers discarded)",
            added=() if existing else (version,),
            removed=removed,
        )

    # -- helpers -----------------------------------------------------------------------------

    def _set_canary_weight(self, weight: int) -> None:
        c = self.canary
        self.slots = [
            Slot(s.version, 100 - weight, s.role)
            if s.version == c.stable_version
            else Slot(s.version, weight, s.role)
            if s.version == c.canary_version
            else s
            for s in self.slots
        ]

    def _no_canary(self, what: str) -> None:
        if self.canary_active():
            raise Conflict(
                f"a canary of v{self.canary.canary_version} is in progress on {self.name}, so "
                f"cannot {what}",
                hint="promote it (`gantry serve promote`) or roll it back first",
            )

    def _need_canary(self) -> None:
        if not self.canary_active():
            raise Conflict(
                f"deployment {self.name} has no canary in progress",
                hint="start one with `gantry serve deploy --canary 10%`",
            )

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Plain data for the database."""
        return {
            "spec": asdict(self.spec),
            "canary_policy": asdict(self.canary_policy),
            "slots": [asdict(s) for s in self.slots],
            "canary": asdict(self.canary),
        }

    @classmethod
    def from_json(
        cls, name: str, model: str, data: Mapping[str, Any], created_ms: int, updated_ms: int
    ) -> Deployment:
        """Back from :meth:`to_json`."""
        return cls(
            name=name,
            model=model,
            spec=ServingSpec(**data.get("spec", {})),
            canary_policy=CanaryPolicy(**data.get("canary_policy", {})),
            slots=[Slot(**s) for s in data.get("slots", [])],
            canary=CanaryState(**data.get("canary", {})),
            created_ms=created_ms,
            updated_ms=updated_ms,
        )


__all__ = [
    "ENVIRONMENTS",
    "MAX_HISTORY",
    "CanaryPolicy",
    "CanaryState",
    "Change",
    "Deployment",
    "HistoryEntry",
    "Phase",
    "Role",
    "ServingSpec",
    "Slot",
    "check_name",
]
