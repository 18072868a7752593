"""The fair baseline for benchmarks: a plain PyTorch loader over local Parquet files.

What a careful engineer would write without Gantry: an IterableDataset over Parquet row
groups, split across DataLoader workers, batches sliced from each row group (no per-row
``__getitem__``), converted with the same tensor conversion as the governed loader. It has no
governance, no network, no encryption and no cache, so the comparison measures exactly what
governance costs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gantry.core import InvalidInput
from gantry.dataload._tensors import TensorTransform


class ParquetRowGroups(IterableDataset[Any]):
    """Batches from the row groups of ``paths``; worker ``w`` reads every n-th row group."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        batch_size: int,
        columns: Sequence[str] | None = None,
        label: str | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise InvalidInput(f"batch_size={batch_size} must be at least 1")
        self.paths = [Path(p) for p in paths]
        self.batch_size = batch_size
        self.columns = (
            None
            if columns is None
            else list(dict.fromkeys([*columns, *([label] if label else [])]))
        )
        self.transform = TensorTransform(label)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.groups = [
            (i, g)
            for i, p in enumerate(self.paths)
            for g in range(pq.ParquetFile(p).num_row_groups)
        ]

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently from now on (persistent workers keep the epoch they started with)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = np.random.default_rng([self.seed, self.epoch, worker])
        groups = self.groups[worker::workers]
        if self.shuffle:
            groups = [groups[i] for i in rng.permutation(len(groups))]
        files: dict[int, pq.ParquetFile] = {}
        bs = self.batch_size
        for file_no, group in groups:
            reader = files.get(file_no) or files.setdefault(
                file_no, pq.ParquetFile(self.paths[file_no])
            )
            batch = _one_batch(reader.read_row_group(group, columns=self.columns))
            order = rng.permutation(batch.num_rows) if self.shuffle else None
            stop = batch.num_rows - (batch.num_rows % bs if self.drop_last else 0)
            for start in range(0, stop, bs):
                n = min(bs, stop - start)
                rows = (
                    batch.slice(start, n)
                    if order is None
                    else batch.take(pa.array(order[start : start + n]))
                )
                yield self.transform(rows)


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def plain_parquet_loader(
    paths: Sequence[str | Path],
    batch_size: int,
    columns: Sequence[str] | None = None,
    label: str | None = None,
    *,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> DataLoader[Any]:
    """A standard DataLoader over local Parquet files, yielding what :class:`GovernedDataset`
    yields for the same arguments (a dict of tensors, or ``(features, label)``)."""
    dataset = ParquetRowGroups(
        paths, batch_size, columns, label, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
    )


__all__ = ["ParquetRowGroups", "plain_parquet_loader"]
