"""What the report states, computed apart from its HTML: every number and sentence the
page shows comes from here (``html.py`` only lays them out), so each claim can be
checked against the data it summarises without a browser.

The rule a host's limit follows is :func:`host_interval`, one function, so that it
can be taken from the crawl's host policy once there is one.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from crawler.politeness import HostPolicy
from crawler.report.advice import advice
from crawler.report.build import Report, RunReport
from crawler.report.logread import NO_HOST, LogStats
from crawler.report.sources import HubHost, HubSummary
from crawler.storage.actionlog import BAD_LINE_KIND, ROBOTS_KIND

TOP_HOSTS = 20


# -- numbers as text --------------------------------------------------------------------------
def duration(seconds: float) -> str:
    """``1h05m``, ``2m07s``, and under a minute ``3.4 s``."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def interval_text(seconds: float) -> str:
    """An interval in rounded units: ``26 ms``, ``4.5 ms``, ``0.5 s``, ``1.25 s``."""
    if seconds < 0.1:
        ms = seconds * 1000
        return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
    return f"{seconds:.2f}".rstrip("0").rstrip(".") + " s"


def rate_text(span: float, rate: float) -> str:
    """A rate over a span; none when all lines share one instant."""
    return f"{rate:,.2f}" if span else "-"


def byte_unit(peak: float) -> tuple[float, str]:
    """(divisor, unit) for bytes per second whose largest value is *peak*: 600000
    bytes/s reads as 600 kB/s."""
    for divisor, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if peak >= divisor:
            return divisor, unit
    return 1.0, "B/s"


def size(nbytes: float) -> str:
    divisor, unit = byte_unit(nbytes)
    return f"{nbytes / divisor:,.1f} {unit[:-2]}" if divisor > 1 else f"{nbytes:,.0f} bytes"


def bytes_rate_text(rate: float) -> str:
    divisor, unit = byte_unit(rate)
    return f"{rate / divisor:,.1f} {unit}"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- runs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pace:
    """How long a log (or a run's share of the logs) was active, and its rates then."""

    active: float  # seconds
    pages: int
    failed: int  # retries + errors
    pages_per_second: float
    bytes_per_second: float

    @classmethod
    def of(cls, stats: LogStats) -> Pace:
        active = stats.active_seconds
        return cls(
            active,
            stats.pages,
            stats.outcomes["retry"] + stats.outcomes["error"],
            stats.pages / active if active else 0.0,
            stats.ok_bytes / active if active else 0.0,
        )


def run_title(run: RunReport) -> str:
    if run.entry is None:
        return "Before the first recorded run" if run.number == 0 and run.total.first_ts else "All"
    entry = run.entry
    return (
        f"Run {run.number}: {entry.get('spider', '?')}, started {entry.get('started', '?')} "
        f"on {entry.get('host', '?')} (pid {entry.get('pid', '?')})"
    )


# -- problems --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One cause of failed attempts in a log: how often, on how many hosts, how many
    URLs were given up with it, and what that means."""

    cause: str
    attempts: int
    hosts: int
    given_up: int  # URLs whose last attempt failed with it (at least, when untracked)
    advice: str  # what the cause means and what to do
    fate: str  # what became of the URLs given up, checked against the catalog


def problems(stats: LogStats, stored: set[str]) -> list[Problem]:
    """Each cause of the log's failed attempts, most frequent first; *stored* holds the
    keys of given-up URLs that have a catalog row now (``Report.stored``)."""
    out = []
    for kind, attempts in stats.kinds().most_common():
        hosts = sum(1 for counts in stats.host_errors.values() if counts[kind])
        keys = stats.given_up.get(kind, set())
        untracked = stats.given_up_untracked[kind]
        unstored = len(keys - stored)
        given_up = len(keys) + untracked
        fate = fate_text(kind, given_up, unstored, untracked)
        out.append(Problem(kind, attempts, hosts, given_up, advice(kind), fate))
    return out


def fate_text(kind: str, given_up: int, unstored: int, untracked: int = 0) -> str:
    """What became of the URLs given up with *kind*: *unstored* of them have no catalog
    row (so the next run of the list asks for them again); *untracked* more were
    counted but not looked up."""
    if kind == BAD_LINE_KIND:
        return ""  # no URL: the line is skipped every run
    if kind == ROBOTS_KIND:
        return "Never fetched; the next run asks robots.txt again."
    if not given_up:
        return "No URL was given up with it: each failed attempt was retried."
    plural = "URL" if given_up == 1 else "URLs"
    if untracked:
        return (
            f"{given_up:,} {plural} given up with it; at least {unstored:,} of them have "
            "no stored row, and the next run of the same list asks for those again."
        )
    if unstored == given_up:
        which, them = ("it has no", "it") if given_up == 1 else ("none of them has a", "them")
        return (
            f"{given_up:,} {plural} given up with it, and {which} stored row: the next "
            f"run of the same list asks for {them} again."
        )
    if unstored == 0:
        return f"{given_up:,} {plural} given up with it, all stored since by a later attempt."
    return (
        f"{given_up:,} {plural} given up with it: {given_up - unstored:,} stored since, "
        f"{unstored:,} without a stored row, which the next run of the same list asks "
        "for again."
    )


# -- hosts -----------------------------------------------------------------------------------
def failing_hosts(stats: LogStats, top: int = TOP_HOSTS) -> list[tuple[str, Counter[str]]]:
    """The hosts with most failed attempts, most first, with their causes; a line that
    names no host (a bad line of the URL list) is no host's."""
    ranked = sorted(
        ((host, counts) for host, counts in stats.host_errors.items() if host not in NO_HOST),
        key=lambda kv: (-sum(kv[1].values()), kv[0]),
    )
    return ranked[:top]


