"""De-identified views: which transform each column gets, and applying them to a table.

A :class:`ViewPolicy` maps columns to transforms: a rule naming the column wins, else the rule
for the column's classification, else the column is dropped (deny by default). Transforms are
deterministic per dataset (hash and tokenize use the dataset's :class:`DeidKeys`; noise is
seeded per read unit), so re-reading a version gives the same values and hashed columns still
join across the dataset's tables.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gantry.core import InvalidInput
from gantry.governance.schema import Column, ColumnClass, ColumnType, DatasetSchema, parse_enum
from gantry.protos.v1 import governance_pb2 as pb

_TOKEN_PREFIX = "tok_"  # noqa: S105 -- a marker, not a secret


class Transform(StrEnum):
    """What a view does to a column."""

    KEEP = "keep"
    DROP = "drop"
    HASH = "hash"
    TOKENIZE = "tokenize"
    GENERALIZE = "generalize"
    NOISE = "noise"


class View(StrEnum):
    """The two ways a table dataset can be read."""

    RAW = "raw"
    DEIDENTIFIED = "deidentified"


_PARAMS: dict[Transform, frozenset[str]] = {
    Transform.GENERALIZE: frozenset({"date", "bucket", "prefix"}),
    Transform.NOISE: frozenset({"scale"}),
}


def _positive(value: str, what: str, *, integer: bool = False) -> float:
    try:
        number = float(int(value)) if integer else float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        kind = "positive whole number" if integer else "positive number"
        raise InvalidInput(f"{what} {value!r} is not a {kind}", hint=f"write a {kind}, e.g. '10'")
    return number


@dataclass(frozen=True, kw_only=True)
class ColumnRule:
    """One rule of a view policy: for a named ``column``, or for every column of a
    ``classification``; ``params`` configure generalize and noise.
    """

    transform: Transform
    column: str = ""
    classification: ColumnClass | None = None
    params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "transform", parse_enum(Transform, self.transform, "transform"))
        if bool(self.column) == (self.classification is not None):
            raise InvalidInput(
                "a view rule needs either a column or a classification, not both or neither",
                hint="set column for a per-column rule, or classification for a class default",
            )
        if self.classification is not None:
            klass = parse_enum(ColumnClass, self.classification, "classification")
            object.__setattr__(self, "classification", klass)
        # A copy, with values as text whatever the JSON or caller gave (10 and "10" alike).
        object.__setattr__(self, "params", {str(k): str(v) for k, v in self.params.items()})
        allowed = _PARAMS.get(self.transform, frozenset())
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            raise InvalidInput(
                f"rule for {self.target}: {self.transform} takes no parameter(s) "
                f"{', '.join(unknown)}",
                hint=f"allowed: {', '.join(sorted(allowed)) or 'none'}",
            )
        where = f"rule for {self.target}:"
        if self.transform == Transform.GENERALIZE:
            if len(self.params) != 1:
                raise InvalidInput(
                    f"{where} generalize needs exactly one of date, bucket or prefix",
                    hint="e.g. {date: year}, {bucket: '10'} or {prefix: '3'}",
                )
            if self.params.get("date", "year") not in ("year", "month"):
                raise InvalidInput(
                    f"{where} date {self.params['date']!r} is not year or month",
                    hint="write date: year or date: month",
                )
            if "bucket" in self.params:
                _positive(self.params["bucket"], f"{where} bucket")
            if "prefix" in self.params:
                _positive(self.params["prefix"], f"{where} prefix", integer=True)
        if self.transform == Transform.NOISE:
            if "scale" not in self.params:
                raise InvalidInput(f"{where} noise needs a scale", hint="e.g. {scale: '1.0'}")
            _positive(self.params["scale"], f"{where} noise scale")

    @property
    def target(self) -> str:
        """What the rule applies to, for messages: ``column email`` or ``class pii``."""
        return f"column {self.column}" if self.column else f"class {self.classification}"

    def check(self, column: Column) -> None:
        """Raise :class:`InvalidInput` when this rule cannot apply to ``column``'s type."""
        t, p = column.type, self.params
        ok = True
        if self.transform == Transform.GENERALIZE:
            if "date" in p:
                ok = t in (ColumnType.DATE, ColumnType.TIMESTAMP)
            elif "bucket" in p:
                ok = t.numeric and (t == ColumnType.FLOAT64 or float(p["bucket"]).is_integer())
            else:
                ok = t == ColumnType.STRING
        elif self.transform == Transform.NOISE:
            ok = t.numeric
        elif self.transform == Transform.TOKENIZE:
            ok = t != ColumnType.BINARY
        if not ok:
            raise InvalidInput(
                f"column {column.name} ({t}): {self.transform} {dict(p) or ''} does not apply "
                f"to {t} columns (rule for {self.target})",
                hint="generalize: date for date/timestamp, bucket for numbers (whole for int64), "
                "prefix for strings; noise for numbers; tokenize for anything but binary",
            )


