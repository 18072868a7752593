"""Deployments (pure domain): names and specs are checked field by field; every transition
(deploy, swap, canary start / step / failure / skip, promote, rollback, manual split, shadow)
changes the slots as documented, says what to load and unload, and refuses what it cannot do
with a clear error; the state survives a JSON round trip."""

from __future__ import annotations

import json

import pytest

from gantry.core import Conflict, InvalidInput
from gantry.serving.deployments import (
    CanaryPolicy,
    CanaryState,
    Deployment,
    ServingSpec,
    Slot,
    check_name,
)

POLICY = CanaryPolicy(step_percent=20, max_percent=50, failure_threshold=2, min_requests=5)


def served(version: int = 1, *, policy: CanaryPolicy = POLICY) -> Deployment:
    """A deployment serving ``version`` alone."""
    d = Deployment(name="scorer", model="scorer-model", canary_policy=policy)
    d.deploy(version)
    return d


def canaried(percent: int = 10) -> Deployment:
    """v1 stable, v2 a canary at ``percent``."""
    d = served(1)
    d.start_canary(2, percent, now_ms=1000)
    return d


def weights(d: Deployment) -> dict[int, tuple[int, str]]:
    return {s.version: (s.weight, s.role) for s in d.slots}


# -- names and specs ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "scorer", "Scorer-v2.prod_1", "9lives", "x" * 63])
def test_endpoint_names_that_are_allowed(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".x", "_x", "a b", "a/b", "x" * 64, "ü", "a\n"])
def test_endpoint_names_that_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match=r"model name .* is not allowed") as info:
        check_name(name, "model")
    assert "letters, digits" in (info.value.hint or "")


def test_default_policy_and_spec_are_valid() -> None:
    assert CanaryPolicy().check() == CanaryPolicy()
    assert ServingSpec().check() == ServingSpec()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_percent", 0),
        ("step_percent", 101),
        ("max_percent", 0),
        ("max_percent", 101),
        ("interval_s", 0),
        ("interval_s", -1.0),
        ("failure_threshold", 0),
        ("min_success_rate", -0.1),
        ("min_success_rate", 99),
        ("max_p99_ms", 0),
        ("min_requests", -1),
    ],
)
def test_a_bad_canary_policy_names_its_field(field: str, value: float) -> None:
    with pytest.raises(InvalidInput, match=f"canary {field} {value}"):
        CanaryPolicy(**{field: value}).check()  # type: ignore[arg-type]


