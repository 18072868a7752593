"""Unit tests of view policies and the de-identification transforms."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

import numpy as np
import pyarrow as pa
import pytest

from gantry.core import InvalidInput
from gantry.governance.deid import (
    DEFAULT_POLICY,
    ColumnRule,
    DeidKeys,
    Transform,
    ViewPolicy,
    apply_view,
    detokenize,
    policy_from_json,
    policy_to_json,
    rules_from_pb,
    rules_to_pb,
    view_columns,
)
from gantry.governance.schema import Column, ColumnClass, ColumnType, DatasetSchema
from gantry.protos.v1 import governance_pb2 as pb

KEYS = DeidKeys(hash_key=b"h" * 32, token_key=b"t" * 32)
OTHER_KEYS = DeidKeys(hash_key=b"H" * 32, token_key=b"T" * 32)
SCHEMA = DatasetSchema(
    [
        Column("id", ColumnType.INT64, ColumnClass.INTERNAL),
        Column("email", ColumnType.STRING, ColumnClass.PII),
        Column("zip", ColumnType.STRING, ColumnClass.PII),
        Column("born", ColumnType.DATE, ColumnClass.PII),
        Column("seen", ColumnType.TIMESTAMP, ColumnClass.INTERNAL),
        Column("age", ColumnType.INT64, ColumnClass.SENSITIVE),
        Column("income", ColumnType.FLOAT64, ColumnClass.SENSITIVE),
        Column("photo", ColumnType.BINARY, ColumnClass.PII),
        Column("flag", ColumnType.BOOL, ColumnClass.PUBLIC),
    ]
)


def rows() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "email": ["a@x", "b@x", "a@x", None],
            "zip": ["10115", "80331", "1", None],
            "born": pa.array(
                [dt.date(1990, 5, 17), dt.date(1985, 12, 1), None, dt.date(2001, 1, 1)]
            ),
            "seen": pa.array(
                [dt.datetime(2024, 3, 9, 12, tzinfo=dt.UTC)] * 4, pa.timestamp("ms", tz="UTC")
            ),
            "age": pa.array([37, -3, None, 64], pa.int64()),
            "income": [1234.5, -0.5, None, 99.0],
            "photo": pa.array([b"\x00\x01", b"", None, b"\x00\x01"], pa.binary()),
            "flag": [True, False, None, True],
        },
        schema=SCHEMA.to_arrow(),
    )


def rule(target: str, transform: str, **params: str) -> ColumnRule:
    if target in {c.value for c in ColumnClass}:
        return ColumnRule(
            classification=ColumnClass(target), transform=Transform(transform), params=params
        )
    return ColumnRule(column=target, transform=Transform(transform), params=params)


def view(policy: ViewPolicy, keys: DeidKeys = KEYS, seed: bytes = b"shard-1") -> pa.Table:
    return apply_view(rows(), SCHEMA, policy, keys, view="deidentified", noise_seed=seed)


def test_raw_view_is_unchanged() -> None:
    data = rows()
    assert apply_view(data, SCHEMA, DEFAULT_POLICY, KEYS, view="raw") is data
    with pytest.raises(InvalidInput, match="view 'peek'"):
        apply_view(data, SCHEMA, DEFAULT_POLICY, KEYS, view="peek")


def test_default_policy() -> None:
    out = view(DEFAULT_POLICY)
    assert out.column_names == ["id", "email", "zip", "born", "seen", "photo", "flag"]
    assert out["id"].equals(rows()["id"])
    assert out.schema.field("born").type == pa.string()
    assert out.schema == pa.schema([c.field() for c in view_columns(SCHEMA, DEFAULT_POLICY)])


def test_column_rule_beats_class_and_missing_class_drops() -> None:
    policy = ViewPolicy([rule("pii", "hash"), rule("zip", "keep"), rule("age", "keep")])
    assert policy.rule_for(SCHEMA.column("zip")).transform == Transform.KEEP
    assert policy.rule_for(SCHEMA.column("email")).transform == Transform.HASH
    assert policy.rule_for(SCHEMA.column("income")).transform == Transform.DROP
    out = view(policy)
    # internal and public have no rule: deny by default; sensitive age is kept by name.
    assert out.column_names == ["email", "zip", "born", "age", "photo"]
    assert out["zip"].equals(rows()["zip"])


def test_hash_is_keyed_deterministic_and_null_preserving() -> None:
    out = view(DEFAULT_POLICY)
    email = out["email"].to_pylist()
    expected = hmac.new(KEYS.hash_key, b"a@x", hashlib.sha256).hexdigest()[:32]
    assert email == [expected, email[1], expected, None]
    assert email[1] != expected
    assert len(email[1]) == 32
    # Joins work across tables of the dataset: the same value hashes the same in any table.
    other_table = apply_view(
        rows().slice(2), SCHEMA, DEFAULT_POLICY, KEYS, view="deidentified", noise_seed=b"s2"
    )
    assert other_table["email"][0].as_py() == expected
    # Another dataset's key gives unrelated hashes.
    assert view(DEFAULT_POLICY, keys=OTHER_KEYS)["email"][0].as_py() != expected
    photo = out["photo"].to_pylist()
    assert photo[0] == photo[3] != photo[1]
    assert photo[2] is None
    born = out["born"].to_pylist()
    assert born[0] == hmac.new(KEYS.hash_key, b"1990-05-17", hashlib.sha256).hexdigest()[:32]


def test_tokenize_round_trip() -> None:
    policy = ViewPolicy(
        [rule("email", "tokenize"), rule("age", "tokenize"), rule("born", "tokenize")]
    )
    out = view(policy)
    tokens = out["email"].to_pylist()
    assert tokens[0] == tokens[2] != tokens[1]
    assert tokens[3] is None
    assert tokens[0].startswith("tok_") and "=" not in tokens[0]
    assert detokenize(tokens[0], KEYS) == "a@x"
    assert detokenize(out["age"][1].as_py(), KEYS) == "-3"
    assert detokenize(out["born"][0].as_py(), KEYS) == "1990-05-17"
    with pytest.raises(InvalidInput, match="not made with this dataset's keys"):
        detokenize(tokens[0], OTHER_KEYS)
    with pytest.raises(InvalidInput, match="is not a token"):
        detokenize("a@x", KEYS)
    with pytest.raises(InvalidInput, match="not made with"):
        detokenize("tok_!!!", KEYS)


def test_generalize_dates_numbers_and_prefixes() -> None:
    policy = ViewPolicy(
        [
            rule("born", "generalize", date="year"),
            rule("seen", "generalize", date="month"),
            rule("age", "generalize", bucket="10"),
            rule("income", "generalize", bucket="0.5"),
            rule("zip", "generalize", prefix="2"),
        ]
    )
    out = view(policy)
    assert out["born"].to_pylist() == [1990, 1985, None, 2001]
    assert out.schema.field("born").type == pa.int64()
    assert out["seen"].to_pylist() == ["2024-03"] * 4
    assert out["age"].to_pylist() == [30, -10, None, 60]
    assert out["income"].to_pylist() == [1234.5, -0.5, None, 99.0]
    assert out["zip"].to_pylist() == ["10", "80", "1", None]
    coarse = view(ViewPolicy([rule("income", "generalize", bucket="100")]))
    assert coarse["income"].to_pylist() == [1200.0, -100.0, None, 0.0]
    month = view(ViewPolicy([rule("born", "generalize", date="month")]))
    assert month["born"].to_pylist() == ["1990-05", "1985-12", None, "2001-01"]


def test_noise_is_deterministic_and_changes_values() -> None:
    n = 2000
    schema = DatasetSchema(
        [
            Column("a", ColumnType.FLOAT64, ColumnClass.SENSITIVE),
            Column("b", ColumnType.INT64, ColumnClass.SENSITIVE),
        ]
    )
    data = pa.table(
        {"a": pa.array(np.zeros(n)), "b": pa.array([1000] * (n - 1) + [None], pa.int64())},
        schema=schema.to_arrow(),
    )
    policy = ViewPolicy([rule("sensitive", "noise", scale="2.0")])

    def read(seed: bytes, keys: DeidKeys = KEYS) -> pa.Table:
        return apply_view(data, schema, policy, keys, view="deidentified", noise_seed=seed)

    first = read(b"v1/shard-0")
    assert first.equals(read(b"v1/shard-0"))
    a = first["a"].to_numpy()
    assert np.count_nonzero(a) == n
    assert np.mean(np.abs(a)) == pytest.approx(2.0, rel=0.15)  # Laplace: E|x| = scale
    assert not np.array_equal(a, first["b"].to_numpy(zero_copy_only=False)[:n] - 1000)
    b = first["b"].to_pylist()
    assert b[-1] is None
    assert sum(v != 1000 for v in b[:-1]) > n // 2
    assert first.schema.field("b").type == pa.int64()
    assert not read(b"v1/shard-1")["a"].equals(first["a"])
    assert not read(b"v1/shard-0", OTHER_KEYS)["a"].equals(first["a"])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"transform": "generalize"}, "exactly one of date, bucket or prefix"),
        ({"transform": "generalize", "params": {"date": "week"}}, "'week' is not year or month"),
        ({"transform": "generalize", "params": {"bucket": "-1"}}, "not a positive number"),
        ({"transform": "generalize", "params": {"bucket": "nan"}}, "not a positive number"),
        ({"transform": "generalize", "params": {"prefix": "2.5"}}, "positive whole number"),
        ({"transform": "generalize", "params": {"prefix": "1", "bucket": "1"}}, "exactly one"),
        ({"transform": "noise"}, "noise needs a scale"),
        ({"transform": "noise", "params": {"scale": "0"}}, "not a positive number"),
        ({"transform": "hash", "params": {"salt": "x"}}, "hash takes no parameter"),
        ({"transform": "shuffle"}, "transform 'shuffle'"),
    ],
)
def test_rule_parameters_are_validated(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        ColumnRule(column="x", **params)  # type: ignore[arg-type]


def test_rule_needs_one_target_and_policy_one_rule_each() -> None:
    with pytest.raises(InvalidInput, match="either a column or a classification"):
        ColumnRule(transform=Transform.KEEP)
    with pytest.raises(InvalidInput, match="either a column or a classification"):
        ColumnRule(column="a", classification=ColumnClass.PII, transform=Transform.KEEP)
    with pytest.raises(InvalidInput, match="two view rules for class pii"):
        ViewPolicy([rule("pii", "hash"), rule("pii", "drop")])


@pytest.mark.parametrize(
    ("bad", "column"),
    [
        (rule("email", "generalize", date="year"), "email"),
        (rule("born", "generalize", prefix="2"), "born"),
        (rule("zip", "generalize", bucket="10"), "zip"),
        (rule("age", "generalize", bucket="2.5"), "age"),
        (rule("email", "noise", scale="1"), "email"),
        (rule("flag", "generalize", bucket="1"), "flag"),
        (rule("photo", "tokenize"), "photo"),
        (rule("pii", "noise", scale="1"), "email"),
    ],
)
def test_policy_check_refuses_type_mismatches(bad: ColumnRule, column: str) -> None:
    policy = ViewPolicy([bad])
    with pytest.raises(InvalidInput, match=f"column {column} "):
        policy.check(SCHEMA)
    with pytest.raises(InvalidInput):
        view(policy)


def test_policy_check_refuses_unknown_columns() -> None:
    with pytest.raises(InvalidInput, match="column emial: the dataset has no such column"):
        ViewPolicy([rule("emial", "drop")]).check(SCHEMA)


def test_policy_json_is_canonical_and_round_trips() -> None:
    policy = ViewPolicy([rule("zip", "generalize", prefix="3"), *DEFAULT_POLICY.rules])
    reordered = ViewPolicy([*reversed(DEFAULT_POLICY.rules), rule("zip", "generalize", prefix="3")])
    text = policy_to_json(policy)
    assert text == policy_to_json(reordered)
    assert policy_from_json(text) == ViewPolicy(sorted(policy.rules, key=lambda r: r.target))
    assert policy_to_json(policy_from_json(text)) == text
    numeric = '{"rules": [{"column": "zip", "transform": "generalize", "params": {"prefix": 3}}]}'
    assert policy_from_json(numeric).rules[0].params == {"prefix": "3"}
    with pytest.raises(InvalidInput, match="not valid JSON"):
        policy_from_json("{")
    with pytest.raises(InvalidInput, match="transform 'blur'"):
        policy_from_json('{"rules": [{"column": "a", "transform": "blur"}]}')


def test_rules_pb_round_trip() -> None:
    rules = [rule("zip", "generalize", prefix="3"), rule("pii", "hash")]
    msgs = rules_to_pb(rules)
    assert msgs[0] == pb.ColumnRule(column="zip", transform="generalize", params={"prefix": "3"})
    assert msgs[1] == pb.ColumnRule(classification="pii", transform="hash")
    assert rules_from_pb(msgs) == rules
    with pytest.raises(InvalidInput, match="classification 'secret'"):
        rules_from_pb([pb.ColumnRule(classification="secret", transform="drop")])


def test_keys_are_checked_and_hidden() -> None:
    with pytest.raises(InvalidInput, match="at least 16 bytes"):
        DeidKeys(hash_key=b"short", token_key=b"t" * 32)
    assert "hhhh" not in repr(KEYS)


def test_large_table_sanity() -> None:
    """A shard-sized read with repeated pii values (not timed: CI machines vary)."""
    n = 1_000_000
    schema = DatasetSchema(
        [
            Column("user", ColumnType.STRING, ColumnClass.PII),
            Column("day", ColumnType.DATE, ColumnClass.INTERNAL),
            Column("x", ColumnType.FLOAT64, ColumnClass.PUBLIC),
            Column("y", ColumnType.INT64, ColumnClass.PUBLIC),
        ]
    )
    idx = np.arange(n)
    data = pa.table(
        {
            "user": pa.array([f"user-{i}" for i in range(100_000)]).take(pa.array(idx % 100_000)),
            "day": pa.array(idx % 20_000, pa.int32()).cast(pa.date32()),
            "x": pa.array(idx * 0.5),
            "y": pa.array(idx),
        },
        schema=schema.to_arrow(),
    )
    policy = ViewPolicy([*DEFAULT_POLICY.rules, rule("day", "generalize", date="year")])
    out = apply_view(data, schema, policy, KEYS, view="deidentified")
    assert out.num_rows == n
    assert out["user"][0] == out["user"][100_000]
    assert len(out["user"].unique()) == 100_000
    assert out["day"][0].as_py() == 1970