@dataclass(frozen=True)
class ViewPolicy:
    """The rules of a dataset's de-identified view; at most one rule per column and per class."""

    rules: tuple[ColumnRule, ...]

    def __init__(self, rules: Iterable[ColumnRule]) -> None:
        rules = tuple(rules)
        seen: set[str] = set()
        for rule in rules:
            if rule.target in seen:
                raise InvalidInput(
                    f"two view rules for {rule.target}", hint="keep one rule per column and class"
                )
            seen.add(rule.target)
        object.__setattr__(self, "rules", rules)

    def rule_for(self, column: Column) -> ColumnRule:
        """The rule for ``column``: its own, else its class's, else drop."""
        by_class = None
        for rule in self.rules:
            if rule.column == column.name:
                return rule
            if rule.classification == column.classification:
                by_class = rule
        return by_class or ColumnRule(
            classification=column.classification, transform=Transform.DROP
        )

    def check(self, schema: DatasetSchema) -> None:
        """Raise :class:`InvalidInput` unless every rule fits ``schema`` (names and types)."""
        names = set(schema.names)
        for rule in self.rules:
            if rule.column and rule.column not in names:
                raise InvalidInput(
                    f"view rule for column {rule.column}: the dataset has no such column",
                    hint=f"columns are: {', '.join(schema.names)}",
                )
        for column in schema.columns:
            self.rule_for(column).check(column)


DEFAULT_POLICY = ViewPolicy(
    [
        ColumnRule(classification=ColumnClass.PUBLIC, transform=Transform.KEEP),
        ColumnRule(classification=ColumnClass.INTERNAL, transform=Transform.KEEP),
        ColumnRule(classification=ColumnClass.PII, transform=Transform.HASH),
        ColumnRule(classification=ColumnClass.SENSITIVE, transform=Transform.DROP),
    ]
)
"""The policy of a dataset nobody has set one for: keep public and internal, hash pii, drop
sensitive."""


@dataclass(frozen=True)
class DeidKeys:
    """A dataset's de-identification secrets (at least 16 bytes each; never logged)."""

    hash_key: bytes = field(repr=False)
    token_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.hash_key) < 16 or len(self.token_key) < 16:
            raise InvalidInput(
                "de-identification keys must be at least 16 bytes",
                hint="generate them with secrets.token_bytes(32)",
            )

    def _siv(self) -> AESSIV:
        info = b"gantry.deid.tokenize.v1"
        key = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=info)
        return AESSIV(key.derive(self.token_key))


class _Hmac:
    """HMAC-SHA256 with the keyed inner and outer states computed once (RFC 2104).

    Equal to :func:`hmac.digest` but several times faster per value, which matters because
    every read hashes each distinct value of every hashed column.
    """

    def __init__(self, key: bytes) -> None:
        block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def hexdigest(self, message: bytes) -> str:
        return self.digest(message).hex()


def _canonical(arr: pa.Array, kind: ColumnType) -> list[bytes | None]:
    """Bytes that stand for each value, the same in every table of the dataset."""
    if kind == ColumnType.BINARY:
        return arr.to_pylist()  # type: ignore[no-any-return]
    if kind != ColumnType.STRING:
        arr = pc.cast(arr, pa.string())
    return [None if v is None else v.encode() for v in arr.to_pylist()]


#: Bytes of a keyed digest: the 128 bits whose hex form the ``hash`` transform shows.
DIGEST_BYTES = 16


