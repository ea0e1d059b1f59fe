"""The report's figures, drawn with matplotlib as inline SVG (no JavaScript).

Every function takes aggregated numbers (bins, counters), never log lines, and returns
the SVG text of one figure. Each drawn series carries an SVG id ``<figure>-mark-<n>``
so that a reader (or a test) can find the marks of a figure.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime

from crawler.report.model import byte_unit
from crawler.storage.actionlog import OUTCOMES

# Imported with the first figure (load_matplotlib): over a second of imports that the
# report's text helpers, and a process merely importing this module, have no use for.
matplotlib = mdates = Figure = None

COLOURS = {
    "ok": "#2a9d8f",
    "cache_hit": "#8ab17d",
    "not_modified": "#e9c46a",
    "unchanged": "#c9b458",
    "retry": "#f4a261",
    "error": "#e76f51",
    "item_error": "#9b5de5",
    "host_wait": "#6c757d",
}
# 7 inches: 672 px at 96 dpi, drawn at full size in an 800 px wide window.
WIDE = (7.0, 3.0)
TIME_LABEL = "time (UTC)"


def load_matplotlib() -> None:
    global matplotlib, mdates, Figure
    if Figure is not None:
        return
    import matplotlib as mpl

    mpl.use("svg")
    import matplotlib.dates as dates
    from matplotlib.figure import Figure as MplFigure

    matplotlib, mdates, Figure = mpl, dates, MplFigure


class Canvas:
    """One figure whose artists get stable SVG ids, rendered to SVG text."""

    def __init__(self, name: str, size: tuple[float, float] = WIDE, rows: int = 1):
        self.name = name
        load_matplotlib()
        self.figure = Figure(figsize=size, layout="constrained")
        self.axes = self.figure.subplots(rows, 1, squeeze=False)[:, 0]
        self.marks = 0

    def mark(self, artists) -> None:
        """Give each drawn artist an id naming this figure."""
        items = artists if isinstance(artists, (list, tuple)) else [artists]
        if hasattr(artists, "patches"):  # a BarContainer
            items = artists.patches
        for artist in items:
            artist.set_gid(f"{self.name}-mark-{self.marks}")
            self.marks += 1

    def svg(self) -> str:
        buffer = io.StringIO()
        # Ids inside each SVG are salted per figure, so that several inline SVGs in
        # one page never share an id.
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": self.name}):
            self.figure.savefig(buffer, format="svg")
        text = buffer.getvalue()
        return text[text.index("<svg") :]


def _times(starts: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(s, UTC) for s in starts]


def _steps(width: int, bins: list[tuple[float, list[float]]], slot: int) -> tuple[list, list]:
    """Times and per-second values of one slot, closed by the end of the last bin (a
    step plot draws nothing for a single point)."""
    when = _times([start for start, _ in bins] + [bins[-1][0] + width])
    values = [slots[slot] / width for _, slots in bins]
    return when, values + values[-1:]


def _time_axis(ax) -> None:
    """Clock times in UTC, each tick whole (not "25 30 ... 14:03 05"), the zone in the
    label."""
    locator = mdates.AutoDateLocator(minticks=3, maxticks=6, tz=UTC)
    ax.xaxis.set_major_locator(locator)
    left, right = ax.get_xlim()
    pattern = "%H:%M:%S" if right - left < 0.5 else "%m-%d %H:%M"  # in days
    ax.xaxis.set_major_formatter(mdates.DateFormatter(pattern, tz=UTC))
    ax.set_xlabel(TIME_LABEL)
    ax.grid(alpha=0.3)


def _legend(canvas: Canvas, ax) -> None:
    """A legend above the plot, outside the data it would hide."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        canvas.figure.legend(
            handles,
            labels,
            loc="outside upper center",
            ncols=min(len(labels), 4),
            fontsize="small",
            frameon=False,
        )


def rate_figure(name: str, series: dict[str, tuple[int, list[tuple[float, list[float]]]]]) -> str:
    """Pages/s and bytes/s over time, one line per task."""
    canvas = Canvas(name, (WIDE[0], 5.0), rows=2)
    pages_ax, bytes_ax = canvas.axes
    peak = max((max(_steps(w, bins, -1)[1]) for w, bins in series.values() if bins), default=0.0)
    divisor, unit = byte_unit(peak)
    for task, (width, bins) in series.items():
        if not bins:
            continue
        canvas.mark(pages_ax.step(*_steps(width, bins, 0), where="post", label=task))
        when, values = _steps(width, bins, -1)
        canvas.mark(bytes_ax.step(when, [v / divisor for v in values], where="post", label=task))
    pages_ax.set_ylabel("pages/s")
    bytes_ax.set_ylabel(unit)
    for ax in canvas.axes:
        ax.set_ylim(bottom=0)
        _time_axis(ax)
    if 1 < len(series) <= 12:
        _legend(canvas, pages_ax)
    return canvas.svg()


