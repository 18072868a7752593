"""Table bytes: Parquet shards, and Arrow IPC streams arriving in fragments.

Uploads arrive as fragments of one Arrow IPC stream (:class:`ArrowStreamDecoder` turns them
back into record batches without holding the whole stream); conformed batches are cut into
Parquet shards of about ``shard_bytes`` each (:class:`ShardWriter`). Reads go back through
:func:`shard_to_table` and leave as one IPC stream per shard (:func:`table_to_ipc`).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from gantry.core import IntegrityError, InvalidInput
from gantry.governance.schema import DatasetSchema, conform

_CONTINUATION = 0xFFFFFFFF
_MAX_MESSAGE_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class Shard:
    """One finished shard: a complete Parquet file, its row count and its sha256 (hex); the
    rows themselves ride along in ``table`` (for indexing) when the writer made it."""

    data: bytes
    rows: int
    digest: str
    table: pa.Table | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, data: bytes, rows: int, table: pa.Table | None = None) -> Shard:
        """A shard of ``data`` holding ``rows`` rows, its digest computed."""
        return cls(data=data, rows=rows, digest=hashlib.sha256(data).hexdigest(), table=table)


#: Takes conformed rows and returns those to keep (e.g. without an erased subject's rows).
RowFilter = Callable[[pa.RecordBatch], pa.RecordBatch]


class ShardWriter:
    """Cuts a dataset's rows into zstd Parquet shards of about ``shard_bytes`` (in memory) each.

    Rows keep their order across shards: concatenating the shards gives back the rows added
    (those ``row_filter`` keeps, when one is given).
    """

    def __init__(
        self, schema: DatasetSchema, shard_bytes: int, *, row_filter: RowFilter | None = None
    ) -> None:
        if shard_bytes <= 0:
            raise InvalidInput(
                f"shard size {shard_bytes} is not positive",
                hint="pass a shard size in bytes, e.g. 67108864 for 64 MiB",
            )
        self._schema = schema
        self._arrow_schema = schema.to_arrow()
        self._shard_bytes = shard_bytes
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._row_filter = row_filter

    def add(self, batch: pa.RecordBatch | pa.Table) -> list[Shard]:
        """Add rows (checked with :func:`conform`); return the shards this completed, if any."""
        conformed = conform(batch, self._schema)
        pieces = conformed.to_batches() if isinstance(conformed, pa.Table) else [conformed]
        done: list[Shard] = []
        for piece in pieces:
            rest = self._row_filter(piece) if self._row_filter is not None else piece
            while rest.num_rows:
                room = self._shard_bytes - self._pending_bytes
                if rest.nbytes < room:
                    self._pending.append(rest)
                    self._pending_bytes += rest.nbytes
                    break
                # Take about as many rows as fill the shard, at least one so we progress.
                per_row = max(rest.nbytes / rest.num_rows, 1e-9)
                take = min(rest.num_rows, max(1, math.ceil(room / per_row)))
                self._pending.append(rest.slice(0, take))
                rest = rest.slice(take)
                done.append(self._flush())
        return done

    def finish(self) -> list[Shard]:
        """Flush the remaining rows as a last shard; ``[]`` when none are left."""
        return [self._flush()] if self._pending else []

    def _flush(self) -> Shard:
        table = pa.Table.from_batches(self._pending, schema=self._arrow_schema)
        self._pending = []
        self._pending_bytes = 0
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return Shard.of(sink.getvalue().to_pybytes(), table.num_rows, table)


def _body_length(meta: memoryview) -> int:
    """``bodyLength`` of an IPC ``Message`` flatbuffer (field 3; the header union takes 1 and 2)."""
    try:
        (table,) = struct.unpack_from("<I", meta, 0)
        (vtable_back,) = struct.unpack_from("<i", meta, table)
        vtable = table - vtable_back
        if not (0 <= vtable < len(meta) and 0 <= table < len(meta)):
            raise struct.error("offset out of range")
        (vtable_size,) = struct.unpack_from("<H", meta, vtable)
        slot = 4 + 2 * 3
        if slot + 2 > vtable_size:
            return 0
        (field,) = struct.unpack_from("<H", meta, vtable + slot)
        if field == 0:
            return 0
        (length,) = struct.unpack_from("<q", meta, table + field)
    except struct.error:
        raise _not_a_stream("a message header is malformed") from None
    return int(length)


def _not_a_stream(detail: str) -> InvalidInput:
    return InvalidInput(
        f"the upload is not a valid Arrow IPC stream: {detail}",
        hint="send the table as one Arrow IPC stream (schema, then record batches), e.g. with ",
    )


class ArrowStreamDecoder:
    """Turns the fragments of one Arrow IPC stream back into record batches as they complete.

    Only the message being received is buffered, so memory is bounded by the largest record
    batch (at most ``max_message_bytes``). Fragments may split messages at any byte.
    """

    def __init__(self, *, max_message_bytes: int = _MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_message_bytes
        self._schema: pa.Schema | None = None
        self._ended = False
        self.rows = 0
        """Rows decoded so far."""

    @property
    def schema(self) -> pa.Schema | None:
        """The stream's Arrow schema, once its first message has arrived."""
        return self._schema

    def feed(self, fragment: bytes) -> list[pa.RecordBatch]:
        """Take the next fragment; return the record batches it completed (often none)."""
        if self._ended and fragment:
            raise _not_a_stream("data follows the end-of-stream marker")
        self._buf += fragment
        batches = []
        while (message := self._next_message()) is not None:
            batch = self._decode(message)
            if batch is not None:
                self.rows += batch.num_rows
                batches.append(batch)
        return batches

    def close(self) -> None:
        """Declare the stream over; :class:`InvalidInput` unless it ended with its end marker."""
        if self._buf:
            what = "record batch" if self._schema is not None else "Arrow schema"
            raise InvalidInput(
                f"the upload ended in the middle of a {what} ({len(self._buf)} bytes of it "
                "arrived): was the client interrupted?",
                hint="re-run the upload",
            )
        if self._schema is None:
            raise _not_a_stream("it ended before the schema arrived")
        if not self._ended:
            # Without the marker a stream cut at a batch boundary would pass as complete.
            raise InvalidInput(
                "the upload ended without the Arrow end-of-stream marker: was the client "
                "interrupted?",
                hint="re-run the upload, closing the Arrow stream writer so it writes the marker",
            )

    def _next_message(self) -> pa.ipc.Message | None:
        buf = self._buf
        if self._ended or len(buf) < 8:
            return None
        if self._schema is None and bytes(buf[:4]) in (b"ARRO", b"PAR1"):
            raise _not_a_stream("this is an Arrow or Parquet file, not an IPC stream")
        marker, meta_len = struct.unpack_from("<Ii", buf, 0)
        if marker != _CONTINUATION:
            raise _not_a_stream("a message does not start with the continuation marker")
        if meta_len == 0:
            del buf[:8]
            self._ended = True
            if buf:
                raise _not_a_stream("data follows the end-of-stream marker")
            return None
        if meta_len < 0 or meta_len > self._max:
            raise _not_a_stream(f"a message header claims {meta_len} bytes")
        if len(buf) < 8 + meta_len:
            return None
        with memoryview(buf) as view:
            body = _body_length(view[8 : 8 + meta_len])
        total = 8 + meta_len + body
        if body < 0 or total > self._max:
            raise InvalidInput(
                f"a record batch of {total} bytes exceeds the limit of {self._max} bytes",
                hint="send smaller record batches (the SDK's upload splits them for you)",
            )
        if len(buf) < total:
            return None
        data = bytes(buf[:total])
        del buf[:total]
        try:
            return pa.ipc.read_message(pa.py_buffer(data))
        except (pa.ArrowInvalid, OSError) as exc:
            raise _not_a_stream(str(exc)) from None

    def _decode(self, message: pa.ipc.Message) -> pa.RecordBatch | None:
        try:
            if message.type == "schema":
                if self._schema is not None:
                    raise _not_a_stream("a second schema arrived mid-stream")
                schema = pa.ipc.read_schema(message)
                if any(pa.types.is_dictionary(f.type) for f in schema):
                    raise _not_a_stream("dictionary-encoded columns are not supported")
                self._schema = schema
                return None
            if message.type == "record batch":
                if self._schema is None:
                    raise _not_a_stream("a record batch arrived before the schema")
                return pa.ipc.read_record_batch(message, self._schema)
        except (pa.ArrowInvalid, OSError) as exc:
            raise _not_a_stream(str(exc)) from None
        raise _not_a_stream(f"unexpected {message.type} message")


def shard_to_table(data: bytes | bytearray) -> pa.Table:
    """The rows of a stored shard; :class:`IntegrityError` when it is not readable Parquet."""
    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise IntegrityError(
            f"a stored shard is not a readable Parquet file: {exc}",
            hint="the object store copy is damaged; restore it from backup or roll back",
        ) from None


def table_to_ipc(table: pa.Table) -> bytes:
    """``table`` as one complete Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def ipc_to_table(data: bytes) -> pa.Table:
    """The table in one complete Arrow IPC stream; :class:`InvalidInput` when malformed."""
    try:
        with pa.ipc.open_stream(pa.BufferReader(data)) as reader:
            return reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise _not_a_stream(str(exc)) from None


__all__ = [
    "ArrowStreamDecoder",
    "RowFilter",
    "Shard",
    "ShardWriter",
    "ipc_to_table",
    "shard_to_table",
    "table_to_ipc",
]
