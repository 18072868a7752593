"""Tables on the client side: reading CSV and Parquet files, Arrow IPC streams in and out.

Every function here streams: a file is read batch by batch and an Arrow IPC stream is written
fragment by fragment, so uploading a file larger than memory works. Errors are
:class:`~gantry.core.InvalidInput` naming the file and what was wrong, never a raw pyarrow
exception.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.specs import ColumnSpec

#: File suffixes :func:`read_table_file` understands.
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
#: The CSV reader's block size; each record batch it yields covers about one block of the file.
CSV_BLOCK_BYTES = 1 << 20


def arrow_type(column_type: str) -> pa.DataType:
    """The Arrow type a dataset column of ``column_type`` is uploaded as.

    string → utf8, int64, float64, bool, date → date32, timestamp → timestamp[ms, UTC],
    binary. Raises :class:`InvalidInput` for a type the platform does not know.
    """
    factory = _ARROW_TYPES.get(column_type)
    if factory is None:
        raise InvalidInput(
            f"unknown column type {column_type!r}",
            hint="use one of " + ", ".join(_ARROW_TYPES),
        )
    return factory()


_ARROW_TYPES = {
    "string": pa.string,
    "int64": pa.int64,
    "float64": pa.float64,
    "bool": pa.bool_,
    "date": pa.date32,
    "timestamp": lambda: pa.timestamp("ms", tz="UTC"),
    "binary": pa.binary,
}


@dataclass
class TableSource:
    """An opened table file: its schema, size, and its batches read on demand."""

    path: Path
    schema: pa.Schema
    size: int
    _batches: Iterator[tuple[pa.RecordBatch, int]]

    def batches(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        """Each record batch with the number of file bytes it took (they add up to ``size``)."""
        return self._batches


def open_table_file(path: str | Path, *, columns: Sequence[ColumnSpec] = ()) -> TableSource:
    """Open a .csv, .parquet or .pq file for streaming.

    With ``columns`` (a dataset's declared columns), CSV columns are parsed as their declared
    types instead of guessed ones (a zip code stays a string) and every batch is cast to the
    declared Arrow types (see :func:`arrow_type`); columns that are not declared pass through
    for the service to judge.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise InvalidInput(
            f"can't read {path} as a table: unknown suffix {path.suffix or '(none)'!r}",
            hint="give a .csv, .parquet or .pq file",
        )
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidInput(f"can't read {path}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise InvalidInput(f"can't read {path}: not a file")
    targets = {c.name: arrow_type(c.type) for c in columns}
    try:
        if suffix == ".csv":
            schema, batches = _open_csv(path, size, targets)
        else:
            schema, batches = _open_parquet(path, size)
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"can't read {path}: {_arrow_message(exc)}") from None
    schema = declared_schema(schema, columns)
    return TableSource(path, schema, size, _checked(path, batches, schema))


def read_table_file(
    path: str | Path, *, columns: Sequence[ColumnSpec] = ()
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema of a .csv / .parquet / .pq file and an iterator over its record batches.

    The file is read lazily, one batch at a time; ``columns`` is as for
    :func:`open_table_file`. Raises :class:`InvalidInput` for an unknown suffix, a missing or
    unreadable file, or content that does not parse (also while iterating).
    """
    source = open_table_file(path, columns=columns)
    return source.schema, (batch for batch, _ in source.batches())


def _open_csv(
    path: Path, size: int, targets: Mapping[str, pa.DataType]
) -> tuple[pa.Schema, Iterator[tuple[pa.RecordBatch, int]]]:
    # Timestamps are left to inference: the CSV parser refuses naive times for a tz-aware
    # type, while a cast afterwards reads them as UTC.
    column_types = {n: t for n, t in targets.items() if not pa.types.is_timestamp(t)}
    reader = pa_csv.open_csv(
        str(path),
        read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
        convert_options=pa_csv.ConvertOptions(column_types=column_types),
    )

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        # Each batch is one block of the file (the reader's own position runs ahead of what
        # it has handed out), so a batch counts one block and the last one the rest.
        consumed = 0
        previous: pa.RecordBatch | None = None
        try:
            for batch in reader:
                if previous is not None:
                    step = min(CSV_BLOCK_BYTES, size - consumed)
                    consumed += step
                    yield previous, step
                previous = batch
        finally:
            reader.close()
        if previous is not None:
            yield previous, size - consumed

    return reader.schema, batches()


def _open_parquet(path: Path, size: int) -> tuple[pa.Schema, Iterator[tuple[pa.RecordBatch, int]]]:
    file = pq.ParquetFile(str(path))
    total_rows = file.metadata.num_rows

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        rows = reported = 0
        try:
            for batch in file.iter_batches():
                rows += batch.num_rows
                done = size * rows // total_rows if total_rows else 0
                yield batch, done - reported
                reported = done
        finally:
            file.close()

    return file.schema_arrow, batches()


def declared_schema(schema: pa.Schema, columns: Sequence[ColumnSpec]) -> pa.Schema:
    """``schema`` with each declared column's type replaced by its :func:`arrow_type`."""
    targets = {c.name: arrow_type(c.type) for c in columns}
    fields = [
        pa.field(f.name, targets[f.name], f.nullable) if f.name in targets else f for f in schema
    ]
    return pa.schema(fields)


def _checked(
    path: Path, batches: Iterator[tuple[pa.RecordBatch, int]], schema: pa.Schema
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The batches cast to ``schema``, with parse errors raised as :class:`InvalidInput`."""
    try:
        for batch, step in batches:
            yield conform_batch(batch, schema, where=str(path)), step
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"can't read {path}: {_arrow_message(exc)}") from None


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema, *, where: str) -> pa.RecordBatch:
    """``batch`` with every column cast to the type ``schema`` gives it.

    Raises :class:`InvalidInput` naming ``where`` and the column when a value does not convert
    (for instance ``'n/a'`` in an int64 column).
    """
    if batch.schema.equals(schema):
        return batch
    arrays = []
    for field, column in zip(schema, batch.columns, strict=True):
        if column.type.equals(field.type):
            arrays.append(column)
            continue
        try:
            arrays.append(_cast(column, field.type))
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidInput(
                f"{where}: column {field.name!r} does not convert from {column.type} to "
                f"{field.type}: {_arrow_message(exc)}",
                hint="fix the value in the file, or the column's type in the dataset's schema",
            ) from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _cast(column: pa.Array, target: pa.DataType) -> pa.Array:
    if (
        pa.types.is_timestamp(target)
        and target.tz is not None
        and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type))
    ):
        # Text without a zone offset ('2026-01-31 12:00:00') is taken as UTC, as in CSV files.
        zoned = pc.match_substring_regex(column, r"(?:Z|[+-]\d{2}:?\d{2})$")
        column = pc.if_else(zoned, column, pc.binary_join_element_wise(column, "Z", ""))
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(column.type):
        # The dataset stores milliseconds: finer times (pandas writes ns) are truncated to it.
        return pc.cast(column, target, safe=False)
    return column.cast(target)


def table_batches(table: pa.Table, *, max_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """The record batches of an in-memory table, at most ``max_rows`` rows each."""
    yield from table.to_batches(max_chunksize=max_rows)


def encode_arrow_stream(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    fragment_bytes: int = 1 << 20,
    *,
    max_batch_bytes: int = 16 << 20,
) -> Iterator[bytes]:
    """Write ``batches`` as ONE Arrow IPC stream and yield it in fragments of ``fragment_bytes``.

    Only the last fragment may be shorter. Joined, the fragments are a complete stream (schema,
    batches, end-of-stream marker) that :func:`decode_ipc` reads back; at least one fragment
    is yielded, even for no batches. Batches over ``max_batch_bytes`` are split and dictionary
    columns decoded, so the governance service's stream decoder always accepts the result.
    Memory stays around one batch plus one fragment.
    """
    if fragment_bytes <= 0:
        raise InvalidInput(f"fragment_bytes must be positive, not {fragment_bytes}")
    plain = pa.schema(
        [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema]
    )
    sink = io.BytesIO()
    pending = bytearray()

    def drain() -> Iterator[bytes]:
        pending.extend(sink.getvalue())
        sink.seek(0)
        sink.truncate()
        while len(pending) >= fragment_bytes:
            yield bytes(pending[:fragment_bytes])
            del pending[:fragment_bytes]

    with pa.ipc.new_stream(sink, plain) as writer:
        for batch in batches:
            if batch.schema != plain:
                batch = batch.cast(plain)
            row_bytes = max(batch.nbytes / max(batch.num_rows, 1), 1)
            step = max(1, int(max_batch_bytes / row_bytes))
            for start in range(0, batch.num_rows, step):
                writer.write_batch(batch.slice(start, step))
                yield from drain()
    yield from drain()
    if pending:
        yield bytes(pending)


def decode_ipc(data: bytes) -> pa.Table:
    """The table in one complete Arrow IPC stream; :class:`InvalidInput` if it is not one."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            return reader.read_all()
    except pa.ArrowException as exc:
        raise InvalidInput(f"not a valid Arrow IPC stream: {_arrow_message(exc)}") from None


def _arrow_message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = [
    "CSV_BLOCK_BYTES",
    "TABLE_SUFFIXES",
    "TableSource",
    "arrow_type",
    "conform_batch",
    "declared_schema",
    "decode_ipc",
    "encode_arrow_stream",
    "open_table_file",
    "read_table_file",
    "table_batches",
]
