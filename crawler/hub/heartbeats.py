"""Heartbeats: one row per crawl process in the hub, updated in place every few seconds.

Every crawl process of a hub (``extensions/heartbeat.py``) writes its row of
``hub_heartbeats`` every ``HEARTBEAT_SECONDS`` (5 by default): its job, task, node and
pid, its rates and outcomes so far, what it is doing, its storage lag, peak RSS and last
error. A row is keyed by the process (node, pid and a token of its run) and written by
one statement, an upsert in a transaction of its own: 40 processes at 5 s are 8
statements a second. A process that ends writes its row once more as ``finished``; one
that dies leaves its row as it last was: stale, never deleted, so that the live views
(``scrapy job top``, ``scrapy job serve``) can tell it died and name its log.

What a person may ask SQL about has a column of its own; what only the live views read
(the hosts it holds and waits on, its proxies, the last hour's counts) is one JSON
column, ``detail``.

:class:`HeartbeatWriter` writes a process's beats from a thread of its own, the newest
replacing one not yet written: a slow hub delays the next row, never the crawl, and
beats never queue up. No Scrapy here.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from crawler.hub.db import Hub
from crawler.hub.errors import HubError
from crawler.hub.locks import AdvisoryLock

logger = logging.getLogger(__name__)

HEARTBEAT_SCHEMA_VERSION = 1
TABLE = "hub_heartbeats"

# What a process says it is doing (the views add dead and stalled, which only others
# can tell).
FETCHING = "fetching"
WAITING_HOST = "waiting_host"
WAITING_PROXY = "waiting_proxy"
IDLE = "idle"
FINISHED = "finished"
ACTIVITIES = (FETCHING, WAITING_HOST, WAITING_PROXY, IDLE, FINISHED)

# Rates are over the last RATE_SECONDS (a beat's counts against the oldest within them).
RATE_SECONDS = 30.0
# The last hour's counts, per SERIES_STEP seconds of the wall clock.
SERIES_STEP = 30
SERIES_SPAN = 3600
SERIES_NAMES = ("pages", "errors", "retries")

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_heartbeats (
            id TEXT PRIMARY KEY,
            job TEXT NOT NULL DEFAULT '',
            spider TEXT NOT NULL DEFAULT '',
            task TEXT NOT NULL DEFAULT '',
            node TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started {real} NOT NULL,
            updated {real} NOT NULL,
            period {real} NOT NULL,
            state TEXT NOT NULL,
            pages BIGINT NOT NULL DEFAULT 0,
            bytes BIGINT NOT NULL DEFAULT 0,
            pages_per_s {real} NOT NULL DEFAULT 0,
            bytes_per_s {real} NOT NULL DEFAULT 0,
            ok BIGINT NOT NULL DEFAULT 0,
            errors BIGINT NOT NULL DEFAULT 0,
            retries BIGINT NOT NULL DEFAULT 0,
            bans BIGINT NOT NULL DEFAULT 0,
            host_waits BIGINT NOT NULL DEFAULT 0,
            pending BIGINT NOT NULL DEFAULT 0,
            lag BIGINT NOT NULL DEFAULT 0,
            rss BIGINT NOT NULL DEFAULT 0,
            last_error TEXT NOT NULL DEFAULT '',
            log TEXT NOT NULL DEFAULT '',
            detail TEXT NOT NULL DEFAULT '{{}}'
        )""",
        "CREATE INDEX IF NOT EXISTS hub_heartbeats_job ON hub_heartbeats (job, updated)",
    ],
}


@dataclass
class Beat:
    """One process's heartbeat: what it writes, and what a view reads back (with the
    hub's times of its first and last beat, ``started`` and ``updated``)."""

    id: str
    node: str
    pid: int
    period: float
    state: str
    job: str = ""
    spider: str = ""
    task: str = ""
    pages: int = 0  # fetched: ok, not modified, unchanged
    bytes: int = 0  # of responses received
    pages_per_s: float = 0.0
    bytes_per_s: float = 0.0
    ok: int = 0
    errors: int = 0
    retries: int = 0
    bans: int = 0  # answers that got a proxy banned
    host_waits: int = 0  # wait episodes for a host's budget
    pending: int = 0  # requests scheduled or in the downloader
    lag: int = 0  # rows handed to the writer, not yet committed
    rss: int = 0  # peak resident set size, bytes
    last_error: str = ""
    log: str = ""  # the log file to read, when there is one
    detail: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    updated: float = 0.0