class KeyedDigests:
    """The ``hash`` transform's values as raw bytes, for indexing and matching data subjects.

    A value's digest is the first :data:`DIGEST_BYTES` bytes of HMAC-SHA256 under the dataset's
    hash key over the value's canonical bytes (text as UTF-8, binary as is, numbers, dates and
    booleans as their text form), so ``digest.hex()`` is exactly what the de-identified view
    shows for the value.
    """

    def __init__(self, keys: DeidKeys) -> None:
        self._mac = _Hmac(keys.hash_key)

    def of(self, canonical: bytes) -> bytes:
        """The digest of one value's canonical bytes."""
        return self._mac.digest(canonical)[:DIGEST_BYTES]

    def distinct(
        self, column: pa.ChunkedArray | pa.Array, kind: ColumnType
    ) -> tuple[list[bytes], pa.Array]:
        """The digest of each distinct non-null value of ``column``, and for each row the index
        of its value in that list (null for a null)."""
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        encoded = pc.dictionary_encode(arr)
        values = _canonical(encoded.dictionary, kind)
        return [self.of(v if v is not None else b"") for v in values], encoded.indices


def _per_distinct(column: pa.ChunkedArray, kind: ColumnType, fn: Callable[[bytes], str]) -> Any:
    """Apply ``fn`` once per distinct value: reads repeat values a lot, HMACs are not free."""
    encoded = pc.dictionary_encode(column.combine_chunks())
    values = [None if v is None else fn(v) for v in _canonical(encoded.dictionary, kind)]
    return pa.array(values, pa.string()).take(encoded.indices)


def _numbers(column: pa.ChunkedArray) -> tuple[Any, Any]:
    arr = column.combine_chunks()
    return arr.fill_null(0).to_numpy(zero_copy_only=False), arr.is_null().to_numpy(
        zero_copy_only=False
    )


def _noise_seed(keys: DeidKeys, noise_seed: bytes, column: str) -> int:
    message = b"gantry.deid.noise\x00" + struct.pack(">I", len(noise_seed)) + noise_seed
    return int.from_bytes(hmac.digest(keys.hash_key, message + column.encode(), "sha256"))


