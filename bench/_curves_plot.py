"""The capacity curves of ``bench/curves.py`` as SVG charts and as Markdown tables.

Both are drawn from the same results (the JSON ``curves.py`` writes), so a chart and its
table never disagree, and ``curves.py --plot-only JSON`` redraws the charts without
measuring again. The SVGs are deterministic for given results (no date, a fixed hash salt),
so a rerun that measured the same numbers leaves git with nothing to commit.

Results: ``{"meta": {...}, "curves": {name: {"title", "x_label", "y_label", "note",
"rows": [{"x", "oncelog", "mock", "rss_mib", ...}]}}}``, where ``mock`` is None where the mock
cannot run that point; a latency curve's rows hold ``oncelog_p50``, ``oncelog_p99``,
``mock_p50`` and ``mock_p99`` instead of ``oncelog`` and ``mock``.
"""

from __future__ import annotations

import math
from pathlib import Path

ONCELOG_COLOR = "#1f77b4"
MOCK_COLOR = "#ff7f0e"
RSS_COLOR = "#7f7f7f"


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """The points of one line: rows without a value for ``key`` (None, NaN) are gaps."""
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            xs.append(row["x"])
            ys.append(value)
    return xs, ys


def plot_curve(name: str, curve: dict, meta: dict, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: the benchmark runs headless
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "oncelog-curves"  # stable element ids from run to run
    fig, ax = plt.subplots(figsize=(8, 5.2))
    rows = curve["rows"]
    if curve.get("kind") == "latency":
        lines = (("oncelog_p50", "oncelog p50", ONCELOG_COLOR, "-"),
                 ("oncelog_p99", "oncelog p99", ONCELOG_COLOR, "--"),
                 ("mock_p50", "librdkafka mock p50", MOCK_COLOR, "-"),
                 ("mock_p99", "librdkafka mock p99", MOCK_COLOR, "--"))
    else:
        lines = (("oncelog", "oncelog", ONCELOG_COLOR, "-"),
                 ("mock", "librdkafka mock", MOCK_COLOR, "-"))
    for key, label, color, style in lines:
        xs, ys = _series(rows, key)
        if xs:
            # The id names the series in the SVG, for people editing it and for the test.
            ax.plot(xs, ys, style, marker="o", color=color, label=label, gid=f"series-{key}")
    ax.set_xscale(curve.get("x_scale", "log"))
    if curve.get("y_scale"):
        ax.set_yscale(curve["y_scale"])
    ax.set_xlabel(curve["x_label"])
    ax.set_ylabel(curve["y_label"])
    ax.set_ylim(bottom=0 if curve.get("y_scale") != "log" else None)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    xs, ys = _series(rows, "rss_mib")
    if xs:
        rss = ax.twinx()
        rss.plot(xs, ys, ":", marker="s", color=RSS_COLOR, label="oncelog broker RSS (MiB)",
                 gid="series-rss_mib")
        rss.set_ylabel("oncelog broker RSS after the point (MiB)", color=RSS_COLOR)
        rss.set_ylim(bottom=0)
        more_handles, more_labels = rss.get_legend_handles_labels()
        handles += more_handles
        labels += more_labels
    ax.legend(handles, labels, loc="best", fontsize="small")
    ax.set_title(curve["title"], fontsize="medium")
    fig.text(0.01, 0.01, f"{curve['note']}\n{meta.get('stamp', '')}", fontsize="x-small",
             va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.svg"
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path


def plot_all(results: dict, out_dir: Path) -> list[Path]:
    return [plot_curve(name, curve, results.get("meta", {}), out_dir)
            for name, curve in results["curves"].items()]


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(curve: dict) -> str:
    """One Markdown table of a curve's rows, every column the rows carry, in their order."""
    columns: list[str] = []
    for row in curve["rows"]:
        columns += [key for key in row if key not in columns]
    headers = [curve.get("columns", {}).get(c, c) for c in columns]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |"
              for row in curve["rows"]]
    return "\n".join(lines)


def tables(results: dict) -> str:
    parts = []
    for name, curve in results["curves"].items():
        parts.append(f"#### {curve['title']} (`{name}.svg`)\n\n{curve['note']}\n\n"
                     f"{table(curve)}\n")
    return "\n".join(parts)