def test_canary_policy_edges_that_are_allowed() -> None:
    CanaryPolicy(step_percent=100, max_percent=1, min_success_rate=0, min_requests=0).check()
    CanaryPolicy(min_success_rate=1.0, failure_threshold=1).check()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_batch_size": -1}, "max_batch_size -1 must be >= 0"),
        ({"queue_capacity": -1}, "queue_capacity -1 must be >= 0"),
        ({"timeout_ms": -5}, "timeout_ms -5 must be >= 0"),
        ({"min_instances": -1}, "min_instances -1 must be >= 0"),
        ({"max_queue_delay_us": -2}, "max_queue_delay_us -2"),
        ({"min_instances": 3, "max_instances": 2}, "min_instances 3 is above max_instances 2"),
        ({"device": "gpu"}, "device 'gpu' is not one of"),
        ({"device": "cuda:x"}, "device 'cuda:x'"),
        ({"device": "CPU"}, "device 'CPU'"),
        ({"environment": "prod"}, "environment 'prod' is not one of staging, production"),
        ({"sticky_header": "x user"}, "sticky header 'x user' is not a valid header name"),
        ({"sticky_header": "x_user"}, "sticky header"),
        ({"shadow_percent": 101}, "shadow_percent 101 must be 0..100"),
        ({"shadow_percent": -1}, "shadow_percent -1"),
    ],
)
def test_a_bad_serving_spec_says_what_is_wrong(changes: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        ServingSpec(**changes).check()


@pytest.mark.parametrize(
    "changes",
    [
        {"max_queue_delay_us": -1},
        {"max_queue_delay_us": 0},
        {"min_instances": 4, "max_instances": 0},  # 0 = the service's maximum
        {"min_instances": 2, "max_instances": 2},
        {"device": "cuda"},
        {"device": "cuda:3"},
        {"environment": "production"},
        {"sticky_header": "X-User-Id"},
        {"shadow_percent": 100},
    ],
)
def test_serving_spec_values_that_are_allowed(changes: dict) -> None:
    spec = ServingSpec(**changes)
    assert spec.check() is spec


# -- deploy and swap ----------------------------------------------------------------------------


def test_the_first_deploy_serves_the_version_alone() -> None:
    d = Deployment(name="scorer", model="scorer-model")
    change = d.deploy(3)
    assert change.action == "deployed"
    assert change.detail == "scorer-model v3 serves 100%"
    assert (change.added, change.removed) == ((3,), ())
    assert d.slots == [Slot(3, 100, "stable")]
    assert d.versions() == (3,)
    assert d.stable_version() == 3
    assert d.routed() == (Slot(3, 100, "stable"),)
    assert not d.canary_active()


def test_deploying_the_version_already_served_is_a_conflict() -> None:
    d = served(1)
    with pytest.raises(Conflict, match="already serves scorer-model v1") as info:
        d.deploy(1)
    assert "--canary" in (info.value.hint or "")
    assert d.slots == [Slot(1, 100, "stable")]


def test_a_swap_replaces_the_stable_version() -> None:
    d = served(1)
    change = d.deploy(2)
    assert change.action == "swapped"
    assert change.detail == "scorer-model v2 replaces v1 (100%)"
    assert (change.added, change.removed) == ((2,), (1,))
    assert d.slots == [Slot(2, 100, "stable")]


def test_a_swap_keeps_the_shadow_and_a_shadow_can_become_the_stable_version() -> None:
    d = served(1)
    d.set_shadow(2, 25)
    change = d.deploy(3)
    assert (change.added, change.removed) == ((3,), (1,))
    assert d.slots == [Slot(3, 100, "stable"), Slot(2, 0, "shadow")]
    # the shadow is loaded already: deploying it adds nothing and drops the shadow slot
    change = d.deploy(2)
    assert (change.added, change.removed) == ((), (3,))
    assert d.slots == [Slot(2, 100, "stable")]


def test_a_swap_removes_every_version_of_a_manual_split() -> None:
    d = canaried(10)
    d.set_traffic({1: 60, 2: 40})
    change = d.deploy(3)
    assert change.action == "swapped"
    assert set(change.removed) == {1, 2}
    assert "replaces v1, v2" in change.detail
    assert d.slots == [Slot(3, 100, "stable")]


# -- canary -------------------------------------------------------------------------------------


def test_a_canary_takes_its_share_from_the_stable_version() -> None:
    d = served(1)
    change = d.start_canary(2, 10, now_ms=1000)
    assert change.action == "canary.started"
    assert change.detail == "canary scorer-model v2 gets 10%, v1 keeps 90%"
    assert (change.added, change.removed) == ((2,), ())
    assert d.slots == [Slot(1, 90, "stable"), Slot(2, 10, "canary")]
    assert d.canary == CanaryState(
        phase="progressing",
        canary_version=2,
        stable_version=1,
        weight=10,
        started_ms=1000,
        updated_ms=1000,
    )
    assert d.canary_active()
    assert d.role("canary") == Slot(2, 10, "canary")


def test_a_canary_needs_a_stable_version_other_than_itself() -> None:
    empty = Deployment(name="scorer", model="scorer-model")
    with pytest.raises(Conflict, match="no stable version") as info:
        empty.start_canary(1, 10, now_ms=0)
    assert "without --canary" in (info.value.hint or "")
    with pytest.raises(Conflict, match="v1 is already the stable version"):
        served(1).start_canary(1, 10, now_ms=0)


@pytest.mark.parametrize("percent", [0, 100, -5, 150])
def test_a_canary_weight_must_leave_the_stable_version_some_traffic(percent: int) -> None:
    d = served(1)
    with pytest.raises(InvalidInput, match=f"canary weight {percent}% must be 1..99"):
        d.start_canary(2, percent, now_ms=0)
    assert d.slots == [Slot(1, 100, "stable")] and not d.canary_active()


def test_while_a_canary_runs_the_serving_versions_cannot_be_replaced() -> None:
    d = canaried()
    for attempt in (lambda: d.deploy(3), lambda: d.start_canary(3, 10, now_ms=0)):
        with pytest.raises(Conflict, match="a canary of v2 is in progress on scorer") as info:
            attempt()
        assert "promote" in (info.value.hint or "")
    assert d.slots == [Slot(1, 90, "stable"), Slot(2, 10, "canary")]


def test_a_canary_over_a_manual_split_is_refused() -> None:
    d = canaried()
    d.set_traffic({1: 50, 2: 50})
    with pytest.raises(Conflict, match="splits traffic between several versions") as info:
        d.start_canary(3, 10, now_ms=0)
    assert "gantry serve traffic" in (info.value.hint or "")


def test_a_passed_check_steps_the_weight_up_to_the_maximum_then_promotes() -> None:
    d = canaried(10)  # step 20, max 50
    change = d.canary_passed("fine", {"requests": 12}, now_ms=2000)
    assert change.action == "canary.step"
    assert change.detail == "canary v2 passed (fine); weight 10% -> 30%"
    assert change.evidence == {"requests": 12}
    assert d.slots == [Slot(1, 70, "stable"), Slot(2, 30, "canary")]
    assert (d.canary.weight, d.canary.passed_checks, d.canary.last_check) == (30, 1, "fine")
    assert d.canary.updated_ms == 2000

    d.canary_passed("fine", {}, now_ms=3000)  # 30 + 20 = 50 = max
    assert d.slots == [Slot(1, 50, "stable"), Slot(2, 50, "canary")]
    assert (d.canary.weight, d.canary.passed_checks) == (50, 2)

    change = d.canary_passed("still fine", {}, now_ms=4000)  # passed at the top: promoted
    assert change.action == "promoted"
    assert "passed at 50%: still fine" in change.detail
    assert change.removed == (1,)
    assert d.slots == [Slot(2, 100, "stable")]
    assert d.canary.phase == "promoted" and not d.canary_active()
    assert (d.canary.weight, d.canary.updated_ms) == (100, 4000)
    assert d.stable_version() == 2


def test_a_step_never_goes_past_the_maximum() -> None:
    d = canaried(40)  # 40 + 20 > 50
    d.canary_passed("ok", {}, now_ms=0)
    assert d.canary.weight == 50
    assert weights(d) == {1: (50, "stable"), 2: (50, "canary")}


def test_a_canary_started_above_the_maximum_is_promoted_on_its_first_pass() -> None:
    d = canaried(80)
    assert d.canary_passed("ok", {}, now_ms=0).action == "promoted"


def test_failed_checks_are_counted_and_roll_back_at_the_threshold() -> None:
    d = canaried(10)  # failure_threshold 2
    change = d.canary_failed("p99 too high", {"p99_ms": 900}, now_ms=2000)
    assert change.action == "canary.check_failed"
    assert change.detail == "canary v2 failed a check (1/2): p99 too high"
    assert change.evidence == {"p99_ms": 900}
    assert change.removed == ()
    assert d.canary_active() and d.canary.failed_checks == 1
    assert d.slots == [Slot(1, 90, "stable"), Slot(2, 10, "canary")]

    change = d.canary_failed("errors", {"errors": 7}, now_ms=3000)
    assert change.action == "rolled_back"
    assert "2 failed checks (threshold 2), last: errors" in change.detail
    assert "v1 serves 100%" in change.detail
    assert change.evidence == {"errors": 7}
    assert change.removed == (2,)
    assert d.slots == [Slot(1, 100, "stable")]
    assert d.canary.phase == "rolled_back"
    assert (d.canary.weight, d.canary.failed_checks, d.canary.last_check) == (0, 2, "errors")


def test_a_skipped_check_changes_only_the_note() -> None:
    d = canaried(10)
    slots = list(d.slots)
    assert d.canary_skipped("too few requests", now_ms=5000) is None
    assert d.slots == slots
    assert d.canary.last_check == "too few requests"
    assert (d.canary.passed_checks, d.canary.failed_checks, d.canary.weight) == (0, 0, 10)
    assert d.canary.updated_ms == 5000 and d.canary_active()


def test_a_manual_promote_and_rollback() -> None:
    d = canaried(10)
    change = d.promote(9000)
    assert change.detail == "v2 promoted to 100% (promoted by hand); v1 removed"
    assert d.slots == [Slot(2, 100, "stable")]

    d = canaried(10)
    change = d.rollback(9000, reason="looks wrong")
    assert change.detail == "canary v2 rolled back: looks wrong; v1 serves 100%"
    assert change.evidence == {}
    assert d.slots == [Slot(1, 100, "stable")]


def test_promote_and_rollback_keep_the_shadow() -> None:
    d = canaried(10)
    d.set_shadow(3, 5)
    d.promote(0)
    assert d.slots == [Slot(2, 100, "stable"), Slot(3, 0, "shadow")]
    d.start_canary(4, 10, now_ms=0)
    d.rollback(0, reason="no")
    assert d.slots == [Slot(2, 100, "stable"), Slot(3, 0, "shadow")]
    assert d.spec.shadow_percent == 5


def test_canary_transitions_need_a_canary_in_progress() -> None:
    d = served(1)
    attempts = [
        lambda: d.canary_passed("x", {}, now_ms=0),
        lambda: d.canary_failed("x", {}, now_ms=0),
        lambda: d.canary_skipped("x", now_ms=0),
        lambda: d.promote(0),
        lambda: d.rollback(0, reason="x"),
    ]
    for attempt in attempts:
        with pytest.raises(Conflict, match="has no canary in progress") as info:
            attempt()
        assert "--canary" in (info.value.hint or "")
    # ... also once a canary has ended
    d = canaried()
    d.promote(0)
    with pytest.raises(Conflict, match="no canary in progress"):
        d.promote(0)


def test_a_new_canary_may_start_after_the_last_one_ended() -> None:
    d = canaried(10)
    d.rollback(0, reason="no")
    change = d.start_canary(3, 20, now_ms=7)
    assert change.added == (3,)
    assert d.slots == [Slot(1, 80, "stable"), Slot(3, 20, "canary")]
    assert d.canary.phase == "progressing" and d.canary.failed_checks == 0


# -- manual split -------------------------------------------------------------------------------


def test_a_manual_split_over_the_versions_a_canary_brought_in() -> None:
    d = canaried(10)
    change = d.set_traffic({1: 70, 2: 30})
    assert change.action == "traffic"
    assert change.detail == "traffic split v1=70%, v2=30%; canary v2 stopped (manual split)"
    assert change.removed == ()
    assert d.slots == [Slot(1, 70, "stable"), Slot(2, 30, "canary")]
    assert not d.canary_active()  # the split is manual now: no analysis steps it
    # the heaviest version is the stable one; a version at 0% is held but not routed
    assert d.set_traffic({1: 0, 2: 100}).detail == "traffic split v1=0%, v2=100%"
    assert d.slots == [Slot(1, 0, "canary"), Slot(2, 100, "stable")]
    assert d.routed() == (Slot(2, 100, "stable"),)
    assert d.stable_version() == 2


def test_a_manual_split_drops_the_versions_it_leaves_out() -> None:
    d = canaried(10)
    d.set_traffic({1: 50, 2: 50})
    change = d.set_traffic({2: 100})
    assert change.removed == (1,)
    assert d.slots == [Slot(2, 100, "stable")]


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({}, "at least one version=weight pair"),
        ({3: 100}, r"v3 is not a version of scorer \(it holds v1, v2, v9\)"),
        ({1: 101, 2: -1}, "weight 101 of v1 must be 0..100"),
        ({1: 80, 2: 10}, "weights add up to 90, not 100"),
    ],
)
def test_a_bad_manual_split_is_refused_and_changes_nothing(split: dict, message: str) -> None:
    d = canaried(10)
    d.set_traffic({1: 90, 2: 10})
    d.set_shadow(9, 10)
    before = list(d.slots)
    with pytest.raises(InvalidInput, match=message):
        d.set_traffic(split)
    assert d.slots == before


