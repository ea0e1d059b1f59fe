"""Send requests through proxies leased from the hub's shared proxy table.

Many crawl processes, on many nodes, share one pool of proxies without ever using the
same proxy at the same time: each process leases up to ``PROXY_LEASES_PER_PROCESS``
proxies from the hub (``HUB_URL``, see ``crawler/hub/``), spreads its requests over
them, renews the leases with a heartbeat, lets a proxy go after ``PROXY_ROTATE_EVERY``
uses (only once every request it sent through it has finished) and ends a lease at once
when the proxy looks banned (``middlewares/proxy_bans.py`` judges), retrying the
request through another proxy.

The lease state machine is :class:`crawler.hub.leases.LeasePool`; this middleware is
its Scrapy side: the ``PROXY_*`` settings (:class:`ProxyLeaseConfig`), request meta,
retries, and the pool's events as stats and log lines. Every blocking hub call runs in
one dedicated thread (:class:`crawler.hub.runner.HubThread`), never on the reactor
thread. Other components ask :meth:`ProxyLeaseMiddleware.lease_for` for a request's
lease, and one that held a request after this middleware gave it a lease asks
:meth:`ProxyLeaseMiddleware.sendable` before letting it go (and ``refresh`` if not).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import signals
from scrapy.exceptions import (
    NotConfigured,
    UsageError,
)
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from crawler.downloader import not_sent
from crawler.hub import (
    Holder,
    Hub,
    HubUnavailableError,
    InvalidHubURLError,
    PoolOutlook,
    ProxyPool,
    RestPolicy,
)
from crawler.hub.db import hub_url
from crawler.hub.leases import (
    Finished,
    LeaseConfig,
    LeaseEvents,
    LeasePool,
    LeaseView,
    PoolClosedError,
)
from crawler.hub.runner import HubThread, LoopClock
from crawler.signals import crawl_closing, live_settings_changed, send_action
from extensions.progress import requests_left
from middlewares.proxy_bans import BanRules, ProxyBanJudge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

META_TOKEN = "_proxy_lease"  # this attempt's lease token (not the proxy URL)
META_AVOID = "_proxy_lease_avoid"  # proxy ids that banned this request
META_LABEL = "proxy_label"  # redacted proxy URL of this attempt, for logs and the action log


class ProxyLeaseConfigError(ValueError):
    """A PROXY_* setting has a value the middleware cannot work with."""


@dataclass(frozen=True)
class ProxyLeaseConfig:
    """The PROXY_* settings, read once; defaults here are the documented ones."""

    hub_url: str
    lease_ttl: float = 60.0
    heartbeat_seconds: float = 0.0  # 0: a third of lease_ttl
    rotate_every: int = 50
    rest_seconds: float = 60.0
    rest_jitter: float = 0.25
    ban_rest_seconds: float = 600.0
    ban_rest_max_seconds: float = 6 * 3600.0
    leases_per_process: int = 2
    ban_statuses: tuple[int, ...] = (403, 407, 429)
    ban_body_markers: tuple[str, ...] = ()
    ban_failed_hosts: int = 2
    max_ban_retries: int = 3
    poll_seconds: float = 2.0
    wait_log_seconds: float = 30.0
    connect_timeout: float = 10.0

    _SETTINGS = {
        "lease_ttl": ("PROXY_LEASE_TTL", "getfloat"),
        "heartbeat_seconds": ("PROXY_HEARTBEAT_SECONDS", "getfloat"),
        "rotate_every": ("PROXY_ROTATE_EVERY", "getint"),
        "rest_seconds": ("PROXY_REST_SECONDS", "getfloat"),
        "rest_jitter": ("PROXY_REST_JITTER", "getfloat"),
        "ban_rest_seconds": ("PROXY_BAN_REST_SECONDS", "getfloat"),
        "ban_rest_max_seconds": ("PROXY_BAN_REST_MAX_SECONDS", "getfloat"),
        "leases_per_process": ("PROXY_LEASES_PER_PROCESS", "getint"),
        "ban_statuses": ("PROXY_BAN_STATUSES", "getlist"),
        "ban_body_markers": ("PROXY_BAN_BODY_MARKERS", "getlist"),
        "ban_failed_hosts": ("PROXY_BAN_FAILED_HOSTS", "getint"),
        "max_ban_retries": ("PROXY_MAX_BAN_RETRIES", "getint"),
        "poll_seconds": ("PROXY_POLL_SECONDS", "getfloat"),
        "wait_log_seconds": ("PROXY_WAIT_LOG_SECONDS", "getfloat"),
        "connect_timeout": ("HUB_CONNECT_TIMEOUT", "getfloat"),
    }

    @classmethod
    def setting_names(cls) -> dict[str, str]:
        """Field name -> setting name."""
        return {name: setting for name, (setting, _) in cls._SETTINGS.items()}

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, environ: dict[str, str] | None = None
    ) -> ProxyLeaseConfig:
        """Read the settings; NotConfigured when no hub is set or PROXY_ENABLED is off."""
        if not settings.getbool("PROXY_ENABLED", True):
            raise NotConfigured("PROXY_ENABLED is False: the crawl goes direct")
        url = hub_url(settings, environ)
        if not url:
            raise NotConfigured("HUB_URL is not set: no proxy leases, the crawl goes direct")
        defaults = {f.name: f.default for f in fields(cls) if f.name != "hub_url"}
        values: dict[str, Any] = {}
        for name, (setting, getter) in cls._SETTINGS.items():
            if settings.get(setting) is None:
                values[name] = defaults[name]
                continue
            try:
                values[name] = getattr(settings, getter)(setting)
            except (TypeError, ValueError):
                raise ProxyLeaseConfigError(
                    f"{setting}={settings.get(setting)!r} is not a valid "
                    f"{getter.removeprefix('get')}"
                ) from None
        try:
            values["ban_statuses"] = tuple(int(s) for s in values["ban_statuses"])
        except ValueError:
            raise ProxyLeaseConfigError(
                f"PROXY_BAN_STATUSES={values['ban_statuses']!r} must be HTTP status numbers"
            ) from None
        values["ban_body_markers"] = tuple(str(m) for m in values["ban_body_markers"] if m)
        config = cls(hub_url=url, **values)
        config.check()
        return config

    def check(self) -> None:
        """Refuse combinations that cannot work, naming the setting to fix."""
        problems = []
        if self.lease_ttl <= 0:
            problems.append("PROXY_LEASE_TTL must be > 0")
        if self.heartbeat_seconds < 0 or self.heartbeat_seconds >= self.lease_ttl:
            problems.append("PROXY_HEARTBEAT_SECONDS must be >= 0 and < PROXY_LEASE_TTL")
        if self.rotate_every < 1:
            problems.append("PROXY_ROTATE_EVERY must be >= 1")
        if self.leases_per_process < 1:
            problems.append("PROXY_LEASES_PER_PROCESS must be >= 1")
        if self.rest_seconds < 0 or self.ban_rest_seconds < 0:
            problems.append("PROXY_REST_SECONDS and PROXY_BAN_REST_SECONDS must be >= 0")
        if self.ban_rest_max_seconds < self.ban_rest_seconds:
            problems.append("PROXY_BAN_REST_MAX_SECONDS must be >= PROXY_BAN_REST_SECONDS")
        if not 0 <= self.rest_jitter < 1:
            problems.append("PROXY_REST_JITTER must be in [0, 1)")
        if self.ban_failed_hosts < 1:
            problems.append("PROXY_BAN_FAILED_HOSTS must be >= 1")
        if self.max_ban_retries < 0:
            problems.append("PROXY_MAX_BAN_RETRIES must be >= 0")
        if self.poll_seconds <= 0:
            problems.append("PROXY_POLL_SECONDS must be > 0")
        if problems:
            raise ProxyLeaseConfigError("; ".join(problems))

    @property
    def heartbeat(self) -> float:
        return self.heartbeat_seconds or self.lease_ttl / 3

    @property
    def rest_policy(self) -> RestPolicy:
        return RestPolicy(
            rest_seconds=self.rest_seconds,
            ban_rest_seconds=self.ban_rest_seconds,
            ban_rest_max_seconds=self.ban_rest_max_seconds,
            jitter=self.rest_jitter,
        )

    @property
    def ban_rules(self) -> BanRules:
        return BanRules(self.ban_statuses, self.ban_body_markers, self.ban_failed_hosts)

    @property
    def pool_config(self) -> LeaseConfig:
        return LeaseConfig(
            lease_ttl=self.lease_ttl,
            heartbeat=self.heartbeat,
            rotate_every=self.rotate_every,
            leases_per_process=self.leases_per_process,
            poll_seconds=self.poll_seconds,
            rest=self.rest_policy,
        )


T = TypeVar("T")


class _StatsAndLogs(LeaseEvents):
    """What the lease pool reports, as stats and log lines."""

    def __init__(self, mw: ProxyLeaseMiddleware) -> None:
        self.mw = mw
        self.stats = mw.stats
        self._last_wait_log = -1e9
        self._asking = False  # the hub is being asked what frees next

    def acquired(self, lease: LeaseView, held: int) -> None:
        self.stats.inc_value("proxy/leases_acquired")
        self.stats.max_value("proxy/leases_held_max", held)
        logger.info("Leased proxy #%d %s (lease %d)", lease.proxy_id, lease.label, lease.lease_id)

    def none_free(self) -> None:
        self.stats.inc_value("proxy/acquire_none_free")
        if self.mw.pool.waiting:  # asked again every PROXY_POLL_SECONDS while they wait
            self._stalled()

    def acquire_failed(self, error: Exception) -> None:
        self.stats.inc_value("proxy/hub_errors")
        if isinstance(error, HubUnavailableError):  # the hub logs once that it is away
            logger.debug("Could not lease a proxy: %s", error)
            return
        logger.error("Could not lease a proxy from %s: %s", self.mw.hub.label, error)

    def released(self, lease: LeaseView, reason: str, ok: bool) -> None:
        if not ok:
            self.stats.inc_value("proxy/leases_lost")
            logger.warning(
                "Lease %d on proxy %s had already expired when released",
                lease.lease_id,
                lease.label,
            )
            return
        self.stats.inc_value(f"proxy/leases_released/{reason}")
        logger.info(
            "Released proxy #%d %s (%s after %d request(s))",
            lease.proxy_id,
            lease.label,
            reason,
            lease.uses,
        )

    def lost(self, lease: LeaseView) -> None:
        self.stats.inc_value("proxy/leases_lost")
        logger.warning(
            "Lost the lease on proxy #%d %s: it expired (PROXY_LEASE_TTL=%g s) and "
            "was taken over; no more requests go through it",
            lease.proxy_id,
            lease.label,
            self.mw.config.lease_ttl,
        )

    def hub_failed(self, error: Exception, doing: str) -> None:
        self.stats.inc_value("proxy/hub_errors")
        if isinstance(error, HubUnavailableError):  # the hub logs once that it is away
            logger.debug("Hub unavailable while %s: %s", doing, error)
            return
        logger.error("Hub %s failed while %s: %s", self.mw.hub.label, doing, error)

    def wait_started(self, waiting: int, shortage: bool) -> None:
        self.stats.inc_value("proxy/requests_waited")
        if not shortage:
            # Not a shortage: a lease of ours is finishing its requests before rotating.
            logger.debug("Waiting for a proxy lease to rotate (%d waiting)", waiting)
            return
        self._stalled()

    def _stalled(self) -> None:
        """Requests wait for want of proxies: say so every PROXY_WAIT_LOG_SECONDS for as
        long as it lasts, with when the next proxy frees (a hub query, off the reactor)."""
        now = monotonic()
        if self._asking or now - self._last_wait_log < self.mw.config.wait_log_seconds:
            return
        self._last_wait_log, self._asking = now, True
        self.mw.hub_call(self.mw.pool.proxies.outlook, self._log_wait, self._log_wait)

    def _log_wait(self, outlook: PoolOutlook | Exception) -> None:
        self._asking = False
        pool = self.mw.pool
        if not pool.waiting:
            return
        self.stats.inc_value("proxy/wait_logs")
        if isinstance(outlook, Exception):
            ahead = f"could not ask the hub what frees next ({outlook})"
        elif outlook.next_free_at is None:
            ahead = (
                f"{outlook.leased} of {outlook.enabled} enabled proxies leased and none "
                "resting: the next frees when a holder lets one go"
            )
        else:
            until = time.strftime("%H:%M:%S UTC", time.gmtime(outlook.next_free_at))
            ahead = (
                f"{outlook.leased} of {outlook.enabled} enabled proxies leased; the next "
                f"frees in {outlook.next_free_in:.0f} s (proxy #{outlook.next_id}, "
                f"{outlook.next_state} until {until})"
            )
            if outlook.next_state == "banned":
                ahead += "; `scrapy proxies unban` lifts bans"
        logger.warning(
            "No proxy free in the hub %s: %d request(s) waiting, the longest for %.0f s "
            "(holding %d of PROXY_LEASES_PER_PROCESS=%d); %s",
            self.mw.hub.label,
            pool.waiting,
            pool.longest_wait,
            len(pool.leases),
            self.mw.config.leases_per_process,
            ahead,
        )

    def wait_ended(self, seconds: float) -> None:
        self.stats.inc_value("proxy/wait_seconds", round(seconds, 3))
        self.stats.max_value("proxy/wait_seconds_max", round(seconds, 3))

    def heartbeat(self) -> None:
        self.stats.inc_value("proxy/heartbeats")

    def heartbeat_stopped(self, error: Exception) -> None:
        logger.error("Proxy lease heartbeat stopped: %s", error)


def crawl_holder(settings: BaseSettings) -> Holder:
    """This process as a lease holder, with the crawl it runs for: the node and the
    data directory, the same in a rerun (which then takes at once a proxy whose rest
    this crawl caused, instead of waiting it out)."""
    here = Holder.current()
    data = os.path.abspath(settings.get("DATA_DIR") or "data")
    return dataclasses.replace(here, crawl=f"{here.host}:{data}")


class ProxyLeaseMiddleware:
    """Downloader middleware: a leased proxy, and its own download slot, per request."""

    def __init__(self, crawler: Crawler, hub: Hub | None = None) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        try:
            self.config = ProxyLeaseConfig.from_settings(crawler.settings)
            self.hub = hub or Hub.open(self.config.hub_url, self.config.connect_timeout)
        except (ProxyLeaseConfigError, InvalidHubURLError) as exc:
            # A usage error: `scrapy crawl` prints its one line and exits 2.
            raise UsageError(str(exc)) from None
        try:
            proxies = ProxyPool(self.hub)
            enabled = proxies.enabled_count()
        except Exception:
            self.hub.close()
            raise
        if enabled == 0:
            self.hub.close()
            raise NotConfigured(
                f"the hub {self.hub.label} has no enabled proxies: the crawl goes direct "
                "(add some with `scrapy proxies add URL`)"
            )
        from twisted.internet import reactor

        self._thread = HubThread(reactor.callFromThread, "proxy-hub")
        self.judge = ProxyBanJudge(crawler, self.config.ban_rules)
        self.pool = LeasePool(
            proxies,
            crawl_holder(crawler.settings),
            self.config.pool_config,
            LoopClock(reactor.callLater),
            self._thread,
            _StatsAndLogs(self),
            backlog=lambda: requests_left(crawler),
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProxyLeaseMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw.pool.stop_waiting, signal=crawl_closing)
        crawler.signals.connect(mw.settings_changed, signal=live_settings_changed)
        return mw

    # --- lifecycle ----------------------------------------------------------------
    def spider_opened(self) -> None:
        logger.info(
            "Proxy leases from %s: up to %d per process, rotate every %d uses, TTL %g s",
            self.hub.label,
            self.config.leases_per_process,
            self.config.rotate_every,
            self.config.lease_ttl,
        )
        self.pool.start()

    async def spider_closed(self) -> None:
        """Release every lease (usage rows closed), then close the hub."""
        closed: Deferred[None] = Deferred()
        self.pool.close(lambda: closed.callback(None))
        try:
            await maybe_deferred_to_future(closed)
        finally:
            self._thread.run(self.hub.close, lambda _: None, lambda _: None)
            self._thread.stop()

    def settings_changed(self, settings: BaseSettings, changed: set[str]) -> None:
        """A job's live PROXY_* values (rotation, rest, ban verdicts); leases held keep
        going under the new rules."""
        config = ProxyLeaseConfig.from_settings(settings, {"HUB_URL": self.config.hub_url})
        self.config = config
        self.pool.config = config.pool_config
        self.judge.rules = config.ban_rules

    def hub_call(
        self, fn: Callable[[], T], done: Callable[[T], None], failed: Callable[[Exception], None]
    ) -> None:
        """Run a blocking hub call in the hub's thread; *done* or *failed* on the reactor."""
        self._thread.run(fn, done, failed)

    # --- what other components ask ---------------------------------------------------
    def lease_for(self, request: Request) -> LeaseView | None:
        """The lease this attempt of *request* goes through, or None (direct, or done)."""
        token = request.meta.get(META_TOKEN)
        return self.pool.lease_of(token) if token is not None else None

    def sendable(self, request: Request) -> bool:
        """Whether *request* may still go on the lease it was given (True if it has
        none): one held back since (for its host's slot) may have outlived the lease,
        the hub being away, or seen it banned."""
        token = request.meta.get(META_TOKEN)
        return token is None or self.pool.sendable(token)

    async def refresh(self, request: Request) -> None:
        """Give *request* another lease in place of one it may not go on (see
        :meth:`sendable`); IgnoreRequest once the pool is closed."""
        self.stats.inc_value("proxy/leases_retaken")
        await self.process_request(request)

    # --- requests -----------------------------------------------------------------
    async def process_request(self, request: Request) -> None:
        if not self._wants_proxy(request):
            return
        self._drop(request)  # a retried copy still carries its previous attempt
        request.meta.pop(META_LABEL, None)  # and its previous proxy, until it has one
        avoid = set(request.meta.get(META_AVOID, ()))
        leased: Deferred[Any] = Deferred(lambda _: waiting.cancel())
        waiting = self.pool.take(avoid, leased.callback, leased.errback)
        try:
            attempt = await maybe_deferred_to_future(leased)
        except PoolClosedError:
            raise not_sent(request, "the crawl is closing: no proxy leases any more") from None
        lease = attempt.lease
        request.meta[META_TOKEN] = attempt.token
        request.meta["proxy"] = lease.proxy_url
        request.meta[META_LABEL] = lease.label
        request.meta["download_slot"] = lease.slot
        self.stats.inc_value("proxy/requests")
        logger.debug("Sending %s through proxy %s", request, lease.label)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        token = request.meta.get(META_TOKEN, 0)
        lease = self.pool.lease_of(token)
        if lease is None:
            self.judge.answered(request, response, None)
            return response
        with self._finishing(request, token, nbytes=len(response.body)):
            banned = self.judge.answered(request, response, lease.proxy_id)
        finished = self._finish(request, token, nbytes=len(response.body), banned=banned)
        if not banned:
            return response
        self.stats.inc_value(f"proxy/bans/status/{response.status}")
        why = f"looks banned: status {response.status}"
        return self._banned(request, finished, why, response.status) or response

    async def process_exception(self, request: Request, exception: Exception) -> Request | None:
        token = request.meta.get(META_TOKEN, 0)
        lease = self.pool.lease_of(token)
        if lease is None:
            return None
        with self._finishing(request, token, failed=True):
            why = await self.judge.failed(request, exception, lease.proxy_id, lease.proxy_url)
        if self.pool.lease_of(token) is None:  # dropped while the proxy was probed
            return None
        finished = self._finish(request, token, failed=True, banned=why is not None)
        if why is None:
            return None
        self.stats.inc_value(f"proxy/bans/exception/{type(exception).__name__}")
        return self._banned(request, finished, why)

    def _wants_proxy(self, request: Request) -> bool:
        if request.meta.get("proxy_lease", True) is False:
            return False
        # A proxy the spider chose itself (not one we set) is left alone.
        return not ("proxy" in request.meta and META_TOKEN not in request.meta)

    def _finish(self, request: Request, token: int, **outcome: Any) -> Finished:
        """End this attempt's hold on its lease, dropping the credentials header."""
        request.headers.pop(b"Proxy-Authorization", None)
        finished = self.pool.finish(token, **outcome)
        assert finished is not None  # checked live by the caller, on this thread
        return finished

    @contextmanager
    def _finishing(self, request: Request, token: int, **outcome: Any) -> Iterator[None]:
        """If the spider's ban verdict raises, the attempt still ends before it goes on."""
        try:
            yield
        except BaseException:
            self._finish(request, token, **outcome)
            raise

    def _drop(self, request: Request) -> None:
        if self.pool.drop(request.meta.get(META_TOKEN, 0)):
            request.headers.pop(b"Proxy-Authorization", None)

    def _banned(
        self, request: Request, finished: Finished, why: str, status: int | None = None
    ) -> Request | None:
        """Count a ban (its lease is ending) and return the retry through another proxy,
        recorded in the action log as a retry through this one."""
        lease = finished.lease
        if finished.newly_banned:
            logger.warning(
                "Proxy #%d %s %s: ending its lease (request %s)",
                lease.proxy_id,
                lease.label,
                why,
                request,
            )
        self.stats.inc_value("proxy/bans")
        retries = request.meta.get("proxy_ban_retries", 0)
        limit = request.meta.get("max_proxy_ban_retries", self.config.max_ban_retries)
        if retries >= limit:
            # Scrapy's retries of this request copy its meta: they are banned again and
            # end here again, for the same URL; said once.
            if not request.meta.get("proxy_ban_gave_up"):
                request.meta["proxy_ban_gave_up"] = True
                self.stats.inc_value("proxy/ban_retries_exhausted")
                logger.warning(
                    "Gave up retrying %s through another proxy after %d ban(s) "
                    "(PROXY_MAX_BAN_RETRIES=%d)",
                    request,
                    retries + 1,
                    limit,
                )
            return None
        retry = request.replace(dont_filter=True)
        retry.meta["proxy_ban_retries"] = retries + 1
        retry.meta[META_AVOID] = [*request.meta.get(META_AVOID, ()), lease.proxy_id]
        retry.meta.pop("_auth_proxy", None)
        retry.headers.pop(b"Proxy-Authorization", None)
        self.stats.inc_value("proxy/ban_retries")
        send_action(
            self.crawler,
            request,
            "retry",
            status=status,
            error=f"proxy #{lease.proxy_id} {why}; retrying through another proxy",
        )
        logger.debug("Retrying %s through another proxy (retry %d)", request, retries + 1)
        return retry
