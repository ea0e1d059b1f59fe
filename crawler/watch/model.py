"""What the live views show, computed from the hub's rows alone: no terminal, no browser.

A :class:`Snapshot` (the rows of a job's processes, its queue, its proxies' bans, read
by :mod:`crawler.watch.source`) becomes a :class:`JobView` (:func:`build`): each
process's state, the job's totals and ETA, the hosts most waited on, the proxies most
banned, the series the page plots. ``scrapy job top`` (:mod:`crawler.watch.terminal`)
and ``scrapy job serve`` (:mod:`crawler.watch.page`) draw the same view.

A process is *dead* when it has written no heartbeat for three of its periods (it does
not say so itself: it was killed, its node went down, its reactor hangs) and *stalled*
when it fetched nothing over its last rate window while requests are pending, with
nothing it waits for to explain it (a proxy, a host's budget).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from crawler.admin import duration
from crawler.hub import heartbeats as hb
from crawler.hub.heartbeats import RATE_SECONDS, Beat, series_points
from crawler.hub.workqueue import QueueStats
from crawler.redact import redact_url

# Periods without a heartbeat after which a process is dead.
DEAD_AFTER = 3

# The states the views show, the most urgent first.
DEAD = "dead"
STALLED = "stalled"
WAITING_PROXY = "waiting for a proxy"
WAITING_HOST = "waiting for a host"
FETCHING = "fetching"
IDLE = "idle"
FINISHED = "finished"
STATES = (DEAD, STALLED, WAITING_PROXY, WAITING_HOST, FETCHING, IDLE, FINISHED)
PROBLEMS = frozenset({DEAD, STALLED})
WAITING = frozenset({WAITING_PROXY, WAITING_HOST})
LIVE = frozenset(STATES) - {DEAD, FINISHED}
# What ``--state`` takes: a state's first word, or a group.
STATE_WORDS: dict[str, frozenset[str]] = {
    **{state.split()[0]: frozenset({state}) for state in STATES if state not in WAITING},
    "proxy": frozenset({WAITING_PROXY}),
    "host": frozenset({WAITING_HOST}),
    "waiting": WAITING,
    "problems": PROBLEMS,
    "live": LIVE,
}
# Rows shown of the hosts and proxies tables.
TOP = 10


class ViewError(ValueError):
    """A sort key or a state filter the views do not know."""


def process_state(beat: Beat, now: float) -> str:
    """The state of the process of *beat* at the hub's time *now*."""
    if beat.state == hb.FINISHED:
        return FINISHED
    if now - beat.updated > DEAD_AFTER * beat.period:
        return DEAD
    if beat.state == hb.WAITING_PROXY:
        return WAITING_PROXY
    if beat.state == hb.WAITING_HOST:
        return WAITING_HOST
    window = float(beat.detail.get("rate_seconds") or RATE_SECONDS)
    # A resumed list skipping stored URLs fetches nothing and moves on: not stalled.
    moving = beat.pages_per_s > 0 or float(beat.detail.get("list_per_s") or 0) > 0
    if not moving and beat.pending > 0 and beat.updated - beat.started >= window:
        return STALLED
    return IDLE if beat.state == hb.IDLE else FETCHING


