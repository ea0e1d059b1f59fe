"""Streaming aggregation of an action log into time bins and counters.

A log of ten million lines is read one line at a time into a bounded summary: lines
are counted into time bins whose width doubles (neighbouring bins merged) whenever
there would be more than ``MAX_BINS`` of them, so memory depends on the number of
hosts, proxies and error kinds, never on the number of lines. Plots are drawn from
these bins, not from the lines.
"""

from __future__ import annotations

import bisect
import calendar
import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from crawler.storage.actionlog import BAD_LINE_KIND, FAILED, OUTCOMES, error_kind

logger = logging.getLogger(__name__)

MAX_BINS = 2048
# Hosts with failures tracked at once; past it the hosts with fewest failures are
# dropped (the top 20 of a crawl of millions of hosts stay, counts become lower bounds).
MAX_HOSTS = 50_000
# Index of each outcome in a bin's list; the last slot holds the bytes of "ok" lines.
_SLOT = {name: i for i, name in enumerate(OUTCOMES)}
_BYTES = len(OUTCOMES)
# A stretch this long with no attempt at all is a stall, or the time between two runs:
# it is not counted in a rate's time (a minute: longer than any download timeout a
# crawl retries within, shorter than a stall anyone would want averaged in).
IDLE_GAP_SECONDS = 60

# URLs whose last attempt failed (an ``error`` line with a key) kept per log, to ask
# the catalogs whether they were stored since; past it they are only counted.
MAX_GIVEN_UP = 50_000
# A line that names no host (a bad line of the URL list) is counted by its cause, never
# as a host's failure.
NO_HOST = frozenset({"(none)", "(bad url)"})

# Lines that are a request sent to a host (a cache hit, an item or a wait is not).
REQUEST_OUTCOMES = frozenset({"ok", "not_modified", "unchanged", "retry", "error"})
# Requests per host are counted in bins this wide at first (the window in which a
# host's limits are usually judged), doubled when a host would have more than
# MAX_HOST_BINS of them; binned for at most MAX_RATE_HOSTS hosts, those with fewest
# requests dropped first, so a crawl of millions of hosts keeps its busiest.
HOST_BIN_SECONDS = 10
MAX_HOST_BINS = 512
MAX_RATE_HOSTS = 200
_CRAWL_DELAY = re.compile(r"Crawl-delay ([0-9.]+) s")


def host_of(url: str) -> str:
    try:
        return urlsplit(url).hostname or "(none)"
    except ValueError:
        return "(bad url)"


