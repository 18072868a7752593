"""A task's resource demand, validated, and the loader for the Alibaba pod list."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gantry.core.errors import InvalidInput
from gantry.sched.cluster import GPU_MILLI

_POD_COLUMNS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True, slots=True)
class Demand:
    """What one task needs on ONE node.

    ``num_gpu == 1`` needs ``gpu_milli`` (1..1000) on one GPU (below 1000 it shares the GPU);
    ``num_gpu > 1`` needs that many whole free GPUs (``gpu_milli`` is then 1000);
    ``num_gpu == 0`` needs no GPU (``gpu_milli`` 0). ``models`` lists the allowed GPU models;
    empty means any.
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.num_gpu < 0:
            raise InvalidInput(
                f"demand {self} has a negative resource", hint="use cpu, memory, num_gpu >= 0"
            )
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise InvalidInput(
                f"a CPU-only demand asks for {self.gpu_milli} milli-GPU",
                hint="set gpu_milli=0 when num_gpu=0",
            )
        if self.num_gpu == 1 and not 1 <= self.gpu_milli <= GPU_MILLI:
            raise InvalidInput(
                f"a one-GPU demand asks for {self.gpu_milli} milli-GPU",
                hint="use 1..1000 milli-GPU on one GPU",
            )
        if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
            raise InvalidInput(
                f"a {self.num_gpu}-GPU demand asks for {self.gpu_milli} milli-GPU per GPU",
                hint="multi-GPU demands take whole GPUs: gpu_milli=1000",
            )

    @property
    def total_gpu_milli(self) -> int:
        """All the milli-GPU this demand takes."""
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, frozenset[str]]:
        """The GPU shape: (num_gpu, gpu_milli, allowed models)."""
        return (self.num_gpu, self.gpu_milli, self.models)


def load_pods_csv(path: str | Path) -> list[Demand]:
    """Load the Alibaba pod list (``cpu_milli, memory_mib, num_gpu, gpu_milli``, ``gpu_spec``).

    ``gpu_spec`` (optional) lists allowed models separated by ``|``. Raises InvalidInput naming
    the file and line for a missing file or column or a bad value.
    """
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise InvalidInput(f"cannot read pod list {path}: {exc.strerror}") from exc
    demands: list[Demand] = []
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _POD_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInput(
                f"pod list {path} lacks columns {missing}",
                hint=f"the header must name {', '.join(_POD_COLUMNS)} (gpu_spec optional)",
            )
        for line, row in enumerate(reader, start=2):
            try:
                numbers = [int(row[c] or 0) for c in _POD_COLUMNS]
            except (TypeError, ValueError) as exc:
                raise InvalidInput(f"pod list {path} line {line}: values must be integers") from exc
            spec = row.get("gpu_spec") or ""
            models = frozenset(m.strip() for m in spec.split("|") if m.strip())
            try:
                cpu, memory, num_gpu, gpu_milli = numbers
                demands.append(Demand(cpu, memory, num_gpu, gpu_milli, models))
            except InvalidInput as exc:
                raise InvalidInput(f"pod list {path} line {line}: {exc.message}") from exc
    return demands
