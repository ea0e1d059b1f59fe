"""The crawl's downloader, and the one module that reaches into Scrapy's internals.

Every request it is handed ends with an outcome line. Downloader middlewares that give
up on a response raise from ``process_response`` (a redirect loop, a body that does not
decompress, one past ``DOWNLOAD_MAXSIZE``), and such an exception skips the
``process_response`` of every middleware outside them, the archive's included: the URL
would leave no line in the action log. Every download passes through
:meth:`AccountingDownloader.fetch`, so it is the one place that sees every way a request
can end.

It lets a middleware *park* requests (the host budgets' gates, waiting for a host slot
from the hub): a parked request holds no connection nor body, so it does not count
against ``CONCURRENT_REQUESTS``, and at most twice that many are parked.

It holds the back-offs in force (:class:`crawler.politeness.HostBackoffs`): a request is
checked as it would go on the wire, after Scrapy's own slot queue, so that none goes to
a host inside a back-off, whoever let it through before the host asked to wait.

Scrapy has no public hook for five things the crawl needs, and this module alone reaches
in for them, ``crawler/connpool.py`` for the HTTP connection pool
(``tests/test_scrapy_internals.py`` fails when a Scrapy version changes what they rely
on):

- ``Downloader._download``: the moment a request goes on the wire (back-offs, the
  send time the host gates keep to, a work batch taken over).
- ``Downloader._get_slot``: a download slot without its own jitter when the host gates
  pace requests (they wait its delay, AutoThrottle's, and add the jitter themselves);
  idle slots dropped past ``DOWNLOAD_SLOTS_MAX`` (Scrapy keeps each a minute).
- ``Downloader.slots[...].queue``: requests queued in a download slot, let go unsent
  when the crawl closes (a slot's delay would pace them out one by one).
- the engine slot's ``close()``: when closing starts (:data:`crawler.signals.crawl_closing`),
  before Scrapy waits for every request it handed out.
- the engine slot's ``nextcall.wait()``: reading start requests ahead while requests
  are parked.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import Request, signals
from scrapy.core.downloader import Downloader
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from crawler.politeness import HostBackoffs
from crawler.signals import (
    FINAL_OUTCOME,
    crawl_closing,
    has_outcome,
    live_settings_changed,
    send_action,
    short_url,
)

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)


class GaveUp(IgnoreRequest):
    """A component gave up on the request; the original exception is its cause."""


class TakenOver(IgnoreRequest):
    """The request's work-queue batch was taken over by another holder, who fetches it."""


class NotSent(IgnoreRequest):
    """The crawl closed while the request waited to be sent (or to be answered): nothing
    was stored, nothing is logged, and the next run fetches it."""


def reason(exc: BaseException) -> str:
    """What the action log says of ``exc``: its text, prefixed with its type unless
    it is an IgnoreRequest (whose text is the reason)."""
    if isinstance(exc, IgnoreRequest):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def not_sent(request: Request, why: str) -> NotSent:
    """The exception for *request* let go unsent; it gets no outcome line."""
    request.meta[FINAL_OUTCOME] = "not_sent"
    return NotSent(why)


class Parking(Protocol):
    """What parks requests in the downloader: how many it holds."""

    parked: int


def host_of(request: Request) -> str:
    return urlparse_cached(request).hostname or ""


