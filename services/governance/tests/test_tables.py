"""Unit tests of shards and the incremental Arrow stream decoder (fed by the SDK's encoder)."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gantry.client.tables import encode_arrow_stream as encode_batches
from gantry.core import IntegrityError, InvalidInput
from gantry.governance.schema import Column, ColumnClass, ColumnType, DatasetSchema
from gantry.governance.tables import (
    ArrowStreamDecoder,
    ShardWriter,
    ipc_to_table,
    shard_to_table,
    table_to_ipc,
)

SCHEMA = DatasetSchema(
    [
        Column("id", ColumnType.INT64, ColumnClass.INTERNAL, nullable=False),
        Column("name", ColumnType.STRING, ColumnClass.PII),
        Column("day", ColumnType.DATE, ColumnClass.PUBLIC),
    ]
)


def table(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"name-{i}" if i % 7 else None for i in ids]),
            "day": pa.array([i % 1000 for i in ids], pa.int32()).cast(pa.date32()),
        },
        schema=SCHEMA.to_arrow(),
    )


def decode(fragments: list[bytes]) -> tuple[pa.Table, ArrowStreamDecoder]:
    decoder = ArrowStreamDecoder()
    batches = [b for f in fragments for b in decoder.feed(f)]
    decoder.close()
    assert decoder.schema is not None
    return pa.Table.from_batches(batches, schema=decoder.schema), decoder


def test_shard_writer_cuts_by_size_and_keeps_row_order() -> None:
    writer = ShardWriter(SCHEMA, shard_bytes=64 << 10)
    shards = []
    for i in range(20):
        shards += writer.add(table(1000, start=i * 1000).to_batches()[0])
    shards += writer.finish()
    rows_bytes = table(20000).nbytes
    assert len(shards) == pytest.approx(rows_bytes / (64 << 10), abs=1.5)
    assert sum(s.rows for s in shards) == 20000
    for shard in shards[:-1]:
        assert shard.rows == pytest.approx((64 << 10) / (rows_bytes / 20000), rel=0.05)
    back = pa.concat_tables(shard_to_table(s.data) for s in shards)
    assert back.equals(table(20000))
    for shard in shards:
        assert shard.digest == hashlib.sha256(shard.data).hexdigest()
        assert shard.data.startswith(b"PAR1")
        meta = pq.ParquetFile(pa.BufferReader(shard.data)).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"


def test_shard_writer_splits_one_big_batch() -> None:
    writer = ShardWriter(SCHEMA, shard_bytes=32 << 10)
    shards = writer.add(table(10000)) + writer.finish()
    assert len(shards) > 5
    assert pa.concat_tables(shard_to_table(s.data) for s in shards).equals(table(10000))


def test_shard_writer_small_and_empty() -> None:
    writer = ShardWriter(SCHEMA, shard_bytes=1 << 30)
    assert writer.add(table(0)) == []
    assert writer.finish() == []
    assert writer.add(table(3)) == []
    (shard,) = writer.finish()
    assert shard.rows == 3
    assert shard_to_table(shard.data).schema == SCHEMA.to_arrow()


def test_shard_writer_conforms_rows() -> None:
    writer = ShardWriter(SCHEMA, shard_bytes=1 << 20)
    with pytest.raises(InvalidInput, match="missing column"):
        writer.add(table(3).drop_columns(["day"]))
    with pytest.raises(InvalidInput, match="not positive"):
        ShardWriter(SCHEMA, shard_bytes=0)


def encode_arrow_stream(
    rows: pa.Table, fragment_bytes: int = 1 << 20, max_batch_bytes: int = 16 << 20
) -> list[bytes]:
    """The SDK's upload encoding of ``rows``."""
    return list(
        encode_batches(
            rows.schema, rows.to_batches(), fragment_bytes, max_batch_bytes=max_batch_bytes
        )
    )


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
def test_decoder_handles_any_fragment_split(size: int) -> None:
    rows = table(300 if size == 1 else 5000)
    fragments = list(encode_arrow_stream(rows, fragment_bytes=size, max_batch_bytes=8 << 10))
    assert all(len(f) == size for f in fragments[:-1])
    got, decoder = decode(fragments)
    assert got.equals(rows)
    assert decoder.rows == rows.num_rows


def test_decoder_yields_batches_as_soon_as_complete() -> None:
    fragments = list(encode_arrow_stream(table(5000), fragment_bytes=1024, max_batch_bytes=8 << 10))
    decoder = ArrowStreamDecoder()
    first_at = next(i for i, f in enumerate(fragments) if decoder.feed(f))
    assert first_at < len(fragments) // 4


def test_decoder_reads_pyarrow_stream_writer_output() -> None:
    rows = table(1000)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, rows.schema, options=options) as writer:
        writer.write_table(rows, max_chunksize=100)
    data = sink.getvalue().to_pybytes()
    got, _ = decode([data[i : i + 333] for i in range(0, len(data), 333)])
    assert got.equals(rows)


def test_encode_batches_iterable_and_dictionaries() -> None:
    rows = table(50)
    dict_rows = rows.set_column(1, "name", rows["name"].dictionary_encode())
    got, _ = decode(list(encode_batches(dict_rows.schema, iter(dict_rows.to_batches()))))
    assert got.equals(rows)
    empty, _ = decode(list(encode_batches(rows.schema, [])))
    assert empty.num_rows == 0


@pytest.mark.parametrize("cut", [4, 100, -20, -8, -1])
def test_truncated_stream_is_refused_on_close(cut: int) -> None:
    data = b"".join(encode_arrow_stream(table(100)))
    decoder = ArrowStreamDecoder()
    decoder.feed(data[:cut])
    with pytest.raises(InvalidInput) as err:
        decoder.close()
    assert "was the client interrupted?" in err.value.message
    assert err.value.hint and "re-run the upload" in err.value.hint


def test_decoder_refuses_garbage() -> None:
    with pytest.raises(InvalidInput, match="not a valid Arrow IPC stream"):
        ArrowStreamDecoder().feed(b"hello, world, not arrow")
    with pytest.raises(InvalidInput, match="Parquet file, not an IPC stream"):
        ArrowStreamDecoder().feed(b"PAR1" + bytes(20))
    with pytest.raises(InvalidInput, match="ended before the schema"):
        ArrowStreamDecoder().close()
    data = b"".join(encode_arrow_stream(table(3)))
    with pytest.raises(InvalidInput, match="follows the end-of-stream"):
        ArrowStreamDecoder().feed(data + data)


def test_decoder_bounds_message_size() -> None:
    data = b"".join(encode_arrow_stream(table(10000), max_batch_bytes=1 << 30))
    decoder = ArrowStreamDecoder(max_message_bytes=16 << 10)
    with pytest.raises(InvalidInput, match="exceeds the limit"):
        decoder.feed(data)


def test_ipc_round_trip() -> None:
    rows = table(10)
    assert ipc_to_table(table_to_ipc(rows)).equals(rows)
    with pytest.raises(InvalidInput, match="not a valid Arrow IPC stream"):
        ipc_to_table(b"nope")


def test_damaged_shard_is_an_integrity_error() -> None:
    with pytest.raises(IntegrityError, match="not a readable Parquet file"):
        shard_to_table(b"PAR1 damaged")
