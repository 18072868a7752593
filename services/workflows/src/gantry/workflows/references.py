"""References between a pipeline's parts: ``${params.x}``, ``${steps.s.outputs.k}``, ``${run.id}``.

A reference is written inside any string of a step (its job spec, its deploy settings, its
gate). A string that is exactly one reference takes the referenced value's own type (a
parameter ``epochs: 20`` used as ``replicas: ${params.replicas}`` stays a number); a reference
inside a longer string is formatted into it. ``$${`` writes a literal ``${``.

What each kind of step outputs is fixed (:data:`OUTPUTS`), so a reference to an output a step
cannot have is refused when the pipeline is submitted, not when the run gets there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gantry.core import InvalidInput

_REF = re.compile(r"(?<!\$)\$\{\s*([^}]*?)\s*\}")
_WHOLE = re.compile(r"^\$\{\s*([^}]*?)\s*\}$")
_NAME = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_STEP_REF = re.compile(rf"^steps\.({_NAME})\.outputs\.([A-Za-z0-9_.\-]+)$")
_PARAM_REF = re.compile(r"^params\.([A-Za-z_][A-Za-z0-9_]*)$")
_TRIAL_REF = re.compile(r"^trial\.([A-Za-z_][A-Za-z0-9_]*)$")
RUN_FIELDS: tuple[str, ...] = ("run.id", "run.date", "run.pipeline")

OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "train": ("job", "model", "metrics.<name>"),
    "evaluate": ("job", "model", "metrics.<name>"),
    "data": ("job", "dataset", "version"),
    "deploy": ("deployment", "model", "version"),
    "experiment": ("job", "model", "trial", "experiment", "metrics.<name>"),
}
"""What each kind of step outputs (``metrics.<name>``: any metric the job reported)."""


@dataclass(frozen=True, slots=True)
class Reference:
    """One parsed ``${...}``: a parameter, a step's output or a property of the run."""

    text: str
    kind: str  # "param" | "step" | "run" | "trial"
    name: str  # the parameter, the step, or the run field
    output: str = ""  # for step references: "model", "metrics.accuracy", ...

    @property
    def metric(self) -> str:
        """The metric's name for ``metrics.<name>`` outputs, else ""."""
        return self.output.removeprefix("metrics.") if self.output.startswith("metrics.") else ""


def parse_reference(text: str) -> Reference:
    """The reference inside ``${...}``; :class:`InvalidInput` saying what may be written."""
    if m := _PARAM_REF.match(text):
        return Reference(text, "param", m.group(1))
    if m := _STEP_REF.match(text):
        return Reference(text, "step", m.group(1), m.group(3))
    if text in RUN_FIELDS:
        return Reference(text, "run", text.removeprefix("run."))
    if m := _TRIAL_REF.match(text):
        return Reference(text, "trial", m.group(1))
    if text.startswith("erasure."):
        raise InvalidInput(
            f"${{{text}}} is only known in an erasure trigger's params: map it to a parameter "
            "there (spec.triggers[].erasure.params) and write ${params.<name>} here"
        )
    raise InvalidInput(
        f"${{{text}}} is not a reference Gantry knows",
        hint="write ${params.<name>}, ${steps.<step>.outputs.<output>}, ${run.id}, "
        "${run.date} or ${run.pipeline} (and ${trial.<parameter>} or ${trial.number} in an "
        "experiment's trial)",
    )


def check_output(ref: Reference, step_kind: str) -> str | None:
    """Why ``ref`` names an output a ``step_kind`` step cannot have, or None when it may."""
    allowed = OUTPUTS[step_kind]
    if ref.output in allowed or (ref.metric and "metrics.<name>" in allowed):
        return None
    return f"a {step_kind} step has no output {ref.output!r}; its outputs are {', '.join(allowed)}"


def references_in(value: Any) -> Iterator[tuple[str, str]]:
    """Every ``(path, reference text)`` in a nested document (dicts, lists, strings)."""
    yield from _walk(value, "")


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        for m in _REF.finditer(value):
            yield path, m.group(1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


class Unresolved(InvalidInput):
    """A reference has no value yet (or at all): the step cannot be built."""


def substitute(value: Any, resolve: Callable[[Reference], Any]) -> Any:
    """``value`` with every reference replaced by ``resolve(reference)``.

    A string that is exactly one reference takes the value's type; references inside longer
    strings are formatted (floats with ``repr`` precision). ``$${`` becomes ``${``.
    """
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole and not value.startswith("$${"):
            return resolve(parse_reference(whole.group(1)))

        def one(m: re.Match[str]) -> str:
            return _format(resolve(parse_reference(m.group(1))))

        return _REF.sub(one, value).replace("$${", "${")
    if isinstance(value, Mapping):
        return {key: substitute(item, resolve) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [substitute(item, resolve) for item in value]
    return value


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = [
    "OUTPUTS",
    "RUN_FIELDS",
    "Reference",
    "Unresolved",
    "check_output",
    "parse_reference",
    "references_in",
    "substitute",
]
