"""Dev session documents (``kind: DevSession``): an interactive Jupyter server on a slice of a
GPU, reading the owner's datasets de-identified, culled when idle, resumable with its files.

::

    apiVersion: gantry/v1
    kind: DevSession
    metadata: {name: ana-scratch}
    spec:
      interface: jupyter          # or shell (terminals only)
      resources: {gpuMilli: 250, cpus: 2, memory: 4Gi}
      data: [{dataset: churn, version: 9fe92b…}]
      idleTimeout: 30m            # the GPU goes back to the pool after this long idle
      lifetime: 8h                # and after this long in any case

The session runs as an ordinary job (``entrypoint: {module: gantry.training.session}``) at
priority ``low`` unless told otherwise, so training preempts it: it saves its files and waits
for a GPU again. Its files live in the object store between runs, so a culled, expired,
stopped or preempted session resumes where it was. Only the de-identified view can be read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from gantry.core import InvalidInput
from gantry.sched.spec import PRIORITY_CLASSES, parse_duration_s, parse_job
from gantry.workflows.documents import (
    API_VERSION,
    NAME_PATTERN,
    DocModel,
    Metadata,
    load_document,
    validation_problems,
)

SESSION_MODULE = "gantry.training.session"
SESSION_LABEL = "gantry.io/session"
MAX_LIFETIME_S = 7 * 86400
_PLACEHOLDER = "checking"


class SessionSpec(DocModel):
    """What the session runs on, reads, and how long it may sit idle or live."""

    interface: Literal["jupyter", "shell"] = "jupyter"
    queue: str = Field(default="default", pattern=NAME_PATTERN)
    priority: int | str = "low"
    resources: dict[str, Any] = Field(default_factory=dict)
    data: tuple[dict[str, Any], ...] = ()
    idle_timeout_s: int = Field(default=1800, ge=1, alias="idleTimeout")
    lifetime_s: int = Field(default=8 * 3600, ge=60, le=MAX_LIFETIME_S, alias="lifetime")
    max_files: str = Field(
        default="1Gi", alias="maxFiles", description="Largest archive of the session's files."
    )

    @field_validator("idle_timeout_s", "lifetime_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> int:
        return parse_duration_s(value)


class SessionDoc(DocModel):
    """A whole submitted DevSession document."""

    api_version: Literal["gantry/v1"] = Field(alias="apiVersion")
    kind: Literal["DevSession"]
    metadata: Metadata
    spec: SessionSpec


@dataclass(frozen=True)
class DevSession:
    """A checked dev session document."""

    doc: SessionDoc
    source: str

    @property
    def name(self) -> str:
        return self.doc.metadata.name

    @property
    def spec(self) -> SessionSpec:
        return self.doc.spec


def token_hash(token: str) -> str:
    """What the node gets instead of the session's token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def job_document(name: str, spec: SessionSpec, *, token: str, generation: int) -> dict[str, Any]:
    """The TrainingJob document of generation ``generation`` of session ``name``."""
    from gantry.sched.spec import parse_memory_mib

    max_bytes = parse_memory_mib(spec.max_files) << 20
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {
            "name": f"session-{name}"[:63].rstrip("-"),
            "queue": spec.queue,
            "priority": spec.priority,
            "labels": {SESSION_LABEL: name, "gantry.io/generation": str(generation)},
        },
        "spec": {
            "replicas": 1,
            "resources": dict(spec.resources),
            "entrypoint": {
                "module": SESSION_MODULE,
                "args": [
                    "--name",
                    name,
                    "--token-sha256",
                    token_hash(token),
                    "--kind",
                    spec.interface,
                    "--idle-timeout",
                    str(spec.idle_timeout_s),
                    "--lifetime",
                    str(spec.lifetime_s),
                    "--max-files-bytes",
                    str(max_bytes),
                ],
            },
            "data": [{**d, "view": "deidentified"} for d in spec.data],
            # the session ends itself at its lifetime; the scheduler's limit is the backstop
            "maxRuntime": spec.lifetime_s + 600,
        },
    }


def parse_session(source: str) -> DevSession:
    """A checked :class:`DevSession`; :class:`InvalidInput` listing every problem."""
    raw = load_document(source)
    if raw.get("kind") != "DevSession":
        raise InvalidInput(
            f"kind {raw.get('kind')!r} is not a dev session", hint="use kind: DevSession"
        )
    try:
        doc = SessionDoc.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(
            "the dev session is invalid: " + "; ".join(validation_problems(exc, raw)),
            hint="see docs/workflows.md for the dev session format",
        ) from None
    problems: list[str] = []
    spec = doc.spec
    for i, use in enumerate(spec.data):
        if use.get("view", "deidentified") != "deidentified":
            problems.append(
                f"spec.data[{i}].view: a dev session reads de-identified data only; remove "
                f"view: {use.get('view')} (train a job to use another view)"
            )
    if isinstance(spec.priority, str) and spec.priority not in PRIORITY_CLASSES:
        problems.append(f"spec.priority: unknown priority class {spec.priority!r}")
    if spec.idle_timeout_s > spec.lifetime_s:
        problems.append(
            f"spec.idleTimeout ({spec.idle_timeout_s}s) is longer than spec.lifetime "
            f"({spec.lifetime_s}s): it could never be culled"
        )
    if not problems:
        try:
            parse_job(job_document(doc.metadata.name, spec, token=_PLACEHOLDER, generation=1))
        except InvalidInput as exc:
            problems.append(exc.message.removeprefix("the job spec is invalid: "))
        except ValueError as exc:
            problems.append(f"spec.maxFiles: {exc}")
    if problems:
        raise InvalidInput(
            f"dev session {doc.metadata.name!r} is invalid: " + "; ".join(problems),
            hint="fix these and start it again; see docs/workflows.md",
        )
    return DevSession(doc, source)


__all__ = [
    "SESSION_LABEL",
    "SESSION_MODULE",
    "DevSession",
    "SessionDoc",
    "SessionSpec",
    "job_document",
    "parse_session",
    "token_hash",
]
