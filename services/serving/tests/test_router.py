"""Routing: requests spread over the versions by weight, a routing key always lands on the same
version (on every replica: the bucket depends only on the key and the deployment), a canary's
weight stepping up moves sticky keys from the stable version to the canary and never back, and
the shadow gets its share of copies."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gantry.serving.deployments import Slot
from gantry.serving.router import BUCKETS, Route, Router, bucket

KEYS = [f"user-{i}" for i in range(3000)]


def split(weight: int) -> list[Slot]:
    """v1 stable, v2 a canary at ``weight``."""
    return [Slot(1, 100 - weight, "stable"), Slot(2, weight, "canary")]


def test_buckets_are_stable_in_range_and_salted() -> None:
    assert bucket("alice") == bucket("alice")
    assert bucket("alice", "scorer") == bucket("alice", "scorer")
    assert all(0 <= bucket(k, "d") < BUCKETS for k in KEYS)
    # the salt (the deployment's name) changes where keys land
    moved = sum(bucket(k, "a") != bucket(k, "b") for k in KEYS)
    assert moved > len(KEYS) * 0.8
    # and the buckets are used roughly evenly
    counts = Counter(bucket(k, "d") for k in KEYS)
    assert len(counts) == BUCKETS
    assert max(counts.values()) < 3 * len(KEYS) / BUCKETS


def test_a_single_version_takes_everything() -> None:
    router = Router([Slot(7, 100)], rng=random.Random(0))
    assert not router.empty
    assert {router.route().version for _ in range(50)} == {7}
    assert router.route("anyone") == Route(7, None)


def test_without_a_key_requests_follow_the_weights() -> None:
    router = Router(split(20), rng=random.Random(1))
    counts = Counter(router.route().version for _ in range(10_000))
    assert set(counts) == {1, 2}
    assert 1700 < counts[2] < 2300


def test_a_manual_split_over_three_versions() -> None:
    slots = [Slot(1, 50), Slot(2, 30, "canary"), Slot(3, 20, "canary")]
    router = Router(slots, rng=random.Random(2))
    counts = Counter(router.route().version for _ in range(10_000))
    assert 4600 < counts[1] < 5400
    assert 2600 < counts[2] < 3400
    assert 1600 < counts[3] < 2400


def test_zero_weights_and_shadows_take_no_routed_traffic() -> None:
    slots = [Slot(1, 100), Slot(2, 0, "canary"), Slot(3, 0, "shadow")]
    router = Router(slots, shadow_percent=50, rng=random.Random(3))
    assert {router.route().version for _ in range(500)} == {1}
    assert {router.route(k).version for k in KEYS[:500]} == {1}


def test_nothing_to_route_to() -> None:
    for slots in ([], [Slot(1, 0)], [Slot(2, 0, "shadow")]):
        router = Router(slots, shadow_percent=100)
        assert router.empty
        with pytest.raises(LookupError, match="no version takes traffic"):
            router.route()


def test_a_key_keeps_its_version_across_replicas() -> None:
    # two replicas of the service build their routers apart, with different random sources
    a = Router(split(30), salt="scorer", rng=random.Random(1))
    b = Router(split(30), salt="scorer", rng=random.Random(2))
    for key in KEYS[:500]:
        assert a.route(key).version == b.route(key).version == a.route(key).version


def test_keys_split_by_the_weights() -> None:
    router = Router(split(25), salt="scorer")
    counts = Counter(router.route(k).version for k in KEYS)
    assert 0.19 < counts[2] / len(KEYS) < 0.31


def test_when_a_canary_steps_up_sticky_keys_only_move_to_the_canary() -> None:
    steps = [5, 10, 20, 30, 50, 75, 99]
    routes = [{k: Router(split(w), salt="scorer").route(k).version for k in KEYS} for w in steps]
    for before, after, weight in zip(routes, routes[1:], steps[1:], strict=False):
        moved_back = [k for k in KEYS if before[k] == 2 and after[k] == 1]
        assert moved_back == [], f"keys left the canary when it stepped up to {weight}%"
        moved = sum(before[k] == 1 and after[k] == 2 for k in KEYS)
        assert moved > 0, f"no key moved to the canary at {weight}%"
    # on the way the canary's share tracks its weight
    for weight, routed in zip(steps, routes, strict=True):
        share = sum(v == 2 for v in routed.values()) / len(KEYS)
        assert abs(share - weight / 100) < 0.06


def test_a_version_not_ready_leaves_its_share_to_the_others() -> None:
    # the fleet builds the router over the ready versions only: a loading canary gets nothing
    router = Router([Slot(1, 90, "stable")], salt="scorer")
    assert {router.route(k).version for k in KEYS[:300]} == {1}
    assert {router.route().version for _ in range(300)} == {1}


@pytest.mark.parametrize(
    ("percent", "low", "high"), [(0, 0, 0), (30, 2600, 3400), (100, 10_000, 10_000)]
)
def test_the_shadow_gets_its_share_of_copies(percent: int, low: int, high: int) -> None:
    slots = [Slot(1, 100), Slot(9, 0, "shadow")]
    router = Router(slots, shadow_percent=percent, rng=random.Random(4))
    routes = [router.route(None if i % 2 else f"k{i}") for i in range(10_000)]
    assert {r.version for r in routes} == {1}  # the shadow never answers
    copies = sum(r.shadow == 9 for r in routes)
    assert low <= copies <= high
    assert all(r.shadow in (None, 9) for r in routes)


def test_a_shadow_share_without_a_shadow_version_copies_nothing() -> None:
    router = Router([Slot(1, 100)], shadow_percent=100, rng=random.Random(5))
    assert all(router.route().shadow is None for _ in range(100))