@dataclass
class LogStats:
    """What one action log (or several merged) says, in bounded memory."""

    width: int = 1  # seconds per bin
    bins: dict[int, list[float]] = field(default_factory=dict)
    lines: int = 0
    bad_lines: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    ok_bytes: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    host_errors: defaultdict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    proxy_outcomes: defaultdict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    first_problem: str | None = None
    hosts_dropped: int = 0
    rates: HostRates = field(default_factory=lambda: HostRates())
    # Failed attempts by cause, every one (host_errors drops hosts, and skips lines
    # that name none).
    causes: Counter[str] = field(default_factory=Counter)
    # Per cause, the keys of URLs given up with it (an ``error`` line), up to
    # MAX_GIVEN_UP in all, and how many more there were.
    given_up: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    given_up_untracked: Counter[str] = field(default_factory=Counter)
    # Per bin (as ``bins``), the earliest start of an attempt that ended in it: an
    # attempt in flight through a long stretch without lines keeps that stretch active.
    starts: dict[int, float] = field(default_factory=dict)

    def add(self, ts: float, outcome: str, nbytes: int, elapsed: float = 0.0) -> None:
        key = int(ts) // self.width
        slots = self.bins.get(key)
        if slots is None:
            if len(self.bins) >= MAX_BINS:
                self._coarsen()
                key = int(ts) // self.width
                slots = self.bins.get(key)
            if slots is None:
                slots = self.bins[key] = [0] * (len(OUTCOMES) + 1)
        slot = _SLOT.get(outcome)
        if slot is not None:
            slots[slot] += 1
        if outcome == "ok":
            slots[_BYTES] += nbytes
        if elapsed > 0:
            start = ts - elapsed
            if start < self.starts.get(key, ts):
                self.starts[key] = start
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts

    def _coarsen(self) -> None:
        """Double the bin width, merging pairs of bins."""
        merged: dict[int, list[float]] = {}
        for key, slots in self.bins.items():
            into = merged.get(key // 2)
            if into is None:
                merged[key // 2] = slots
            else:
                for i, value in enumerate(slots):
                    into[i] += value
        self.bins = merged
        starts: dict[int, float] = {}
        for key, start in self.starts.items():
            starts[key // 2] = min(start, starts.get(key // 2, start))
        self.starts = starts
        self.width *= 2

    def series(
        self, target_points: int = 300, min_width: int = 1
    ) -> tuple[int, list[tuple[float, list[float]]]]:
        """(bin seconds, [(bin start epoch, slots)]) with at most target_points bins,
        each at least *min_width* seconds wide (to draw several logs with one width).

        Empty bins inside the span are included as zeros so that a stall shows as a dip.
        """
        if not self.bins:
            return self.width, []
        lo, hi = min(self.bins), max(self.bins)
        factor = 1
        while hi // factor - lo // factor + 1 > target_points or self.width * factor < min_width:
            factor *= 2
        grouped: dict[int, list[float]] = {}
        for key, slots in self.bins.items():
            into = grouped.setdefault(key // factor, [0] * len(slots))
            for i, value in enumerate(slots):
                into[i] += value
        width = self.width * factor
        first, last = min(grouped), max(grouped)
        empty = [0] * (len(OUTCOMES) + 1)
        return width, [(k * width, grouped.get(k, empty)) for k in range(first, last + 1)]

    @property
    def pages(self) -> int:
        """Responses fetched and stored or counted as final (outcome ``ok``)."""
        return self.outcomes["ok"]

    @property
    def span_seconds(self) -> float:
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return self.last_ts - self.first_ts

    @property
    def active_seconds(self) -> float:
        """The span less its idle stretches: IDLE_GAP_SECONDS or more with no line
        written and no attempt in flight (an attempt's line says, in ``elapsed_ms``,
        how long it was on its way), as far as the bins tell. Rates over it are the
        crawl's speed while it ran."""
        keys = sorted(self.bins)
        idle = 0.0
        # The earliest start of an attempt that ended in each bin or a later one.
        earliest = float("inf")
        reach = {}
        for key in reversed(keys):
            earliest = min(earliest, self.starts.get(key, float("inf")))
            reach[key] = earliest
        for a, b in zip(keys, keys[1:], strict=False):
            quiet_from = (a + 1) * self.width
            quiet_to = min(b * self.width, reach[b])
            if quiet_to - quiet_from >= IDLE_GAP_SECONDS:
                idle += quiet_to - quiet_from
        return max(self.span_seconds - idle, 0.0)

    @property
    def pages_per_second(self) -> float:
        """Pages (outcome ok) per active second; 0 when all lines share one instant."""
        active = self.active_seconds
        return self.pages / active if active else 0.0

    def kinds(self) -> Counter[str]:
        """Failed attempts by cause, every one counted."""
        return self.causes

    def give_up(self, kind: str, key: str) -> None:
        """A URL (its key) whose attempt failed with *kind* and was not retried."""
        keys = self.given_up[kind]
        if key in keys:
            return
        if sum(map(len, self.given_up.values())) >= MAX_GIVEN_UP:
            self.given_up_untracked[kind] += 1
            return
        keys.add(key)

    def merge(self, other: LogStats) -> None:
        """Add another log's counts (for the total over several tasks)."""
        while self.width < other.width:
            self._coarsen()
        for key, slots in other.bins.items():
            into = self._bin_at(key * other.width)
            for i, value in enumerate(slots):
                into[i] += value
        for key, start in other.starts.items():
            mine = int(key * other.width) // self.width
            self.starts[mine] = min(start, self.starts.get(mine, start))
        self.lines += other.lines
        self.bad_lines += other.bad_lines
        self.outcomes.update(other.outcomes)
        self.ok_bytes += other.ok_bytes
        for ts in (other.first_ts, other.last_ts):
            if ts is not None:
                self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
                self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        for host, kinds in other.host_errors.items():
            self.host_errors[host].update(kinds)
        self.hosts_dropped += other.hosts_dropped
        if len(self.host_errors) > MAX_HOSTS:
            self.prune_hosts()
        for proxy, counts in other.proxy_outcomes.items():
            self.proxy_outcomes[proxy].update(counts)
        self.first_problem = self.first_problem or other.first_problem
        self.rates.merge(other.rates)
        self.causes.update(other.causes)
        for kind, keys in other.given_up.items():
            for key in keys:
                self.give_up(kind, key)
        self.given_up_untracked.update(other.given_up_untracked)

    def prune_hosts(self) -> None:
        """Keep the half of the hosts with most failures."""
        totals = sorted(((sum(c.values()), h) for h, c in self.host_errors.items()), reverse=True)
        for _, host in totals[len(totals) // 2 :]:
            del self.host_errors[host]
            self.hosts_dropped += 1

    def _bin_at(self, ts: float) -> list[float]:
        key = int(ts) // self.width
        if key not in self.bins and len(self.bins) >= MAX_BINS:
            self._coarsen()
            key = int(ts) // self.width
        return self.bins.setdefault(key, [0] * (len(OUTCOMES) + 1))


@dataclass
class HostWaits:
    """What the ``host_wait`` lines of one host say: wait episodes, their seconds, and
    those that were a back-off (a 429 or 503 with Retry-After)."""

    episodes: int = 0
    seconds: float = 0.0
    backoffs: int = 0
    last_backoff: str | None = None  # its reason
    last_backoff_ts: float | None = None

    def merge(self, other: HostWaits) -> None:
        self.episodes += other.episodes
        self.seconds += other.seconds
        self.backoffs += other.backoffs
        if other.last_backoff_ts is not None and (
            self.last_backoff_ts is None or other.last_backoff_ts > self.last_backoff_ts
        ):
            self.last_backoff, self.last_backoff_ts = other.last_backoff, other.last_backoff_ts


@dataclass
class HostRates:
    """Requests per host over time (for the busiest hosts), the Crawl-delay each host
    was kept to, and its waits, in bounded memory (see ``MAX_RATE_HOSTS``)."""

    width: int = HOST_BIN_SECONDS
    requests: Counter[str] = field(default_factory=Counter)  # every host, pruned by half
    bins: dict[str, Counter[int]] = field(default_factory=dict)  # the binned hosts
    crawl_delays: dict[str, float] = field(default_factory=dict)
    waits: dict[str, HostWaits] = field(default_factory=dict)
    dropped: int = 0  # hosts no longer binned

    def request(self, host: str, ts: float) -> None:
        self.requests[host] += 1
        bins = self.bins.get(host)
        if bins is None:
            if len(self.bins) >= MAX_RATE_HOSTS:
                self._drop_quietest()
            bins = self.bins[host] = Counter()
        key = int(ts) // self.width
        if key not in bins and len(bins) >= MAX_HOST_BINS:
            self._coarsen()
            key = int(ts) // self.width
        bins[key] += 1
        if len(self.requests) > MAX_HOSTS:
            for host_, _ in self.requests.most_common()[MAX_HOSTS // 2 :]:
                if host_ not in self.bins:
                    del self.requests[host_]

    def wait(self, host: str, ts: float, seconds: float, reason: str) -> None:
        waits = self.waits.get(host)
        if waits is None:
            if len(self.waits) >= MAX_HOSTS:
                return
            waits = self.waits[host] = HostWaits()
        waits.episodes += 1
        waits.seconds += seconds
        # An episode says every reason that held it, "; "-separated.
        backoff = next((r for r in reason.split("; ") if r.startswith("back-off")), None)
        if backoff is not None:
            waits.backoffs += 1
            if waits.last_backoff_ts is None or ts >= waits.last_backoff_ts:
                waits.last_backoff, waits.last_backoff_ts = backoff, ts
        if match := _CRAWL_DELAY.search(reason):
            self.crawl_delays[host] = float(match.group(1))

    def _drop_quietest(self) -> None:
        quietest = min(self.bins, key=lambda h: (self.requests[h], h))
        del self.bins[quietest]
        self.dropped += 1

    def _coarsen(self) -> None:
        for host, bins in self.bins.items():
            merged: Counter[int] = Counter()
            for key, n in bins.items():
                merged[key // 2] += n
            self.bins[host] = merged
        self.width *= 2

    def merge(self, other: HostRates) -> None:
        while self.width < other.width:
            self._coarsen()
        self.requests.update(other.requests)
        for host, bins in other.bins.items():
            into = self.bins.setdefault(host, Counter())
            for key, n in bins.items():
                into[key * other.width // self.width] += n
        while len(self.bins) > MAX_RATE_HOSTS:
            self._drop_quietest()
        self.dropped += other.dropped
        self.crawl_delays.update(other.crawl_delays)
        for host, waits in other.waits.items():
            self.waits.setdefault(host, HostWaits()).merge(waits)

    def busiest(self, count: int) -> list[str]:
        """The binned hosts with most requests, most first."""
        return sorted(self.bins, key=lambda h: (-self.requests[h], h))[:count]

    def peak(self, host: str) -> float:
        """The most requests per second ``host`` got in one bin (``width`` seconds)."""
        bins = self.bins.get(host)
        return max(bins.values()) / self.width if bins else 0.0

    def series(self, host: str) -> list[tuple[float, float]]:
        """(bin start epoch, requests per second) of ``host``, empty bins included."""
        bins = self.bins.get(host) or {}
        if not bins:
            return []
        lo, hi = min(bins), max(bins)
        return [(k * self.width, bins.get(k, 0) / self.width) for k in range(lo, hi + 1)]


class _Clock:
    """ISO 8601 timestamps to epoch seconds, caching per second (lines share seconds)."""

    def __init__(self) -> None:
        self._cache: dict[str, int] = {}

    def epoch(self, ts: str) -> float:
        second = ts[:19]
        base = self._cache.get(second)
        if base is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            y, mo, d = int(ts[0:4]), int(ts[5:7]), int(ts[8:10])
            h, mi, s = int(ts[11:13]), int(ts[14:16]), int(ts[17:19])
            base = self._cache[second] = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
        if ts[19:20] == ".":
            try:
                return base + float(ts[19:23])
            except ValueError:
                pass
        return float(base)


def read_action_log(path: Path, stats: LogStats | None = None) -> LogStats:
    """Read the whole of *path* into *stats* (a new one by default).

    A line that is not JSON (a line cut short by a kill, say) is counted in
    ``bad_lines`` and the first one is remembered as ``file:line: reason``.
    """
    follower = LogFollower(path, stats)
    follower.update(final=True)
    return follower.stats


# json.loads checks its argument on every call; the decoder itself does not.
_decode = json.JSONDecoder().decode


class LogFollower:
    """Reads an append-only action log in steps, each step only what was appended.

    ``--watch`` keeps one per log, so rewriting the report of a long crawl costs the
    new lines, not the whole log again. A log that shrank (replaced) is read anew.
    """

    def __init__(self, path: Path, stats: LogStats | None = None, starts: list[float] = ()):
        self.path = Path(path)
        self.stats = stats if stats is not None else LogStats()
        self.offset = 0
        self.number = 0  # lines consumed, for error messages
        self._clock = _Clock()
        # Runs (DATA_DIR/runs.jsonl) by start time; runs[i] counts the lines from
        # starts[i - 1] on, runs[0] those before the first start. Each line is counted
        # once, into its run; the total is their sum (without runs, runs[0] itself).
        self.starts = list(starts)
        self.runs = [self.stats] + [LogStats() for _ in self.starts]

    def _restart(self) -> None:
        self.stats, self.offset, self.number = LogStats(), 0, 0
        self.runs = [self.stats] + [LogStats() for _ in self.starts]

    def set_starts(self, starts: list[float]) -> None:
        """Runs as runs.jsonl lists them now: a run appended since the last call gets
        the lines from its start on; any other change reads the log anew."""
        starts = list(starts)
        if starts[: len(self.starts)] != self.starts:
            self.starts = starts
            self._restart()
        elif len(starts) > len(self.starts):
            self.runs += [LogStats() for _ in starts[len(self.starts) :]]
            self.starts = starts

    def update(self, final: bool = False) -> LogStats:
        """Read what was appended since the last call.

        A last line without its newline is still being written: it waits for the next
        call, unless *final* (then it is read, or counted as unreadable).
        """
        if self.path.stat().st_size < self.offset:
            logger.warning("%s shrank: reading it again from the start", self.path)
            self._restart()
        with open(self.path, "rb") as lines:
            lines.seek(self.offset)
            for raw in lines:
                if not raw.endswith(b"\n") and not final:
                    break
                self.offset += len(raw)
                self.number += 1
                self._add(raw)
        if len(self.runs) > 1:
            self.stats = LogStats()
            for run in self.runs:
                self.stats.merge(run)
        if self.stats.bad_lines and final:
            logger.warning(
                "%d unreadable lines, first %s", self.stats.bad_lines, self.stats.first_problem
            )
        return self.stats

    def _add(self, raw: bytes) -> None:
        stats = self.runs[-1]  # an unreadable line has no time: the latest run's
        try:
            entry = _decode(raw.decode("utf-8", "replace"))
            ts = self._clock.epoch(entry["ts"])
            outcome = entry.get("outcome") or "unknown"
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if raw.strip():
                stats.bad_lines += 1
                if stats.first_problem is None:
                    where = f"{self.path}:{self.number}"
                    stats.first_problem = f"{where}: {type(exc).__name__}: {exc}"
            return
        _count(self.runs[bisect.bisect_right(self.starts, ts)], entry, ts, outcome)


def _count(stats: LogStats, entry: dict, ts: float, outcome: str) -> None:
    stats.lines += 1
    stats.outcomes[outcome] += 1
    nbytes = (entry.get("bytes") or 0) if outcome == "ok" else 0
    stats.ok_bytes += nbytes
    elapsed = entry.get("elapsed_ms")
    seconds = elapsed / 1000 if isinstance(elapsed, (int, float)) else 0.0
    stats.add(ts, outcome, nbytes, seconds if outcome in REQUEST_OUTCOMES else 0.0)
    if outcome in FAILED:
        kind = error_kind(entry.get("error"), entry.get("status"))
        stats.causes[kind] += 1
        key = entry.get("key")
        if outcome == "error" and key:
            stats.give_up(kind, key)
        # A bad line of the URL list is no host's failure, whatever it holds.
        host = "(none)" if kind == BAD_LINE_KIND else host_of(entry.get("url") or "")
        if host not in NO_HOST:
            stats.host_errors[host][kind] += 1
            if len(stats.host_errors) > MAX_HOSTS:
                stats.prune_hosts()
    proxy = entry.get("proxy")
    if proxy:
        stats.proxy_outcomes[proxy][outcome] += 1
    if outcome in REQUEST_OUTCOMES and entry.get("key"):
        stats.rates.request(host_of(entry.get("url") or ""), ts)
    elif outcome == "host_wait":
        host = entry.get("host") or host_of(entry.get("url") or "")
        seconds = (entry.get("elapsed_ms") or 0) / 1000
        stats.rates.wait(str(host), ts, float(seconds), str(entry.get("reason") or ""))
