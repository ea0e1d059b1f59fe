"""Each request waits for its host's budget, shared by every crawl process of a cluster.

Scrapy keeps a host to ``DOWNLOAD_DELAY`` and ``CONCURRENT_REQUESTS_PER_DOMAIN`` within
one process; N processes sharing a host gave it N times that. Here every request first
waits at its host's gate (:class:`crawler.hub.hostgates.HostGates`) for a slot of the
hub's host budget (``crawler/hub/hostbudget.py``): at most ``CONCURRENT_REQUESTS_PER_DOMAIN``
requests in flight to the host and one every ``DOWNLOAD_DELAY`` seconds, all processes
together. Without ``HUB_URL`` the same budget lives in an in-memory hub of this process.

The interval asked for is the largest of ``DOWNLOAD_DELAY``, the host's robots.txt
``Crawl-delay`` (capped at ``HOST_CRAWL_DELAY_MAX``) and AutoThrottle's current delay for
the request's download slot: AutoThrottle still slows a host down on latency, never
below the budget. Scrapy's own per-process delay and concurrency still apply on top.
A 429 or 503 answer with ``Retry-After`` (seconds or an HTTP date, capped at
``HOST_RETRY_AFTER_MAX``) stops every process from asking the host until then; the
request itself is retried by the retry middleware as any 429 or 503 is.

Every blocking hub call runs in one thread of this middleware's, never on the reactor.
"""

from __future__ import annotations

import inspect
import logging
import secrets
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import signals
from scrapy.exceptions import NotConfigured, UsageError
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from crawler.downloader import NotSent
from crawler.hub import Holder, Hub, HubUnavailableError, InvalidHubURLError
from crawler.hub.db import hub_url
from crawler.hub.hostbudget import HostBudgetStore
from crawler.hub.hostgates import GateConfig, GateEvents, HostGates, WaitEpisode
from crawler.signals import FINAL_OUTCOME
from crawler.storage.actionlog import Outcome
from middlewares.proxy_lease import META_LABEL, ProxyLeaseMiddleware, _HubThread, _ReactorClock

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")

META_SLOT = "_host_slot"  # (budget key, slot) this attempt went through
BACKOFF_STATUSES = (429, 503)


class HostBudgetConfigError(ValueError):
    """A HOST_* setting has a value the middleware cannot work with."""


@dataclass(frozen=True)
class HostBudgetConfig:
    """The settings the host budget reads, once."""

    hub_url: str | None
    delay: float
    concurrency: int
    per_proxy: bool = False
    slot_ttl: float = 30.0
    slot_seconds: float = 10.0
    poll_seconds: float = 1.0
    crawl_delay_max: float = 30.0
    retry_after_max: float = 600.0
    connect_timeout: float = 10.0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> HostBudgetConfig:
        if not settings.getbool("HOST_BUDGET_ENABLED", True):
            raise NotConfigured("HOST_BUDGET_ENABLED is False: each process keeps its own limits")
        try:
            config = cls(
                hub_url=hub_url(settings),
                delay=settings.getfloat("DOWNLOAD_DELAY"),
                concurrency=settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
                per_proxy=settings.getbool("HOST_BUDGET_PER_PROXY"),
                slot_ttl=settings.getfloat("HOST_SLOT_TTL"),
                slot_seconds=settings.getfloat("HOST_SLOT_SECONDS"),
                poll_seconds=settings.getfloat("HOST_POLL_SECONDS"),
                crawl_delay_max=settings.getfloat("HOST_CRAWL_DELAY_MAX"),
                retry_after_max=settings.getfloat("HOST_RETRY_AFTER_MAX"),
                connect_timeout=settings.getfloat("HUB_CONNECT_TIMEOUT"),
            )
        except (TypeError, ValueError) as exc:
            raise HostBudgetConfigError(f"a HOST_* setting is not a number: {exc}") from None
        config.check()
        return config

    def check(self) -> None:
        problems = []
        if self.slot_ttl <= 1:
            problems.append("HOST_SLOT_TTL must be > 1 (seconds)")
        if self.slot_seconds < 0 or self.poll_seconds <= 0:
            problems.append("HOST_SLOT_SECONDS must be >= 0 and HOST_POLL_SECONDS > 0")
        if self.crawl_delay_max < 0 or self.retry_after_max < 0:
            problems.append("HOST_CRAWL_DELAY_MAX and HOST_RETRY_AFTER_MAX must be >= 0")
        if self.concurrency < 1:
            problems.append("CONCURRENT_REQUESTS_PER_DOMAIN must be >= 1")
        if problems:
            raise HostBudgetConfigError("; ".join(problems))


