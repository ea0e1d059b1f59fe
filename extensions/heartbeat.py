"""Reports this crawl process to the hub every few seconds: one row of the hub's
heartbeat table (``crawler/hub/heartbeats.py``), updated in place, that ``scrapy job
top`` and ``scrapy job serve`` read.

On whenever the crawl has a hub (``HUB_URL``) and ``HEARTBEAT_ENABLED`` (the default).
Every ``HEARTBEAT_SECONDS`` the reactor thread takes what the crawl already knows (its
stats, what the host-budget gates hold and wait on, which proxies it leases, its storage
lag, peak RSS, last error) as plain data, and a thread of its own writes it: no hub call
and no JSON encoding on the reactor. A crawl that ends writes its row once more, as
``finished``; a killed one stops writing, and the views call it dead after three
periods without a beat.

What it reads, and through what: ``crawler.stats`` (``actions/*``, ``proxy/bans``,
``progress/*``, ``downloader/response_bytes``); the storage extension's
:meth:`~extensions.storage.StorageExtension.rows_pending` and ``last_error``; the
host-budget middleware's gates (:meth:`crawler.hub.hostgates.HostGates.snapshot`); the
proxy-lease middleware's pool (``leases``, ``waiting``, ``longest_wait``); and
``host_wait`` lines of the action signal, for the hosts waited on longest.
"""

from __future__ import annotations

import logging
import os
import resource
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured, UsageError
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task
from twisted.internet.threads import deferToThread

from crawler import signals as crawler_signals
from crawler.hub import Holder, Hub, redact_text, redact_url
from crawler.hub.db import hub_url
from crawler.hub.heartbeats import (
    FINISHED,
    RATE_SECONDS,
    Beat,
    HeartbeatStore,
    HeartbeatWriter,
    Series,
    activity,
    top,
)
from crawler.storage.actionlog import Outcome
from extensions.progress import crawl_backlog
from extensions.storage import StorageExtension

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

# Hosts and proxies a row names (the most waited on first): a crawl of many hosts
# writes the same small row as one of a few.
SHOWN = 10
# Hosts whose waits are remembered; past it, the least waited on are forgotten.
REMEMBERED_HOSTS = 2000
PAGE_OUTCOMES = ("ok", "not_modified", "unchanged")


def log_file(settings: Any) -> str:
    """The file this process logs to: ``LOG_FILE``, else the regular file its standard
    error goes to (a Slurm task's log, a shell's redirect); "" for a terminal or a pipe."""
    path = settings.get("LOG_FILE")
    if path:
        return os.path.abspath(path)
    try:
        target = os.readlink("/proc/self/fd/2")  # Linux; elsewhere the views say nothing
    except OSError:
        return ""
    return target if target.startswith("/") and os.path.isfile(target) else ""


