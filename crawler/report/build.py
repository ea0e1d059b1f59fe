"""Collect a data directory's numbers, render the page, write it atomically, or keep
rewriting it (``--watch``)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from crawler.redact import redact_url
from crawler.report.logread import LogFollower, LogStats
from crawler.report.sources import (
    CatalogSummary,
    HubHost,
    HubSummary,
    Layout,
    QueueSummary,
    find_layout,
    read_catalogs,
    read_host_budgets,
    read_hub,
    read_queues,
    stored_keys,
)
from crawler.runsettings import crawl_settings
from crawler.storage.datadir import DataDir
from crawler.storage.runlog import read_runs

logger = logging.getLogger(__name__)


@dataclass
class RunReport:
    """One run's share of the action logs: the lines from its start (runs.jsonl) to
    the next run's. Run 0 holds the lines older than the first recorded run, or all of
    them when the data directory has no runs.jsonl."""

    number: int
    entry: dict | None  # its line of runs.jsonl
    total: LogStats
    tasks: dict[str, LogStats]


@dataclass
class Report:
    """Everything the page shows, already aggregated."""

    layout: Layout
    generated: float
    catalog: CatalogSummary | None
    tasks: dict[str, LogStats]
    total: LogStats
    hub: HubSummary | None
    settings: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0  # time taken to collect
    queues: list[QueueSummary] = field(default_factory=list)  # the hub's work queues
    run: dict | None = None  # the latest line of runs.jsonl, whose settings are shown
    runs: list[RunReport] = field(default_factory=list)  # oldest first
    host_budgets: list[HubHost] = field(default_factory=list)  # the hub's, by host
    # Of the URLs the action logs say were given up (LogStats.given_up), those that
    # have a row in the catalog now (a later run stored them).
    stored: set[str] = field(default_factory=set)


def report_settings(
    items: Iterable[tuple[str, object]], hub_url: str | None = None
) -> list[tuple[str, str]]:
    """The crawl-relevant settings as text, credentials redacted, sorted by name;
    ``HUB_URL`` as used (it may come from the environment)."""
    return list(crawl_settings(items, hub_url).items())


class ReportBuilder:
    """Reads a data directory (and the hub, when given) into a :class:`Report`."""

    def __init__(
        self,
        data_dir: Path,
        hub_url: str | None = None,
        settings: list[tuple[str, str]] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.data_dir = Path(data_dir)
        self.hub_url = hub_url or None
        self.settings = settings or []
        self.clock = clock
        # Kept between collections: a rewrite reads only what each log gained.
        self.followers: dict[Path, LogFollower] = {}

    def collect(self) -> Report:
        started = time.perf_counter()
        layout = find_layout(self.data_dir)
        catalog = read_catalogs(layout.catalogs) if layout.catalogs else None
        entries = sorted(read_runs(DataDir(self.data_dir).runs_path), key=run_start)
        starts = [run_start(entry) for entry in entries]
        tasks: dict[str, LogStats] = {}
        total = LogStats()
        followers = {}
        for name, path in layout.logs:
            follower = self.followers.get(path)
            if follower is None:
                follower = self.followers[path] = LogFollower(path, starts=starts)
            follower.set_starts(starts)
            stats = follower.update()
            tasks[name] = stats
            total.merge(stats)
            followers[name] = follower
        runs = []
        for number in range(len(starts) + 1):
            share = {name: f.runs[number] for name, f in followers.items()}
            run_total = LogStats()
            for stats in share.values():
                run_total.merge(stats)
            if number == 0 and entries and not run_total.lines:
                continue  # nothing older than the first recorded run
            runs.append(
                RunReport(number, entries[number - 1] if number else None, run_total, share)
            )
        now = self.clock()
        hub = read_hub(self.hub_url, now) if self.hub_url else None
        run = entries[-1] if entries else None
        report = Report(
            layout, now, catalog, tasks, total, hub, self.run_settings(run), run=run, runs=runs
        )
        given_up = set().union(*total.given_up.values())
        if given_up and layout.catalogs:
            report.stored = stored_keys(layout.catalogs, given_up)
        if self.hub_url:
            report.queues = read_queues(self.hub_url)
            report.host_budgets = read_host_budgets(self.hub_url)
        report.seconds = time.perf_counter() - started
        return report

    def run_settings(self, run: dict | None) -> list[tuple[str, str]]:
        """The latest run's settings as it recorded them (the hub this command reads
        added when the run named none); without a run, the settings this command sees."""
        if run is None:
            return self.settings
        # Redacted again: the file may come from an older or hand-edited run.
        shown = {str(name): redact_url(str(value)) for name, value in run["settings"].items()}
        if self.hub_url and "HUB_URL" not in shown:
            shown["HUB_URL"] = crawl_settings([], self.hub_url)["HUB_URL"]
        arguments = run.get("arguments")
        given = arguments.items() if isinstance(arguments, dict) else ()
        # The spider's arguments first, as the command line gave them (-a depth=3).
        return [(f"-a {k}", redact_url(str(v))) for k, v in given] + sorted(shown.items())

    def render(self) -> str:
        from crawler.report.html import render_page

        return render_page(self.collect())

    def write(self, output: Path) -> None:
        write_atomic(Path(output), self.render())


def run_start(entry: dict) -> float:
    """A run's start (runs.jsonl's ``started``, UTC, to the millisecond or, written by
    an older version, the second) as epoch seconds."""
    for pattern in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
        try:
            return datetime.strptime(str(entry.get("started")), pattern).timestamp()
        except ValueError:
            continue
    return 0.0


def write_atomic(path: Path, text: str) -> None:
    """Write *text* to *path* through a temporary file in the same directory, so a
    reader (a browser reloading the page) sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def watch(builder: ReportBuilder, output: Path, interval: float) -> int:
    """Rewrite *output* every *interval* seconds until SIGINT or SIGTERM; returns 0."""
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        logger.info("signal %d: stopping after this report", signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.is_set():
            builder.write(output)
            logger.info("wrote %s", output)
            stop.wait(interval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
