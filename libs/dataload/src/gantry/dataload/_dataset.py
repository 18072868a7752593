"""The governed dataset: batches of a granted dataset version, split across ranks and workers.

Each reader (a rank, or a DataLoader worker inside it) reads its own shards (see ``_plan``),
fetching a few ahead in background threads, shuffles rows within a small window of shards,
and yields ready-made batches sliced from the decoded Arrow data. Use it with
``DataLoader(batch_size=None)`` -- :func:`loader` builds one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gantry.core import ConfigError, IntegrityError, InvalidInput, load_settings
from gantry.dataload._governance import GovernanceShardSource
from gantry.dataload._plan import Assignment, Layout, assign, batch_count, rank_batches
from gantry.dataload._prefetch import Prefetcher
from gantry.dataload._settings import DataSettings
from gantry.dataload._sources import (
    CachedShardSource,
    DescribedSource,
    ShardCache,
    ShardRef,
    ShardSource,
    decode_shard,
)
from gantry.dataload._tensors import TensorTransform
from gantry.storage import NodeCache

Transform = Callable[[pa.RecordBatch], Any]


class GovernedDataset(IterableDataset[Any]):
    """Batches of ``source``'s rows for this rank, ready for training.

    Construction lists the shards once (where the governance service checks the grant) and
    keeps the list, so every worker and epoch reads the same version. Each yielded item is
    ``transform(batch)`` for an Arrow record batch of ``batch_size`` rows holding ``columns``
    (all columns when None) plus ``label``; the default transform gives a dict of tensors, or
    ``(features, label_tensor)`` when ``label`` is set (see :class:`TensorTransform`).

    Ranks read disjoint shards; ``rank``/``world_size`` default to ``torch.distributed`` when
    it is initialised, else the ``RANK``/``WORLD_SIZE`` environment, else 0/1. With
    ``even_batches`` (the default) every rank yields the same number of batches per epoch, so
    no rank waits forever in a collective. Call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``: the order depends only on ``seed`` and the epoch.

    ``shuffle`` mixes the shard order and the rows within windows of ``shuffle_shards``
    consecutive shards. ``prefetch`` shards are fetched ahead on ``num_threads`` threads (per
    DataLoader worker). ``num_workers`` is the DataLoader worker count, used only by
    ``len()``; :func:`loader` sets it.
    """

    def __init__(
        self,
        source: ShardSource,
        batch_size: int,
        *,
        columns: Sequence[str] | None = None,
        label: str | None = None,
        transform: Transform | None = None,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        even_batches: bool = True,
        shuffle_shards: int = 2,
        prefetch: int = 4,
        num_threads: int = 2,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        _check_positive(
            batch_size=batch_size, shuffle_shards=shuffle_shards, num_threads=num_threads
        )
        if prefetch < 0 or seed < 0 or epoch < 0 or num_workers < 0:
            raise InvalidInput("prefetch, seed, epoch and num_workers must be >= 0")
        if rank is None or world_size is None:
            default_rank, default_world = default_rank_and_world_size()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidInput(
                f"rank {rank} is not in a world of size {world_size}",
                hint="rank must be 0..world_size-1",
            )
        self.source = source
        self.batch_size = batch_size
        self.label = label
        self.transform: Transform = transform or TensorTransform(label)
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.even_batches = even_batches
        self.shuffle_shards = shuffle_shards
        self.prefetch = prefetch
        self.num_threads = num_threads
        self.num_workers = num_workers
        self.shards = tuple(source.list_shards())
        if not self.shards:
            raise InvalidInput("the dataset version has no shards to read")
        if len(self.shards) < world_size:
            raise InvalidInput(
                f"{len(self.shards)} shards cannot be split across {world_size} ranks",
                hint="use fewer ranks, or upload the dataset with smaller shards",
            )
        self.columns = self._select(columns, label)
        # A shared-memory counter: persistent DataLoader workers hold a copy of the dataset
        # made when they started, and still see set_epoch() calls made later in the parent.
        counter: Any = torch.full((), epoch, dtype=torch.int64)
        self._epoch: torch.Tensor = counter.share_memory_()

    def _select(self, columns: Sequence[str] | None, label: str | None) -> tuple[str, ...] | None:
        chosen = [] if columns is None else list(dict.fromkeys(columns))
        if label is not None and label not in chosen:
            chosen.append(label)
        known = self.source.column_names() if isinstance(self.source, DescribedSource) else None
        if known is not None:
            _check_columns(chosen, known)
        return None if columns is None else tuple(chosen)

    # ---------------------------------------------------------------- configuration

    @classmethod
    def from_env(
        cls,
        dataset: str,
        batch_size: int,
        *,
        version: str = "",
        view: str = "",
        purpose: str = "training",
        settings: DataSettings | None = None,
        cache: ShardCache | None = None,
        **options: Any,
    ) -> GovernedDataset:
        """The dataset as a Gantry job sees it: grant, address and token from the environment.

        Reads ``GANTRY_GOVERNANCE_ADDR``, ``GANTRY_TOKEN``, ``GANTRY_DATA_GRANT`` and
        ``GANTRY_TLS__*`` once (or takes ``settings``). Shards go through ``cache`` when
        given, else through the node cache at ``GANTRY_DATA_CACHE_DIR`` when that is set.
        ``options`` are the other constructor arguments.
        """
        s = settings or load_settings(DataSettings)
        address, token, grant = s.require()
        source: ShardSource = GovernanceShardSource(
            address,
            token,
            dataset,
            version,
            grant,
            view=view,
            purpose=purpose,
            grant_file=str(s.data_grant_file or ""),
            tls=s.tls,
        )
        if cache is None and s.data_cache_dir is not None:
            cache = NodeCache(s.data_cache_dir, s.data_cache_bytes)
        if cache is not None:
            source = CachedShardSource(source, cache)
        return cls(source, batch_size, **options)

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration uses."""
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on (in every worker, too)."""
        if epoch < 0:
            raise InvalidInput(f"epoch {epoch} is negative")
        self._epoch.fill_(epoch)

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch with ``num_workers`` workers."""
        return rank_batches(
            self.shards,
            rank=self.rank,
            world_size=self.world_size,
            num_workers=self.num_workers,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            even_batches=self.even_batches,
        )

    def __repr__(self) -> str:
        return (
            f"GovernedDataset({self.source!r}, batch_size={self.batch_size}, "
            f"shards={len(self.shards)}, rank={self.rank}/{self.world_size})"
        )

    # ---------------------------------------------------------------- reading

    def assignment(self, worker: int = 0, num_workers: int = 1) -> Assignment:
        """This rank's worker ``worker``'s shards and batch count in the current epoch."""
        return assign(
            self.shards,
            Layout(self.rank, self.world_size, worker, num_workers),
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            even_batches=self.even_batches,
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        work = self.assignment(worker, workers)  # raises here, not at the first next()
        transform = self.transform
        return (transform(b) for b in self._record_batches(work, self.epoch, worker))

    def _record_batches(
        self, work: Assignment, epoch: int, worker: int
    ) -> Iterator[pa.RecordBatch]:
        if work.batches == 0 or not work.shards:
            return
        bs = self.batch_size
        natural = batch_count(work.rows, bs, self.drop_last)
        # Padding for even_batches reads the reader's shards again, as often as needed.
        keys = itertools.cycle(work.shards) if work.batches > natural else iter(work.shards)
        per_window = self.shuffle_shards if self.shuffle else 1
        depth = max(self.prefetch, per_window)
        # Windows never span two passes over the shards, so the first pass covers every row.
        full_windows, last = divmod(len(work.shards), per_window)
        window_sizes = itertools.cycle([per_window] * full_windows + ([last] if last else []))
        yielded = 0
        empty_run = 0
        pending: pa.RecordBatch | None = None  # fewer than bs rows, completed by the next window
        with Prefetcher(self._load, keys, depth=depth, threads=self.num_threads) as tables:
            for window_no, size in enumerate(window_sizes):
                window = list(itertools.islice(tables, size))
                if not window:
                    break
                empty_run = empty_run + len(window) if all(t.num_rows == 0 for t in window) else 0
                if empty_run >= len(work.shards):
                    break  # every shard came back empty: nothing to repeat
                batch = _combine(window)
                rows = batch.num_rows
                order = None
                if self.shuffle:
                    seq = [self.seed, epoch, self.rank, worker, window_no]
                    order = np.random.default_rng(seq).permutation(rows)
                start = 0
                if pending is not None:
                    head = _rows(batch, order, 0, min(bs - pending.num_rows, rows))
                    pending = pa.concat_batches([pending, head])
                    start = head.num_rows
                    if pending.num_rows == bs:
                        yield pending
                        pending = None
                        yielded += 1
                        if yielded == work.batches:
                            return
                while rows - start >= bs:
                    yield _rows(batch, order, start, bs)
                    start += bs
                    yielded += 1
                    if yielded == work.batches:
                        return
                if start < rows:
                    pending = _rows(batch, order, start, rows - start)
        if pending is not None and not self.drop_last and yielded < work.batches:
            yield pending

    def _load(self, shard: ShardRef) -> pa.Table:
        """Fetch and decode one shard (in a prefetch thread)."""
        table = decode_shard(self.source.fetch(shard.id))
        if self.columns is not None:
            _check_columns(self.columns, table.schema.names)
            table = table.select(list(self.columns))
        elif self.label is not None:
            _check_columns([self.label], table.schema.names)
        if not self.shuffle and table.num_rows:
            # Unshuffled batches are slices of the shard, and a decoded IPC payload is
            # read-only memory that PyTorch would copy column by column for every batch. One
            # copy of the shard here, off the training thread, makes every batch zero-copy.
            table = pa.Table.from_batches([pa.concat_batches(table.to_batches())])
        return table


def loader(
    dataset: GovernedDataset,
    *,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = True,
    multiprocessing_context: str | None = None,
) -> DataLoader[Any]:
    """A DataLoader over ``dataset``'s ready-made batches (``batch_size=None``).

    Workers stay alive across epochs (``persistent_workers``) and each reads its own shards;
    ``pin_memory`` defaults to whether CUDA is available. Raises :class:`InvalidInput` up
    front when the rank has fewer shards than workers.
    """
    if num_workers < 0:
        raise InvalidInput(f"num_workers {num_workers} is negative")
    dataset.num_workers = num_workers
    if num_workers:
        dataset.assignment(0, num_workers)  # checks there are enough shards for the workers
    extra: dict[str, Any] = {}
    if num_workers:
        extra.update(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
        if multiprocessing_context is not None:
            extra["multiprocessing_context"] = multiprocessing_context
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        **extra,
    )


def default_rank_and_world_size() -> tuple[int, int]:
    """``torch.distributed``'s rank and world size, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    raw = {
        name: os.environ.get(name, default)
        for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"))
    }
    try:
        return int(raw["RANK"]), int(raw["WORLD_SIZE"])
    except ValueError:
        raise ConfigError(
            f"RANK={raw['RANK']!r} and WORLD_SIZE={raw['WORLD_SIZE']!r} must be integers",
            hint="launch with torchrun, or pass rank= and world_size= explicitly",
        ) from None


def _combine(tables: list[pa.Table]) -> pa.RecordBatch:
    try:
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    except pa.ArrowInvalid as exc:
        raise IntegrityError(f"shards of one dataset version differ in schema: {exc}") from None
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


def _rows(
    batch: pa.RecordBatch, order: np.ndarray[Any, Any] | None, start: int, n: int
) -> pa.RecordBatch:
    if order is None:
        return batch.slice(start, n)
    return batch.take(pa.array(order[start : start + n]))


def _check_columns(wanted: Sequence[str], known: Sequence[str]) -> None:
    missing = [c for c in wanted if c not in known]
    if missing:
        raise InvalidInput(
            f"the view has no column{'s' if len(missing) > 1 else ''} "
            + ", ".join(map(repr, missing)),
            hint=f"the granted view's columns are: {', '.join(known)} "
            "(a de-identified view drops some columns)",
        )


def _check_positive(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise InvalidInput(
            ", ".join(f"{k}={v}" for k, v in bad.items()) + " must be at least 1",
            hint="e.g. batch_size=256, shuffle_shards=2, num_threads=2",
        )


__all__ = ["GovernedDataset", "Transform", "default_rank_and_world_size", "loader"]
