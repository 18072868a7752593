"""Cluster: nodes and their devices, allocation against real utilisation, degraded nodes and
why, queues with their quotas and use."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from gantry.client.profiler import NodeInfo as NodeHealth
from gantry.client.scheduler import NodeInfo, QueueInfo
from gantry.console import charts
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.render import page
from gantry.core import GantryError, InvalidInput

router = APIRouter()


@dataclass(frozen=True)
class NodeRow:
    """What the page shows of one node: the scheduler's view and the profiler's."""

    node: NodeInfo
    health: NodeHealth | None

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def degraded(self) -> bool:
        return self.node.state != "ready" or (self.health is not None and self.health.degraded)

    @property
    def why(self) -> str:
        if self.health is not None and self.health.degraded:
            return self.health.reason
        return self.node.reason


def utilisation_map(rows: list[NodeRow]) -> Markup:
    """Heat map: per node, each GPU's allocation, then allocated and busy share of the node."""
    widest = max((len(r.node.gpus) for r in rows), default=0)
    columns = [f"GPU {i}" for i in range(widest)] + ["allocated", "busy"]
    values: list[list[float | None]] = []
    labels: list[list[str]] = []
    for r in rows:
        cells: list[float | None] = []
        texts: list[str] = []
        for i in range(widest):
            if i < len(r.node.gpus):
                g = r.node.gpus[i]
                share = 1 - g.free_milli / 1000
                cells.append(share)
                texts.append(f"{share:.0%}")
            else:
                cells.append(None)
                texts.append("")
        h = r.health
        if h is not None and h.capacity:
            cells += [h.allocated / h.capacity, h.used / h.capacity]
            texts += [
                f"{h.allocated:.1f}/{h.capacity:.0f} {h.unit}",
                f"{h.used:.1f} {h.unit}",
            ]
        else:
            cpu = r.node.cpu_milli
            cpu_share = (cpu - r.node.cpu_free_milli) / cpu if cpu else None
            cells += [cpu_share, None]
            texts += ["" if cpu_share is None else f"{cpu_share:.0%}", "no data"]
        values.append(cells)
        labels.append(texts)
    return charts.heat_map(
        [r.name for r in rows],
        columns,
        values,
        labels=labels,
        title="Allocation against utilisation",
        cell=96,
        marked_rows=[r.name for r in rows if r.degraded],
    )


@router.get("/cluster", response_class=HTMLResponse)
def cluster(request: Request, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """The cluster page."""
    if not (viewer.may("list", "node") or viewer.may("list", "queue")):
        viewer.require("list", "node")  # refused before any service is asked
    nodes: list[NodeInfo] = []
    queues: list[QueueInfo] = []
    health: dict[str, NodeHealth] = {}
    problems: list[GantryError] = []
    summary = None
    if viewer.may("list", "node"):
        with apis.scheduler(viewer) as sched:
            nodes = sched.nodes()
        try:
            with apis.profiler(viewer) as prof:
                found, summary = prof.nodes()
            health = {h.node: h for h in found}
        except GantryError as exc:  # the page still shows the scheduler's view
            problems.append(exc)
    if viewer.may("list", "queue"):
        with apis.scheduler(viewer) as sched:
            queues = sched.queues()
    rows = [NodeRow(n, health.get(n.name)) for n in sorted(nodes, key=lambda n: n.name)]
    return page(
        request,
        viewer,
        "cluster.html",
        section="cluster",
        title="Cluster",
        rows=rows,
        queues=queues,
        summary=summary,
        heat=utilisation_map(rows) if rows else None,
        problems=problems,
        may_mark=viewer.may("update", "node"),
    )


@router.post("/cluster/nodes/{name}/health")
def mark(
    name: str,
    viewer: ViewerDep,
    apis: ApisDep,
    degraded: str = Form(default=""),
    reason: str = Form(default=""),
) -> Response:
    """Mark a node degraded (with a reason) or recovered: an operator's decision."""
    viewer.require("update", "node", name)
    flag = degraded == "true"
    if flag and not reason.strip():
        raise InvalidInput(
            "say why the node is degraded", hint="write a reason, e.g. 'ECC errors on GPU 1'"
        )
    with apis.profiler(viewer) as prof:
        prof.set_node_health(name, degraded=flag, reason=reason.strip() or "recovered")
    return RedirectResponse("/cluster", status_code=303)


__all__ = ["NodeRow", "router", "utilisation_map"]
