"""Unit tests of dataset names, schemas, conform and schema diffs."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from gantry.core import InvalidInput
from gantry.governance.schema import (
    Column,
    ColumnClass,
    ColumnType,
    DatasetSchema,
    check_dataset_name,
    columns_from_pb,
    columns_to_pb,
    conform,
    schema_diff,
)
from gantry.protos.v1 import governance_pb2 as pb

SCHEMA = DatasetSchema(
    [
        Column("id", ColumnType.INT64, ColumnClass.INTERNAL, nullable=False),
        Column("email", ColumnType.STRING, ColumnClass.PII),
        Column("score", ColumnType.FLOAT64, ColumnClass.PUBLIC),
        Column("seen", ColumnType.TIMESTAMP, ColumnClass.INTERNAL),
    ]
)
UTC = dt.UTC


def rows() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "email": ["a@x", None],
            "score": [0.5, 1.5],
            "seen": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=UTC), None], pa.timestamp("ms", tz="UTC")
            ),
        }
    )


@pytest.mark.parametrize("name", ["sales", "a", "web-logs_2024.v1", "0abc", "x" * 63])
def test_dataset_names_accepted(name: str) -> None:
    assert check_dataset_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "../x", "a/b", "..", "a..b", "Upper", "-lead", ".hidden", "x" * 64, "sp ace"]
)
def test_dataset_names_refused_with_what_is_allowed(name: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_dataset_name(name)
    assert "lowercase" in str(err.value)
    assert "'..'" in str(err.value)


def test_column_types_map_to_arrow() -> None:
    assert ColumnType.TIMESTAMP.arrow() == pa.timestamp("ms", tz="UTC")
    assert ColumnType.DATE.arrow() == pa.date32()
    assert SCHEMA.to_arrow().field("id").nullable is False
    assert SCHEMA.to_arrow().names == ["id", "email", "score", "seen"]


def test_column_accepts_strings_and_refuses_unknown_values() -> None:
    col = Column("age", "int64", "pii")  # type: ignore[arg-type]
    assert col.type is ColumnType.INT64
    assert col.classification is ColumnClass.PII
    with pytest.raises(InvalidInput, match=r"column age: type 'int32'.*use one of: string"):
        Column("age", "int32", "pii")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="classification 'secret'"):
        Column("age", "int64", "secret")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x" * 129])
def test_bad_column_names(name: str) -> None:
    with pytest.raises(InvalidInput, match="column name"):
        Column(name, ColumnType.STRING, ColumnClass.PUBLIC)


def test_schema_needs_unique_columns() -> None:
    with pytest.raises(InvalidInput, match="at least one column"):
        DatasetSchema([])
    col = Column("a", ColumnType.STRING, ColumnClass.PUBLIC)
    with pytest.raises(InvalidInput, match="'a' is declared twice"):
        DatasetSchema([col, col])


def test_from_arrow_requires_every_column_classified() -> None:
    arrow = pa.schema(
        [("n", pa.int32()), ("s", pa.large_string()), ("t", pa.timestamp("s")), ("d", pa.date64())]
    )
    got = DatasetSchema.from_arrow(arrow, {"n": "public", "s": "pii", "t": "internal", "d": "pii"})
    assert [c.type for c in got.columns] == [
        ColumnType.INT64,
        ColumnType.STRING,
        ColumnType.TIMESTAMP,
        ColumnType.DATE,
    ]
    with pytest.raises(InvalidInput, match=r"no classification for column.*: d"):
        DatasetSchema.from_arrow(arrow, {"n": "public", "s": "pii", "t": "internal"})
    with pytest.raises(InvalidInput, match="does not have: zz"):
        DatasetSchema.from_arrow(
            arrow, {"n": "public", "s": "pii", "t": "pii", "d": "pii", "zz": "pii"}
        )
    with pytest.raises(InvalidInput, match="column l: Arrow type list"):
        DatasetSchema.from_arrow(pa.schema([("l", pa.list_(pa.int64()))]), {"l": "public"})


def test_conform_reorders_and_widens_safely() -> None:
    data = rows()
    shuffled = pa.table(
        {
            "score": data["score"].cast(pa.float32()),
            "seen": data["seen"],
            "email": data["email"].cast(pa.large_string()),
            "id": data["id"].cast(pa.int32()),
        }
    )
    out = conform(shuffled, SCHEMA)
    assert isinstance(out, pa.Table)
    assert out.schema == SCHEMA.to_arrow()
    assert out.equals(conform(data, SCHEMA))
    batch = conform(data.to_batches()[0], SCHEMA)
    assert isinstance(batch, pa.RecordBatch)
    assert batch.num_rows == 2


def test_conform_names_missing_and_extra_columns() -> None:
    data = rows().drop_columns(["email"]).append_column("phone", pa.array(["1", "2"]))
    with pytest.raises(InvalidInput) as err:
        conform(data, SCHEMA)
    assert "missing column(s) email" in err.value.message
    assert "unexpected column(s) phone" in err.value.message
    assert err.value.hint and "id, email, score, seen" in err.value.hint


@pytest.mark.parametrize(
    ("column", "value", "found"),
    [
        ("id", pa.array([1, 2], pa.uint64()), "uint64"),
        ("id", pa.array([1.0, 2.0]), "double"),
        ("score", pa.array([1, 2], pa.int64()), "int64"),
        ("seen", pa.array(["2024-01-01", None]), "string"),
        ("seen", pa.array([dt.datetime(2024, 1, 1)] * 2, pa.timestamp("ms")), "timestamp[ms]"),
    ],
)
def test_conform_refuses_lossy_types(column: str, value: pa.Array, found: str) -> None:
    data = rows()
    data = data.set_column(data.schema.get_field_index(column), column, value)
    with pytest.raises(InvalidInput) as err:
        conform(data, SCHEMA)
    assert err.value.message.startswith(f"column {column}: expected")
    assert f"found {found}" in err.value.message
    assert err.value.hint and f"convert column {column}" in err.value.hint


def test_conform_refuses_nulls_in_non_nullable_column() -> None:
    data = rows().set_column(0, "id", pa.array([1, None], pa.int64()))
    with pytest.raises(InvalidInput, match="column id: 1 null value"):
        conform(data, SCHEMA)


def test_schema_diff_lists_changes() -> None:
    new = DatasetSchema(
        [
            Column("email", ColumnType.STRING, ColumnClass.SENSITIVE),
            Column("id", ColumnType.INT64, ColumnClass.INTERNAL, nullable=True),
            Column("score", ColumnType.INT64, ColumnClass.PUBLIC),
            Column("x", ColumnType.INT64, ColumnClass.PII),
        ]
    )
    assert schema_diff(SCHEMA, new) == [
        "removed column seen timestamp",
        "column email: classification pii -> sensitive",
        "column id: not nullable -> nullable",
        "column score: type float64 -> int64",
        "added column x int64 (pii)",
        "column order: id, email, score -> email, id, score",
    ]
    assert schema_diff(SCHEMA, SCHEMA) == []


def test_columns_pb_round_trip() -> None:
    msgs = columns_to_pb(SCHEMA.columns)
    assert msgs[0] == pb.Column(name="id", type="int64", classification="internal", nullable=False)
    assert DatasetSchema(columns_from_pb(msgs)) == SCHEMA
    with pytest.raises(InvalidInput, match="column 'a' has no type"):
        columns_from_pb([pb.Column(name="a", classification="pii")])
    with pytest.raises(InvalidInput, match="column 'a' has no classification"):
        columns_from_pb([pb.Column(name="a", type="string")])
    with pytest.raises(InvalidInput, match="type 'text'"):
        columns_from_pb([pb.Column(name="a", type="text", classification="pii")])
