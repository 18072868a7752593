"""The benchmark baseline yields what the governed loader yields, from plain Parquet."""

from __future__ import annotations

from pathlib import Path

import torch

from gantry.dataload import GovernedDataset, LocalShardSource, plain_parquet_loader


def test_plain_loader_reads_every_row_in_the_same_shape(
    parquet_files: list[Path], expected_ids: list[int]
) -> None:
    batches = list(plain_parquet_loader(parquet_files, 16, ["id", "x"], "y", num_workers=2))
    features, label = batches[0]
    assert set(features) == {"id", "x"} and label.dtype == torch.int64
    got = sorted(int(i) for f, _ in batches for i in f["id"].tolist())
    assert got == sorted(expected_ids)
    governed = GovernedDataset(
        LocalShardSource(parquet_files), 16, columns=["id", "x"], label="y", world_size=1, rank=0
    )
    g_features, g_label = next(iter(governed))
    assert set(g_features) == set(features)
    assert g_features["x"].dtype == features["x"].dtype and g_label.dtype == label.dtype
