"""What users write about their data: columns, view rules and version references.

A dataset's columns come from ``--column name:type:class`` or a schema file; a view policy
from a policy file; a dataset version is named ``NAME@VERSION``. Each is parsed here into a
small frozen value that checks itself and, when it is wrong, says what to write instead::

    # schema.yaml                          # policy.yaml
    columns:                               rules:
      - {name: id, type: int64,              - {class: pii, transform: hash}
         class: internal, nullable: false}   - {column: dob, transform: generalize,
      - {name: email, type: string,             params: {date: year}}
         class: pii}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gantry.core import InvalidInput
from gantry.protos.v1 import governance_pb2 as pb

#: Column types a table dataset may declare.
COLUMN_TYPES = ("string", "int64", "float64", "bool", "date", "timestamp", "binary")
#: Data classifications, from least to most sensitive.
CLASSIFICATIONS = ("public", "internal", "pii", "sensitive")
#: What a view rule may do to a column.
TRANSFORMS = ("keep", "drop", "hash", "tokenize", "generalize", "noise")
#: How a dataset can be read: the stored values, or through the view policy.
VIEWS = ("raw", "deidentified")
#: Dataset formats.
FORMATS = ("table", "files")

_COLUMN_SYNTAX = (
    "expected name:type:class, e.g. email:string:pii (add :required for a column that may "
    f"not be null); types: {', '.join(COLUMN_TYPES)}; classes: {', '.join(CLASSIFICATIONS)}"
)


@dataclass(frozen=True)
class ColumnSpec:
    """A column of a table dataset: its name, type, classification and nullability."""

    name: str
    type: str
    classification: str
    nullable: bool = True

    def check(self, where: str = "") -> ColumnSpec:
        """This column if its type and class are known; else :class:`InvalidInput`."""
        at = f"{where}: " if where else ""
        if not self.name or self.name != self.name.strip():
            raise InvalidInput(f"{at}column name {self.name!r} is empty or has spaces around it")
        if self.type not in COLUMN_TYPES:
            raise InvalidInput(
                f"{at}column {self.name!r}: unknown type {self.type!r}",
                hint="use one of " + ", ".join(COLUMN_TYPES),
            )
        if self.classification not in CLASSIFICATIONS:
            raise InvalidInput(
                f"{at}column {self.name!r}: unknown class {self.classification!r}",
                hint="use one of " + ", ".join(CLASSIFICATIONS),
            )
        return self

    @classmethod
    def parse(cls, text: str) -> ColumnSpec:
        """A column from ``name:type:class`` or ``name:type:class:required``."""
        parts = text.split(":")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "required"):
            raise InvalidInput(f"invalid column {text!r}: {_COLUMN_SYNTAX}")
        name, type_, klass = (p.strip() for p in parts[:3])
        if not name or type_ not in COLUMN_TYPES or klass not in CLASSIFICATIONS:
            raise InvalidInput(f"invalid column {text!r}: {_COLUMN_SYNTAX}")
        return cls(name, type_, klass, nullable=len(parts) == 3)

    def __str__(self) -> str:
        return f"{self.name}:{self.type}:{self.classification}" + (
            "" if self.nullable else ":required"
        )

    def to_pb(self) -> pb.Column:
        """As the protocol message."""
        return pb.Column(
            name=self.name,
            type=self.type,
            classification=self.classification,
            nullable=self.nullable,
        )

    @classmethod
    def from_pb(cls, m: pb.Column) -> ColumnSpec:
        """From the protocol message."""
        return cls(m.name, m.type, m.classification, m.nullable)


@dataclass(frozen=True)
class ColumnRule:
    """One rule of a view policy: a transform for one column, or for every column of a class.

    Exactly one of ``column`` and ``classification`` is set. ``params`` depend on the
    transform: generalize takes ``date: year|month``, ``bucket: "10"`` or ``prefix: "3"``;
    noise takes ``scale: "1.0"``.
    """

    transform: str
    column: str = ""
    classification: str = ""
    params: Mapping[str, str] = field(default_factory=dict)

    def check(self, where: str = "") -> ColumnRule:
        """This rule if it is well formed; else :class:`InvalidInput` saying what to write."""
        at = f"{where}: " if where else ""
        if bool(self.column) == bool(self.classification):
            raise InvalidInput(
                f"{at}a rule names either a column or a class, not "
                + ("both" if self.column else "neither"),
                hint="e.g. {column: dob, transform: generalize} or {class: pii, transform: hash}",
            )
        if self.classification and self.classification not in CLASSIFICATIONS:
            raise InvalidInput(
                f"{at}unknown class {self.classification!r}",
                hint="use one of " + ", ".join(CLASSIFICATIONS),
            )
        if self.transform not in TRANSFORMS:
            raise InvalidInput(
                f"{at}unknown transform {self.transform!r}",
                hint="use one of " + ", ".join(TRANSFORMS),
            )
        return self

    def to_pb(self) -> pb.ColumnRule:
        """As the protocol message."""
        return pb.ColumnRule(
            column=self.column,
            classification=self.classification,
            transform=self.transform,
            params=dict(self.params),
        )

    @classmethod
    def from_pb(cls, m: pb.ColumnRule) -> ColumnRule:
        """From the protocol message."""
        return cls(m.transform, m.column, m.classification, dict(m.params))

    def to_dict(self) -> dict[str, Any]:
        """As written in a policy file."""
        out: dict[str, Any] = (
            {"column": self.column} if self.column else {"class": self.classification}
        )
        out["transform"] = self.transform
        if self.params:
            out["params"] = dict(self.params)
        return out


class VersionRef(NamedTuple):
    """A dataset version, written ``NAME@VERSION`` (a version id or a unique prefix of one)."""

    dataset: str
    version: str

    @classmethod
    def parse(cls, text: str) -> VersionRef:
        """From ``NAME@VERSION``."""
        name, sep, version = text.partition("@")
        if not sep or not name or not version or "@" in version:
            raise InvalidInput(
                f"invalid dataset version {text!r}",
                hint="write NAME@VERSION, e.g. customers@3f9a1c2b7d4e (see 'gantry data log')",
            )
        return cls(name, version)

    def __str__(self) -> str:
        return f"{self.dataset}@{self.version}"


# ---------------------------------------------------------------------- files


def load_yaml(path: str | Path) -> Any:
    """The YAML document in ``path``; :class:`InvalidInput` if it is unreadable or malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidInput(f"can't read {path}: {reason or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InvalidInput(f"{path} is not valid YAML{where}: {problem}") from None


def parse_schema(doc: Any, *, source: str = "schema") -> list[ColumnSpec]:
    """The columns of a schema document: ``{columns: [{name, type, class, nullable}]}``."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("columns"), list):
        raise InvalidInput(
            f"{source}: expected a mapping with a 'columns' list",
            hint="write columns: [{name: email, type: string, class: pii, nullable: true}]",
        )
    unknown = sorted(set(doc) - {"columns"})
    if unknown:
        raise InvalidInput(f"{source}: unknown key {unknown[0]!r}; the only key is 'columns'")
    columns: list[ColumnSpec] = []
    for i, item in enumerate(doc["columns"]):
        where = f"{source}: columns[{i}]"
        entry = _entry(item, where, required=("name", "type", "class"), optional=("nullable",))
        nullable = entry.get("nullable", True)
        if not isinstance(nullable, bool):
            raise InvalidInput(f"{where}: nullable must be true or false, not {nullable!r}")
        spec = ColumnSpec(str(entry["name"]), str(entry["type"]), str(entry["class"]), nullable)
        columns.append(spec.check(where))
    if not columns:
        raise InvalidInput(f"{source}: 'columns' is empty; a table needs at least one column")
    seen: set[str] = set()
    for c in columns:
        if c.name in seen:
            raise InvalidInput(f"{source}: column {c.name!r} is declared twice")
        seen.add(c.name)
    return columns


def load_schema(path: str | Path) -> list[ColumnSpec]:
    """The columns declared in a schema YAML file (see :func:`parse_schema`)."""
    return parse_schema(load_yaml(path), source=str(path))


def parse_policy(doc: Any, *, source: str = "policy") -> list[ColumnRule]:
    """The rules of a policy document: ``{rules: [...]}`` (a bare list of rules is taken too).

    A rule is ``{class: C, transform: T}`` or ``{column: NAME, transform: T}`` with optional
    ``params: {key: value}``; values are sent as text.
    """
    rules_doc = doc.get("rules") if isinstance(doc, Mapping) else doc
    if isinstance(doc, Mapping) and sorted(set(doc) - {"rules"}):
        raise InvalidInput(
            f"{source}: unknown key {sorted(set(doc) - {'rules'})[0]!r}; the only key is 'rules'"
        )
    if not isinstance(rules_doc, list):
        raise InvalidInput(
            f"{source}: expected a mapping with a 'rules' list",
            hint="write rules: [{class: pii, transform: hash}]",
        )
    rules: list[ColumnRule] = []
    for i, item in enumerate(rules_doc):
        where = f"{source}: rules[{i}]"
        entry = _entry(item, where, required=("transform",), optional=("column", "class", "params"))
        params = entry.get("params") or {}
        if not isinstance(params, Mapping) or any(
            isinstance(v, Mapping | list) or v is None for v in params.values()
        ):
            raise InvalidInput(
                f"{where}: params must map names to single values, e.g. {{date: year}}"
            )
        rule = ColumnRule(
            transform=str(entry["transform"]),
            column=str(entry.get("column") or ""),
            classification=str(entry.get("class") or ""),
            params={str(k): _param_text(v) for k, v in params.items()},
        )
        rules.append(rule.check(where))
    targets = [f"column {r.column}" if r.column else f"class {r.classification}" for r in rules]
    for target in targets:
        if targets.count(target) > 1:
            raise InvalidInput(
                f"{source}: two rules for {target}", hint="keep one rule per column and per class"
            )
    return rules


def load_policy(path: str | Path) -> list[ColumnRule]:
    """The rules of a view-policy YAML file (see :func:`parse_policy`)."""
    return parse_policy(load_yaml(path), source=str(path))


def dump_policy(rules: Sequence[ColumnRule]) -> str:
    """``rules`` as a policy file that :func:`load_policy` reads back."""
    return yaml.safe_dump({"rules": [r.to_dict() for r in rules]}, sort_keys=False)


def _entry(
    item: Any, where: str, *, required: Sequence[str], optional: Sequence[str]
) -> Mapping[str, Any]:
    allowed = (*required, *optional)
    if not isinstance(item, Mapping):
        raise InvalidInput(f"{where}: expected a mapping with keys {', '.join(allowed)}")
    for key in item:
        if key not in allowed:
            raise InvalidInput(
                f"{where}: unknown key {key!r}", hint="use the keys " + ", ".join(allowed)
            )
    for key in required:
        if item.get(key) in (None, ""):
            raise InvalidInput(f"{where}: {key!r} is missing")
    return item


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = [
    "CLASSIFICATIONS",
    "COLUMN_TYPES",
    "FORMATS",
    "TRANSFORMS",
    "VIEWS",
    "ColumnRule",
    "ColumnSpec",
    "VersionRef",
    "dump_policy",
    "load_policy",
    "load_schema",
    "load_yaml",
    "parse_policy",
    "parse_schema",
]
