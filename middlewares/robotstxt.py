"""Scrapy's RobotsTxtMiddleware, with every waiter getting the parsed robots.txt, one
fetch per host for a whole cluster, a fetch that cannot hang the crawl, and the host's
``Crawl-delay`` known to the host budgets.

Requests that arrive while a site's robots.txt is being fetched all wait for it, and each
reads the parser from ``_parsers`` once it is there (awaited through ``asFuture``, a
shared Deferred gave its result to the first waiter only, and every later one went out
unchecked).

With the host budget on (``middlewares/host_budget.py``), robots.txt goes through the
hub: the first process to need a host's robots.txt claims it, fetches it and stores it
there; the others wait for it and parse the stored body, until it is
``HOST_ROBOTS_TTL`` seconds old. A claim not fulfilled within the host policy's claim
lifetime (its process died) passes to the next asker; a process that ends gives its
claims back at once.

A robots.txt gets ``HOST_ROBOTS_TIMEOUT`` seconds and no retry; one that does not
answer counts as none (everything allowed, as Scrapy treats a failed fetch), with a
warning naming the host. The ``Crawl-delay`` for this crawl's user agent, capped by the
host policy, is what :meth:`RobotsTxtMiddleware.crawl_delay` answers for the host.

Parsed robots.txt files are kept for the ``ROBOTSTXT_CACHE_HOSTS`` hosts met last: a
list of ten million hosts does not keep ten million parsers; a host met again after it
was dropped has its robots.txt read again (from the hub, when there is one).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest, UsageError
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from crawler.politeness import HostPolicy, HostPolicyError
from crawler.signals import crawl_closing, live_settings_changed

logger = logging.getLogger(__name__)

# Seconds between looks at the hub while another process fetches a robots.txt.
SHARED_POLL = 0.25
_MISSING = object()


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    def __init__(self, crawler) -> None:
        super().__init__(crawler)
        try:
            self.policy = HostPolicy.from_settings(crawler.settings)
        except HostPolicyError as exc:
            raise UsageError(str(exc)) from None
        self.timeout = crawler.settings.getfloat("HOST_ROBOTS_TIMEOUT", 10.0)
        self._parsers = RecentHosts(crawler.settings.getint("ROBOTSTXT_CACHE_HOSTS", 10_000))
        self._budget: Any = None  # the host budget middleware, when it is on
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler):
        mw = super().from_crawler(crawler)
        crawler.signals.connect(mw._find_budget, signal=signals.engine_started)
        crawler.signals.connect(mw._stop_waiting, signal=crawl_closing)
        crawler.signals.connect(mw._settings_changed, signal=live_settings_changed)
        return mw

    def _find_budget(self) -> None:
        from middlewares.host_budget import HostBudgetMiddleware

        self._budget = self.crawler.get_downloader_middleware(HostBudgetMiddleware)

    def _stop_waiting(self) -> None:
        self._closing = True

    def _settings_changed(self, settings, changed) -> None:
        self.policy = self.policy.updated(settings)

    def crawl_delay(self, request: Request) -> float | None:
        """The Crawl-delay kept to for *request*'s host (None: none known), read from
        its parsed robots.txt: the one place it is kept."""
        parser = self._parsers.get(urlparse_cached(request).netloc)
        if parser is None or isinstance(parser, Deferred):
            return None
        return self.policy.crawl_delay(self._asked_delay(parser))

    def _asked_delay(self, parser) -> float | None:
        agent = self._robotstxt_useragent or self._default_useragent
        delay = getattr(getattr(parser, "rp", None), "crawl_delay", None)
        if delay is None:
            return None
        try:
            asked = delay(agent)
        except Exception:  # a parser that cannot tell
            return None
        return float(asked) if asked else None

    async def robot_parser(self, request):
        netloc = urlparse_cached(request).netloc
        parser = self._parsers.get(netloc, _MISSING)
        if parser is not _MISSING:
            self._parsers.move_to_end(netloc)
        if parser is _MISSING:
            self._parsers[netloc] = Deferred()
            await self._load(request, netloc)
        elif isinstance(parser, Deferred):
            await maybe_deferred_to_future(_when_fired(parser))
        parser = self._parsers.get(netloc)
        return None if isinstance(parser, Deferred) else parser

    async def _load(self, request: Request, netloc: str) -> None:
        """Parse *netloc*'s robots.txt from the hub, or fetch it (and share it); the
        parser (or None) ends up in ``_parsers`` as Scrapy's would."""
        budget = self._budget
        if budget is not None:
            try:
                entry = await self._shared(budget, netloc)
            except Exception as exc:  # the hub away: fetch it here, as without a hub
                logger.debug("robots.txt of %s not shared through the hub: %s", netloc, exc)
                budget = None
            else:
                if entry is not None:
                    self._stats.inc_value("robotstxt/shared")
                    await self._parse_stored(entry, netloc, request)
                    return
                if self._closing:
                    self._robots_error(IgnoreRequest("the crawl is closing"), netloc)
                    return
        url = urlparse_cached(request)
        robotsreq = Request(
            f"{url.scheme}://{netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            # Not retried: a retry would be a line of its own, and a robots.txt that
            # fails counts as none (one warning below).
            meta={
                "dont_obey_robotstxt": True,
                "download_timeout": self.timeout,
                "dont_retry": True,
            },
            callback=NO_CALLBACK,
        )
        self._stats.inc_value("robotstxt/request_count")
        try:
            resp = await self.crawler.engine.download_async(robotsreq)
        except Exception as exc:
            if not isinstance(exc, IgnoreRequest):
                self._stats.inc_value("robotstxt/unanswered")
                logger.warning(
                    "Could not fetch %s (%s): crawling %s as if it had no robots.txt, as "
                    "Scrapy does",
                    robotsreq.url,
                    f"{type(exc).__name__}: {exc}",
                    netloc,
                )
            self._robots_error(exc, netloc)
            await self._share(budget, netloc, None, b"")
            return
        await self._share(budget, netloc, resp.status, resp.body)
        await self._parse_robots(resp, netloc, request)
        self._note_crawl_delay(self._parsers.get(netloc), netloc)

    async def _shared(self, budget: Any, netloc: str):
        """The stored robots.txt of *netloc*, or None once this process is to fetch it
        (or the crawl is closing)."""
        while not self._closing:
            entry = await budget.shared_robots(netloc)
            if entry is not None:
                return entry
            if await budget.claim_robots(netloc):
                return None
            await _sleep(SHARED_POLL)
        return None

    async def _parse_stored(self, entry, netloc: str, request) -> None:
        if entry.status is None:
            self._robots_error(IgnoreRequest("robots.txt could not be fetched"), netloc)
            return
        response = Response(
            f"{urlparse_cached(request).scheme}://{netloc}/robots.txt",
            status=entry.status,
            body=entry.body,
        )
        await self._parse_robots(response, netloc, request)
        self._note_crawl_delay(self._parsers.get(netloc), netloc)

    async def _share(self, budget: Any, netloc: str, status: int | None, body: bytes) -> None:
        if budget is None:
            return
        try:
            await budget.put_robots(netloc, status, body)
        except Exception as exc:
            logger.debug("Could not share robots.txt of %s through the hub: %s", netloc, exc)

    def _note_crawl_delay(self, parser, netloc: str) -> None:
        """Say (once per parse) that *netloc* asks for a Crawl-delay, and whether the
        policy caps it."""
        asked = self._asked_delay(parser)
        kept = self.policy.crawl_delay(asked)
        if kept is None:
            return
        if kept < asked:
            logger.warning(
                "robots.txt of %s asks for Crawl-delay: %g s; keeping to HOST_CRAWL_DELAY_MAX=%g s",
                netloc,
                asked,
                kept,
            )
            self._stats.inc_value("host/crawl_delay_capped")
        self._stats.inc_value("host/crawl_delays")


class RecentHosts(OrderedDict):
    """A dict of the *most* hosts met last (a host read again is met again): the oldest
    go as new ones come, but for those still being fetched (a Deferred)."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = max(most, 1)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.most:
            for oldest, value in self.items():
                if not isinstance(value, Deferred):
                    del self[oldest]
                    break
            else:
                break  # every one is being fetched


def _when_fired(shared: Deferred) -> Deferred:
    """A Deferred of its own that fires when *shared* does, leaving its result alone."""
    mine: Deferred[None] = Deferred()

    def fire(result):
        if not mine.called:
            mine.callback(None)
        return result

    shared.addBoth(fire)
    return mine


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor

    d: Deferred[None] = Deferred()
    reactor.callLater(seconds, d.callback, None)
    await maybe_deferred_to_future(d)
