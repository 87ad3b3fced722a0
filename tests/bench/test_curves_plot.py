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

from _curves_plot import plot_all, plot_curve, table, tables  # noqa: E402

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


def test_charts_are_valid_stable_svg_with_gaps_left_out(tmp_path):
    paths = plot_all(RESULTS, tmp_path / "a")
    assert [p.name for p in paths] == ["partitions.svg", "latency.svg"]
    again = plot_curve("partitions", RESULTS["curves"]["partitions"], RESULTS["meta"],
                       tmp_path / "b")
    assert again.read_bytes() == paths[0].read_bytes()  # committed charts do not churn
    # The mock's points where it cannot run are left out, not drawn at zero.
    assert _points(paths[0]) == {"oncelog": 3, "mock": 1, "rss_mib": 3}
    assert _points(paths[1]) == {"oncelog_p50": 2, "oncelog_p99": 2, "mock_p50": 2,
                                 "mock_p99": 2, "rss_mib": 2}


def test_table_has_every_point_and_dashes_for_gaps():
    lines = table(RESULTS["curves"]["partitions"]).splitlines()
    assert lines[0] == "| partitions | oncelog MB/s | mock MB/s | broker RSS MiB |"
    assert lines[2:] == ["| 1 | 60.5 | 90.2 | 55.0 |",
                         "| 100 | 25.0 | - | 57.5 |",
                         "| 10,000 | 1.23 | - | 210 |"]
    assert "#### Latency against load (`latency.svg`)" in tables(RESULTS)
