"""gantry.dataload: PyTorch data loading under a job's data-governance grant.

::

    from gantry.dataload import GovernedDataset, loader

    dataset = GovernedDataset.from_env("clicks", batch_size=512, version=VERSION, label="y")
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for features, label in loader(dataset, num_workers=4):
            ...

Shards come from the data-governance service already transformed into the job's view
(:class:`GovernanceShardSource`), optionally through the node's encrypted shard cache
(:class:`CachedShardSource`); each rank and DataLoader worker reads its own shards and yields
ready-made batches. See docs/dataload.md.
"""

from gantry.dataload._baseline import ParquetRowGroups, plain_parquet_loader
from gantry.dataload._dataset import GovernedDataset, Transform, loader
from gantry.dataload._errors import GrantRefused
from gantry.dataload._governance import GovernanceShardSource
from gantry.dataload._plan import Assignment
from gantry.dataload._settings import DataSettings
from gantry.dataload._sources import (
    CachedShardSource,
    DescribedSource,
    LocalShardSource,
    ScopedSource,
    ShardCache,
    ShardRef,
    ShardSource,
    decode_shard,
    encode_shard,
)
from gantry.dataload._tensors import TensorTransform, column_to_tensor, to_tensors

__all__ = [
    "Assignment",
    "CachedShardSource",
    "DataSettings",
    "DescribedSource",
    "GovernanceShardSource",
    "GovernedDataset",
    "GrantRefused",
    "LocalShardSource",
    "ParquetRowGroups",
    "ScopedSource",
    "ShardCache",
    "ShardRef",
    "ShardSource",
    "TensorTransform",
    "Transform",
    "column_to_tensor",
    "decode_shard",
    "encode_shard",
    "loader",
    "plain_parquet_loader",
    "to_tensors",
]