def outcome_figure(name: str, width: int, bins: list[tuple[float, list[float]]]) -> str:
    """Attempts per second by outcome, stacked."""
    canvas = Canvas(name)
    ax = canvas.axes[0]
    columns = [
        (outcome, _steps(width, bins, i)[1])
        for i, outcome in enumerate(OUTCOMES)
        if any(slots[i] for _, slots in bins)
    ]
    when = _steps(width, bins, 0)[0] if bins else []
    if columns:
        stacks = ax.stackplot(
            when,
            *[values for _, values in columns],
            labels=[o for o, _ in columns],
            colors=[COLOURS[o] for o, _ in columns],
            step="post",
        )
        canvas.mark(stacks)
    ax.set_ylabel("attempts/s")
    ax.set_ylim(bottom=0)
    _time_axis(ax)
    _legend(canvas, ax)
    return canvas.svg()


def bar_figure(name: str, labels: list[str], values: list[float], xlabel: str) -> str:
    """Horizontal bars, largest on top."""
    height = max(1.6, 0.3 * len(labels) + 0.8)
    canvas = Canvas(name, (WIDE[0], height))
    ax = canvas.axes[0]
    # Positions, not the labels themselves: labels such as "200" would be parsed as numbers.
    canvas.mark(ax.barh(range(len(labels)), values[::-1], color="#457b9d"))
    ax.set_yticks(range(len(labels)), labels[::-1])
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    return canvas.svg()


def stacked_bar_figure(
    name: str, labels: list[str], parts: dict[str, list[int]], xlabel: str
) -> str:
    """Horizontal bars split into parts (e.g. hosts by error kind), first label on top."""
    height = max(1.8, 0.3 * len(labels) + 1.3)
    canvas = Canvas(name, (WIDE[0], height))
    ax = canvas.axes[0]
    left = [0] * len(labels)
    for part, values in parts.items():
        bars = ax.barh(range(len(labels)), values[::-1], left=left[::-1], label=part)
        canvas.mark(bars)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(range(len(labels)), labels[::-1])
    ax.set_xlabel(xlabel)
    _legend(canvas, ax)
    ax.grid(axis="x", alpha=0.3)
    return canvas.svg()


def lease_figure(name: str, proxies: list[tuple[str, list[tuple[float, float, str]]]]) -> str:
    """Per proxy: lease periods (by how they ended) and rest periods, over time.

    *proxies* holds (label, [(start, end, kind)]) where kind is a lease's end reason
    or ``rest``.
    """
    colours = {"banned": "#e76f51", "rest": "#cccccc", "rotated": "#2a9d8f"}
    canvas = Canvas(name, (WIDE[0], max(2.2, 0.45 * len(proxies) + 1.5)))
    ax = canvas.axes[0]
    seen: set[str] = set()
    for row, (_, spans) in enumerate(proxies):
        for start, end, kind in spans:
            left = mdates.date2num(datetime.fromtimestamp(start, UTC))
            right = mdates.date2num(datetime.fromtimestamp(max(end, start + 0.5), UTC))
            label = kind if kind not in seen else None
            seen.add(kind)
            bars = ax.broken_barh(
                [(left, right - left)],
                (row - 0.35, 0.7),
                facecolors=colours.get(kind, "#457b9d"),
                hatch="//" if kind == "rest" else None,
                label=label,
            )
            canvas.mark(bars)
    ax.set_yticks(range(len(proxies)), [label for label, _ in proxies])
    ax.invert_yaxis()
    ax.xaxis_date()
    _time_axis(ax)
    _legend(canvas, ax)
    return canvas.svg()


def host_rate_figure(
    name: str,
    width: int,
    hosts: list[tuple[str, list[tuple[float, float]], float | None]],
    ylabel: str = "requests/s",
) -> str:
    """Requests per second over time, one line per host, each with its limit dashed in
    the same colour. *hosts* holds (host, [(bin start epoch, requests/s)], limit), in
    bins *width* seconds wide. (The live page draws pages/s per node with it.)"""
    canvas = Canvas(name)
    ax = canvas.axes[0]
    for index, (host, series, limit) in enumerate(hosts):
        if not series:
            continue
        colour = f"C{index % 10}"
        when = _times([start for start, _ in series] + [series[-1][0] + width])
        values = [rate for _, rate in series]
        canvas.mark(ax.step(when, values + values[-1:], where="post", label=host, color=colour))
        if limit:
            canvas.mark(ax.axhline(limit, linestyle="--", linewidth=1, color=colour))
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    _time_axis(ax)
    _legend(canvas, ax)
    return canvas.svg()
