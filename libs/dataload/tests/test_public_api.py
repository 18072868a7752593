"""Pins gantry.dataload's public names: changing them is a deliberate act."""

from __future__ import annotations

import gantry.dataload

PUBLIC = [
    "Assignment", "CachedShardSource", "DataSettings", "DescribedSource",
    "GovernanceShardSource", "GovernedDataset", "GrantRefused", "LocalShardSource",
    "ParquetRowGroups", "ScopedSource", "ShardCache", "ShardRef", "ShardSource",
    "TensorTransform", "Transform", "column_to_tensor", "decode_shard", "encode_shard", "loader",
    "plain_parquet_loader", "to_tensors",
]  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert sorted(gantry.dataload.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(gantry.dataload, name), name
