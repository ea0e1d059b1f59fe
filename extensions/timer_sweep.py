"""Keeps one Twisted timer firing so that the reactor drops the timers a crawl cancels.

Each download arms two Twisted timers and cancels them when it ends: its timeout
(``DOWNLOAD_TIMEOUT``, 180 s) and, for the idle connection it returns to the pool,
a 240 s close. A cancelled timer stays in the reactor's heap until ``runUntilCurrent``
compacts it, and under the asyncio reactor that runs only when a Twisted timer is due.
Scrapy schedules its own periodic work on asyncio, so a crawl with no Twisted timer of
its own (``PROGRESS_INTERVAL = 0``) kept every cancelled timer of its last three
minutes, ~0.5 KB per page: a bare crawl grew from 99 to 167 MB over 120,000 pages at
1,300 pages/s, and stayed at 99-100 MB with this running. Off with ``TIMER_SWEEP_INTERVAL = 0``.
"""

from __future__ import annotations

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task


def _nothing() -> None:
    pass


class TimerSweepExtension:
    def __init__(self, interval: float):
        if interval <= 0:
            raise NotConfigured("TIMER_SWEEP_INTERVAL is 0")
        self.interval = interval
        self._task: task.LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler):
        ext = cls(crawler.settings.getfloat("TIMER_SWEEP_INTERVAL"))
        crawler.signals.connect(ext.start, signal=signals.spider_opened)
        crawler.signals.connect(ext.stop, signal=signals.spider_closed)
        return ext

    def start(self) -> None:
        self._task = task.LoopingCall(_nothing)
        self._task.start(self.interval, now=False)

    def stop(self) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()
        self._task = None
