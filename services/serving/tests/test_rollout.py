"""The rollout controller over a real SQLite database and real exported models: deploy, swap,
canary (stepped, promoted and rolled back by analysis of the recorded windows, or by hand),
manual splits, shadows and undeploy. Each change is stored with its history entry and its
outbox event; a version that cannot be fetched or loaded is refused with the reason while the
versions already serving keep serving; after a restart the deployments come back from the
database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from gantry.core import Conflict, GantryError, InvalidInput, NotFound, Unavailable
from gantry.events import EventEnvelope
from gantry.serving import rollout as rollout_module
from gantry.serving import store
from gantry.serving.batcher import BatchingConfig
from gantry.serving.deployments import CanaryPolicy, ServingSpec, Slot
from gantry.serving.rollout import Rollouts
from gantry.serving.router import Route
from gantry.serving.runtime import Artifact

from .exported_models import FEATURES, exported

CHANGED = "gantry.serving.deployment.changed"
STATE = "gantry.serving.version.state"
#: step 20 up to 50, two failed checks roll back, five requests are enough to judge
POLICY = CanaryPolicy(
    step_percent=20, max_percent=50, interval_s=60.0, failure_threshold=2, min_requests=5
)
LATEST = 5


@dataclass
class Registry:
    """A fake model registry: every version is a small exported MLP unless told otherwise."""

    errors: dict[int, Exception] = field(default_factory=dict)
    damaged: set[int] = field(default_factory=set)
    #: version -> how many more fetches fail with Unavailable (the registry still starting)
    starting: dict[int, int] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)

    def fetch(self, model: str, version: int) -> Artifact:
        self.calls.append((model, version))
        version = version or LATEST
        if version in self.errors:
            raise self.errors[version]
        if self.starting.get(version, 0) > 0:
            self.starting[version] -= 1
            raise Unavailable("the registry is starting")
        artifact = exported("a").artifact(model, version)
        if version in self.damaged:
            artifact = replace(artifact, data=b"PK\x03\x04 these are not the bytes you registered")
        return artifact


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    # a file, not sqlite:// — an in-memory database is one per thread, and the controller
    # writes from worker threads
    engine = store.connect(f"sqlite:///{tmp_path / 'serving.db'}")
    store.migrate(engine)
    yield engine
    engine.dispose()


@dataclass
class Notified:
    count: int = 0

    def __call__(self) -> None:
        self.count += 1


def make_rollouts(
    engine: sa.Engine, fetch: Callable[[str, int], Artifact], **extra: Any
) -> Rollouts:
    return Rollouts(
        engine,
        fetch,
        batching=BatchingConfig(max_batch_size=4, max_queue_delay_us=0, queue_capacity=16),
        min_instances=1,
        max_instances=1,
        default_interval_s=30.0,
        drain_timeout_s=5.0,
        **extra,
    )


@pytest.fixture
def notified() -> Notified:
    return Notified()


@pytest.fixture
async def rollouts(
    engine: sa.Engine, registry: Registry, notified: Notified
) -> AsyncIterator[Rollouts]:
    running = make_rollouts(engine, registry.fetch, notify=notified)
    yield running
    await running.close()


def events(engine: sa.Engine, type_: str | None = None) -> list[EventEnvelope]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.outbox.c.payload).order_by(store.outbox.c.id)).all()
    found = [EventEnvelope.from_bytes(row.payload) for row in rows]
    return [e for e in found if type_ is None or e.type == type_]


def actions(engine: sa.Engine) -> list[str]:
    return [e.data["action"] for e in events(engine, CHANGED)]


def stored_history(engine: sa.Engine, name: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(store.history.c.action, store.history.c.actor)
            .where(store.history.c.deployment == name)
            .order_by(store.history.c.id)
        ).all()
    return [(r.action, r.actor) for r in rows]


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def feed(
    rollouts: Rollouts, version: int, n: int, *, failed: bool = False, name: str = "scorer"
) -> None:
    """Record ``n`` finished requests on a version's analysis window."""
    runtime = rollouts.get(name).versions[version]
    for _ in range(n):
        runtime.record(0.004, failed=failed)


async def with_canary(rollouts: Rollouts) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    await rollouts.deploy(
        model="scorer", version=2, canary_percent=10, canary_policy=POLICY, actor="alice"
    )


# -- deploy and swap ----------------------------------------------------------------------------