@dataclass(frozen=True)
class Interval:
    """The least time between two requests to a host, and what set it."""

    seconds: float  # 0: no limit
    why: str


def host_interval(
    delay: float, crawl_delay: float | None = None, budget: HubHost | None = None
) -> Interval:
    """The interval of a host: the one its processes last asked of the hub's budget
    (the host policy's, AutoThrottle and Crawl-delay included), else the host policy's
    (``crawler/politeness.py``) from the run's DOWNLOAD_DELAY and the Crawl-delay the
    host was kept to; AutoThrottle, which no log line records, is then left out."""
    if budget is not None and budget.interval > 0:
        return Interval(budget.interval, f"hub budget: one per {interval_text(budget.interval)}")
    kept = HostPolicy(delay=delay, crawl_delay_max=math.inf).interval(crawl_delay)
    if kept.seconds <= 0:
        return Interval(0.0, "none: DOWNLOAD_DELAY 0")
    return Interval(kept.seconds, f"{kept.why} {interval_text(kept.seconds)}")


@dataclass(frozen=True)
class HostLimit:
    host: str
    requests: int
    peak: float  # requests per second in the busiest bin
    limit: float | None  # requests per second the settings allow; None: no limit
    why: str

    @property
    def ratio(self) -> float | None:
        return self.peak / self.limit if self.limit else None


def run_delay(settings: list[tuple[str, str]]) -> float:
    try:
        return float(dict(settings).get("DOWNLOAD_DELAY") or 0)
    except ValueError:
        return 0.0


def host_limits(report: Report, top: int = TOP_HOSTS) -> list[HostLimit]:
    """The busiest hosts of the report, each with its peak rate and its limit."""
    rates = report.total.rates
    delay = run_delay(report.settings)
    budgets = {b.key: b for b in report.host_budgets}
    out = []
    for host in rates.busiest(top):
        interval = host_interval(delay, rates.crawl_delays.get(host), budgets.get(host))
        limit = 1 / interval.seconds if interval.seconds else None
        out.append(HostLimit(host, rates.requests[host], rates.peak(host), limit, interval.why))
    return out


# -- proxies ---------------------------------------------------------------------------------
def lease_spans(hub: HubSummary) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """Per proxy, its leases (kind: how each ended) and the rests after them."""
    rows = []
    for proxy in hub.proxies:
        leases = [lease for lease in hub.leases if lease.proxy_id == proxy.id]
        spans = []
        for i, lease in enumerate(leases):
            end = lease.ended if lease.ended is not None else hub.now
            spans.append((lease.started, end, lease.end_reason or "held"))
            if lease.end_reason in ("banned", "rotated"):
                following = leases[i + 1].started if i + 1 < len(leases) else None
                rest_end = following or proxy.resting_until
                if rest_end and rest_end > end:
                    spans.append((end, min(rest_end, hub.now), "rest"))
        rows.append((proxy.url, spans))
    return rows
