"""Logs progress every PROGRESS_INTERVAL seconds: list done/total, pages/s, ETA."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task

logger = logging.getLogger(__name__)


def format_progress(stats: dict, rate: float, list_rate: float) -> str:
    """One progress line; ``rate`` in pages fetched/s, ``list_rate`` in list URLs done/s."""
    done = stats.get("progress/list_done", 0)
    total = stats.get("progress/list_total")
    if total:
        share = f"{done:,}/{total:,} ({100 * done / total:.1f}%)"
        left = max(total - done, 0)
        eta = str(timedelta(seconds=int(left / list_rate))) if list_rate > 0 else "?"
    else:
        share, eta = f"{done:,}/?", "?"
    return (
        f"list {share}, {rate:.1f} pages/s, "
        f"{stats.get('catalog/cache_hits', 0):,} cache hits, "
        f"{stats.get('actions/error', 0):,} errors, "
        f"{stats.get('actions/retry', 0):,} retries, ETA {eta}"
    )


def crawl_backlog(crawler) -> tuple[int, int, int]:
    """(requests scheduled, requests in the downloader, listed URLs not yet read) of a
    running crawl: what it has left to do."""
    try:
        engine = crawler.engine
    except RuntimeError:  # not started yet (Scrapy's property raises until then)
        engine = None
    scheduler = getattr(engine, "scheduler", None)
    scheduled = len(scheduler) if hasattr(scheduler, "__len__") else 0
    active = len(engine.downloader.active) if engine is not None else 0
    # Listed URLs not yet read count as work: between one response and the next start
    # request the scheduler and the downloader can both be empty.
    get = crawler.stats.get_value
    total = get("progress/list_total")
    listed_left = max(total - get("progress/list_done", 0), 0) if total else 0
    return scheduled, active, listed_left


def requests_left(crawler) -> int:
    """About how many requests a running crawl has left: its listed URLs not yet done,
    or, where it follows links, what is scheduled and in flight if that is more (the
    listed URLs among them are not counted twice)."""
    scheduled, active, listed_left = crawl_backlog(crawler)
    return max(scheduled + active, listed_left)


class ProgressExtension:
    def __init__(self, crawler):
        self.interval = crawler.settings.getfloat("PROGRESS_INTERVAL")
        if self.interval <= 0:
            # Off on purpose (the shell, benchmarks): Scrapy would log a WARNING for a
            # NotConfigured with a message.
            logger.debug("No progress lines: PROGRESS_INTERVAL is 0")
            raise NotConfigured
        self.stats = crawler.stats
        self._task: task.LoopingCall | None = None
        self._last = (time.monotonic(), 0, 0)

    @classmethod
    def from_crawler(cls, crawler):
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider) -> None:
        self._last = (time.monotonic(), 0, 0)
        self._task = task.LoopingCall(self.log)
        self._task.start(self.interval, now=False)

    def _counts(self) -> tuple[int, int]:
        get = self.stats.get_value
        pages = sum(get(f"actions/{o}", 0) for o in ("ok", "not_modified", "unchanged"))
        return pages, get("progress/list_done", 0)

    def log(self) -> None:
        now = time.monotonic()
        pages, done = self._counts()
        then, pages0, done0 = self._last
        elapsed = max(now - then, 1e-6)
        self._last = (now, pages, done)
        line = format_progress(
            self.stats.get_stats(), (pages - pages0) / elapsed, (done - done0) / elapsed
        )
        logger.info("Progress: %s", line)

    def spider_closed(self, spider, reason) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()
