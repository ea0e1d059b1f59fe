"""The chart of docs/benchmarks.md: each headline figure as its speed against the
reference it is measured with (1.0: as fast), from the figures the page's table lists.

    python -m benchmarks.chart [--out docs/img/benchmarks.svg]

It measures nothing: the benchmark commands of the table do. After running one, update
its row here and in the page's table, and draw the chart again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent
# (what, low, high, command): the speed against the reference, as a range when runs
# scattered. Lower-is-better figures (wall time against an ideal) are inverted.
FIGURES = [
    ("crawl with storage / bare Scrapy spider", 0.87, 0.93, "bench_speed --rounds 3"),
    ("Scrapy HTTPCACHE / bare Scrapy spider", 0.55, 0.82, "bench_crawl --rounds 5"),
    ("re-parse, 1 worker / plain parse loop", 1.00, 1.02, "bench_reparse_loop --rounds 5"),
    ("re-parse, 2 workers / 2 x plain loop", 0.90, 0.93, "bench_reparse_loop --rounds 5"),
    ("politeness: ideal schedule / wall, skewed", 0.94, 0.95, "bench_politeness --only skewed"),
    ("politeness: ideal schedule / wall, even", 0.92, 0.92, "bench_politeness --only even"),
]


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("svg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 3.2), layout="constrained")
    ax = figure.subplots()
    rows = list(reversed(FIGURES))
    for y, (_, low, high, _) in enumerate(rows):
        ax.barh(y, high, color="#9ec5e8")
        ax.barh(y, low, color="#457b9d")
        ax.text(1.04, y, f"{low:.2f}" if low == high else f"{low:.2f}-{high:.2f}",
                va="center", fontsize=9)  # fmt: skip
    ax.set_yticks(range(len(rows)), [what for what, *_ in rows], fontsize=9)
    ax.axvline(1.0, color="#222", linewidth=1, linestyle="--")
    ax.set_xlim(0, 1.3)
    ax.set_xlabel("speed against the reference (1.0: as fast; light: the best run)")
    ax.grid(axis="x", alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.hashsalt": "benchmarks", "svg.fonttype": "none"}):
        figure.savefig(out, format="svg", metadata={"Date": None})


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chart", description=__doc__, formatter_class=ToolHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "benchmarks.svg")
    args = parser.parse_args()
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