# Written by the process; started and updated are the hub's clock.
_WRITTEN = tuple(f.name for f in fields(Beat) if f.name not in ("started", "updated"))
_READ = (*_WRITTEN, "started", "updated")
_UPSERT = (
    f"INSERT INTO {TABLE} ({', '.join(_WRITTEN)}, started, updated) "
    f"VALUES ({', '.join('?' for _ in _WRITTEN)}, NOW(), NOW()) "
    f"ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _WRITTEN if name != "id")
    + ", updated = excluded.updated"
)
_SELECT = f"SELECT {', '.join(_READ)} FROM {TABLE}"


class HeartbeatStore:
    """The heartbeat table of one hub.

    A crawl's store creates or upgrades the table; a view's (``create=False``) only
    reads, and reads a hub without the table (older than heartbeats) as empty.
    """

    def __init__(self, hub: Hub, create: bool = True) -> None:
        self.hub = hub
        if create:
            hub.migrate("hub_heartbeat_schema", _MIGRATIONS, AdvisoryLock.HEARTBEAT_SCHEMA)
            self.present = True
        else:
            self.present = hub.has_table(TABLE)

    def write(self, beat: Beat) -> None:
        """The process's row, inserted or updated in place: one statement."""
        values = [getattr(beat, name) for name in _WRITTEN]
        values[_WRITTEN.index("detail")] = json.dumps(beat.detail, separators=(",", ":"))
        self.hub.execute(_UPSERT, values)

    def read(self, job: str | None = None, window: float | None = None) -> list[Beat]:
        """The rows of *job* (every job's: None), oldest first; with *window*, only
        those heard from within *window* seconds of the newest of them (a job's last
        runs, not the ones of last month)."""
        if not self.present:
            self.present = self.hub.has_table(TABLE)  # a crawl may have made it since
            if not self.present:
                return []
        where, params = "", []
        if job is not None:
            where, params = " WHERE job = ?", [job]
        if window is not None:
            newest = f"SELECT MAX(updated) FROM {TABLE}{where}"
            where += (" AND" if where else " WHERE") + f" updated >= ({newest}) - ?"
            params = [*params, *params, window]
        rows = self.hub.query(f"{_SELECT}{where} ORDER BY started, id", params)
        return [_beat(row) for row in rows]

    def jobs(self) -> list[str]:
        """The jobs named by rows, in order."""
        if not self.present:
            return []
        return [row[0] for row in self.hub.query(f"SELECT DISTINCT job FROM {TABLE} ORDER BY job")]


def _beat(row: tuple[Any, ...]) -> Beat:
    values = dict(zip(_READ, row, strict=True))
    try:
        detail = json.loads(values["detail"] or "{}")
    except ValueError:  # a row written by hand: the rest of it is still worth showing
        detail = {}
    values["detail"] = detail if isinstance(detail, dict) else {}
    for name in ("period", "pages_per_s", "bytes_per_s", "started", "updated"):
        values[name] = float(values[name] or 0)
    return Beat(**values)


def activity(on_wire: int, proxy_waiting: int, host_waiting: int, pending: int) -> str:
    """What a process is doing, from its requests: on the wire, waiting for a proxy
    lease, waiting for a host's budget, and pending (scheduled or in the downloader).
    Any request on the wire is fetching; with none, what the waiting ones wait for."""
    if on_wire > 0:
        return FETCHING
    if proxy_waiting > 0:
        return WAITING_PROXY
    if host_waiting > 0:
        return WAITING_HOST
    return FETCHING if pending > 0 else IDLE


