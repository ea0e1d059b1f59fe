"""The crawl's downloader: every request it is handed ends with an outcome line.

Downloader middlewares that give up on a response raise from ``process_response``
(a redirect loop or a chain past ``REDIRECT_MAX_TIMES``, a body that does not
decompress, one past ``DOWNLOAD_MAXSIZE`` once decompressed), and such an exception
skips the ``process_response`` of every middleware outside them, the archive's
included: the URL would leave no line in the action log. Every download passes
through :meth:`Downloader.fetch`, so it is the one place that sees every way a
request can end.

It also lets a middleware *park* requests (the host budgets' gates, waiting for a host
slot from the hub): a parked request holds no connection nor body, so it does not count
against ``CONCURRENT_REQUESTS``, and at most twice that many are parked (requests of
hosts other processes hold do not stop the crawl unless there are that many). Requests
keep being fetched while others wait for their host; the parking middleware lets no
more than ``CONCURRENT_REQUESTS`` through at once.
"""

from __future__ import annotations

import logging
from typing import Protocol

from scrapy import Request
from scrapy.core.downloader import Downloader
from scrapy.exceptions import IgnoreRequest
from twisted.internet.defer import inlineCallbacks

from crawler.signals import FINAL_OUTCOME, has_outcome, send_action, short_url

logger = logging.getLogger(__name__)


class GaveUp(IgnoreRequest):
    """A component gave up on the request; the original exception is its cause."""


class TakenOver(IgnoreRequest):
    """The request's work-queue batch was taken over by another holder, who fetches it."""


class NotSent(IgnoreRequest):
    """The crawl closed while the request waited to be sent (for a host slot): nothing
    was fetched, nothing is logged, and the next run fetches it."""


def reason(exc: BaseException) -> str:
    """What the action log says of ``exc``: its text, prefixed with its type unless
    it is an IgnoreRequest (whose text is the reason)."""
    if isinstance(exc, IgnoreRequest):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Parking(Protocol):
    """What parks requests in the downloader: how many it holds."""

    parked: int


class AccountingDownloader(Downloader):
    """Scrapy's downloader, which records an ``error`` line for a request that fails
    without one, logs it as one line and hands the spider an :class:`GaveUp` (Scrapy
    would log a traceback at ERROR for anything but an IgnoreRequest); requests parked
    (see the module's docstring) do not count against ``CONCURRENT_REQUESTS``."""

    def __init__(self, crawler) -> None:
        super().__init__(crawler)
        self.parking: Parking | None = None

    def needs_backout(self) -> bool:
        parked = self.parking.parked if self.parking is not None else 0
        if not parked:
            return super().needs_backout()
        return 0 < self.total_concurrency <= max(len(self.active) - parked, parked // 2)

    @inlineCallbacks
    def fetch(self, request: Request, spider=None):
        try:
            result = yield super().fetch(request)
        except Exception as exc:
            if has_outcome(request) or _is_robots(request):
                raise
            why = reason(exc)
            send_action(self.crawler, request, "error", error=why)
            self.crawler.stats.inc_value(f"downloader/gave_up/{type(exc).__name__}")
            logger.warning("Gave up on %s: %s", short_url(request.url), why)
            raise GaveUp(why) from exc
        return result

    async def _download(self, slot, request: Request):
        # Checked as the request would go on the wire, not as it entered the downloader:
        # requests wait there (host slots, the slot's queue) past the lease renewal that
        # found their batch taken over. The new holder fetches it and writes its outcome:
        # none here, and no error.
        if _taken_over(self.crawler, request):
            self.crawler.stats.inc_value("work/lost_skipped")
            logger.info("Not fetching %s: its batch was taken over by another holder",
                        short_url(request.url))  # fmt: skip
            request.meta[FINAL_OUTCOME] = "taken_over"
            raise TakenOver("its batch was taken over by another holder")
        return await super()._download(slot, request)


def _taken_over(crawler, request: Request) -> bool:
    """Whether *request* is of a work-queue batch whose lease this crawl lost
    (``crawler/spiderkit/jobqueue.py``): another holder took the batch over."""
    urls = getattr(crawler.spider, "url_list", None)
    lost = getattr(urls, "lost_keys", None)
    return bool(lost) and request.meta.get("catalog_key") in lost


def _is_robots(request: Request) -> bool:
    # robots.txt requests are the robots middleware's own, not the list's.
    return bool(request.meta.get("dont_obey_robotstxt")) and request.url.endswith("/robots.txt")