def _transform(
    rule: ColumnRule, column: Column, data: pa.ChunkedArray, keys: DeidKeys, noise_seed: bytes
) -> Any:
    t = rule.transform
    if t == Transform.KEEP:
        return data
    if t == Transform.HASH:
        mac = _Hmac(keys.hash_key)
        return _per_distinct(data, column.type, lambda v: mac.hexdigest(v)[:32])
    if t == Transform.TOKENIZE:
        siv = keys._siv()
        return _per_distinct(data, column.type, lambda v: _token(siv.encrypt(v, None)))
    if t == Transform.GENERALIZE:
        p = rule.params
        if p.get("date") == "year":
            return pc.year(data)
        if p.get("date") == "month":
            return pc.strftime(data, "%Y-%m")
        if "prefix" in p:
            return pc.utf8_slice_codeunits(data, 0, int(p["prefix"]))
        values, nulls = _numbers(data)
        if column.type == ColumnType.INT64:
            bucket = int(float(p["bucket"]))
            return pa.array((values // bucket) * bucket, pa.int64(), mask=nulls)
        bucket_f = float(p["bucket"])
        return pa.array(np.floor(values / bucket_f) * bucket_f, pa.float64(), mask=nulls)
    # Noise: drawn for the whole column from a seed that only the keys' holder can derive, so
    # the same read gives the same noise and nobody can regenerate and subtract it.
    values, nulls = _numbers(data)
    rng = np.random.Generator(np.random.PCG64(_noise_seed(keys, noise_seed, column.name)))
    noise = rng.laplace(0.0, float(rule.params["scale"]), size=len(values))
    if column.type == ColumnType.INT64:
        return pa.array(values + np.rint(noise).astype(np.int64), pa.int64(), mask=nulls)
    return pa.array(values + noise, pa.float64(), mask=nulls)


def _token(ciphertext: bytes) -> str:
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(ciphertext).rstrip(b"=").decode()


def detokenize(token: str, keys: DeidKeys) -> str:
    """The original value (as text) behind a ``tok_`` token made with ``keys``."""
    hint = "pass a tok_ value from this dataset's de-identified view"
    if not token.startswith(_TOKEN_PREFIX):
        raise InvalidInput(
            f"{token!r} is not a token (tokens start with {_TOKEN_PREFIX})", hint=hint
        )
    body = token[len(_TOKEN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return keys._siv().decrypt(raw, None).decode()
    except (ValueError, InvalidTag):
        raise InvalidInput("the token was not made with this dataset's keys", hint=hint) from None


def view_columns(schema: DatasetSchema, policy: ViewPolicy) -> list[Column]:
    """The columns the de-identified view of ``schema`` has under ``policy``."""
    out = []
    for column in schema.columns:
        rule = policy.rule_for(column)
        kind = column.type
        if rule.transform == Transform.DROP:
            continue
        if rule.transform in (Transform.HASH, Transform.TOKENIZE):
            kind = ColumnType.STRING
        elif rule.transform == Transform.GENERALIZE and "date" in rule.params:
            kind = ColumnType.INT64 if rule.params["date"] == "year" else ColumnType.STRING
        out.append(Column(column.name, kind, column.classification, column.nullable))
    return out


def apply_view(
    table: pa.Table,
    schema: DatasetSchema,
    policy: ViewPolicy,
    keys: DeidKeys,
    *,
    view: str,
    noise_seed: bytes = b"",
) -> pa.Table:
    """``table`` (rows of ``schema``) as the ``view`` shows them.

    ``raw`` returns it unchanged; ``deidentified`` applies ``policy`` column by column, in
    the shape :func:`view_columns` describes. ``noise_seed`` should name the read unit (e.g.
    the shard id) so each shard's rows get their own noise, the same on every read.
    """
    if parse_enum(View, view, "view") == View.RAW:
        return table
    policy.check(schema)
    columns = view_columns(schema, policy)
    arrays = []
    for out in columns:
        source = schema.column(out.name)
        if out.name not in table.schema.names:
            raise InvalidInput(
                f"the table has no column {out.name} that the schema declares",
                hint="pass the rows of the version the schema belongs to",
            )
        data = table.column(out.name)
        arrays.append(_transform(policy.rule_for(source), source, data, keys, noise_seed))
    return pa.Table.from_arrays(arrays, schema=pa.schema([c.field() for c in columns]))


def _rule_dict(rule: ColumnRule) -> dict[str, Any]:
    return {
        "column": rule.column,
        "classification": rule.classification.value if rule.classification else "",
        "transform": rule.transform.value,
        "params": dict(rule.params),
    }


def _rule_of(
    column: str, classification: str, transform: str, params: Mapping[str, str]
) -> ColumnRule:
    klass = parse_enum(ColumnClass, classification, "classification") if classification else None
    return ColumnRule(
        column=column,
        classification=klass,
        transform=parse_enum(Transform, transform, "transform"),
        params=params,
    )


def policy_to_json(policy: ViewPolicy) -> str:
    """``policy`` as canonical JSON: equal policies give equal text, whatever the rule order."""
    rules = sorted(
        (_rule_dict(r) for r in policy.rules), key=lambda d: (d["column"], d["classification"])
    )
    return json.dumps({"rules": rules}, sort_keys=True, separators=(",", ":"))


def policy_from_json(text: str) -> ViewPolicy:
    """The policy :func:`policy_to_json` wrote; :class:`InvalidInput` when malformed."""
    try:
        rules = json.loads(text)["rules"]
        return ViewPolicy(
            _rule_of(
                r.get("column", ""),
                r.get("classification", ""),
                r["transform"],
                r.get("params", {}),
            )
            for r in rules
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(
            f"a view policy is not valid JSON of the expected shape: {exc}",
            hint='write {"rules": [{"column" or "classification", "transform", "params"}]}',
        ) from None


def rules_from_pb(rules: Iterable[pb.ColumnRule]) -> list[ColumnRule]:
    """Rules from their protobuf form, validated."""
    return [_rule_of(r.column, r.classification, r.transform, dict(r.params)) for r in rules]


def rules_to_pb(rules: Iterable[ColumnRule]) -> list[pb.ColumnRule]:
    """The protobuf form of ``rules``."""
    return [pb.ColumnRule(**_rule_dict(r)) for r in rules]


__all__ = [
    "DEFAULT_POLICY",
    "DIGEST_BYTES",
    "ColumnRule",
    "DeidKeys",
    "KeyedDigests",
    "Transform",
    "View",
    "ViewPolicy",
    "apply_view",
    "detokenize",
    "policy_from_json",
    "policy_to_json",
    "rules_from_pb",
    "rules_to_pb",
    "view_columns",
]