async def test_a_first_deploy_loads_the_version_stores_it_and_queues_its_events(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry, notified: Notified
) -> None:
    d = await rollouts.deploy(model="scorer", version=1, actor="alice")
    assert (d.name, d.model) == ("scorer", "scorer")
    assert d.slots == [Slot(1, 100, "stable")]
    assert [(h.action, h.actor) for h in d.history] == [("deployed", "alice")]
    assert registry.calls == [("scorer", 1)]

    running = rollouts.get("scorer")
    assert running.deployment is d
    runtime = running.versions[1]
    assert runtime.ready and runtime.model is not None and runtime.batcher is not None
    assert running.router.route().version == 1
    # the version answers through its batcher
    (out,) = await runtime.batcher.submit([np.ones((3, FEATURES), np.float32)])
    assert out.shape == (3, 2)

    (state,) = events(engine, STATE)
    assert state.data["state"] == "ready" and state.data["version"] == 1
    assert (state.actor, state.subject, state.source) == (
        "alice",
        "deployment/scorer",
        store.SOURCE,
    )
    (changed,) = events(engine, CHANGED)
    assert changed.data["action"] == "deployed"
    assert changed.data["versions"] == [{"version": 1, "weight": 100, "role": "stable"}]
    assert changed.data["detail"] == "scorer v1 serves 100%"
    assert (changed.actor, changed.subject) == ("alice", "deployment/scorer")
    assert notified.count >= 2

    (loaded,) = store.load_all(engine)
    assert loaded.slots == d.slots and loaded.spec == d.spec
    assert [(h.action, h.actor) for h in loaded.history] == [("deployed", "alice")]


async def test_version_zero_deploys_the_latest(rollouts: Rollouts) -> None:
    d = await rollouts.deploy(model="scorer", version=0, name="latest-scorer", actor="alice")
    assert d.name == "latest-scorer" and d.versions() == (LATEST,)
    assert rollouts.get("latest-scorer").versions[LATEST].ready