def retry_after_seconds(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number or an HTTP date), or None
    when it says nothing usable."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class _Events(GateEvents):
    def __init__(self, mw: HostBudgetMiddleware) -> None:
        self.mw = mw
        self.stats = mw.crawler.stats

    def wait_ended(self, episode: WaitEpisode) -> None:
        self.stats.inc_value("host/wait_episodes")
        self.stats.inc_value("host/wait_seconds", round(episode.seconds, 3))
        from crawler.signals import action

        self.mw.crawler.signals.send_catch_log(
            action,
            url=episode.url,
            key=None,
            outcome=Outcome.HOST_WAIT,
            error=f"waited for host {episode.key}: {episode.reason}",
            elapsed_ms=episode.seconds * 1000,
            host=episode.key,
            reason=episode.reason,
            requests=episode.requests,
        )
        logger.debug(
            "%d request(s) waited %.1f s for %s: %s",
            episode.requests,
            episode.seconds,
            episode.key,
            episode.reason,
        )

    def hub_failed(self, error: Exception, doing: str) -> None:
        self.stats.inc_value("host/hub_errors")
        if isinstance(error, HubUnavailableError):  # the hub logs once that it is away
            logger.debug("Hub unavailable while %s: %s", doing, error)
            return
        logger.error("Hub %s failed while %s: %s", self.mw.hub.label, doing, error)

    def slot_lost(self, key: str) -> None:
        self.stats.inc_value("host/slots_lost")