@dataclass(frozen=True)
class ProcessView:
    """One crawl process as the views show it."""

    beat: Beat
    state: str
    age: float  # seconds since its last heartbeat

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def problem(self) -> bool:
        return self.state in PROBLEMS

    @property
    def pages_per_s(self) -> float:
        """Its rate now: none once it is dead or finished."""
        return self.beat.pages_per_s if self.live else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.beat.bytes_per_s if self.live else 0.0

    @property
    def name(self) -> str:
        """Node and pid, as a person finds the process."""
        return f"{self.beat.node}/{self.beat.pid}"

    @property
    def log(self) -> str:
        """Where to read what happened: its log file, else its data directory's
        action log."""
        if self.beat.log:
            return f"{self.beat.node}:{self.beat.log}"
        actions = self.beat.detail.get("action_log")
        if not actions:
            return "-"
        return f"{self.beat.node}:{actions} (no log file: its stderr was not a file)"

    def why(self) -> str:
        """What makes it stand out, in one line (empty when nothing does)."""
        beat = self.beat
        if self.state == DEAD:
            return f"no heartbeat for {self.age:.0f} s (every {beat.period:g} s)"
        if self.state == STALLED:
            window = float(beat.detail.get("rate_seconds") or RATE_SECONDS)
            return f"0 pages/s over {window:g} s with {beat.pending:,} requests pending"
        if self.state == WAITING_PROXY:
            waited = beat.detail.get("proxy_wait_s") or 0
            return f"{beat.detail.get('proxy_waiting', 0)} requests wait for a proxy lease ({waited:g} s)"
        if self.state == WAITING_HOST:
            hosts = [h for h in beat.detail.get("hosts", []) if h.get("waiting")]
            if hosts:
                first = hosts[0]
                return f"{first['waiting']} wait for {first['key']}: {first.get('reason') or '?'}"
        if self.state == FINISHED:
            return f"finished ({beat.detail.get('reason', '?')})"
        return ""

    def hosts_text(self) -> str:
        """``3 held, 12 waiting``: hosts it holds slots of, requests waiting for hosts."""
        held, waiting = self.hosts()
        if not held and not waiting:
            return "-"
        return f"{held} held" + (f", {waiting} waiting" if waiting else "")

    def hosts(self) -> tuple[int, int]:
        """(hosts it holds slots of, requests waiting for a host) now: none once it is
        dead or finished."""
        if not self.live:
            return 0, 0
        detail = self.beat.detail
        return int(detail.get("hosts_held", 0)), int(detail.get("host_waiting", 0))

    def proxies(self) -> list[str]:
        """The proxies it leases now (labels, credentials redacted)."""
        if not self.live:
            return []
        return [redact_url(str(p.get("label", "?"))) for p in self.beat.detail.get("proxies", [])]

    @property
    def last_error(self) -> str:
        """Its last error line (redacted by the process; again here, whoever wrote it)."""
        return redact_url(self.beat.last_error)


@dataclass(frozen=True)
class HostLine:
    """A host as the views list it: requests waiting for it now, processes holding its
    slots now, and the waits its processes told (``host_wait`` lines)."""

    host: str
    waiting: int
    holders: int
    seconds: float
    episodes: int
    reason: str


@dataclass(frozen=True)
class ProxyLine:
    """A proxy as the views list it: its bans by the job's processes over the last
    hour, its state now, and who of the job holds it."""

    label: str
    state: str
    bans: int
    requests: int
    holders: tuple[str, ...] = ()


@dataclass(frozen=True)
class Totals:
    processes: int = 0
    pages: int = 0
    bytes: int = 0
    pages_per_s: float = 0.0
    bytes_per_s: float = 0.0
    ok: int = 0
    errors: int = 0
    retries: int = 0
    bans: int = 0
    host_waits: int = 0
    lag: int = 0
    list_done: int = 0
    list_total: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What the hub holds for one job (every job: ``job`` None) at the hub's time *now*."""

    job: str | None
    hub: str  # the hub's label, credentials redacted
    now: float
    beats: list[Beat]
    queue_name: str = ""
    queue: QueueStats | None = None
    # Bans per proxy and holder: dicts of id, label, state, host, pid, bans, requests.
    proxy_bans: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ViewOptions:
    """How the processes are listed: ``sort`` (a key of :data:`SORTS`), only the
    ``states`` given (none: all), only the nodes matching one of ``nodes`` (globs)."""

    sort: str = "state"
    states: frozenset[str] = frozenset()
    nodes: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, sort: str | None = None, states: str | None = None, nodes: Sequence[str] = ()
    ) -> ViewOptions:
        """From command-line words; a ViewError names a word it does not know."""
        sort = sort or "state"
        if sort not in SORTS:
            raise ViewError(f"--sort {sort!r}: give one of {', '.join(SORTS)}")
        chosen: set[str] = set()
        for word in filter(None, (w.strip() for w in (states or "").split(","))):
            if word not in STATE_WORDS:
                raise ViewError(f"--state {word!r}: give any of {', '.join(STATE_WORDS)}")
            chosen |= STATE_WORDS[word]
        return cls(sort, frozenset(chosen), tuple(nodes))

    def next_sort(self) -> ViewOptions:
        keys = list(SORTS)
        return ViewOptions(keys[(keys.index(self.sort) + 1) % len(keys)], self.states, self.nodes)

    def toggle_problems(self) -> ViewOptions:
        return ViewOptions(self.sort, frozenset() if self.states else PROBLEMS, self.nodes)

    def shows(self, process: ProcessView) -> bool:
        if self.states and process.state not in self.states:
            return False
        return not self.nodes or any(fnmatch.fnmatch(process.beat.node, n) for n in self.nodes)

    def describe(self) -> str:
        parts = [f"sorted by {self.sort}"]
        if self.states:
            parts.append("only " + ", ".join(s for s in STATES if s in self.states))
        if self.nodes:
            parts.append("nodes " + ", ".join(self.nodes))
        return "; ".join(parts)


