"""The server-drawn charts: text is escaped, axes are readable, graphs are layered."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gantry.console import charts


def _parse(markup: str) -> ET.Element:
    return ET.fromstring(str(markup))  # well-formed SVG or this raises


def test_every_text_is_escaped() -> None:
    evil = '<script>alert("x")</script>'
    drawn = [
        charts.line_chart([charts.Series(evil, [(0, 1), (1, 2)]), charts.Series("b", [(0, 3)])]),
        charts.heat_map([evil], [evil], [[0.5]]),
        charts.stacked_bars([evil], [evil], [[1.0]]),
        charts.graph([charts.Node("a", evil, href='"/x?a=1&b=2')], []),
        charts.empty(evil),
    ]
    for svg in drawn:
        assert "<script>" not in str(svg)
        _parse(svg)


def test_narrow_ranges_get_distinct_tick_labels() -> None:
    svg = str(charts.line_chart([charts.Series("acc", [(1, 0.826), (2, 0.834)])]))
    labels = re.findall(r'text-anchor="end">([^<]+)<', svg)
    assert len(labels) == len(set(labels)) >= 3, labels
    assert "0.830" in labels


def test_no_points_says_so() -> None:
    assert "no data yet" in str(charts.line_chart([charts.Series("loss", [])], title="Loss"))


def test_graph_layers_follow_the_edges() -> None:
    nodes = [charts.Node(n, n) for n in ("deploy", "train", "data", "evaluate")]
    edges = [
        charts.Edge("data", "train"),
        charts.Edge("train", "evaluate"),
        charts.Edge("evaluate", "deploy"),
    ]
    svg = _parse(charts.graph(nodes, edges))
    xs = {}
    for g in svg.iter("{http://www.w3.org/2000/svg}g") or svg.iter("g"):
        rect = g.find("{http://www.w3.org/2000/svg}rect") or g.find("rect")
        xs[g.get("data-node")] = float(rect.get("x"))
    if not xs:
        for g in svg.iter("g"):
            xs[g.get("data-node")] = float(g.find("rect").get("x"))
    assert xs["data"] < xs["train"] < xs["evaluate"] < xs["deploy"]


def test_a_cycle_does_not_hang_the_layout() -> None:
    nodes = [charts.Node("a", "a"), charts.Node("b", "b")]
    svg = charts.graph(nodes, [charts.Edge("a", "b"), charts.Edge("b", "a")])
    _parse(svg)


def test_heat_map_marks_rows_and_greys_missing_cells() -> None:
    svg = str(
        charts.heat_map(["n1", "n2"], ["a", "b"], [[0.1, None], [1.0, 0.0]], marked_rows=["n2"])
    )
    assert "#e5e7eb" in svg  # the missing cell
    assert 'stroke="#c53030"' in svg  # n2 outlined