class HostBudgetMiddleware:
    """Downloader middleware: a request goes once its host's budget lets it."""

    def __init__(self, crawler: Crawler, hub: Hub | None = None) -> None:
        self.crawler = crawler
        try:
            self.config = HostBudgetConfig.from_settings(crawler.settings)
            self.hub = hub or _open_hub(self.config)
        except (HostBudgetConfigError, InvalidHubURLError) as exc:
            raise UsageError(str(exc)) from None
        try:
            store = HostBudgetStore.open(self.hub)
        except Exception:
            self.hub.close()
            raise
        self.store = store
        # Two crawls of one process (tests, scripts) are two holders too.
        self.holder = f"{Holder.current()}#{secrets.token_hex(3)}"
        self.robots_ttl = crawler.settings.getfloat("HOST_ROBOTS_TTL")
        self._thread = _HubThread()
        self._crawl_delays: dict[str, float] = {}
        # Requests that could not go at once, and how long they waited at the gate (for a
        # slot, or for room among CONCURRENT_REQUESTS once it had one).
        self._waited = 0
        self._wait_seconds = 0.0
        self._proxies: ProxyLeaseMiddleware | None = None
        self.gates = HostGates(
            store,
            self.holder,
            GateConfig(
                ttl=self.config.slot_ttl,
                slot_seconds=self.config.slot_seconds,
                poll_seconds=self.config.poll_seconds,
            ),
            _ReactorClock(),
            self._thread,
            _Events(self),
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HostBudgetMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def spider_opened(self) -> None:
        where = self.hub.label if self.config.hub_url else "this process (no HUB_URL)"
        # Without a hub this is what Scrapy does anyway: not worth a line at INFO.
        logger.log(
            logging.INFO if self.config.hub_url else logging.DEBUG,
            "Host budgets in %s: DOWNLOAD_DELAY=%g s, CONCURRENT_REQUESTS_PER_DOMAIN=%d "
            "per host%s, all processes together",
            where,
            self.config.delay,
            self.config.concurrency,
            " and proxy" if self.config.per_proxy else "",
        )
        # Requests waiting here do not hold one of CONCURRENT_REQUESTS (the project's
        # downloader; another keeps them counted as Scrapy's does), and the gates let
        # no more than that through at once.
        downloader = getattr(self.crawler.engine, "downloader", None)
        if hasattr(downloader, "parking"):
            downloader.parking = self.gates
            self.gates.max_in_flight = downloader.total_concurrency
            self._read_start_requests_ahead(2 * downloader.total_concurrency)
        self._proxies = self.crawler.get_downloader_middleware(ProxyLeaseMiddleware)
        self._stop_waiting_when_closing()
        self.gates.start()

    def _read_start_requests_ahead(self, ahead: int) -> None:
        # Scrapy's engine reads the next start request only once the one before was
        # handed to the downloader (a reactor turn each), unless the downloader backs
        # out, when it reads on. Parked requests seldom make it back out, so a list
        # crawl was fed one request a turn and its fetch places waited for the hub
        # (the scheduler empty, a fifth of the places idle: docs/benchmarks.md). The
        # engine waits for that turn through its slot's nextcall.wait() alone: while
        # fewer than *ahead* requests are scheduled, it reads on.
        slot = getattr(self.crawler.engine, "_slot", None)
        nextcall = getattr(slot, "nextcall", None)
        scheduler = getattr(slot, "scheduler", None)
        wait = getattr(nextcall, "wait", None)
        if (
            wait is None
            or not inspect.iscoroutinefunction(wait)
            or not hasattr(scheduler, "__len__")
        ):
            return

        async def wait_unless_short() -> None:
            if len(scheduler) >= ahead:
                await wait()

        nextcall.wait = wait_unless_short

    def _stop_waiting_when_closing(self) -> None:
        # A closing engine waits for every request it handed to the downloader: those
        # waiting here for a host slot would be paced out one by one (up to twice
        # CONCURRENT_REQUESTS of them, a second apart at DOWNLOAD_DELAY=1) before a
        # graceful stop ends. They were never sent: they go back at once, unfetched.
        # Scrapy sends no signal when closing starts; its engine slot's close() is it.
        slot = getattr(self.crawler.engine, "_slot", None)
        close = getattr(slot, "close", None)
        if close is None or not inspect.iscoroutinefunction(close):
            return

        async def closing() -> None:
            self.gates.stop_waiting()
            await close()

        slot.close = closing

    async def spider_closed(self) -> None:
        stats = self.crawler.stats
        stats.set_value("host/hub_calls", self.gates.hub_calls)
        stats.set_value("host/gate_waits", self._waited)
        stats.set_value("host/gate_wait_seconds", round(self._wait_seconds, 3))
        stats.set_value("host/idle_fetch_seconds", round(self.gates.idle_seconds, 3))
        closed: Deferred[None] = Deferred()
        self.gates.close(lambda: closed.callback(None))
        try:
            await maybe_deferred_to_future(closed)
            await maybe_deferred_to_future(self._thread.defer(self.hub.close))
        finally:
            self._thread.stop()

    # --- what other components ask and tell ----------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking hub call in the hub's thread, in order with the budget's own."""
        return await maybe_deferred_to_future(self._thread.defer(lambda: fn(*args)))

    def key_of(self, request: Request) -> str:
        host = urlparse_cached(request).hostname or ""
        proxy = request.meta.get(META_LABEL)
        return f"{host} via {proxy}" if self.config.per_proxy and proxy else host

    def crawl_delay(self, host: str, delay: float | None, fetched_here: bool) -> None:
        """robots.txt of *host* asks for *delay* seconds between requests."""
        if delay is None or delay <= 0:
            return
        if delay > self.config.crawl_delay_max:
            logger.warning(
                "robots.txt of %s asks for Crawl-delay: %g s; keeping to HOST_CRAWL_DELAY_MAX=%g s",
                host,
                delay,
                self.config.crawl_delay_max,
            )
            self.crawler.stats.inc_value("host/crawl_delay_capped")
            delay = self.config.crawl_delay_max
        self._crawl_delays[host] = delay
        self.crawler.stats.inc_value("host/crawl_delays")
        self.gates.crawl_delay(host, delay, fetched_here)

    # --- requests -------------------------------------------------------------------
    async def process_request(self, request: Request) -> None:
        while True:
            key = self.key_of(request)
            slot, waited = await self._slot(request, key)
            if not waited or self._proxies is None or self._proxies.sendable(request):
                break
            # Its proxy lease was given before it waited here and may not be used any
            # more (run out while the hub was away, or banned meanwhile). The slot goes
            # back first: requests still waiting here with that lease must be able to
            # go and end it, or no other lease comes. Then another lease, and a slot
            # again (of another key, if the budget is per proxy).
            self.gates.done(key, slot)
            await self._proxies.refresh(request)
        request.meta[META_SLOT] = (key, slot)
        self.crawler.stats.inc_value("host/requests")

    async def _slot(self, request: Request, key: str) -> tuple[Any, bool]:
        """Wait for a slot of *key* for *request*: (the slot, whether it had to wait)."""
        host = urlparse_cached(request).hostname or ""
        interval, why = max(
            (self.config.delay, "DOWNLOAD_DELAY"),
            (self._throttle(request), "AutoThrottle"),
            (self._crawl_delays.get(host, 0.0), "Crawl-delay"),
        )
        granted: Deferred[Any] = Deferred()
        asked = time.monotonic()
        self.gates.wait(
            key,
            request.url,
            interval,
            self.config.concurrency,
            granted.callback,
            f"{why} {interval:g} s",
        )
        waited = not granted.called
        slot = await maybe_deferred_to_future(granted)
        if waited:
            self._waited += 1
            self._wait_seconds += time.monotonic() - asked
        if slot is None or self.gates.closed:
            # Never sent: no action line (the next run fetches it), no "Gave up".
            request.meta[FINAL_OUTCOME] = "not_sent"
            raise NotSent("the spider is closing: no host slots any more")
        return slot, waited

    def process_response(self, request: Request, response: Response) -> Response:
        self._finished(request, response)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        self._finished(request, None)

    def _finished(self, request: Request, response: Response | None) -> None:
        held = request.meta.pop(META_SLOT, None)
        if held is None:
            return
        key, slot = held
        if response is not None and response.status in BACKOFF_STATUSES:
            seconds = retry_after_seconds(response.headers.get(b"Retry-After"))
            if seconds is not None and seconds > 0:
                seconds = min(seconds, self.config.retry_after_max)
                reason = f"HTTP {response.status}, Retry-After: {seconds:g} s"
                self.crawler.stats.inc_value("host/backoffs")
                logger.info("%s answered %s: no process asks it for %g s", key, reason, seconds)
                self.gates.back_off(key, seconds, reason)
        self.gates.done(key, slot)

    def _throttle(self, request: Request) -> float:
        """AutoThrottle's (or the download slot's) delay for *request*."""
        engine = self.crawler.engine
        downloader = getattr(engine, "downloader", None)
        if downloader is None:
            return 0.0
        slot = downloader.slots.get(downloader.get_slot_key(request))
        return float(slot.delay) if slot is not None else 0.0


def _open_hub(config: HostBudgetConfig) -> Hub:
    if config.hub_url:
        return Hub.open(config.hub_url, config.connect_timeout)
    # One process: the same budgets, in a database of its own in memory.
    return Hub.open("sqlite:///:memory:")
