"""Dataset names and table schemas: what a dataset's columns are, and whether uploaded rows fit.

A :class:`DatasetSchema` is an ordered list of :class:`Column` s, each with a type and a
classification; the classification is what the view policy (:mod:`gantry.governance.deid`)
decides transforms by. :func:`conform` is the gate every uploaded batch passes through: it
refuses data that does not match and returns data in the schema's exact order and types.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import pyarrow as pa

from gantry.core import InvalidInput
from gantry.protos.v1 import governance_pb2 as pb

_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_DATASET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class ColumnClass(StrEnum):
    """How sensitive a column is; the view policy maps each class to a transform."""

    PUBLIC = "public"
    INTERNAL = "internal"
    PII = "pii"
    SENSITIVE = "sensitive"


class ColumnType(StrEnum):
    """The column types a dataset may declare; :meth:`arrow` gives the stored Arrow type."""

    STRING = "string"
    INT64 = "int64"
    FLOAT64 = "float64"
    BOOL = "bool"
    DATE = "date"
    TIMESTAMP = "timestamp"
    BINARY = "binary"

    def arrow(self) -> pa.DataType:
        """The Arrow type values of this column are stored as (timestamps: ms, UTC)."""
        return _ARROW_TYPES[self]

    @property
    def numeric(self) -> bool:
        """Whether the column holds numbers (the types bucketing and noise apply to)."""
        return self in (ColumnType.INT64, ColumnType.FLOAT64)


_ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.STRING: pa.string(),
    ColumnType.INT64: pa.int64(),
    ColumnType.FLOAT64: pa.float64(),
    ColumnType.BOOL: pa.bool_(),
    ColumnType.DATE: pa.date32(),
    ColumnType.TIMESTAMP: pa.timestamp("ms", tz="UTC"),
    ColumnType.BINARY: pa.binary(),
}


_E = TypeVar("_E", bound=StrEnum)


def parse_enum(kind: type[_E], value: str, what: str) -> _E:
    """``value`` as a member of ``kind``; :class:`InvalidInput` listing the members if not.

    ``what`` names the value in the message, e.g. ``"column age: type"``.
    """
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise InvalidInput(
            f"{what} {value!r} is not a known value", hint=f"use one of: {allowed}"
        ) from None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table dataset: its name, type, classification and whether it may be null."""

    name: str
    type: ColumnType
    classification: ColumnClass
    nullable: bool = True

    def __post_init__(self) -> None:
        if not _COLUMN_NAME.fullmatch(self.name):
            raise InvalidInput(
                f"column name {self.name!r} is not allowed",
                hint="start with a letter or '_', then letters, digits or '_', 128 characters "
                "at most",
            )
        # Accept plain strings from callers that read them from JSON or protobuf.
        object.__setattr__(
            self, "type", parse_enum(ColumnType, self.type, f"column {self.name}: type")
        )
        object.__setattr__(
            self,
            "classification",
            parse_enum(ColumnClass, self.classification, f"column {self.name}: classification"),
        )

    def field(self) -> pa.Field:
        """The Arrow field this column is stored as."""
        return pa.field(self.name, self.type.arrow(), nullable=self.nullable)


