"""Each request waits for its host's budget, shared by every crawl process of a cluster.

Scrapy keeps a host to ``DOWNLOAD_DELAY`` and ``CONCURRENT_REQUESTS_PER_DOMAIN`` within
one process; N processes sharing a host gave it N times that. Here every request first
waits at its host's gate (:class:`crawler.hub.hostgates.HostGates`) for a slot of the
hub's host budget (``crawler/hub/hostbudget.py``), the limits being the host policy's
(:class:`crawler.politeness.HostPolicy`: the interval from the delay, the host's
Crawl-delay and AutoThrottle; the concurrency; back-offs from ``Retry-After``), all
processes together. Without ``HUB_URL`` the same budget lives in an in-memory hub of
this process. Every blocking hub call runs in a thread of its own, never on the reactor.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import signals
from scrapy.exceptions import NotConfigured, UsageError
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from crawler.downloader import AccountingDownloader, not_sent
from crawler.hub import Holder, Hub, HubUnavailableError, InvalidHubURLError
from crawler.hub.db import hub_url
from crawler.hub.hostbudget import HostBudgetStore, RobotsEntry
from crawler.hub.hostgates import GateConfig, GateEvents, HostGates, WaitEpisode
from crawler.hub.runner import HubThread, LoopClock
from crawler.politeness import HostPolicy, HostPolicyError
from crawler.signals import crawl_closing, live_settings_changed
from crawler.storage.actionlog import Outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")

META_SLOT = "_host_slot"  # (budget key, slot) this attempt went through
META_WIRE = "_host_slot_sent"  # this attempt reached the wire
META_LABEL = "proxy_label"  # the proxy of this attempt (middlewares/proxy_lease.py)
INTERVALS_KEPT = 4096


class HostBudgetConfigError(ValueError):
    """A HOST_* setting has a value the middleware cannot work with."""


@dataclass(frozen=True)
class HostBudgetConfig:
    """How this process shares host budgets: the hub, and the HOST_* settings of the
    gates (the limits themselves are the host policy's)."""

    hub_url: str | None
    per_proxy: bool = False
    slot_seconds: float = 10.0
    poll_seconds: float = 1.0
    robots_ttl: float = 86400.0
    connect_timeout: float = 10.0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> HostBudgetConfig:
        if not settings.getbool("HOST_BUDGET_ENABLED", True):
            raise NotConfigured("HOST_BUDGET_ENABLED is False: each process keeps its own limits")
        try:
            config = cls(
                hub_url=hub_url(settings),
                per_proxy=settings.getbool("HOST_BUDGET_PER_PROXY"),
                slot_seconds=settings.getfloat("HOST_SLOT_SECONDS"),
                poll_seconds=settings.getfloat("HOST_POLL_SECONDS"),
                robots_ttl=settings.getfloat("HOST_ROBOTS_TTL"),
                connect_timeout=settings.getfloat("HUB_CONNECT_TIMEOUT"),
            )
        except (TypeError, ValueError) as exc:
            raise HostBudgetConfigError(f"a HOST_* setting is not a number: {exc}") from None
        config.check()
        return config

    def check(self) -> None:
        numbers = (self.slot_seconds, self.poll_seconds, self.robots_ttl)
        if not all(math.isfinite(n) for n in numbers):
            raise HostBudgetConfigError(
                "HOST_SLOT_SECONDS, HOST_POLL_SECONDS and HOST_ROBOTS_TTL must be finite"
            )
        if self.slot_seconds < 0 or self.poll_seconds <= 0:
            raise HostBudgetConfigError("HOST_SLOT_SECONDS must be >= 0 and HOST_POLL_SECONDS > 0")


class _Events(GateEvents):
    def __init__(self, mw: HostBudgetMiddleware) -> None:
        self.mw = mw
        self.stats = mw.crawler.stats

    def wait_ended(self, episode: WaitEpisode) -> None:
        from crawler.signals import action

        self.stats.inc_value("host/wait_episodes")
        self.stats.inc_value("host/wait_seconds", round(episode.seconds, 3))
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
            self.policy = HostPolicy.from_settings(crawler.settings)
            self.hub = hub or _open_hub(self.config)
        except (HostBudgetConfigError, HostPolicyError, InvalidHubURLError) as exc:
            raise UsageError(str(exc)) from None
        try:
            self.store = HostBudgetStore.open(self.hub)
        except Exception:
            self.hub.close()
            raise
        # Two crawls of one process (tests, scripts) are two holders too.
        self.holder = f"{Holder.current()}#{secrets.token_hex(3)}"
        from twisted.internet import reactor

        self._thread = HubThread(reactor.callFromThread, "host-budget-hub")
        self._waited = 0
        self._wait_seconds = 0.0
        self._proxies: Any = None
        self._robots: Any = None
        # (Crawl-delay, throttle delay) -> the interval and why, as the gates take it:
        # the same few pairs come back for every request of a crawl.
        self._intervals: dict[tuple[float | None, float], tuple[float, str]] = {}
        self.downloader: AccountingDownloader | None = None
        self.gates = HostGates(
            self.store,
            self.holder,
            GateConfig(
                ttl=self.policy.slot_ttl,
                slot_seconds=self.config.slot_seconds,
                poll_seconds=self.config.poll_seconds,
            ),
            LoopClock(reactor.callLater),
            self._thread,
            _Events(self),
            gap=lambda interval: self.policy.gap(interval),
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HostBudgetMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw.gates.stop_waiting, signal=crawl_closing)
        crawler.signals.connect(mw.settings_changed, signal=live_settings_changed)
        return mw

    def spider_opened(self) -> None:
        where = self.hub.label if self.config.hub_url else "this process (no HUB_URL)"
        # Without a hub this is what Scrapy does anyway: not worth a line at INFO.
        logger.log(
            logging.INFO if self.config.hub_url else logging.DEBUG,
            "Host budgets in %s: DOWNLOAD_DELAY=%g s, CONCURRENT_REQUESTS_PER_DOMAIN=%d "
            "per host%s, all processes together",
            where,
            self.policy.delay,
            self.policy.concurrency,
            " and proxy" if self.config.per_proxy else "",
        )
        from middlewares.proxy_lease import ProxyLeaseMiddleware
        from middlewares.robotstxt import RobotsTxtMiddleware

        self._proxies = self.crawler.get_downloader_middleware(ProxyLeaseMiddleware)
        self._robots = self.crawler.get_downloader_middleware(RobotsTxtMiddleware)
        downloader = getattr(self.crawler.engine, "downloader", None)
        if isinstance(downloader, AccountingDownloader):
            # Requests waiting here do not hold one of CONCURRENT_REQUESTS, and the gates
            # let no more than that through at once.
            self.downloader = downloader
            downloader.parking = self.gates
            downloader.backoff_key = self.key_of
            downloader.on_wire = self._on_wire
            downloader.paced_by_gates = True
            self.gates.backoffs = downloader.backoffs
            self.gates.max_in_flight = downloader.total_concurrency
            downloader.read_ahead(2 * downloader.total_concurrency)
        self.gates.start()

    def settings_changed(self, settings: BaseSettings, changed: set[str]) -> None:
        self.policy = self.policy.updated(settings)
        self._intervals = {}
        if self.downloader is not None:
            self.gates.max_in_flight = self.downloader.total_concurrency

    async def spider_closed(self) -> None:
        stats = self.crawler.stats
        stats.set_value("host/hub_calls", self.gates.calls.made)
        stats.set_value("host/gate_waits", self._waited)
        stats.set_value("host/gate_wait_seconds", round(self._wait_seconds, 3))
        stats.set_value("host/idle_fetch_seconds", round(self.gates.idle_seconds, 3))
        closed: Deferred[None] = Deferred()
        self.gates.close(lambda: closed.callback(None))
        try:
            await maybe_deferred_to_future(closed)
            await self.call(self.hub.close)
        finally:
            self._thread.stop()

    # --- what other components ask -------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking hub call in the hub's thread, in order with the budget's own."""
        answered: Deferred[T] = Deferred()
        self._thread.run(lambda: fn(*args), answered.callback, answered.errback)
        return await maybe_deferred_to_future(answered)

    def key_of(self, request: Request) -> str:
        host = urlparse_cached(request).hostname or ""
        proxy = request.meta.get(META_LABEL)
        return f"{host} via {proxy}" if self.config.per_proxy and proxy else host

    async def shared_robots(self, netloc: str) -> RobotsEntry | None:
        """*netloc*'s robots.txt as a process of the cluster stored it, if fresh."""
        return await self.call(self.store.robots, netloc, self.config.robots_ttl)

    async def claim_robots(self, netloc: str) -> bool:
        """Whether this process is the one to fetch *netloc*'s robots.txt."""
        return await self.call(
            self.store.claim_robots,
            netloc,
            self.holder,
            self.policy.claim_ttl,
            self.config.robots_ttl,
        )

    async def put_robots(self, netloc: str, status: int | None, body: bytes) -> None:
        await self.call(self.store.put_robots, netloc, status, body)

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
            # go and end it, or no other lease comes.
            self.gates.done(key, slot, sent=False)
            await self._proxies.refresh(request)
        request.meta[META_SLOT] = (key, slot)
        self.crawler.stats.inc_value("host/requests")

    async def _slot(self, request: Request, key: str) -> tuple[Any, bool]:
        """Wait for a slot of *key* for *request*: (the slot, whether it had to wait)."""
        crawl_delay = self._robots.crawl_delay(request) if self._robots is not None else None
        seconds, why = self._interval(crawl_delay, self._throttle(request))
        granted: Deferred[Any] = Deferred()
        self.gates.wait(key, request.url, seconds, self.policy.concurrency, granted.callback, why)
        waited = not granted.called
        asked = self.gates.clock.now()
        slot = await maybe_deferred_to_future(granted)
        if waited:
            self._waited += 1
            self._wait_seconds += self.gates.clock.now() - asked
        if slot is None or self.gates.closed:
            raise not_sent(request, "the crawl is closing: no host slots any more")
        return slot, waited

    def _interval(self, crawl_delay: float | None, throttle: float) -> tuple[float, str]:
        """The policy's interval for these delays, worked out once per pair of them."""
        known = self._intervals.get((crawl_delay, throttle))
        if known is None:
            if len(self._intervals) >= INTERVALS_KEPT:  # AutoThrottle's delays drift
                self._intervals = {}
            interval = self.policy.interval(crawl_delay, throttle)
            known = self._intervals[(crawl_delay, throttle)] = (interval.seconds, str(interval))
        return known

    def _on_wire(self, request: Request) -> None:
        held = request.meta.get(META_SLOT)
        if held is not None:
            request.meta[META_WIRE] = True
            self.gates.sent(*held)

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
        sent = request.meta.pop(META_WIRE, False)
        if response is not None:
            seconds = self.policy.backoff(response.status, response.headers.get(b"Retry-After"))
            if seconds is not None:
                reason = f"HTTP {response.status}, Retry-After: {seconds:g} s"
                self.crawler.stats.inc_value("host/backoffs")
                logger.info("%s answered %s: no process asks it for %g s", key, reason, seconds)
                self.gates.back_off(key, seconds, reason)
        self.gates.done(key, slot, sent)

    def _throttle(self, request: Request) -> float:
        """AutoThrottle's (or the download slot's) delay for *request*."""
        downloader = self.downloader
        if downloader is None:
            return 0.0
        slot = downloader.slots.get(downloader.get_slot_key(request))
        return float(slot.delay) if slot is not None else 0.0


def _open_hub(config: HostBudgetConfig) -> Hub:
    if config.hub_url:
        return Hub.open(config.hub_url, config.connect_timeout)
    # One process: the same budgets, in a database of its own in memory.
    return Hub.open("sqlite:///:memory:")
