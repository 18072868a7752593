"""Job traces for the simulator: a generic CSV format, and a converter from the Alibaba trace.

The generic format (one job per row, header required)::

    submit_time,duration,num_gpus[,queue,user,gpu_milli,gpu_model,cpus,memory_mib,name]

``submit_time`` and ``duration`` are seconds (numbers); ``num_gpus`` whole GPUs (0 for CPU
jobs); ``gpu_milli`` 1..1000 makes a one-GPU job a share of one GPU; ``gpu_model`` lists allowed
models separated by ``|``; ``cpus`` is cores and ``memory_mib`` MiB. Rows are validated with
their line number in the error.

:func:`jobs_from_alibaba` turns the Alibaba GPU-sharing pod list into that form: a pod's
``creation_time`` is its submit time and its run time is ``deletion_time - scheduled_time``
(pods never scheduled in the trace are left out, since their run time is unknown).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gantry.core import InvalidInput

REQUIRED = ("submit_time", "duration", "num_gpus")
OPTIONAL = ("queue", "user", "gpu_milli", "gpu_model", "cpus", "memory_mib", "name")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace."""

    submit_time: float
    duration: float
    num_gpus: int
    gpu_milli: int = 1000
    queue: str = "default"
    user: str = ""
    gpu_models: tuple[str, ...] = ()
    cpu_milli: int = 1000
    memory_mib: int = 1024
    name: str = ""

    @property
    def gpu_milli_total(self) -> int:
        """The job's GPU demand in milli-GPU."""
        if self.num_gpus == 1:
            return self.gpu_milli
        return self.num_gpus * 1000


def _number(row: dict[str, str], key: str, line: int, *, integer: bool = False) -> float:
    text = (row.get(key) or "").strip()
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise InvalidInput(f"line {line}: {key} must be {kind}, not {text!r}") from None
    if value < 0:
        raise InvalidInput(f"line {line}: {key} must not be negative ({text})")
    return value


def parse_jobs_csv(text: str) -> list[TraceJob]:
    """Jobs from generic-CSV text, sorted by submit time (stable)."""
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InvalidInput(
            f"the jobs CSV has no {', '.join(missing)} column",
            hint=f"the header must name {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})",
        )
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise InvalidInput(
            f"the jobs CSV has unknown columns: {', '.join(unknown)}",
            hint=f"known optional columns: {', '.join(OPTIONAL)}",
        )
    jobs = []
    for line, row in enumerate(reader, start=2):
        row = {k.strip(): v for k, v in row.items() if k}
        gpus = int(_number(row, "num_gpus", line, integer=True))
        milli = int(_number(row, "gpu_milli", line, integer=True)) if row.get("gpu_milli") else 1000
        if not 1 <= milli <= 1000:
            raise InvalidInput(f"line {line}: gpu_milli must be 1..1000, not {milli}")
        models = tuple(m for m in (row.get("gpu_model") or "").split("|") if m)
        jobs.append(
            TraceJob(
                submit_time=_number(row, "submit_time", line),
                duration=_number(row, "duration", line),
                num_gpus=gpus,
                gpu_milli=milli if gpus == 1 else 1000,
                queue=(row.get("queue") or "default").strip(),
                user=(row.get("user") or "").strip(),
                gpu_models=models,
                cpu_milli=int(_number(row, "cpus", line) * 1000) if row.get("cpus") else 1000,
                memory_mib=(
                    int(_number(row, "memory_mib", line, integer=True))
                    if row.get("memory_mib")
                    else 1024
                ),
                name=(row.get("name") or "").strip(),
            )
        )
    return sorted(jobs, key=lambda j: j.submit_time)


def load_jobs_csv(path: Path) -> list[TraceJob]:
    """Jobs from a generic-CSV file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read the jobs CSV {path}: {exc.strerror}") from None
    return parse_jobs_csv(text)


def jobs_from_alibaba(pod_csv: Path, *, queue_by_qos: bool = True) -> list[TraceJob]:
    """Jobs from the Alibaba pod list (pods that were scheduled; see the module docstring).

    With ``queue_by_qos`` the pod's QoS class (LS, Burstable, BE, ...) names its queue.
    """
    jobs = []
    with Path(pod_csv).open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            if not row.get("scheduled_time") or not row.get("deletion_time"):
                continue
            start = float(row["scheduled_time"])
            duration = float(row["deletion_time"]) - start
            if duration <= 0:
                continue
            gpus = int(row["num_gpu"])
            jobs.append(
                TraceJob(
                    submit_time=float(row["creation_time"]),
                    duration=duration,
                    num_gpus=gpus,
                    gpu_milli=int(row["gpu_milli"]) if gpus == 1 else 1000,
                    queue=(row.get("qos") or "default").lower() if queue_by_qos else "default",
                    user="",
                    gpu_models=tuple(m for m in (row.get("gpu_spec") or "").split("|") if m),
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    name=row.get("name", f"pod-{line}"),
                )
            )
    return sorted(jobs, key=lambda j: j.submit_time)


def write_jobs_csv(jobs: Iterable[TraceJob]) -> Iterator[str]:
    """The generic CSV, line by line (header first)."""
    columns = REQUIRED + OPTIONAL
    yield ",".join(columns) + "\n"
    for j in jobs:
        row = [
            f"{j.submit_time:g}",
            f"{j.duration:g}",
            str(j.num_gpus),
            j.queue,
            j.user,
            str(j.gpu_milli),
            "|".join(j.gpu_models),
            f"{j.cpu_milli / 1000:g}",
            str(j.memory_mib),
            j.name,
        ]
        yield ",".join(row) + "\n"


__all__ = [
    "OPTIONAL",
    "REQUIRED",
    "TraceJob",
    "jobs_from_alibaba",
    "load_jobs_csv",
    "parse_jobs_csv",
    "write_jobs_csv",
]