def _by_state(p: ProcessView) -> tuple:
    return (STATES.index(p.state), p.beat.node, p.beat.task, p.beat.pid)


SORTS = {
    "state": _by_state,
    "node": lambda p: (p.beat.node, p.beat.task, p.beat.pid),
    "task": lambda p: (p.beat.task, p.beat.node, p.beat.pid),
    "rate": lambda p: (-p.pages_per_s, *_by_state(p)),
    "errors": lambda p: (-p.beat.errors, *_by_state(p)),
    "bans": lambda p: (-p.beat.bans, *_by_state(p)),
    "lag": lambda p: (-p.beat.lag, *_by_state(p)),
    "rss": lambda p: (-p.beat.rss, *_by_state(p)),
}


@dataclass(frozen=True)
class JobView:
    """One refresh of a live view."""

    snapshot: Snapshot
    options: ViewOptions
    every: list[ProcessView]  # every process, in the options' order
    shown: list[ProcessView]  # those the options keep
    counts: dict[str, int]  # processes per state
    totals: Totals
    eta: float | None
    hosts: list[HostLine]
    proxies: list[ProxyLine]

    @property
    def job(self) -> str | None:
        return self.snapshot.job

    @property
    def problems(self) -> list[ProcessView]:
        """Every dead or stalled process, whatever the filter."""
        return [p for p in self.every if p.problem]

    def title(self) -> str:
        """``job 'news' in postgresql://...: 2026-05-01 12:00:00 UTC``."""
        job = f"job {self.job!r}" if self.job is not None else "every job"
        stamp = datetime.fromtimestamp(self.snapshot.now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{job} in {self.snapshot.hub}, {stamp}"

    def eta_text(self) -> str:
        if self.eta is None:
            return "unknown"
        return "done" if self.eta == 0 else duration(self.eta)

    def state_line(self) -> str:
        """``4 processes: 3 fetching, 1 dead``."""
        parts = [f"{self.counts[s]} {s}" for s in STATES if self.counts.get(s)]
        count = self.totals.processes
        said = f"{count} process" + ("" if count == 1 else "es")
        return said + (f": {', '.join(parts)}" if parts else "")


def build(snapshot: Snapshot, options: ViewOptions | None = None) -> JobView:
    options = options or ViewOptions()
    every = [
        ProcessView(b, process_state(b, snapshot.now), snapshot.now - b.updated)
        for b in snapshot.beats
    ]
    every.sort(key=SORTS[options.sort])
    return JobView(
        snapshot=snapshot,
        options=options,
        every=every,
        shown=[p for p in every if options.shows(p)],
        counts=dict(Counter(p.state for p in every)),
        totals=totals(every),
        eta=eta(every, snapshot.queue),
        hosts=hosts(every),
        proxies=proxies(every, snapshot.proxy_bans),
    )


def totals(processes: Sequence[ProcessView]) -> Totals:
    def total(name: str) -> int:
        return sum(int(getattr(p.beat, name)) for p in processes)

    return Totals(
        processes=len(processes),
        pages=total("pages"),
        bytes=total("bytes"),
        pages_per_s=sum(p.pages_per_s for p in processes),
        bytes_per_s=sum(p.bytes_per_s for p in processes),
        ok=total("ok"),
        errors=total("errors"),
        retries=total("retries"),
        bans=total("bans"),
        host_waits=total("host_waits"),
        lag=sum(p.beat.lag for p in processes if p.live),
        list_done=sum(int(p.beat.detail.get("list_done") or 0) for p in processes),
        list_total=sum(int(p.beat.detail.get("list_total") or 0) for p in processes),
    )


def eta(processes: Sequence[ProcessView], queue: QueueStats | None) -> float | None:
    """Seconds until the job is done at the current rates (0: done); None when that
    cannot be told (nothing moves, a process crawls a list of unknown length, or every
    process died).

    With a work queue: its URLs left over the live processes' list rate (the queue's own
    when they say none). Without: the last of the live processes to finish its list."""
    live = [p for p in processes if p.live]
    if queue is not None:
        left = queue.progress.total - queue.progress.done
        if left <= 0:
            return 0.0
        rate = sum(float(p.beat.detail.get("list_per_s") or 0) for p in live) or queue.rate
        return left / rate if rate > 0 else None
    ends = []
    for p in live:
        detail = p.beat.detail
        total, done = detail.get("list_total"), int(detail.get("list_done") or 0)
        rate = float(detail.get("list_per_s") or 0)
        if not total:
            return None
        if done >= int(total):
            continue
        if rate <= 0:
            return None
        ends.append((int(total) - done) / rate)
    if not live:
        return 0.0 if processes and all(p.state == FINISHED for p in processes) else None
    return max(ends, default=0.0)


def hosts(processes: Iterable[ProcessView], limit: int = TOP) -> list[HostLine]:
    """The hosts most waited on: by requests waiting now, then by the waits told."""
    waiting: Counter[str] = Counter()
    holders: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {}
    seconds: Counter[str] = Counter()
    episodes: Counter[str] = Counter()
    for p in processes:
        if p.live:
            for gate in p.beat.detail.get("hosts", []):
                key = str(gate.get("key", "?"))
                waiting[key] += int(gate.get("waiting", 0))
                holders[key] += int(bool(gate.get("slots")))
                if gate.get("reason"):
                    reasons.setdefault(key, Counter())[str(gate["reason"])] += 1
        for told in p.beat.detail.get("waited", []):
            key = str(told.get("host", "?"))
            seconds[key] += float(told.get("seconds", 0))
            episodes[key] += int(told.get("episodes", 0))
    names = {h for h in waiting if waiting[h]} | set(seconds)
    lines = [
        HostLine(
            h,
            waiting[h],
            holders[h],
            round(seconds[h], 1),
            episodes[h],
            reasons[h].most_common(1)[0][0] if h in reasons else "",
        )
        for h in names
    ]
    lines.sort(key=lambda line: (-line.waiting, -line.seconds, line.host))
    return lines[:limit]


def proxies(
    processes: Sequence[ProcessView], bans: Iterable[dict[str, Any]], limit: int = TOP
) -> list[ProxyLine]:
    """The proxies most banned by the job's processes (their leases over the last
    hour, as the hub counts them), then the others they hold now."""
    mine = {(p.beat.node, p.beat.pid) for p in processes}
    held: dict[str, list[str]] = {}
    for p in processes:
        if p.live:
            for label in p.proxies():
                held.setdefault(label, []).append(p.name)
    found: dict[str, list[Any]] = {}
    for row in bans:
        if (row.get("host"), row.get("pid")) not in mine:
            continue
        line = found.setdefault(redact_url(row["label"]), [row.get("state", "?"), 0, 0])
        line[1] += int(row.get("bans") or 0)
        line[2] += int(row.get("requests") or 0)
    lines = [
        ProxyLine(label, state, banned, requests, tuple(held.get(label, ())))
        for label, (state, banned, requests) in found.items()
    ]
    lines += [
        ProxyLine(label, "leased", 0, 0, tuple(names))
        for label, names in held.items()
        if label not in found
    ]
    lines.sort(key=lambda line: (-line.bans, -len(line.holders), line.label))
    return lines[:limit]


# --- the last hour, for the page's figures ---------------------------------------------------
def node_rates(
    processes: Iterable[ProcessView], now: float
) -> dict[str, list[tuple[float, float]]]:
    """Pages/s per node over the last hour: (bucket start, pages/s), the rates of the
    node's processes added up. A bucket a process started in, or that is still filling,
    counts over the part of it the process was running."""
    per_node: dict[str, Counter[float]] = {}
    for p in processes:
        series = p.beat.detail.get("series") or {}
        step = float(series.get("step") or hb.SERIES_STEP)
        end = now if p.live else p.beat.updated
        rates = per_node.setdefault(p.beat.node, Counter())
        for start, count in series_points(series, "pages"):
            if start >= now - hb.SERIES_SPAN:
                ran = min(start + step, end) - max(start, p.beat.started)
                rates[start] += count / max(ran, 1.0)
    return {node: sorted(rates.items()) for node, rates in sorted(per_node.items())}


def failure_counts(processes: Iterable[ProcessView], now: float) -> list[tuple[float, int, int]]:
    """(bucket start, errors, retries) of every process over the last hour."""
    errors: Counter[float] = Counter()
    retries: Counter[float] = Counter()
    for p in processes:
        series = p.beat.detail.get("series") or {}
        for start, count in series_points(series, "errors"):
            if start >= now - hb.SERIES_SPAN:
                errors[start] += count
        for start, count in series_points(series, "retries"):
            if start >= now - hb.SERIES_SPAN:
                retries[start] += count
    return [(t, errors[t], retries[t]) for t in sorted(set(errors) | set(retries))]