def test_a_shadow_named_in_a_split_takes_routed_traffic() -> None:
    d = served(1)
    d.set_shadow(2, 30)
    change = d.set_traffic({1: 80, 2: 20})
    assert (change.added, change.removed) == ((), ())
    assert d.slots == [Slot(1, 80, "stable"), Slot(2, 20, "canary")]
    assert d.spec.shadow_percent == 0


# -- shadow -------------------------------------------------------------------------------------


def test_a_shadow_mirrors_a_share_and_can_be_replaced_and_removed() -> None:
    d = served(1)
    change = d.set_shadow(2, 30)
    assert change.action == "shadow"
    assert change.detail == "v2 mirrors 30% of the requests (answers discarded)"
    assert (change.added, change.removed) == ((2,), ())
    assert d.slots == [Slot(1, 100, "stable"), Slot(2, 0, "shadow")]
    assert d.spec.shadow_percent == 30
    assert d.routed() == (Slot(1, 100, "stable"),)

    change = d.set_shadow(2, 60)  # a new share for the same version: nothing to load
    assert (change.added, change.removed) == ((), ())
    assert d.spec.shadow_percent == 60

    change = d.set_shadow(3, 60)  # another version replaces it
    assert (change.added, change.removed) == ((3,), (2,))
    assert d.slots == [Slot(1, 100, "stable"), Slot(3, 0, "shadow")]

    change = d.set_shadow(3, 0)
    assert change.action == "shadow.removed"
    assert change.removed == (3,)
    assert d.slots == [Slot(1, 100, "stable")]
    assert d.spec.shadow_percent == 0


