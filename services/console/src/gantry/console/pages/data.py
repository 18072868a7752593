"""Data: datasets, their versions and view policies, diffs between versions, lineage graphs,
and a preview of a few rows in the view the viewer's role allows (never raw rows for a role
that may only see de-identified data; the service enforces it too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from gantry.client.governance import Dataset, GovernanceClient, LineageEdge, Version
from gantry.console import charts
from gantry.console.deps import ApisDep, ViewerDep
from gantry.console.render import is_htmx, page
from gantry.console.viewer import Viewer
from gantry.core import GantryError, InvalidInput

router = APIRouter()

#: Datasets per page of the list.
PAGE_SIZE = 50
#: Versions shown in a dataset's log.
LOG_LIMIT = 200
#: Rows a preview shows by default, and at most.
PREVIEW_ROWS = 20
PREVIEW_MAX_ROWS = 200
#: Characters of a cell shown in a preview (longer values are cut).
CELL_CHARS = 80
#: Shards listed in a diff, per side.
DIFF_SHARDS = 50
#: Lineage edges drawn (and listed) at most; the service returns two hops each way.
LINEAGE_EDGES = 80


def human_bytes(n: int | float) -> str:
    """A size as ``78.0 KiB`` (``''`` for none)."""
    if not n:
        return "0 B" if n == 0 else ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover - unreachable


def readable_views(viewer: Viewer) -> list[str]:
    """The views of a dataset ``viewer`` may read, most revealing first."""
    return [v for v in ("raw", "deidentified") if viewer.may("read", "dataset", view=v)]


def choose_view(viewer: Viewer, requested: str, dataset: str = "") -> tuple[str, str]:
    """The view a preview reads and why: raw when the role may (unless de-identified is
    asked for), else de-identified; ``("", why)`` when the role may read neither. Asking for
    a view the role may not read is refused (:class:`~gantry.core.PermissionDenied`)."""
    if requested not in ("", "raw", "deidentified"):
        raise InvalidInput(f"unknown view {requested!r}", hint="use 'raw' or 'deidentified'")
    allowed = readable_views(viewer)
    if requested:
        viewer.require("read", "dataset", f"{dataset} ({requested} view)", view=requested)
        return requested, "the view you asked for"
    if "raw" in allowed:
        return "raw", "your role may read raw data"
    if "deidentified" in allowed:
        return "deidentified", "your role may read de-identified data only"
    return "", "your role may not read the rows of datasets, raw or de-identified"


@dataclass(frozen=True)
class Preview:
    """A few rows of a version in one view (or why there are none)."""

    dataset: Dataset
    version: Version | None
    view: str
    why: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    total_rows: int = 0
    files: tuple[str, ...] = ()
    shard: str = ""


def _cell(value: Any) -> str:
    """A value as a short text."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        text = f"<{len(value)} bytes> {bytes(value[:16]).hex()}"
    else:
        text = str(value)
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def _node_id(kind: str, ident: str) -> str:
    return f"{kind}:{ident}"


def lineage_graph(
    edges: Sequence[LineageEdge], *, centre: str, viewer: Viewer, title: str = ""
) -> Markup:
    """The lineage edges (the first :data:`LINEAGE_EDGES`) as a graph: dataset versions, jobs
    and model versions, each linked to its page (jobs and models only for a viewer who may
    read them); ``centre`` is the ``kind:id`` node asked about, drawn even with no edges."""
    may_job = viewer.may("read", "job")
    may_model = viewer.may("list", "model")
    seen: dict[str, charts.Node] = {}

    def node(kind: str, ident: str) -> str:
        key = _node_id(kind, ident)
        if key in seen:
            return key
        here = " (this)" if key == centre else ""
        if kind == "dataset_version":
            name, _, version = ident.partition("@")
            seen[key] = charts.Node(
                key,
                f"{name}@{version[:12]}",
                state="dataset",
                href=f"/data/{quote(name)}/lineage?version={quote(version)}",
                detail="dataset version" + here,
            )
        elif kind == "job":
            seen[key] = charts.Node(
                key,
                ident,
                state="job",
                href=f"/jobs/{quote(ident)}" if may_job else "",
                detail="job" + here,
            )
        elif kind == "model_version":
            model, _, number = ident.rpartition(":")
            model = model or ident
            seen[key] = charts.Node(
                key,
                f"{model} v{number}" if number else model,
                state="model",
                href=f"/models/{quote(model)}?version={quote(number)}" if may_model else "",
                detail="model version" + here,
            )
        else:
            seen[key] = charts.Node(key, ident, detail=kind + here)
        return key

    kind, _, ident = centre.partition(":")
    node(kind, ident)
    graph_edges = [
        charts.Edge(node(e.from_kind, e.from_id), node(e.to_kind, e.to_id))
        for e in edges[:LINEAGE_EDGES]
    ]
    return charts.graph(list(seen.values()), graph_edges, title=title)


