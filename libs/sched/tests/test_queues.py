"""Quotas, cohort borrowing, reclaiming and DRF fair share."""

from __future__ import annotations

import pytest

from gantry.core import InvalidInput, NotFound
from gantry.sched.queues import UNLIMITED, Amount, QueueBook, load_queues

QUEUES = """
queues:
  - {name: research, cohort: lab, quota: {gpus: 4, cpus: 64, memory: 256Gi}}
  - {name: prod, cohort: lab, quota: {gpus: 8, cpus: 64, memory: 256Gi}, borrowingLimit: {gpus: 2}}
  - {name: solo, quota: {gpus: 2, cpus: 16, memory: 64Gi}, weight: 2}
"""
CAPACITY = Amount(14_000, 144_000, 576 * 1024)


def gpus(n: float, cpus: float = 1, mem: int = 1024) -> Amount:
    return Amount(int(n * 1000), int(cpus * 1000), mem)


def book() -> QueueBook:
    return QueueBook(load_queues(QUEUES), CAPACITY)


def test_within_quota_is_admitted_and_release_gives_it_back() -> None:
    b = book()
    assert b.admit("research", "j1", gpus(4)).allowed
    assert b.used("research") == gpus(4)
    b.release("j1")
    b.release("j1")  # idempotent
    assert b.used("research") == Amount()


def test_borrowing_from_the_cohort_up_to_the_limit() -> None:
    b = book()
    borrowed = b.admit("research", "big", gpus(10))  # 4 own + 6 idle in prod
    assert borrowed.allowed and borrowed.borrowed.gpu_milli == 6000
    over = b.check("research", gpus(3))  # prod has only 2 idle left
    assert not over.allowed and "cohort has 2 GPU" in over.reason
    # prod's limit: it may borrow at most 2 GPUs beyond its 8
    assert not b.check("prod", gpus(11)).allowed
    # prod is owed what research borrowed from it
    assert b.lenders_short("prod").gpu_milli == 6000
    assert b.borrowed("research").gpu_milli == 6000


def test_a_queue_without_cohort_never_borrows_and_says_why() -> None:
    b = book()
    assert b.admit("solo", "a", gpus(2)).allowed
    refused = b.check("solo", gpus(1))
    assert not refused.allowed and "over its quota" in refused.reason
    assert "admitted when capacity frees" in refused.reason


def test_drf_orders_by_weighted_dominant_share() -> None:
    b = book()
    b.admit("research", "r", gpus(1, cpus=60))  # dominant: CPU 60/144
    b.admit("prod", "p", gpus(3, cpus=1))  # dominant: GPU 3/14
    b.admit("solo", "s", gpus(2, cpus=1))  # GPU 2/14 = 0.14, weight 2 -> 0.07
    assert b.fair_order(["research", "prod", "solo"]) == ["solo", "prod", "research"]
    assert b.dominant_share("research") == pytest.approx(60 / 144)


def test_bad_queue_files_and_names() -> None:
    with pytest.raises(InvalidInput, match="needs a 'queues:' list"):
        load_queues("{}")
    with pytest.raises(InvalidInput, match=r"queues\[0\].quota.gpus"):
        load_queues("queues: [{name: a, quota: {gpus: -1}}]")
    with pytest.raises(InvalidInput, match="defined twice"):
        load_queues("queues: [{name: a}, {name: a}]")
    with pytest.raises(NotFound, match="known queues: prod, research, solo"):
        book().check("nope", gpus(1))
    b = book()
    b.charge("prod", "x", gpus(1))
    with pytest.raises(InvalidInput, match="already charged"):
        b.charge("prod", "x", gpus(1))


def test_a_resource_a_quota_does_not_name_is_not_limited_and_names_are_checked() -> None:
    (q,) = load_queues("queues: [{name: gpu-only, quota: {gpus: 2}}]")
    assert q.quota.gpu_milli == 2000 and q.quota.cpu_milli == UNLIMITED
    book = QueueBook([q], Amount(8000, 64_000, 1 << 20))
    assert book.check("gpu-only", Amount(2000, 32_000, 1 << 18)).allowed
    assert not book.check("gpu-only", Amount(3000, 1000, 1)).allowed
    with pytest.raises(InvalidInput, match=r"queues\[0\].name"):
        load_queues("queues: [{name: Research}]")
