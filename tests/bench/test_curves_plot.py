"""bench/_curves_plot.py: the capacity charts and tables drawn from a fixed results table.

The charts are committed into docs/, so they must come out byte-identical from the same
numbers (no date, stable ids) and must leave out the points where the mock cannot run
instead of drawing them at zero.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _curves_plot import plot_curve, table, tables

RESULTS = {
    "meta": {"stamp": "2026-11-28 12:00 UTC, fixed"},
    "curves": {
        "partitions": {
            "title": "Throughput against partitions", "x_label": "partitions",
            "y_label": "MB/s", "note": "fixed numbers",
            "columns": {"x": "partitions", "oncelog": "oncelog MB/s", "mock": "mock MB/s",
                        "rss_mib": "broker RSS MiB"},
            "rows": [{"x": 1, "oncelog": 60.5, "mock": 90.25, "rss_mib": 55.0},
                     {"x": 100, "oncelog": 25.0, "mock": None, "rss_mib": 57.5},
                     {"x": 10_000, "oncelog": 1.234, "mock": None, "rss_mib": 210.0}],
        },
        "latency": {
            "kind": "latency", "x_scale": "linear", "title": "Latency against load",
            "x_label": "msgs/s", "y_label": "ms", "note": "fixed numbers",
            "rows": [{"x": 5000.0, "oncelog_p50": 5.0, "oncelog_p99": 20.0,
                      "mock_p50": 4.0, "mock_p99": 10.0, "rss_mib": 56.0},
                     {"x": 15000.0, "oncelog_p50": 6.0, "oncelog_p99": 70.0,
                      "mock_p50": 4.5, "mock_p99": 12.0, "rss_mib": 56.0}],
        },
    },
}


def _points(svg: Path) -> dict[str, int]:
    """Markers drawn per series (the ``series-*`` groups the plotter names)."""
    counts = {}
    for element in ET.parse(svg).iter("{http://www.w3.org/2000/svg}g"):
        name = element.get("id") or ""
        if name.startswith("series-"):
            counts[name[len("series-"):]] = sum(
                1 for _ in element.iter("{http://www.w3.org/2000/svg}use"))
    return counts


def test_chart_is_stable_svg_with_the_gaps_left_out(tmp_path):
    # One chart, drawn twice (each draw costs about a second of matplotlib).
    curve = RESULTS["curves"]["partitions"]
    first = plot_curve("partitions", curve, RESULTS["meta"], tmp_path / "a")
    second = plot_curve("partitions", curve, RESULTS["meta"], tmp_path / "b")
    assert first.name == "partitions.svg"
    assert second.read_bytes() == first.read_bytes()  # committed charts do not churn
    # The mock's points where it cannot run are left out, not drawn at zero.
    assert _points(first) == {"oncelog": 3, "mock": 1, "rss_mib": 3}


def test_table_has_every_point_and_dashes_for_gaps():
    lines = table(RESULTS["curves"]["partitions"]).splitlines()
    assert lines[0] == "| partitions | oncelog MB/s | mock MB/s | broker RSS MiB |"
    assert lines[2:] == ["| 1 | 60.5 | 90.2 | 55.0 |",
                         "| 100 | 25.0 | - | 57.5 |",
                         "| 10,000 | 1.23 | - | 210 |"]
    assert "#### Latency against load (`latency.svg`)" in tables(RESULTS)
