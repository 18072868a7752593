"""Which shards a reader reads in an epoch, and how many batches it yields.

Every rank computes the same thing from the same inputs, with no communication:

1. the epoch's shard order: a permutation seeded by ``(seed, epoch)`` (or the listed order);
2. rank ``r`` of ``world_size`` takes positions ``r, r + world_size, ...``;
3. DataLoader worker ``w`` of ``num_workers`` takes every ``num_workers``-th of those.

So the readers' shard sets are disjoint and together cover every shard. With ``even_batches``
each rank also yields the same number of batches (the largest rank's count): a rank with fewer
rows reads some of its own shards a second time to make up the difference, because a rank that
stops early leaves the others waiting forever in their next collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gantry.core import InvalidInput
from gantry.dataload._sources import ShardRef


@dataclass(frozen=True)
class Layout:
    """Who is reading: rank and world size, and the DataLoader worker within the rank."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def readers(self) -> int:
        """How many readers share the shards."""
        return self.world_size * self.num_workers


@dataclass(frozen=True)
class Assignment:
    """One reader's work for one epoch: its shards in order, and how many batches to yield."""

    shards: tuple[ShardRef, ...]
    batches: int

    @property
    def rows(self) -> int:
        """The rows in its shards, as listed."""
        return sum(s.rows for s in self.shards)


def shard_order(count: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's order of shard positions, identical on every rank."""
    if not shuffle:
        return list(range(count))
    rng = np.random.default_rng([seed, epoch])
    return [int(i) for i in rng.permutation(count)]


def check_enough_shards(count: int, layout: Layout) -> None:
    """Raise :class:`InvalidInput` when some reader would get no shard at all."""
    if count < layout.readers:
        raise InvalidInput(
            f"{count} shard{'s' if count != 1 else ''} cannot be split across "
            f"{layout.world_size} rank(s) x {layout.num_workers} DataLoader worker(s): "
            "each reader needs at least one shard",
            hint=(
                "use fewer DataLoader workers or ranks, or upload the dataset with smaller "
                f"shards (UploadStart.shard_bytes) so it has at least {layout.readers}"
            ),
        )


def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches made from ``rows`` rows."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


def assign(
    shards: Sequence[ShardRef],
    layout: Layout,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    even_batches: bool,
) -> Assignment:
    """The shards and batch count of ``layout``'s reader in ``epoch``."""
    check_enough_shards(len(shards), layout)
    order = [shards[i] for i in shard_order(len(shards), seed=seed, epoch=epoch, shuffle=shuffle)]

    def reader_shards(rank: int, worker: int) -> tuple[ShardRef, ...]:
        return tuple(order[rank :: layout.world_size][worker :: layout.num_workers])

    def natural(rank: int, worker: int) -> int:
        rows = sum(s.rows for s in reader_shards(rank, worker))
        return batch_count(rows, batch_size, drop_last)

    mine = reader_shards(layout.rank, layout.worker)
    batches = natural(layout.rank, layout.worker)
    if even_batches and layout.world_size > 1:
        totals = [
            sum(natural(r, w) for w in range(layout.num_workers)) for r in range(layout.world_size)
        ]
        missing = max(totals) - totals[layout.rank]
        # Only workers with rows can repeat them; spread the missing batches over those.
        able = [
            w
            for w in range(layout.num_workers)
            if any(s.rows for s in reader_shards(layout.rank, w))
        ]
        if missing and layout.worker in able:
            share, extra = divmod(missing, len(able))
            batches += share + (1 if able.index(layout.worker) < extra else 0)
    return Assignment(mine, batches)


def rank_batches(
    shards: Sequence[ShardRef],
    *,
    rank: int,
    world_size: int,
    num_workers: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    even_batches: bool,
) -> int:
    """How many batches rank ``rank`` yields in ``epoch``, over all its workers."""
    workers = max(1, num_workers)
    return sum(
        assign(
            shards,
            Layout(rank, world_size, w, workers),
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            batch_size=batch_size,
            drop_last=drop_last,
            even_batches=even_batches,
        ).batches
        for w in range(workers)
    )


__all__ = [
    "Assignment",
    "Layout",
    "assign",
    "batch_count",
    "check_enough_shards",
    "rank_batches",
    "shard_order",
]
