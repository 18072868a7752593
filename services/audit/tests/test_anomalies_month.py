"""The detector over a simulated month (gantry.testing.access_month): every injected behaviour
is flagged with the right reason, and the normal month raises few false alarms."""

from __future__ import annotations

import pytest

from gantry.audit.behaviour import BehaviourModel
from gantry.testing.access_month import simulate_month


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_injected_behaviours_are_flagged_and_normal_ones_rarely(seed: int) -> None:
    month = simulate_month(seed)
    found = BehaviourModel().observe_all(month.events)
    injected_ids = {i for inj in month.injected for i in inj.event_ids}
    caught = [
        inj
        for inj in month.injected
        if any(
            a.kind == inj.kind
            and a.principal == inj.principal
            and set(a.event_ids) & set(inj.event_ids)
            for a in found
        )
    ]
    recall = len(caught) / len(month.injected)
    assert recall >= 0.95, [(i.kind, i.principal) for i in month.injected if i not in caught]
    false = [a for a in found if not set(a.event_ids) & injected_ids]
    assert len(false) / month.days <= 1.0, [(a.kind, a.principal, a.reason) for a in false]
    for a in found:  # every alert explains itself
        assert a.principal in a.reason and a.evidence and a.event_ids


def test_the_normal_month_alone_raises_under_one_alarm_a_day() -> None:
    month = simulate_month(3, inject=False)
    found = BehaviourModel().observe_all(month.events)
    assert len(found) / month.days <= 1.0, [(a.kind, a.principal, a.reason) for a in found]
