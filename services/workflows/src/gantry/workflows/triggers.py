"""Triggers (domain, no I/O): events that start a pipeline's run by themselves.

A pipeline's ``spec.triggers`` lists them. The one kind so far is ``erasure``: when governance
erases a data subject (``gantry.data.subject.erased``: new dataset versions without the
person's rows, and the model versions trained on data that held them), a pipeline whose
trigger names one of those datasets, or the name of one of those models, is run — as its
owner, once per erasure — to retrain without them::

    triggers:
      - erasure:
          datasets: [churn]
          models: [churn-classifier]
          params:
            source: ${erasure.version.churn}   # the version committed without the rows
            erasure: ${erasure.id}

A trigger's ``params`` set the run's declared parameters: to a value of the erasure
(:data:`ERASURE_FIELDS`) or to a literal of the parameter's type. Everything is checked when the
pipeline is submitted (:func:`trigger_problems`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, model_validator

from gantry.events.catalog import SubjectErased
from gantry.workflows.documents import DocModel

TRIGGER_KINDS = ("erasure",)
MAX_TRIGGERS = 16
ERASURE_FIELDS = ("${erasure.id}", "${erasure.version.<dataset>}")
"""What a value of an erasure trigger's ``params`` may be (besides a literal)."""

#: Governance's names for datasets and models (path segments in its storage).
_GOVERNED_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_WHOLE = re.compile(r"^\$\{\s*([^}]*?)\s*\}$")
_VERSION = re.compile(r"^erasure\.version\.(.+)$")

Scalar = str | int | float | bool


class ErasureTrigger(DocModel):
    """Run when an erasure touched one of ``datasets`` or names a version of one of
    ``models`` for retraining; ``params`` set the run's parameters."""

    datasets: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    params: dict[str, Scalar] = Field(default_factory=dict)

    def matches(self, erasure: SubjectErased) -> tuple[str, ...]:
        """Why ``erasure`` starts a run (``dataset churn``, ``model churn-classifier:3``), or
        nothing when it does not."""
        touched = [d for d in erased_versions(erasure) if d in self.datasets]
        models = [
            m for m in erasure.models_to_retrain if m.partition(":")[0].strip() in self.models
        ]
        return (*(f"dataset {d}" for d in touched), *(f"model {m}" for m in models))

    def run_params(self, erasure: SubjectErased) -> dict[str, str]:
        """The run's parameters (as text, typed later like ``--param``) for ``erasure``.

        A ``${erasure.version.<dataset>}`` of a dataset this erasure did not touch sets
        nothing: that dataset did not hold the person, and the parameter keeps its default.
        """
        versions = erased_versions(erasure)
        out: dict[str, str] = {}
        for key, value in self.params.items():
            field = erasure_field(value)
            if field is None:
                out[key] = _text(value)
            elif field == ("id", ""):
                out[key] = erasure.erasure_id
            elif field[0] == "version" and versions.get(field[1]):
                out[key] = versions[field[1]]
        return out


class Trigger(DocModel):
    """One entry of ``spec.triggers``: exactly one kind (:data:`TRIGGER_KINDS`)."""

    erasure: ErasureTrigger | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_kind(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            unknown = [str(k) for k in value if k not in TRIGGER_KINDS]
            if unknown:
                raise ValueError(
                    f"{', '.join(repr(k) for k in unknown)} is not a trigger kind; "
                    f"the kinds are: {', '.join(TRIGGER_KINDS)}"
                )
        return value

    @property
    def kind(self) -> str:
        return next((k for k in TRIGGER_KINDS if getattr(self, k) is not None), "")


def erased_versions(erasure: SubjectErased) -> dict[str, str]:
    """``{dataset: the version committed without the subject}`` for the datasets it touched."""
    out: dict[str, str] = {}
    for entry in erasure.datasets:
        name = entry.get("dataset")
        if isinstance(name, str) and name:
            out[name] = str(entry.get("new_version") or "")
    return out


def erasure_field(value: Any) -> tuple[str, str] | None:
    """``("id", "")`` for ``${erasure.id}``, ``("version", <dataset>)`` for
    ``${erasure.version.<dataset>}``, ``("", <text>)`` for anything else written with ``${``,
    None for a literal."""
    if not isinstance(value, str) or "${" not in value:
        return None
    whole = _WHOLE.match(value.strip())
    if whole is None:
        return "", value
    text = whole.group(1)
    if text == "erasure.id":
        return "id", ""
    m = _VERSION.match(text)
    return ("version", m.group(1)) if m else ("", text)


def trigger_problems(triggers: Sequence[Trigger], params: Mapping[str, Scalar]) -> list[str]:
    """Every problem with ``spec.triggers``, each with its place."""
    problems: list[str] = []
    for i, trigger in enumerate(triggers):
        at = f"spec.triggers[{i}]"
        if trigger.erasure is None:
            problems.append(f"{at}: give a trigger kind ({', '.join(TRIGGER_KINDS)})")
            continue
        problems.extend(_erasure_problems(trigger.erasure, f"{at}.erasure", params))
    return problems


def _erasure_problems(e: ErasureTrigger, at: str, declared: Mapping[str, Scalar]) -> list[str]:
    problems: list[str] = []
    if not e.datasets and not e.models:
        problems.append(
            f"{at}: name the datasets and/or the models whose erasures start a run, "
            "e.g. datasets: [churn] or models: [churn-classifier]"
        )
    for label, names in (("datasets", e.datasets), ("models", e.models)):
        what = label.removesuffix("s")
        for j, name in enumerate(names):
            if not _governed(name):
                problems.append(
                    f"{at}.{label}[{j}]: {name!r} is not a {what} name: 1-63 lower-case letters, "
                    "digits, '-', '_' or '.', starting with a letter or digit"
                )
    for key, value in e.params.items():
        place = f"{at}.params.{key}"
        if key not in declared:
            problems.append(
                f"{place}: spec.params does not declare {key!r} "
                f"(declared: {', '.join(declared) or 'none'})"
            )
            continue
        default = declared[key]
        field = erasure_field(value)
        if field is None:
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{place}: {value} is not a finite number")
            elif _kind(value) != _kind(default) and not _widens(value, default):
                problems.append(
                    f"{place}: {value!r} is {_kind(value)} but the parameter {key} is "
                    f"{_kind(default)} (its default is {default!r})"
                )
            continue
        kind, name = field
        if not kind:
            problems.append(
                f"{place}: {value!r} is not a value of the erasure; write "
                f"{' or '.join(ERASURE_FIELDS)} (the whole value), or a literal"
            )
        elif kind == "version" and not _governed(name):
            problems.append(f"{place}: {name!r} in {value} is not a dataset name")
        elif not isinstance(default, str):
            problems.append(
                f"{place}: {value} is text but the parameter {key} is {_kind(default)} "
                f'(its default is {default!r}); declare it with a text default, e.g. {key}: ""'
            )
    return problems


def _governed(name: str) -> bool:
    return bool(_GOVERNED_NAME.fullmatch(name)) and ".." not in name


def _kind(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    return "text"


def _widens(value: Scalar, default: Scalar) -> bool:
    """A whole number where a number is declared is fine."""
    return isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = [
    "ERASURE_FIELDS",
    "MAX_TRIGGERS",
    "TRIGGER_KINDS",
    "ErasureTrigger",
    "Trigger",
    "erased_versions",
    "erasure_field",
    "trigger_problems",
]