class Series:
    """Counts per ``step`` seconds of the wall clock over the last ``span`` seconds:
    what the live page plots (pages/s per node, errors over the last hour). A node's
    buckets start at the same instants as every other node's."""

    def __init__(self, step: int = SERIES_STEP, span: int = SERIES_SPAN) -> None:
        self.step = step
        self.size = max(int(span // step), 1)
        self._buckets: dict[int, list[int]] = {}

    def add(self, when: float, counts: Mapping[str, int]) -> None:
        """Add *counts* (of :data:`SERIES_NAMES`) to the bucket of the epoch time *when*."""
        index = int(when // self.step)
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = [0] * len(SERIES_NAMES)
            for old in [i for i in self._buckets if i <= index - self.size]:
                del self._buckets[old]
        for n, name in enumerate(SERIES_NAMES):
            bucket[n] += int(counts.get(name, 0))

    def to_json(self) -> dict[str, Any]:
        """``{"step": s, "t0": epoch of the first bucket, name: [count per bucket]}``,
        the buckets contiguous up to the newest."""
        if not self._buckets:
            return {"step": self.step, "t0": 0, **{name: [] for name in SERIES_NAMES}}
        first, last = min(self._buckets), max(self._buckets)
        empty = [0] * len(SERIES_NAMES)
        rows = [self._buckets.get(i, empty) for i in range(first, last + 1)]
        return {
            "step": self.step,
            "t0": first * self.step,
            **{name: [row[n] for row in rows] for n, name in enumerate(SERIES_NAMES)},
        }


def series_points(data: Mapping[str, Any], name: str) -> list[tuple[float, int]]:
    """(bucket start, count) of one of :data:`SERIES_NAMES` in a :meth:`Series.to_json`."""
    try:
        step, t0, values = float(data["step"]), float(data["t0"]), data[name]
    except (KeyError, TypeError, ValueError):
        return []
    if not isinstance(values, list):
        return []
    return [(t0 + n * step, int(v)) for n, v in enumerate(values) if isinstance(v, int | float)]


class HeartbeatWriter:
    """Writes the newest beat it was given, from a thread of its own.

    ``connect`` opens the store (in that thread, at the first beat: a hub that is
    slow to answer delays no one); a beat that cannot be written is counted in
    ``failed`` and the next one tried in its turn.
    """

    def __init__(self, connect: Callable[[], HeartbeatStore], label: str = "the hub") -> None:
        self._connect = connect
        self.label = label
        self.store: HeartbeatStore | None = None
        self.written = 0
        self.failed = 0
        self.cpu_seconds = 0.0  # the thread's own, once it ended: what the beats cost it
        self._cond = threading.Condition()
        self._next: Beat | None = None
        self._closing = False
        self._said = False
        self._thread = threading.Thread(target=self._run, name="hub-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, beat: Beat) -> None:
        """Write *beat* next, in place of one not yet written."""
        with self._cond:
            self._next = beat
            self._cond.notify()

    def close(self, last: Beat | None = None, timeout: float = 10.0) -> bool:
        """Write *last* (if given), stop, and close the hub; False when that took longer
        than *timeout* seconds (the thread is a daemon: it does not hold the process)."""
        with self._cond:
            if last is not None:
                self._next = last
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closing:
                    self._cond.wait()
                beat, self._next = self._next, None
                closing = self._closing
            if beat is not None:
                self._write(beat)
            if closing:
                with self._cond:
                    if self._next is None:
                        break
        if self.store is not None:
            self.store.hub.close()
        self.cpu_seconds = time.thread_time()

    def _write(self, beat: Beat) -> None:
        try:
            if self.store is None:
                self.store = self._connect()
            self.store.write(beat)
        except Exception as exc:  # a hub error, or one of the backend's driver
            self.failed += 1
            # The hub says once itself that it is away; anything else is said once here.
            level = logging.DEBUG if self._said else logging.WARNING
            self._said = True
            logger.log(
                level,
                "Could not write this process's heartbeat to %s: %s; the crawl goes on, "
                "the live views (scrapy job top) show it as dead until one is written",
                self.label,
                exc if isinstance(exc, HubError) else f"{type(exc).__name__}: {exc}",
            )
            return
        self.written += 1


def top(items: Iterable[tuple[str, float]], limit: int) -> list[tuple[str, float]]:
    """The *limit* largest (name, value) pairs, largest first, ties by name."""
    return sorted(items, key=lambda item: (-item[1], item[0]))[:limit]