async def test_a_swap_serves_the_new_version_and_drains_the_old(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    old = rollouts.get("scorer").versions[1]
    d = await rollouts.deploy(model="scorer", version=2, actor="bob")
    assert d.slots == [Slot(2, 100, "stable")]
    running = rollouts.get("scorer")
    assert set(running.versions) == {2}
    assert {running.router.route().version for _ in range(20)} == {2}
    await until(lambda: old.state == "draining" and old.batcher is None, "v1 to unload")
    assert actions(engine) == ["deployed", "swapped"]
    assert events(engine, CHANGED)[-1].data["detail"] == "scorer v2 replaces v1 (100%)"
    assert stored_history(engine, "scorer") == [("deployed", "alice"), ("swapped", "bob")]


async def test_deploying_what_is_served_and_other_misuse_is_refused(rollouts: Rollouts) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(Conflict, match="already serves scorer v1"):
        await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(Conflict, match="serves model scorer, not ranker") as info:
        await rollouts.deploy(model="ranker", version=1, name="scorer", actor="alice")
    assert "--name" in (info.value.hint or "")
    with pytest.raises(InvalidInput, match="either a canary or a shadow"):
        await rollouts.deploy(
            model="scorer", version=2, canary_percent=10, shadow_percent=10, actor="alice"
        )
    with pytest.raises(InvalidInput, match="model name 'bad name' is not allowed"):
        await rollouts.deploy(model="bad name", version=1, actor="alice")
    with pytest.raises(InvalidInput, match="deployment name '-x' is not allowed"):
        await rollouts.deploy(model="scorer", version=1, name="-x", actor="alice")
    with pytest.raises(InvalidInput, match="device 'tpu'"):
        await rollouts.deploy(
            model="scorer", version=2, spec=ServingSpec(device="tpu"), actor="alice"
        )
    with pytest.raises(Conflict, match="does not exist yet"):
        await rollouts.deploy(model="ranker", version=2, canary_percent=10, actor="alice")
    with pytest.raises(Conflict, match="does not exist yet"):
        await rollouts.deploy(model="ranker", version=2, shadow_percent=10, actor="alice")
    assert set(rollouts.deployments) == {"scorer"}
    assert rollouts.get("scorer").deployment.slots == [Slot(1, 100, "stable")]


async def test_an_unknown_deployment_names_the_ones_there_are(rollouts: Rollouts) -> None:
    with pytest.raises(NotFound) as info:
        rollouts.get("nope")
    assert "deployments: none" in (info.value.hint or "")
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(NotFound) as info:
        await rollouts.promote("nope", actor="alice")
    assert "deployments: scorer" in (info.value.hint or "")


# -- versions that cannot be served -------------------------------------------------------------


async def test_an_artefact_the_registry_cannot_give_is_a_conflict_and_the_old_version_serves(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    registry.errors[2] = GantryError("stored digest does not match")
    with pytest.raises(Conflict) as info:
        await rollouts.deploy(model="scorer", version=2, actor="bob")
    assert str(info.value.message) == (
        "scorer v2 cannot be served: the registry could not give its artefact: "
        "stored digest does not match"
    )
    assert "keep serving" in (info.value.hint or "")
    running = rollouts.get("scorer")
    assert running.deployment.slots == [Slot(1, 100, "stable")]
    assert set(running.versions) == {1} and running.versions[1].ready
    assert running.router.route().version == 1
    failed = events(engine, STATE)[-1]
    assert (failed.data["version"], failed.data["state"], failed.actor) == (2, "failed", "bob")
    assert "stored digest does not match" in failed.data["reason"]
    assert actions(engine) == ["deployed"]


@pytest.mark.parametrize(
    "error",
    [
        NotFound("model version", "scorer v2"),
        Unavailable("the registry is down"),
    ],
)
async def test_registry_errors_the_caller_should_see_pass_through(
    rollouts: Rollouts, registry: Registry, error: Exception
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    registry.errors[2] = error
    with pytest.raises(type(error)):
        await rollouts.deploy(model="scorer", version=2, actor="alice")
    assert rollouts.get("scorer").deployment.versions() == (1,)


async def test_a_version_that_does_not_load_is_refused_and_the_old_version_serves(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    registry.damaged.add(2)
    for kwargs in ({}, {"canary_percent": 10}, {"shadow_percent": 10}):
        with pytest.raises(Conflict, match="scorer v2 cannot be served: cannot read") as info:
            await rollouts.deploy(model="scorer", version=2, actor="bob", **kwargs)
        assert "keep serving" in (info.value.hint or "")
        running = rollouts.get("scorer")
        assert running.deployment.slots == [Slot(1, 100, "stable")]
        assert not running.deployment.canary_active()
        assert set(running.versions) == {1}
        assert running.router.route().version == 1
    states = [(e.data["version"], e.data["state"]) for e in events(engine, STATE)]
    assert states == [(1, "ready"), (2, "failed"), (2, "failed"), (2, "failed")]
    assert actions(engine) == ["deployed"]
    assert stored_history(engine, "scorer") == [("deployed", "alice")]


async def test_a_first_version_that_does_not_load_creates_nothing(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry
) -> None:
    registry.damaged.add(1)
    with pytest.raises(Conflict, match="cannot be served"):
        await rollouts.deploy(model="scorer", version=1, actor="alice")
    assert rollouts.deployments == {}
    assert store.load_all(engine) == []


# -- canary -------------------------------------------------------------------------------------


async def test_a_canary_steps_up_on_passed_checks_and_is_promoted(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await with_canary(rollouts)
    running = rollouts.get("scorer")
    d = running.deployment
    assert d.slots == [Slot(1, 90, "stable"), Slot(2, 10, "canary")]
    assert d.canary_active() and d.canary_policy == POLICY
    assert running.versions[2].ready

    assert await rollouts.analyse(time.monotonic()) == []  # the first check is not due yet
    base = time.monotonic() + POLICY.interval_s + 1
    feed(rollouts, 1, 50, failed=True)  # the stable version's figures do not count
    for step, weight in enumerate((30, 50)):
        feed(rollouts, 2, 6)
        (change,) = await rollouts.analyse(base + step * 100)
        assert change.action == "canary.step"
        assert change.evidence["requests"] == 6
        assert rollouts.get("scorer").deployment.canary.weight == weight
    assert rollouts.get("scorer").deployment.slots == [Slot(1, 50, "stable"), Slot(2, 50, "canary")]
    # the next check is one interval later
    assert await rollouts.analyse(base + 100 + POLICY.interval_s / 2) == []

    feed(rollouts, 2, 6)
    (change,) = await rollouts.analyse(base + 200)
    assert change.action == "promoted"
    d = rollouts.get("scorer").deployment
    assert d.slots == [Slot(2, 100, "stable")] and not d.canary_active()
    assert set(rollouts.get("scorer").versions) == {2}
    assert await rollouts.analyse(base + 10_000) == []  # no more checks

    assert actions(engine) == [
        "deployed",
        "canary.started",
        "canary.step",
        "canary.step",
        "promoted",
    ]
    steps = [e for e in events(engine, CHANGED) if e.data["action"] == "canary.step"]
    assert all(e.actor == "gantry/serving" for e in steps)
    assert steps[0].data["versions"] == [
        {"version": 1, "weight": 70, "role": "stable"},
        {"version": 2, "weight": 30, "role": "canary"},
    ]
    assert steps[0].data["evidence"]["success_rate"] == 1.0
    (stored,) = store.load_all(engine)
    assert stored.slots == [Slot(2, 100, "stable")] and stored.canary.phase == "promoted"
    assert [h.action for h in stored.history][-1] == "promoted"


async def test_failed_checks_roll_the_canary_back(rollouts: Rollouts, engine: sa.Engine) -> None:
    await with_canary(rollouts)
    canary = rollouts.get("scorer").versions[2]
    base = time.monotonic() + POLICY.interval_s + 1
    feed(rollouts, 2, 3, failed=True)  # three failures need no minimum of requests
    (change,) = await rollouts.analyse(base)
    assert change.action == "canary.check_failed"
    assert rollouts.get("scorer").deployment.canary_active()
    feed(rollouts, 2, 3, failed=True)
    (change,) = await rollouts.analyse(base + 100)
    assert change.action == "rolled_back"
    assert change.evidence["errors"] == 3
    d = rollouts.get("scorer").deployment
    assert d.slots == [Slot(1, 100, "stable")] and d.canary.phase == "rolled_back"
    assert set(rollouts.get("scorer").versions) == {1}
    await until(lambda: canary.state == "draining", "the canary to drain")
    assert actions(engine)[-2:] == ["canary.check_failed", "rolled_back"]
    assert events(engine, CHANGED)[-1].data["evidence"]["errors"] == 3


async def test_a_check_with_too_few_requests_changes_nothing_but_the_note(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await with_canary(rollouts)
    feed(rollouts, 2, 2)
    assert await rollouts.analyse(time.monotonic() + 100) == []
    d = rollouts.get("scorer").deployment
    assert d.canary_active() and d.canary.weight == 10
    assert "too few requests" in d.canary.last_check
    (stored,) = store.load_all(engine)
    assert stored.canary.last_check == d.canary.last_check
    assert actions(engine) == ["deployed", "canary.started"]  # no event for a skipped check


async def test_promote_and_rollback_by_hand(rollouts: Rollouts, engine: sa.Engine) -> None:
    await with_canary(rollouts)
    d = await rollouts.rollback("scorer", "", actor="bob")
    assert d.slots == [Slot(1, 100, "stable")]
    assert "rolled back by bob" in d.history[-1].detail
    with pytest.raises(Conflict, match="no canary in progress"):
        await rollouts.promote("scorer", actor="bob")

    await rollouts.deploy(
        model="scorer", version=3, canary_percent=25, canary_policy=POLICY, actor="alice"
    )
    d = await rollouts.promote("scorer", actor="carol")
    assert d.slots == [Slot(3, 100, "stable")]
    assert "promoted by carol" in d.history[-1].detail
    assert set(rollouts.get("scorer").versions) == {3}
    assert stored_history(engine, "scorer") == [
        ("deployed", "alice"),
        ("canary.started", "alice"),
        ("rolled_back", "bob"),
        ("canary.started", "alice"),
        ("promoted", "carol"),
    ]
    assert await rollouts.analyse(time.monotonic() + 1000) == []


async def test_a_canary_blocks_other_deploys(rollouts: Rollouts) -> None:
    await with_canary(rollouts)
    with pytest.raises(Conflict, match="a canary of v2 is in progress"):
        await rollouts.deploy(model="scorer", version=3, actor="alice")
    with pytest.raises(Conflict, match="a canary of v2 is in progress"):
        await rollouts.deploy(model="scorer", version=3, canary_percent=5, actor="alice")
    assert set(rollouts.get("scorer").versions) == {1, 2}


# -- traffic, shadow, options -------------------------------------------------------------------


async def test_set_traffic_splits_held_versions_and_sets_the_sticky_header(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await with_canary(rollouts)
    d = await rollouts.set_traffic("scorer", {1: 60, 2: 40}, "", actor="bob")
    assert d.slots == [Slot(1, 60, "stable"), Slot(2, 40, "canary")]
    assert not d.canary_active()
    assert await rollouts.analyse(time.monotonic() + 1000) == []  # the manual split stays

    d = await rollouts.set_traffic("scorer", {}, "X-User-Id", actor="bob")
    assert d.spec.sticky_header == "x-user-id"
    assert d.history[-1].detail == "sticky routing by x-user-id"
    d = await rollouts.set_traffic("scorer", {1: 50, 2: 50}, "-", actor="bob")
    assert d.spec.sticky_header == ""
    assert d.history[-1].detail == "traffic split v1=50%, v2=50%; sticky routing off"

    d = await rollouts.set_traffic("scorer", {2: 100}, "", actor="bob")
    assert d.slots == [Slot(2, 100, "stable")]
    assert set(rollouts.get("scorer").versions) == {2}
    assert actions(engine)[-4:] == ["traffic"] * 4
    (stored,) = store.load_all(engine)
    assert stored.slots == d.slots and stored.spec.sticky_header == ""


async def test_set_traffic_refuses_bad_splits_and_headers(rollouts: Rollouts) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    with pytest.raises(InvalidInput, match="give weights"):
        await rollouts.set_traffic("scorer", {}, "", actor="bob")
    with pytest.raises(InvalidInput, match=r"v2 is not a version of scorer \(it holds v1\)"):
        await rollouts.set_traffic("scorer", {1: 50, 2: 50}, "", actor="bob")
    with pytest.raises(InvalidInput, match="add up to 90"):
        await rollouts.set_traffic("scorer", {1: 90}, "", actor="bob")
    with pytest.raises(InvalidInput, match="sticky header 'x user'"):
        await rollouts.set_traffic("scorer", {}, "x user", actor="bob")
    with pytest.raises(NotFound):
        await rollouts.set_traffic("other", {1: 100}, "", actor="bob")
    d = rollouts.get("scorer").deployment
    assert d.slots == [Slot(1, 100, "stable")] and d.spec.sticky_header == ""


async def test_a_shadow_is_loaded_mirrored_and_removed(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    d = await rollouts.deploy(model="scorer", version=3, shadow_percent=100, actor="alice")
    assert d.slots == [Slot(1, 100, "stable"), Slot(3, 0, "shadow")]
    assert d.spec.shadow_percent == 100
    running = rollouts.get("scorer")
    assert running.versions[3].ready
    assert running.router.route() == Route(1, 3)
    assert actions(engine) == ["deployed", "shadow"]
    # a swap keeps the shadow
    await rollouts.deploy(model="scorer", version=2, actor="alice")
    assert rollouts.get("scorer").deployment.slots == [Slot(2, 100, "stable"), Slot(3, 0, "shadow")]
    assert set(rollouts.get("scorer").versions) == {2, 3}


async def test_options_of_an_existing_deployment_change_only_when_given(rollouts: Rollouts) -> None:
    spec = ServingSpec(max_batch_size=8, environment="production", anonymous=True)
    await rollouts.deploy(model="scorer", version=1, spec=spec, actor="alice")
    d = await rollouts.deploy(model="scorer", version=2, actor="alice")
    assert d.spec == spec
    assert d.canary_policy == CanaryPolicy(interval_s=30.0)  # the service's default interval
    d = await rollouts.deploy(
        model="scorer", version=3, spec=ServingSpec(max_batch_size=2), canary_policy=POLICY,
        actor="alice",
    )  # fmt: skip
    assert d.spec == ServingSpec(max_batch_size=2) and d.canary_policy == POLICY


async def test_history_is_bounded_in_memory(
    rollouts: Rollouts, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollout_module, "MAX_HISTORY", 3)
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    for header in ("a", "b", "c", "d"):
        await rollouts.set_traffic("scorer", {}, f"x-{header}", actor="bob")
    d = rollouts.get("scorer").deployment
    assert [h.detail for h in d.history] == [f"sticky routing by x-{h}" for h in "bcd"]
    assert len(stored_history(engine, "scorer")) == 5  # the database keeps them all


# -- undeploy and restore -----------------------------------------------------------------------


async def test_undeploy_removes_the_deployment_and_keeps_its_history(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await with_canary(rollouts)
    runtimes = list(rollouts.get("scorer").versions.values())
    d = await rollouts.undeploy("scorer", actor="bob")
    assert d.history[-1].action == "removed"
    assert rollouts.deployments == {}
    with pytest.raises(NotFound):
        rollouts.get("scorer")
    await until(lambda: all(r.state == "draining" and r.batcher is None for r in runtimes),
                "the versions to unload")  # fmt: skip
    assert store.load_all(engine) == []
    assert stored_history(engine, "scorer")[-1] == ("removed", "bob")
    removed = events(engine, CHANGED)[-1]
    assert removed.data["action"] == "removed"
    assert removed.data["detail"] == "deployment scorer removed"
    assert (removed.actor, removed.subject) == ("bob", "deployment/scorer")
    assert await rollouts.analyse(time.monotonic() + 1000) == []
    with pytest.raises(NotFound):
        await rollouts.undeploy("scorer", actor="bob")


async def test_restore_brings_back_every_deployment_with_its_weights_and_canary(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry
) -> None:
    await with_canary(rollouts)
    await rollouts.set_traffic("scorer", {}, "x-user", actor="bob")
    await rollouts.deploy(model="ranker", version=4, actor="carol")
    before = {name: r.deployment for name, r in rollouts.deployments.items()}
    await rollouts.close()

    again = make_rollouts(engine, Registry().fetch)
    try:
        await again.restore()
        assert set(again.deployments) == {"scorer", "ranker"}
        await until(
            lambda: all(
                set(r.versions) == set(r.deployment.versions())
                and all(v.ready for v in r.versions.values())
                for r in again.deployments.values()
            ),
            "the restored versions to load",
        )
        scorer = again.get("scorer")
        d = scorer.deployment
        old = before["scorer"]
        assert (d.slots, d.spec, d.canary, d.canary_policy) == (
            old.slots, old.spec, old.canary, old.canary_policy,
        )  # fmt: skip
        assert [h.action for h in d.history] == ["deployed", "canary.started", "traffic"]
        assert set(scorer.versions) == {1, 2}
        assert {scorer.router.route().version for _ in range(300)} == {1, 2}
        assert again.get("ranker").deployment.versions() == (4,)
        assert again.get("ranker").router.route().version == 4

        # the canary analysis goes on where it was
        feed(again, 2, 6)
        (change,) = await again.analyse(time.monotonic() + 1000)
        assert change.action == "canary.step"
        assert again.get("scorer").deployment.canary.weight == 30
    finally:
        await again.close()


async def test_a_version_that_fails_to_come_back_stays_visible(
    rollouts: Rollouts, engine: sa.Engine, registry: Registry
) -> None:
    await with_canary(rollouts)
    await rollouts.close()
    down = Registry(errors={2: GantryError("stored digest does not match")})
    again = make_rollouts(engine, down.fetch)
    try:
        await again.restore()
        running = again.get("scorer")
        await until(
            lambda: (
                set(running.versions) == {1, 2}
                and running.versions[1].ready
                and running.versions[2].state == "failed"
            ),
            "v1 to load and v2 to fail",
        )
        assert "stored digest does not match" in running.versions[2].reason
        # the stable version takes everything while the canary cannot answer
        assert {running.router.route().version for _ in range(100)} == {1}
        assert running.deployment.canary_active()

        def failed_events() -> list[EventEnvelope]:
            return [e for e in events(engine, STATE) if e.data["state"] == "failed"]

        await until(lambda: len(failed_events()) == 1, "the failed state event")
        failed = failed_events()
        assert [(e.data["version"], e.actor) for e in failed] == [(2, "gantry/serving")]
    finally:
        await again.close()


async def test_a_registry_still_starting_is_waited_for(
    rollouts: Rollouts, engine: sa.Engine
) -> None:
    await rollouts.deploy(model="scorer", version=1, actor="alice")
    await rollouts.close()
    starting = Registry(starting={1: 1})
    again = make_rollouts(engine, starting.fetch)
    try:
        await again.restore()
        running = again.get("scorer")
        await until(lambda: 1 in running.versions, "v1 to be restored")
        runtime = running.versions[1]
        await until(lambda: runtime.ready, "v1 to load once the registry answers")
        assert starting.calls == [("scorer", 1), ("scorer", 1)]
        assert running.router.route().version == 1
        await until(lambda: len(events(engine, STATE)) == 2, "the state event")
        assert [e.data["state"] for e in events(engine, STATE)] == ["ready", "ready"]
    finally:
        await again.close()