@dataclass(frozen=True, slots=True)
class DatasetSchema:
    """The ordered columns of a table dataset; names are unique and there is at least one."""

    columns: tuple[Column, ...]

    def __init__(self, columns: Iterable[Column]) -> None:
        cols = tuple(columns)
        if not cols:
            raise InvalidInput(
                "a table dataset needs at least one column",
                hint="declare the columns, or create the dataset with format=files",
            )
        seen: set[str] = set()
        for col in cols:
            if col.name in seen:
                raise InvalidInput(
                    f"column {col.name!r} is declared twice", hint="give every column its own name"
                )
            seen.add(col.name)
        object.__setattr__(self, "columns", cols)

    @property
    def names(self) -> list[str]:
        """The column names in order."""
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        """The column called ``name``; :class:`InvalidInput` when there is none."""
        for col in self.columns:
            if col.name == name:
                return col
        raise InvalidInput(
            f"the dataset has no column {name!r}", hint=f"columns are: {', '.join(self.names)}"
        )

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema stored shards have."""
        return pa.schema([c.field() for c in self.columns])

    @classmethod
    def from_arrow(cls, schema: pa.Schema, classifications: Mapping[str, str]) -> DatasetSchema:
        """A schema for Arrow data (e.g. an inferred CSV), every column classified by name.

        Every column must be classified: an unclassified column would otherwise fall back to
        a guess, and classifications are what protects the data.
        """
        unknown = sorted(set(classifications) - set(schema.names))
        if unknown:
            raise InvalidInput(
                f"classifications name columns the data does not have: {', '.join(unknown)}",
                hint=f"the data's columns are: {', '.join(schema.names)}",
            )
        missing = [n for n in schema.names if n not in classifications]
        if missing:
            raise InvalidInput(
                f"no classification for column(s): {', '.join(missing)}",
                hint="classify every column as public, internal, pii or sensitive",
            )
        columns = []
        for f in schema:
            label = f"column {f.name}: classification"
            klass = parse_enum(ColumnClass, classifications[f.name], label)
            columns.append(Column(f.name, _column_type_of(f), klass, f.nullable))
        return cls(columns)


def _column_type_of(f: pa.Field) -> ColumnType:
    t = f.type
    if pa.types.is_integer(t):
        return ColumnType.INT64
    if pa.types.is_floating(t):
        return ColumnType.FLOAT64
    checks = (
        (pa.types.is_string, ColumnType.STRING),
        (pa.types.is_large_string, ColumnType.STRING),
        (pa.types.is_string_view, ColumnType.STRING),
        (pa.types.is_boolean, ColumnType.BOOL),
        (pa.types.is_date, ColumnType.DATE),
        (pa.types.is_timestamp, ColumnType.TIMESTAMP),
        (pa.types.is_binary, ColumnType.BINARY),
        (pa.types.is_large_binary, ColumnType.BINARY),
    )
    for check, column_type in checks:
        if check(t):
            return column_type
    raise InvalidInput(
        f"column {f.name}: Arrow type {t} has no dataset column type",
        hint=f"convert it to one of: {', '.join(c.value for c in ColumnType)}",
    )


def check_dataset_name(name: str) -> str:
    """Return ``name`` if it is a valid dataset name, else raise :class:`InvalidInput`.

    Names are path segments in storage, so anything that could climb or nest ('../x', 'a/b')
    is refused.
    """
    if not _DATASET_NAME.fullmatch(name) or ".." in name:
        raise InvalidInput(
            f"dataset name {name!r} is not allowed",
            hint="use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or "
            "digit, with no '/' and no '..'",
        )
    return name


def _safe_source(found: pa.DataType, want: pa.DataType) -> bool:
    """Whether ``found`` converts to ``want`` without losing information."""
    types = pa.types
    if want == pa.int64():
        ok = types.is_signed_integer(found) or (
            types.is_unsigned_integer(found) and found.bit_width <= 32
        )
    elif want == pa.float64():
        # Integers up to 32 bits are exact in a double; int64 would not be.
        ok = types.is_floating(found) or (types.is_integer(found) and found.bit_width <= 32)
    elif want == pa.string():
        ok = types.is_large_string(found) or types.is_string_view(found)
    elif want == pa.binary():
        ok = types.is_large_binary(found) or types.is_binary_view(found)
    else:
        ok = False
    return bool(ok)


def conform(data: pa.RecordBatch | pa.Table, schema: DatasetSchema) -> pa.RecordBatch | pa.Table:
    """Check uploaded ``data`` against ``schema``; return it in schema order and exact types.

    Only lossless conversions are made (integer and float widening, large/view strings to
    strings); anything else is refused with a message naming the column, the expected and the
    found type. Returns the same kind (record batch or table) it was given.
    """
    found_names = list(data.schema.names)
    missing = [n for n in schema.names if n not in found_names]
    extra = [n for n in found_names if n not in schema.names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected column(s) {', '.join(extra)}")
        raise InvalidInput(
            f"uploaded data does not match the dataset schema: {'; '.join(parts)}",
            hint=f"send exactly the columns {', '.join(schema.names)} (or change the schema)",
        )
    if len(set(found_names)) != len(found_names):
        dupes = sorted({n for n in found_names if found_names.count(n) > 1})
        raise InvalidInput(
            f"uploaded data has duplicate column(s): {', '.join(dupes)}",
            hint="send each column once",
        )
    arrays = []
    for col in schema.columns:
        arr = data.column(col.name)
        want = col.type.arrow()
        if arr.type != want:
            if not _safe_source(arr.type, want):
                raise InvalidInput(
                    f"column {col.name}: expected {col.type} ({want}), found {arr.type}",
                    hint=f"convert column {col.name} to {want} before uploading",
                )
            arr = arr.cast(want)
        if not col.nullable and arr.null_count:
            raise InvalidInput(
                f"column {col.name}: {arr.null_count} null value(s) in a non-nullable column",
                hint=f"fill the nulls in {col.name}, or declare it nullable",
            )
        arrays.append(arr)
    target = schema.to_arrow()
    if isinstance(data, pa.Table):
        return pa.Table.from_arrays(arrays, schema=target)
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def schema_diff(old: DatasetSchema, new: DatasetSchema) -> list[str]:
    """Human-readable changes from ``old`` to ``new``, one line each (empty when equal)."""
    before = {c.name: c for c in old.columns}
    after = {c.name: c for c in new.columns}
    changes = [f"removed column {c.name} {c.type}" for c in old.columns if c.name not in after]
    for c in new.columns:
        prev = before.get(c.name)
        if prev is None:
            changes.append(f"added column {c.name} {c.type} ({c.classification})")
            continue
        if prev.type != c.type:
            changes.append(f"column {c.name}: type {prev.type} -> {c.type}")
        if prev.classification != c.classification:
            changes.append(
                f"column {c.name}: classification {prev.classification} -> {c.classification}"
            )
        if prev.nullable != c.nullable:
            changes.append(
                f"column {c.name}: {'nullable' if prev.nullable else 'not nullable'} -> "
                f"{'nullable' if c.nullable else 'not nullable'}"
            )
    kept_before = [n for n in old.names if n in after]
    kept_after = [n for n in new.names if n in before]
    if kept_before != kept_after:
        changes.append(f"column order: {', '.join(kept_before)} -> {', '.join(kept_after)}")
    return changes


def columns_from_pb(columns: Iterable[pb.Column]) -> list[Column]:
    """Columns from their protobuf form, validated (protobuf's ``nullable`` defaults to false)."""
    out = []
    for c in columns:
        if not c.type:
            raise InvalidInput(
                f"column {c.name!r} has no type",
                hint=f"set type to one of: {', '.join(t.value for t in ColumnType)}",
            )
        if not c.classification:
            raise InvalidInput(
                f"column {c.name!r} has no classification",
                hint=f"set classification to one of: {', '.join(k.value for k in ColumnClass)}",
            )
        out.append(
            Column(
                c.name,
                parse_enum(ColumnType, c.type, f"column {c.name}: type"),
                parse_enum(ColumnClass, c.classification, f"column {c.name}: classification"),
                c.nullable,
            )
        )
    return out


def columns_to_pb(columns: Iterable[Column]) -> list[pb.Column]:
    """The protobuf form of ``columns``."""
    return [
        pb.Column(
            name=c.name,
            type=c.type.value,
            classification=c.classification.value,
            nullable=c.nullable,
        )
        for c in columns
    ]


__all__ = [
    "Column",
    "ColumnClass",
    "ColumnType",
    "DatasetSchema",
    "check_dataset_name",
    "columns_from_pb",
    "columns_to_pb",
    "conform",
    "parse_enum",
    "schema_diff",
]