def _page_number(value: int) -> int:
    if value < 1:
        raise InvalidInput(f"page {value} does not exist", hint="pages start at 1")
    return value


@router.get("/data", response_class=HTMLResponse)
def datasets(request: Request, viewer: ViewerDep, apis: ApisDep, p: int = 1) -> HTMLResponse:
    """Every dataset the viewer may see, a page at a time; sizes load lazily per row."""
    number = _page_number(p)
    with apis.governance(viewer) as gov:
        found = sorted(gov.list_datasets(), key=lambda d: d.name)
    pages = max(1, (len(found) + PAGE_SIZE - 1) // PAGE_SIZE)
    shown = found[(number - 1) * PAGE_SIZE : number * PAGE_SIZE]
    return page(
        request,
        viewer,
        "data.html",
        section="data",
        title="Data",
        datasets=shown,
        total=len(found),
        page_number=number,
        pages=pages,
    )


@router.get("/data/{name}/size", response_class=HTMLResponse)
def dataset_size(request: Request, name: str, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """A fragment: the rows and size of a dataset's latest version."""
    with apis.governance(viewer) as gov:
        version = gov.get_version(name)
    return page(request, viewer, "_data_size.html", version=version, size=human_bytes)


@router.get("/data/{name}", response_class=HTMLResponse)
def dataset(request: Request, name: str, viewer: ViewerDep, apis: ApisDep) -> HTMLResponse:
    """A dataset: columns, versions, a diff form, its view policy, lineage of its head and a
    preview of rows in the viewer's view."""
    views = readable_views(viewer)
    policy = None
    policy_error: GantryError | None = None
    lineage_error: GantryError | None = None
    edges: list[LineageEdge] = []
    with apis.governance(viewer) as gov:
        ds = gov.get_dataset(name)
        versions = gov.log(name, limit=LOG_LIMIT) if ds.head else []
        if views:
            try:
                policy = gov.get_view_policy(name)
            except GantryError as exc:
                policy_error = exc
        if ds.head:
            try:
                edges = gov.lineage(dataset=name, version=ds.head)
            except GantryError as exc:
                lineage_error = exc
    graph = (
        lineage_graph(edges, centre=_node_id("dataset_version", f"{name}@{ds.head}"), viewer=viewer)
        if ds.head
        else None
    )
    return page(
        request,
        viewer,
        "data_detail.html",
        section="data",
        title=f"Dataset {name}",
        ds=ds,
        versions=versions,
        policy=policy,
        policy_error=policy_error,
        views=views,
        graph=graph,
        edges=edges,
        lineage_error=lineage_error,
        size=human_bytes,
        preview_rows=PREVIEW_ROWS,
        edge_limit=LINEAGE_EDGES,
    )


@router.get("/data/{name}/diff", response_class=HTMLResponse)
def diff(
    request: Request, name: str, viewer: ViewerDep, apis: ApisDep, a: str = "", b: str = ""
) -> HTMLResponse:
    """What changed from version ``a`` to version ``b`` (a page, or a fragment for htmx)."""
    a, b = a.strip(), b.strip()
    if not a or not b:
        raise InvalidInput(
            "choose two versions to compare",
            hint="pick a 'from' and a 'to' version (ids or unique prefixes from the log)",
        )
    with apis.governance(viewer) as gov:
        result = gov.diff(name, a, b)
    context: dict[str, Any] = {
        "name": name,
        "diff": result,
        "size": human_bytes,
        "limit": DIFF_SHARDS,
    }
    if is_htmx(request):
        return page(request, viewer, "_data_diff.html", **context)
    return page(
        request, viewer, "data_diff.html", section="data", title=f"Diff of {name}", **context
    )


@router.get("/data/{name}/lineage", response_class=HTMLResponse)
def lineage(
    request: Request, name: str, viewer: ViewerDep, apis: ApisDep, version: str = ""
) -> HTMLResponse:
    """The lineage of one version (the latest by default): jobs that read it, the models and
    dataset versions they made, and where it came from."""
    with apis.governance(viewer) as gov:
        found = gov.get_version(name, version.strip())
        edges = gov.lineage(dataset=name, version=found.id)
    graph = lineage_graph(
        edges, centre=_node_id("dataset_version", f"{name}@{found.id}"), viewer=viewer
    )
    context: dict[str, Any] = {
        "name": name,
        "version": found,
        "graph": graph,
        "edges": edges,
        "edge_limit": LINEAGE_EDGES,
    }
    if is_htmx(request):
        return page(request, viewer, "_data_lineage.html", **context)
    return page(
        request,
        viewer,
        "data_lineage.html",
        section="data",
        title=f"Lineage of {name}@{found.short_id}",
        **context,
    )


@router.get("/data/{name}/preview", response_class=HTMLResponse)
def preview(
    request: Request,
    name: str,
    viewer: ViewerDep,
    apis: ApisDep,
    version: str = "",
    rows: int = PREVIEW_ROWS,
    view: str = "",
) -> HTMLResponse:
    """The first ``rows`` rows of a version, read from its first shard only, in the most
    revealing view the viewer's role allows (or the ``view`` asked for, if allowed)."""
    if not 1 <= rows <= PREVIEW_MAX_ROWS:
        raise InvalidInput(
            f"cannot preview {rows} rows", hint=f"ask for 1 to {PREVIEW_MAX_ROWS} rows"
        )
    chosen, why = choose_view(viewer, view.strip(), name)
    with apis.governance(viewer) as gov:
        ds = gov.get_dataset(name)
        found = gov.get_version(name, version.strip()) if ds.head or version.strip() else None
        result = Preview(ds, found, chosen, why)
        if found is not None and chosen:
            result = _read_preview(gov, ds, found, chosen, why, rows)
    context: dict[str, Any] = {"p": result, "rows": rows, "views": readable_views(viewer)}
    if is_htmx(request):
        return page(request, viewer, "_data_preview.html", **context)
    return page(
        request, viewer, "data_preview.html", section="data", title=f"Preview of {name}", **context
    )


def _read_preview(
    gov: GovernanceClient, ds: Dataset, version: Version, view: str, why: str, rows: int
) -> Preview:
    """Read the first shard of ``version`` in ``view`` and keep its first ``rows`` rows (a
    files dataset: the first file names, no content)."""
    if ds.format == "files":
        files = tuple(s.path for s in version.shards[:rows])
        return Preview(ds, version, view, why, files=files, total_rows=len(version.shards))
    if not version.shards:
        return Preview(ds, version, view, why, total_rows=0)
    first = version.shards[0].id
    batches = gov.read_batches(ds.name, version.id, view, shards=[first], purpose="console preview")
    try:
        _shard, table = next(batches, ("", None))
    finally:  # stop the stream once the first shard is in (closing cancels the read)
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    if table is None:
        return Preview(ds, version, view, why, total_rows=version.rows, shard=first)
    head = table.slice(0, rows)
    columns = tuple(head.schema.names)
    data = head.to_pylist()
    return Preview(
        ds,
        version,
        view,
        why,
        columns=columns,
        rows=tuple(tuple(_cell(r.get(c)) for c in columns) for r in data),
        total_rows=version.rows,
        shard=first,
    )


__all__ = [
    "Preview",
    "choose_view",
    "human_bytes",
    "lineage_graph",
    "readable_views",
    "router",
]