class HeartbeatExtension:
    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.url = hub_url(settings)
        if not self.url or not settings.getbool("HEARTBEAT_ENABLED", True):
            raise NotConfigured  # with a message, Scrapy would warn in every crawl
        self.period = settings.getfloat("HEARTBEAT_SECONDS", 5.0)
        if self.period <= 0:
            raise UsageError(
                f"HEARTBEAT_SECONDS={settings.get('HEARTBEAT_SECONDS')!r}: give seconds > 0 "
                "(HEARTBEAT_ENABLED=False turns heartbeats off)"
            )
        self.crawler = crawler
        self.connect_timeout = settings.getfloat("HUB_CONNECT_TIMEOUT", 10.0)
        holder = Holder.current()
        # Two crawls of one process (tests, scripts) are two rows.
        self.id = f"{holder.host}/{holder.pid}/{secrets.token_hex(4)}"
        self.identity = {
            "node": holder.host,
            "pid": holder.pid,
            "task": holder.task,
            "job": settings.get("JOB") or "",
            "log": log_file(settings),
        }
        self.series = Series()
        self._samples: deque[tuple[float, int, int, int]] = deque()
        self._last = {"pages": 0, "errors": 0, "retries": 0}
        self._waited: dict[str, list[float]] = {}  # host -> [episodes, seconds]
        self._loop = task.LoopingCall(self.beat)
        self.writer = HeartbeatWriter(self._connect, redact_url(self.url))
        self._storage: StorageExtension | None = None
        self._action_log = ""  # where the views send a reader when there is no log file
        self.reactor_seconds = 0.0  # CPU the beats took the reactor thread
        self._gates: Any = None
        self._pool: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HeartbeatExtension:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.action, signal=crawler_signals.action)
        return ext

    def _connect(self) -> HeartbeatStore:
        """In the writer's thread: the hub, its heartbeat table created or upgraded."""
        hub = Hub.open(self.url, self.connect_timeout)
        try:
            return HeartbeatStore(hub)
        except Exception:
            hub.close()
            raise

    # --- life cycle ---------------------------------------------------------------------
    def spider_opened(self, spider) -> None:
        from middlewares.host_budget import HostBudgetMiddleware
        from middlewares.proxy_lease import ProxyLeaseMiddleware

        self.identity["spider"] = spider.name
        self._storage = StorageExtension.of(self.crawler)
        if self._storage is not None:
            self._action_log = str(self._storage.session.datadir.action_log_path.resolve())
        budget = self.crawler.get_downloader_middleware(HostBudgetMiddleware)
        self._gates = getattr(budget, "gates", None)
        self._pool = getattr(
            self.crawler.get_downloader_middleware(ProxyLeaseMiddleware), "pool", None
        )
        self._samples.append((time.monotonic(), 0, 0, 0))
        self.writer.start()
        self._loop.start(self.period, now=True)

    async def spider_closed(self, spider, reason: str = "finished") -> None:
        if self._loop.running:
            self._loop.stop()
        last = self.snapshot(FINISHED, reason)
        await maybe_deferred_to_future(
            deferToThread(self.writer.close, last, min(self.connect_timeout, 10.0))
        )
        stats = self.crawler.stats
        stats.set_value("heartbeat/rows_written", self.writer.written)
        # What heartbeats cost this process: benchmarks read them.
        stats.set_value("heartbeat/reactor_cpu_seconds", round(self.reactor_seconds, 4))
        stats.set_value("heartbeat/thread_cpu_seconds", round(self.writer.cpu_seconds, 4))
        if self.writer.failed:
            stats.set_value("heartbeat/hub_errors", self.writer.failed)

    def action(self, outcome: str = "", host: str | None = None, elapsed_ms=None, **_) -> None:
        """A ``host_wait`` line: its host's waits add up, for the hosts waited on most."""
        if outcome != Outcome.HOST_WAIT or not host:
            return
        waited = self._waited.get(host)
        if waited is None:
            if len(self._waited) >= REMEMBERED_HOSTS:
                kept = top(((h, w[1]) for h, w in self._waited.items()), REMEMBERED_HOSTS // 2)
                self._waited = {h: self._waited[h] for h, _ in kept}
            waited = self._waited[host] = [0, 0.0]
        waited[0] += 1
        waited[1] += (elapsed_ms or 0) / 1000

    # --- a beat -------------------------------------------------------------------------
    def beat(self) -> None:
        began = time.thread_time()
        self.writer.offer(self.snapshot())
        self.reactor_seconds += time.thread_time() - began

    def snapshot(self, state: str | None = None, reason: str = "") -> Beat:
        """What the crawl knows now, as plain data (on the reactor thread: cheap)."""
        get = self.crawler.stats.get_value
        if self._storage is not None:
            pages = sum(get(f"actions/{outcome}", 0) for outcome in PAGE_OUTCOMES)
        else:
            pages = get("response_received_count", 0)
        size = get("downloader/response_bytes", 0)
        done = get("progress/list_done", 0)
        rates = self._rates(pages, size, done)
        counts = {
            "pages": pages,
            "errors": get("actions/error", 0),
            "retries": get("actions/retry", 0),
        }
        self.series.add(time.time(), {k: v - self._last[k] for k, v in counts.items()})
        self._last = counts
        work = self._work()
        detail = {
            **work["detail"],
            "series": self.series.to_json(),
            "list_done": done,
            "list_total": get("progress/list_total"),
            "list_per_s": rates[2],
            "rate_seconds": RATE_SECONDS,
            "waited": [
                {"host": h, "episodes": int(self._waited[h][0]), "seconds": round(s, 1)}
                for h, s in top(((h, w[1]) for h, w in self._waited.items()), SHOWN)
            ],
            "action_log": self._action_log,
        }
        if reason:
            detail["reason"] = reason
        return Beat(
            id=self.id,
            period=self.period,
            state=state or work["state"],
            **self.identity,
            pages=pages,
            bytes=size,
            pages_per_s=round(rates[0], 3),
            bytes_per_s=round(rates[1], 1),
            ok=get("actions/ok", 0),
            errors=counts["errors"],
            retries=counts["retries"],
            bans=get("proxy/bans", 0),
            host_waits=get("actions/host_wait", 0),
            pending=work["pending"],
            lag=self._storage.rows_pending() if self._storage is not None else 0,
            rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            last_error=self._last_error(),
            detail=detail,
        )

    def _rates(self, pages: int, size: int, done: int) -> tuple[float, float, float]:
        """Pages, bytes and list URLs per second over the last RATE_SECONDS."""
        now = time.monotonic()
        samples = self._samples
        samples.append((now, pages, size, done))
        while len(samples) > 2 and samples[1][0] <= now - RATE_SECONDS:
            samples.popleft()
        then, pages0, size0, done0 = samples[0]
        span = now - then
        if span <= 0:
            return 0.0, 0.0, 0.0
        return (pages - pages0) / span, (size - size0) / span, (done - done0) / span

    def _work(self) -> dict[str, Any]:
        """What the crawl is doing: requests on the wire, waiting for a proxy or a host,
        pending; the hosts it holds and waits on, the proxies it leases."""
        scheduled, active, listed_left = crawl_backlog(self.crawler)
        detail: dict[str, Any] = {}
        proxy_waiting = host_waiting = 0
        if self._pool is not None:
            proxy_waiting = self._pool.waiting
            detail["proxies"] = [
                {
                    "id": lease.proxy_id,
                    "label": lease.label,
                    "uses": lease.uses,
                    "alive": lease.alive,
                }
                for lease in self._pool.leases[:SHOWN]
            ]
            detail["proxy_waiting"] = proxy_waiting
            detail["proxy_wait_s"] = round(self._pool.longest_wait, 1)
        if self._gates is not None:
            gates = self._gates.snapshot()
            host_waiting = sum(g["waiting"] for g in gates)
            gates.sort(key=lambda g: (-g["waiting"], -g["in_flight"], g["key"]))
            detail["hosts"] = gates[:SHOWN]
            detail["hosts_held"] = sum(1 for g in gates if g["slots"])
            detail["host_waiting"] = host_waiting
        on_wire = max(active - proxy_waiting - host_waiting, 0)
        detail["on_wire"] = on_wire
        return {
            "state": activity(
                on_wire, proxy_waiting, host_waiting, scheduled + active + listed_left
            ),
            "pending": scheduled + active,
            "detail": detail,
        }

    def _last_error(self) -> str:
        failed = self.crawler.stats.get_value("archive/error")
        if failed:
            return redact_text(str(failed), [])[:300]
        last = self._storage.last_error if self._storage is not None else None
        if last is None:
            return ""
        when, url, said = last
        stamp = time.strftime("%H:%M:%S", time.gmtime(when))
        return redact_text(f"{stamp} UTC {said}: {url}", [])[:300]
