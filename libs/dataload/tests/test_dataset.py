"""GovernedDataset over local shards: sharding, order, batching, transforms, workers."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from gantry.core import InvalidInput
from gantry.dataload import GovernedDataset, GrantRefused, LocalShardSource, loader


def batch_ids(batches: Iterable[Any]) -> list[int]:
    out: list[int] = []
    for batch in batches:
        features = batch[0] if isinstance(batch, tuple) else batch
        out.extend(int(v) for v in features["id"].tolist())
    return out


def dataset(files: list[Path], **kw: Any) -> GovernedDataset:
    options: dict[str, Any] = dict(batch_size=16, rank=0, world_size=1, seed=3)
    options.update(kw)
    return GovernedDataset(LocalShardSource(files), **options)


def read(ds: GovernedDataset, num_workers: int) -> list[Any]:
    if num_workers == 0:
        return list(ds)
    return list(loader(ds, num_workers=num_workers, persistent_workers=False))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_and_workers_read_every_row_exactly_once(
    arrow_files: list[Path], expected_ids: list[int], world_size: int, num_workers: int
) -> None:
    per_rank = [
        batch_ids(
            read(
                dataset(arrow_files, rank=r, world_size=world_size, even_batches=False), num_workers
            )
        )
        for r in range(world_size)
    ]
    everything = [i for ids in per_rank for i in ids]
    assert sorted(everything) == sorted(expected_ids)
    shards_of = [{i // 1000 for i in ids} for ids in per_rank]  # each shard read by one rank
    assert sum(len(s) for s in shards_of) == len(set().union(*shards_of))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_even_batches_pads_short_ranks_and_still_covers_everything(
    arrow_files: list[Path], expected_ids: list[int], num_workers: int
) -> None:
    datasets = [dataset(arrow_files, rank=r, world_size=3) for r in range(3)]
    results = [read(ds, num_workers) for ds in datasets]
    counts = [len(r) for r in results]
    assert len(set(counts)) == 1
    for ds in datasets:
        ds.num_workers = num_workers
    assert [len(ds) for ds in datasets] == counts
    seen = Counter(i for r in results for i in batch_ids(r))
    assert set(seen) == set(expected_ids)
    for r in results:  # only a worker's last batch may be short
        assert sum(len(b["id"]) < 16 for b in r) <= max(1, num_workers)


def test_order_is_deterministic_per_epoch_and_changes_across_epochs(
    arrow_files: list[Path],
) -> None:
    a, b = dataset(arrow_files), dataset(arrow_files)
    first = batch_ids(a)
    assert batch_ids(b) == first
    a.set_epoch(1)
    second = batch_ids(a)
    assert second != first and sorted(second) == sorted(first)
    a.set_epoch(0)
    assert batch_ids(a) == first
    assert batch_ids(dataset(arrow_files, seed=4)) != first


def test_rows_are_shuffled_within_shards_and_kept_in_order_without_shuffle(
    arrow_files: list[Path], expected_ids: list[int]
) -> None:
    plain = batch_ids(dataset(arrow_files, shuffle=False))
    assert plain == expected_ids
    shuffled = batch_ids(dataset(arrow_files))
    first_shard = [i for i in shuffled[:30]]
    assert first_shard != sorted(first_shard)


def test_set_epoch_reaches_persistent_workers(arrow_files: list[Path]) -> None:
    ds = dataset(arrow_files)
    dl = loader(ds, num_workers=2)
    epoch0 = batch_ids(dl)
    ds.set_epoch(1)
    epoch1 = batch_ids(dl)
    fresh = dataset(arrow_files, epoch=1)
    assert epoch1 != epoch0
    assert epoch1 == batch_ids(loader(fresh, num_workers=2, persistent_workers=False))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_yields_only_full_batches(
    arrow_files: list[Path], expected_ids: list[int], num_workers: int
) -> None:
    ds = dataset(arrow_files, drop_last=True)
    kept = read(ds, num_workers)
    assert all(len(b["id"]) == 16 for b in kept)
    assert len(kept) == len(ds) >= len(expected_ids) // 16 - num_workers
    every = read(dataset(arrow_files, drop_last=False), num_workers)
    assert sorted(batch_ids(every)) == sorted(expected_ids)
    assert sum(len(b["id"]) < 16 for b in every) <= max(1, num_workers)


def test_transform_hook_gets_the_selected_columns(
    arrow_files: list[Path], expected_ids: list[int]
) -> None:
    seen: list[list[str]] = []

    def transform(batch: pa.RecordBatch) -> int:
        seen.append(batch.schema.names)
        return batch.num_rows

    ds = dataset(arrow_files, columns=["x"], label="y", transform=transform, shuffle=False)
    assert sum(ds) == len(expected_ids)
    assert all(names == ["x", "y"] for names in seen)


def test_default_transform_gives_tensors_and_label(arrow_files: list[Path]) -> None:
    features, label = next(iter(dataset(arrow_files, columns=["x", "name"], label="y")))
    assert set(features) == {"x", "name"}
    assert features["x"].dtype == torch.float32 and features["x"].shape == (16,)
    assert isinstance(features["name"], list) and features["name"][0].startswith("user-")
    assert label.dtype == torch.int64 and set(label.tolist()) <= {0, 1, 2}


def test_unknown_column_is_refused_up_front_with_the_view_columns(arrow_files: list[Path]) -> None:
    with pytest.raises(InvalidInput) as info:
        dataset(arrow_files, columns=["x", "ssn"])
    assert "no column 'ssn'" in str(info.value)
    assert "id, x, y, name" in str(info.value)
    with pytest.raises(InvalidInput, match="no column 'target'"):
        dataset(arrow_files, label="target")


def test_too_few_shards_for_workers_is_refused_before_workers_start(
    arrow_files: list[Path],
) -> None:
    ds = dataset(arrow_files[:3], world_size=2)
    with pytest.raises(InvalidInput, match="smaller shards"):
        loader(ds, num_workers=2)
    with pytest.raises(InvalidInput, match="3 shards cannot be split across 4 ranks"):
        dataset(arrow_files[:3], world_size=4)


def test_bad_arguments_say_what_to_write(arrow_files: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="batch_size=0 must be at least 1"):
        dataset(arrow_files, batch_size=0)
    with pytest.raises(InvalidInput, match="rank 2 is not in a world of size 2"):
        dataset(arrow_files, rank=2, world_size=2)


def test_rank_and_world_size_come_from_the_environment(
    arrow_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = GovernedDataset(LocalShardSource(arrow_files), 16)
    assert (ds.rank, ds.world_size) == (1, 3)


def test_dataset_pickles_and_the_copy_reads_the_same(arrow_files: list[Path]) -> None:
    ds = dataset(arrow_files, label="y")
    ds.set_epoch(2)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.epoch == 2
    assert batch_ids(copy) == batch_ids(ds)


def test_parquet_shards_read_like_arrow_shards(
    arrow_files: list[Path], parquet_files: list[Path]
) -> None:
    assert batch_ids(dataset(parquet_files)) == batch_ids(dataset(arrow_files))


class _RevokedSource(LocalShardSource):
    """Lists shards, then refuses every read, as when a grant is revoked mid-job."""

    def fetch(self, shard_id: str) -> bytes:
        raise GrantRefused("grant g-7 was revoked", resource="dataset 'patients'")


def test_a_refusal_in_a_worker_reaches_the_script_as_the_same_type(arrow_files: list[Path]) -> None:
    ds = GovernedDataset(_RevokedSource(arrow_files), 16, rank=0, world_size=1)
    batches = iter(loader(ds, num_workers=2, persistent_workers=False))
    try:
        with pytest.raises(GrantRefused, match="grant g-7 was revoked"):
            next(batches)
    finally:
        # The raised error's traceback puts the iterator in a reference cycle; left to the
        # garbage collector, PyTorch's shutdown then waits 5 s per worker for a stop signal
        # that its already-finalised queues never deliver.
        batches._shutdown_workers()  # type: ignore[attr-defined]
