"""Lineage (domain): dataset version → job → model version, queryable both ways.

Edges are added when a job reads a version through its grant and when a model version is
registered with the job that produced it (or the versions it was trained on). Node ids are
``<dataset>@<version>`` for dataset versions, the job id, and ``<model>:<n>`` for models. Each
edge keeps the id and type of the event written in the transaction that made it, so the audit
can prove it by that one event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from gantry.core import InvalidInput
from gantry.governance import store as db

Kind = Literal["dataset_version", "job", "model_version"]


@dataclass(frozen=True, slots=True)
class Edge:
    """One lineage edge."""

    from_kind: str
    from_id: str
    to_kind: str
    to_id: str
    time_ms: int
    event_id: str = ""  #: the event that made the edge ("" for edges made before schema 4)
    event_type: str = ""


def dataset_node(dataset: str, version: str) -> str:
    """The lineage id of a dataset version."""
    return f"{dataset}@{version}"


def model_node(name: str, version: int) -> str:
    """The lineage id of a model version."""
    return f"{name}:{version}"


def add_edge(
    conn: sa.Connection,
    from_kind: Kind,
    from_id: str,
    to_kind: Kind,
    to_id: str,
    time_ms: int,
    *,
    event_id: str = "",
    event_type: str = "",
) -> None:
    """Record an edge in ``conn``'s transaction (recording it again changes nothing).

    ``event_id`` and ``event_type`` name the event written in the same transaction whose
    handling made the edge; the first recording keeps its event."""
    exists = conn.execute(
        sa.select(db.lineage.c.time_ms).where(
            db.lineage.c.from_kind == from_kind,
            db.lineage.c.from_id == from_id,
            db.lineage.c.to_kind == to_kind,
            db.lineage.c.to_id == to_id,
        )
    ).first()
    if exists is None:
        conn.execute(
            db.lineage.insert().values(
                from_kind=from_kind,
                from_id=from_id,
                to_kind=to_kind,
                to_id=to_id,
                time_ms=time_ms,
                event_id=event_id,
                event_type=event_type,
            )
        )


def edge(row: sa.Row[tuple[object, ...]]) -> Edge:
    """An edge from a row of the lineage table."""
    m = row._mapping
    return Edge(
        str(m["from_kind"]),
        str(m["from_id"]),
        str(m["to_kind"]),
        str(m["to_id"]),
        int(str(m["time_ms"])),
        str(m["event_id"] or ""),
        str(m["event_type"] or ""),
    )


def model_nodes(edges: Iterable[Edge]) -> list[str]:
    """The model version ids the edges name, each once, in order of appearance."""
    found: dict[str, None] = {}
    for e in edges:
        for kind, node in ((e.from_kind, e.from_id), (e.to_kind, e.to_id)):
            if kind == "model_version":
                found[node] = None
    return list(found)


class Lineage:
    """Queries over the lineage graph."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def add(self, from_kind: Kind, from_id: str, to_kind: Kind, to_id: str, time_ms: int) -> None:
        """Record one edge in its own transaction."""
        with self.engine.begin() as conn:
            add_edge(conn, from_kind, from_id, to_kind, to_id, time_ms)

    def query(
        self,
        *,
        dataset: str = "",
        version: str = "",
        job_id: str = "",
        model: str = "",
        model_version: int = 0,
    ) -> list[Edge]:
        """Everything connected to the given node, downstream and upstream, two hops deep.

        A dataset version gives the jobs that read it and the models they produced; a job
        gives the versions it read and the models it produced; a model version gives the job
        that produced it and the versions that job read.
        """
        given = sum(bool(x) for x in (dataset, job_id, model))
        if given != 1 or (dataset and not version) or (model and not model_version):
            raise InvalidInput(
                "lineage needs exactly one of: a dataset and version, a job id, or a model "
                "and model version",
                hint="e.g. --dataset customers --version 3f2a9c, or --job J, or --model m "
                "--model-version 2",
            )
        if dataset:
            start: tuple[str, str] = ("dataset_version", dataset_node(dataset, version))
        elif job_id:
            start = ("job", job_id)
        else:
            start = ("model_version", model_node(model, model_version))
        with self.engine.connect() as conn:
            edges: dict[tuple[str, str, str, str], Edge] = {}
            for direction in ("down", "up"):
                frontier = {start}
                for _hop in range(2):
                    found = self._step(conn, frontier, direction)
                    for e in found:
                        edges[(e.from_kind, e.from_id, e.to_kind, e.to_id)] = e
                    frontier = {
                        (e.to_kind, e.to_id) if direction == "down" else (e.from_kind, e.from_id)
                        for e in found
                    }
                    if not frontier:
                        break
        return sorted(edges.values(), key=lambda e: (e.time_ms, e.from_id, e.to_id))

    @staticmethod
    def _step(conn: sa.Connection, nodes: Iterable[tuple[str, str]], direction: str) -> list[Edge]:
        t = db.lineage
        out: list[Edge] = []
        for kind, node in nodes:
            if direction == "down":
                where = sa.and_(t.c.from_kind == kind, t.c.from_id == node)
            else:
                where = sa.and_(t.c.to_kind == kind, t.c.to_id == node)
            out.extend(edge(r) for r in conn.execute(sa.select(t).where(where)).all())
        return out


__all__ = [
    "Edge",
    "Kind",
    "Lineage",
    "add_edge",
    "dataset_node",
    "edge",
    "model_node",
    "model_nodes",
]