def test_bad_shadows_are_refused() -> None:
    d = served(1)
    with pytest.raises(Conflict, match="has no shadow version"):
        d.set_shadow(2, 0)
    with pytest.raises(InvalidInput, match=r"shadow share 101% must be 1\.\.100"):
        d.set_shadow(2, 101)
    with pytest.raises(Conflict, match="v1 already takes routed traffic"):
        d.set_shadow(1, 10)
    assert d.slots == [Slot(1, 100, "stable")]


def test_a_shadow_may_be_added_during_a_canary() -> None:
    d = canaried(10)
    d.set_shadow(3, 10)
    assert d.canary_active()
    d.canary_passed("ok", {}, now_ms=0)
    assert d.slots == [Slot(1, 70, "stable"), Slot(2, 30, "canary"), Slot(3, 0, "shadow")]


# -- persistence --------------------------------------------------------------------------------


def test_the_state_survives_a_json_round_trip() -> None:
    d = Deployment(
        name="scorer",
        model="scorer-model",
        spec=ServingSpec(max_batch_size=8, sticky_header="x-user", environment="production"),
        canary_policy=POLICY,
        created_ms=11,
        updated_ms=22,
    )
    d.deploy(1)
    d.start_canary(2, 10, now_ms=1000)
    d.set_shadow(3, 15)
    d.canary_failed("slow", {}, now_ms=2000)
    data = json.loads(json.dumps(d.to_json()))
    back = Deployment.from_json("scorer", "scorer-model", data, 11, 22)
    assert back == d
    assert back.canary_active() and back.canary.failed_checks == 1


def test_missing_state_reads_as_the_defaults() -> None:
    back = Deployment.from_json("a", "m", {}, 1, 2)
    assert back == Deployment(name="a", model="m", created_ms=1, updated_ms=2)
