"""Scrapy's RobotsTxtMiddleware, with every waiter getting the parsed robots.txt, one
fetch per host for a whole cluster, and the host's ``Crawl-delay`` kept to.

Requests that arrive while a site's robots.txt is being fetched all await one
Deferred. Awaited through ``asFuture`` (the asyncio reactor), its first waiter's
callback returns None, so every later waiter got None, meaning "no robots.txt", and
their requests went out unchecked. Once the Deferred has fired the parser is in
``_parsers``: read it from there.

With the host budget on (``middlewares/host_budget.py``), robots.txt goes through the
hub: the first process to need a host's robots.txt claims it, fetches it and stores it
there; the others wait for it and parse the stored body, until it is
``HOST_ROBOTS_TTL`` seconds old. A claim not fulfilled within ``HOST_SLOT_TTL`` (its
process died) passes to the next asker. The ``Crawl-delay`` for this crawl's user agent
(capped at ``HOST_CRAWL_DELAY_MAX``) becomes the host's interval in its budget.
"""

from __future__ import annotations

import logging

from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

# Seconds between looks at the hub while another process fetches a robots.txt.
SHARED_POLL = 0.25


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    _budget = None  # the host budget middleware, when it is on

    @classmethod
    def from_crawler(cls, crawler):
        mw = super().from_crawler(crawler)
        crawler.signals.connect(mw._find_budget, signal=signals.engine_started)
        return mw

    def _find_budget(self) -> None:
        from middlewares.host_budget import HostBudgetMiddleware

        self._budget = self.crawler.get_downloader_middleware(HostBudgetMiddleware)

    async def robot_parser(self, request):
        netloc = urlparse_cached(request).netloc
        if self._budget is not None and netloc not in self._parsers:
            self._parsers[netloc] = Deferred()
            await self._shared_robots(request, netloc)
        parser = await super().robot_parser(request)
        if parser is None:
            parser = self._parsers.get(netloc)
            if isinstance(parser, Deferred):
                return None
        return parser

    async def _shared_robots(self, request, netloc: str) -> None:
        """Parse *netloc*'s robots.txt from the hub, fetching it if this process is the
        one to; the parser (or None) ends up in ``_parsers`` as Scrapy's would."""
        budget = self._budget
        url = urlparse_cached(request)
        host = url.hostname or ""
        try:
            while True:
                entry = await budget.call(budget.store.robots, netloc, budget.robots_ttl)
                if entry is not None:
                    self._stats.inc_value("robotstxt/shared")
                    await self._parse_shared(entry.status, entry.body, netloc, request, host)
                    return
                claimed = await budget.call(
                    budget.store.claim_robots,
                    netloc,
                    budget.holder,
                    budget.config.slot_ttl,
                    budget.robots_ttl,
                )
                if claimed:
                    break
                await _sleep(SHARED_POLL)
        except Exception as exc:  # the hub away: fetch it here, as without a hub
            logger.debug("robots.txt of %s not shared through the hub: %s", netloc, exc)
        robotsreq = Request(
            f"{url.scheme}://{netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True},
            callback=NO_CALLBACK,
        )
        try:
            resp = await self.crawler.engine.download_async(robotsreq)
        except Exception as exc:
            if not isinstance(exc, IgnoreRequest):
                logger.error("Error downloading %s: %s", robotsreq, exc, exc_info=exc)
            self._robots_error(exc, netloc)
            self._stats.inc_value("robotstxt/request_count")
            await self._store(budget, netloc, None, b"")
            return
        self._stats.inc_value("robotstxt/request_count")
        # The delay is in the hub before the body: no process reads the one without the other.
        self._crawl_delay(self._build(resp.body), host, fetched_here=True)
        await self._store(budget, netloc, resp.status, resp.body)
        await self._parse_robots(resp, netloc, request)

    async def _store(self, budget, netloc: str, status: int | None, body: bytes) -> None:
        try:
            await budget.call(budget.store.put_robots, netloc, status, body)
        except Exception as exc:
            logger.debug("Could not share robots.txt of %s through the hub: %s", netloc, exc)

    async def _parse_shared(self, status, body: bytes, netloc: str, request, host: str) -> None:
        if status is None:
            self._robots_error(IgnoreRequest("robots.txt could not be fetched"), netloc)
            return
        self._crawl_delay(self._build(body), host, fetched_here=False)
        response = Response(
            f"{urlparse_cached(request).scheme}://{netloc}/robots.txt", status=status, body=body
        )
        await self._parse_robots(response, netloc, request)

    def _build(self, body: bytes):
        return build_from_crawler(self._parserimpl, self.crawler, body)

    def _crawl_delay(self, parser, host: str, fetched_here: bool) -> None:
        agent = self._robotstxt_useragent or self._default_useragent
        rp = getattr(parser, "rp", None)
        delay = getattr(rp, "crawl_delay", None)
        if delay is None:
            return
        try:
            seconds = delay(agent)
        except Exception:  # a parser that cannot tell
            return
        if seconds:
            self._budget.crawl_delay(host, float(seconds), fetched_here)


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor

    d: Deferred[None] = Deferred()
    reactor.callLater(seconds, d.callback, None)
    await maybe_deferred_to_future(d)
