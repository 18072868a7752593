"""The shard plan: disjoint, complete, deterministic, and even across ranks."""

from __future__ import annotations

import pytest

from gantry.core import InvalidInput
from gantry.dataload import ShardRef
from gantry.dataload._plan import Layout, assign, batch_count, rank_batches, shard_order

SHARDS = [ShardRef(f"s{i:02d}", rows, rows * 10) for i, rows in enumerate([5, 9, 3, 7, 8, 2, 6, 4])]


def _plan(layout: Layout, **kw: object) -> tuple[str, ...]:
    options: dict[str, object] = dict(
        seed=7, epoch=0, shuffle=True, batch_size=4, drop_last=False, even_batches=True
    )
    options.update(kw)
    return tuple(s.id for s in assign(SHARDS, layout, **options).shards)  # type: ignore[arg-type]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("epoch", [0, 1])
def test_readers_are_disjoint_and_cover_every_shard(
    world_size: int, num_workers: int, epoch: int
) -> None:
    seen: list[str] = []
    for rank in range(world_size):
        for worker in range(num_workers):
            seen.extend(_plan(Layout(rank, world_size, worker, num_workers), epoch=epoch))
    assert sorted(seen) == sorted(s.id for s in SHARDS)


def test_order_is_seeded_by_seed_and_epoch() -> None:
    assert shard_order(8, seed=1, epoch=0, shuffle=True) == shard_order(
        8, seed=1, epoch=0, shuffle=True
    )
    assert shard_order(8, seed=1, epoch=0, shuffle=True) != shard_order(
        8, seed=1, epoch=1, shuffle=True
    )
    assert shard_order(8, seed=1, epoch=0, shuffle=True) != shard_order(
        8, seed=2, epoch=0, shuffle=True
    )
    assert shard_order(8, seed=1, epoch=3, shuffle=False) == list(range(8))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_even_batches_gives_every_rank_the_same_count(drop_last: bool, num_workers: int) -> None:
    for epoch in range(3):
        counts = [
            rank_batches(
                SHARDS, rank=r, world_size=3, num_workers=num_workers, seed=0, epoch=epoch,
                shuffle=True, batch_size=4, drop_last=drop_last, even_batches=True,
            )
            for r in range(3)
        ]  # fmt: skip
        assert len(set(counts)) == 1, counts


def test_without_even_batches_each_reader_makes_its_natural_count() -> None:
    layout = Layout(1, 3, 0, 1)
    work = assign(
        SHARDS, layout, seed=0, epoch=0, shuffle=False, batch_size=4, drop_last=False,
        even_batches=False,
    )  # fmt: skip
    assert [s.id for s in work.shards] == ["s01", "s04", "s07"]
    assert work.batches == batch_count(9 + 8 + 4, 4, drop_last=False) == 6


def test_too_few_shards_for_the_readers_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidInput) as info:
        assign(
            SHARDS[:5], Layout(0, 3, 0, 2), seed=0, epoch=0, shuffle=True, batch_size=4,
            drop_last=False, even_batches=True,
        )  # fmt: skip
    message = str(info.value)
    assert "5 shards cannot be split across 3 rank(s) x 2 DataLoader worker(s)" in message
    assert "smaller shards" in message