class AccountingDownloader(Downloader):
    """Scrapy's downloader, which records an ``error`` line for a request that fails
    without one, logs it as one line and hands the spider an :class:`GaveUp`; requests
    parked do not count against ``CONCURRENT_REQUESTS``; none goes on the wire inside a
    back-off; at close, what waits is let go unsent and what is in flight gets
    ``CRAWL_CLOSE_GRACE`` seconds."""

    def __init__(self, crawler) -> None:
        super().__init__(crawler)
        self.parking: Parking | None = None
        self.backoffs = HostBackoffs()
        # The budget key of a request, for back-offs (the host budgets may key by proxy).
        self.backoff_key: Callable[[Request], str] = host_of
        # Told when a request goes on the wire (the host gates).
        self.on_wire: Callable[[Request], None] | None = None
        # The host gates pace every request (delay and jitter): a download slot's jitter
        # would send late what the gates let go on time, into another process's turn.
        self.paced_by_gates = False
        self.close_grace = crawler.settings.getfloat("CRAWL_CLOSE_GRACE", 5.0)
        self.slots_max = crawler.settings.getint("DOWNLOAD_SLOTS_MAX", 10_000)
        self.closing = False
        self._held: set[Deferred] = set()
        self._in_flight: set[Deferred] = set()
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._closing, signal=crawl_closing)
        crawler.signals.connect(self._settings_changed, signal=live_settings_changed)

    def needs_backout(self) -> bool:
        parked = self.parking.parked if self.parking is not None else 0
        if not parked:
            return super().needs_backout()
        return 0 < self.total_concurrency <= max(len(self.active) - parked, parked // 2)

    def fetch(self, request: Request, spider=None) -> Deferred:
        # An errback, not a generator of inlineCallbacks around Scrapy's own: one
        # layer less for every request, and only a failure pays for the handling.
        return super().fetch(request).addErrback(self._gave_up, request)

    def _gave_up(self, failure: Failure, request: Request) -> Failure:
        exc = failure.value
        if not isinstance(exc, Exception) or has_outcome(request) or _is_robots(request):
            return failure
        why = reason(exc)
        send_action(self.crawler, request, "error", error=why)
        self.crawler.stats.inc_value(f"downloader/gave_up/{type(exc).__name__}")
        logger.warning("Gave up on %s: %s", short_url(request.url), why)
        raise GaveUp(why) from exc

    def _settings_changed(self, settings, changed: set[str]) -> None:
        """A job's live settings: the limits of the slots there are and of those to come."""
        if "CONCURRENT_REQUESTS" in changed:
            self.total_concurrency = settings.getint("CONCURRENT_REQUESTS")
        if "CONCURRENT_REQUESTS_PER_DOMAIN" in changed:
            self.domain_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
            for slot in self.slots.values():
                slot.concurrency = self.domain_concurrency
        if "DOWNLOAD_DELAY" in changed:
            delay = settings.getfloat("DOWNLOAD_DELAY")
            for slot in self.slots.values():
                slot.delay = delay
            # New slots start at _delay, which AutoThrottle sets to its start delay.
            if settings.getbool("AUTOTHROTTLE_ENABLED"):
                delay = max(delay, settings.getfloat("AUTOTHROTTLE_START_DELAY"))
            self._delay = delay

    def _get_slot(self, request: Request, spider=None):
        had = len(self.slots)
        key, slot = super()._get_slot(request)
        if had < len(self.slots) > self.slots_max:
            self._drop_idle_slots(key)
        if self.paced_by_gates and slot.jitter:
            # The gates wait the slot's delay (AutoThrottle's) and add the jitter: the
            # slot's own wait is then over before the request reaches it.
            slot.jitter = 0.0
        return key, slot

    def _drop_idle_slots(self, keep: str) -> None:
        """Scrapy drops a slot a minute after its last request, so a crawl over many
        hosts holds one (about 1.5 KB) for every host of its last minute or two. Past
        ``DOWNLOAD_SLOTS_MAX`` the idle slots whose delay is over go, least recently
        used first, down to three quarters of it: a host met again gets a new slot, as
        it would after Scrapy's minute, and its delay is over already."""
        now = monotonic()
        idle = sorted(
            (slot.lastseen, key)
            for key, slot in self.slots.items()
            if key != keep
            and not (slot.active or slot.transferring or slot.queue or slot.latercall)
            and slot.lastseen + slot.delay <= now
        )
        for _, key in idle[: len(self.slots) - self.slots_max * 3 // 4]:
            self.slots.pop(key).close()

    # --- back-offs --------------------------------------------------------------------
    def back_off(self, request: Request, seconds: float, why: str) -> None:
        """*request*'s host asked to wait *seconds*: nothing goes to it meanwhile."""
        now = monotonic()
        self.backoffs.set(self.backoff_key(request), now + seconds, why, now)

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
        if self.backoffs:
            await self._wait_for_backoff(request)
        if self.closing:
            raise not_sent(request, "the crawl is closing")
        if self.on_wire is not None:
            self.on_wire(request)
        download = deferred_from_coro(super()._download(slot, request))
        self._in_flight.add(download)
        try:
            return await maybe_deferred_to_future(download)
        except (CancelledError, asyncio.CancelledError):
            if not self.closing:
                raise
            raise not_sent(request, "the crawl closed before the answer came") from None
        finally:
            self._in_flight.discard(download)

    async def _wait_for_backoff(self, request: Request) -> None:
        from twisted.internet import reactor

        key = self.backoff_key(request)
        while (left := self.backoffs.until(key, monotonic()) - monotonic()) > 0:
            if self.closing:
                raise not_sent(request, "the crawl is closing")
            self.crawler.stats.inc_value("host/held_for_backoff")
            held: Deferred[None] = Deferred()
            timer = reactor.callLater(left, held.callback, None)
            self._held.add(held)
            try:
                await maybe_deferred_to_future(held)
            except (CancelledError, asyncio.CancelledError):
                raise not_sent(request, "the crawl is closing") from None
            finally:
                self._held.discard(held)
                if timer.active():
                    timer.cancel()

    # --- closing ------------------------------------------------------------------------
    def _opened(self) -> None:
        _on_engine_close(self.crawler, lambda: self.crawler.signals.send_catch_log(crawl_closing))

    def _closing(self) -> None:
        """Let go what waits (back-offs, slot queues) now, and what is in flight once
        ``close_grace`` seconds have passed: a graceful stop ends within seconds
        whatever the hosts do."""
        from twisted.internet import reactor

        self.closing = True
        waiting = len(self._held)
        for held in list(self._held):
            held.cancel()
        for slot in self.slots.values():
            while slot.queue:
                request, queued = slot.queue.popleft()
                queued.errback(not_sent(request, "the crawl is closing"))
                waiting += 1
        if waiting:
            self.crawler.stats.inc_value("downloader/let_go_at_close", waiting)
            logger.info(
                "Closing: %d request(s) waiting to go out are let go unsent; the next "
                "run fetches them",
                waiting,
            )
        if self._in_flight:
            reactor.callLater(self.close_grace, self._cut_in_flight)

    def _cut_in_flight(self) -> None:
        if self._in_flight:
            logger.info(
                "Closing: %d request(s) still unanswered after CRAWL_CLOSE_GRACE=%g s "
                "are cut; the next run fetches them",
                len(self._in_flight),
                self.close_grace,
            )
            self.crawler.stats.inc_value("downloader/cut_at_close", len(self._in_flight))
        for download in list(self._in_flight):
            download.cancel()

    def read_ahead(self, ahead: int) -> None:
        """Read start requests on while fewer than *ahead* are scheduled (see
        :func:`_read_start_requests_ahead`)."""
        _read_start_requests_ahead(self.crawler, ahead)


def _on_engine_close(crawler, closing: Callable[[], Any]) -> None:
    # Scrapy sends no signal when closing starts; its engine slot's close() is it, and
    # it then waits for every request it handed to the downloader.
    slot = getattr(crawler.engine, "_slot", None)
    close = getattr(slot, "close", None)
    if close is None or not inspect.iscoroutinefunction(close):
        logger.warning("This Scrapy's engine has no slot close(): a stop waits for every wait")
        return

    async def closing_first() -> None:
        closing()
        await close()

    slot.close = closing_first


def _read_start_requests_ahead(crawler, ahead: int) -> None:
    # Scrapy's engine reads the next start request only once the one before was handed
    # to the downloader (a reactor turn each), unless the downloader backs out, when it
    # reads on. Parked requests seldom make it back out, so a list crawl was fed one
    # request a turn and its fetch places waited for the hub. The engine waits for that
    # turn through its slot's nextcall.wait() alone: while fewer than *ahead* requests
    # are scheduled, it reads on.
    slot = getattr(crawler.engine, "_slot", None)
    nextcall = getattr(slot, "nextcall", None)
    scheduler = getattr(slot, "scheduler", None)
    wait = getattr(nextcall, "wait", None)
    if wait is None or not inspect.iscoroutinefunction(wait) or not hasattr(scheduler, "__len__"):
        return

    async def wait_unless_short() -> None:
        if len(scheduler) >= ahead:
            await wait()

    nextcall.wait = wait_unless_short


def _taken_over(crawler, request: Request) -> bool:
    """Whether *request* is of a work-queue batch whose lease this crawl lost
    (``crawler/spiderkit/jobqueue.py``): another holder took the batch over."""
    urls = getattr(crawler.spider, "url_list", None)
    lost = getattr(urls, "lost_keys", None)
    return bool(lost) and request.meta.get("catalog_key") in lost


def _is_robots(request: Request) -> bool:
    # robots.txt requests are the robots middleware's own, not the list's.
    return bool(request.meta.get("dont_obey_robotstxt")) and request.url.endswith("/robots.txt")
