"""Pools and data locality: where a job may run given the data it reads.

Nodes belong to pools (on-premises racks, a public cloud, another cluster). A pool is either
trusted (may hold personal or sensitive data) or not. A job that reads any dataset classified
``pii`` or ``sensitive`` may only be placed in trusted pools; preprocessing of public or
internal data may go anywhere — hybrid cloud without leaking data. The scheduler learns each
dataset's sensitivity from governance's ``gantry.data.dataset.created`` events; a dataset it has
not heard of is treated as sensitive (deny by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gantry.core import InvalidInput

RESTRICTED = frozenset({"pii", "sensitive"})
LEVELS = ("public", "internal", "pii", "sensitive")


@dataclass(frozen=True, slots=True)
class Pool:
    """A set of nodes with one trust level."""

    name: str
    trusted: bool = True


class DataSensitivity:
    """What the scheduler knows of datasets' classifications (from governance events)."""

    def __init__(self) -> None:
        self._levels: dict[str, str] = {}

    def observe(self, dataset: str, sensitivity: str) -> None:
        """Record a dataset's sensitivity (its highest column or files class)."""
        if sensitivity not in LEVELS:
            raise InvalidInput(
                f"dataset {dataset!r}: unknown sensitivity {sensitivity!r}",
                hint=f"one of {', '.join(LEVELS)}",
            )
        self._levels[dataset] = sensitivity

    def level(self, dataset: str) -> str:
        """The dataset's sensitivity; ``sensitive`` when never heard of (deny by default)."""
        return self._levels.get(dataset, "sensitive")

    def needs_trusted(self, datasets: Iterable[str]) -> list[str]:
        """The datasets among ``datasets`` that confine a job to trusted pools."""
        return sorted({d for d in datasets if self.level(d) in RESTRICTED})


def eligible_pools(
    datasets: Iterable[str], pools: Mapping[str, Pool], sensitivity: DataSensitivity
) -> tuple[frozenset[str], str]:
    """The pools a job reading ``datasets`` may use, and why others are excluded ('' if none)."""
    confining = sensitivity.needs_trusted(datasets)
    if not confining:
        return frozenset(pools), ""
    allowed = frozenset(name for name, p in pools.items() if p.trusted)
    excluded = sorted(set(pools) - allowed)
    reason = (
        f"reads {', '.join(confining)} (pii or sensitive), so it runs only in trusted pools"
        + (f"; not in {', '.join(excluded)}" if excluded else "")
    )
    return allowed, reason


__all__ = ["LEVELS", "RESTRICTED", "DataSensitivity", "Pool", "eligible_pools"]
