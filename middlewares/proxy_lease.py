"""Send requests through proxies leased from the hub's shared proxy table.

Many crawl processes, on many nodes, share one pool of proxies without ever using the
same proxy at the same time: each process leases up to ``PROXY_LEASES_PER_PROCESS``
proxies from the hub (``HUB_URL``, see ``crawler/hub/``), spreads its requests over
them, renews the leases with a heartbeat, lets a proxy go after ``PROXY_ROTATE_EVERY``
uses (only once every request it sent through it has finished) and ends a lease at once
when the proxy looks banned, retrying the request through another proxy.

Every blocking hub call runs in one dedicated thread, never on the reactor thread.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field, fields
from time import monotonic
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import error as txerror
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from crawler.hub import Holder, Hub, Lease, ProxyPool, RestPolicy, UsageCounts

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

# Errors that say "this proxy refuses or drops us": connection refused or reset, timeouts.
BAN_EXCEPTIONS: tuple[type[BaseException], ...] = (
    txerror.ConnectionRefusedError,
    txerror.ConnectError,
    txerror.TCPTimedOutError,
    txerror.TimeoutError,
    txerror.ConnectionLost,
    ConnectionRefusedError,
    ConnectionResetError,
    TimeoutError,
    ResponseNeverReceived,
    ResponseFailed,
    TunnelError,
)

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
        env = os.environ if environ is None else environ
        if not settings.getbool("PROXY_ENABLED", True):
            raise NotConfigured("PROXY_ENABLED is False: the crawl goes direct")
        hub_url = settings.get("HUB_URL") or env.get("HUB_URL")
        if not hub_url:
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
        config = cls(hub_url=hub_url, **values)
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


@dataclass(eq=False)
class _Held:
    """A lease this process holds, with what it sent through it."""

    lease: Lease
    deadline: float  # monotonic time the lease runs out unless renewed
    assigned: int = 0
    inflight: int = 0
    draining: str | None = None  # end reason, once no new request may use it
    lost: bool = False
    releasing: bool = False
    counts: UsageCounts = field(default_factory=UsageCounts)

    @property
    def slot(self) -> str:
        return f"proxy-{self.lease.proxy_id}"


class ProxyLeaseMiddleware:
    """Downloader middleware: a leased proxy, and its own download slot, per request."""

    def __init__(self, crawler: Crawler, hub: Hub | None = None) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = ProxyLeaseConfig.from_settings(crawler.settings)
        self.hub = hub or Hub.open(self.config.hub_url, self.config.connect_timeout)
        try:
            self.proxies = ProxyPool(self.hub)
        except Exception:
            self.hub.close()
            raise
        if self.proxies.enabled_count() == 0:
            label = self.hub.label
            self.hub.close()
            raise NotConfigured(
                f"the hub {label} has no enabled proxies: the crawl goes direct "
                "(add some with `scrapy proxies add URL`)"
            )
        self.holder = Holder.current()
        self.policy = self.config.rest_policy
        self._leases: dict[int, _Held] = {}
        self._attempts: dict[int, _Held] = {}
        self._tokens = itertools.count(1)
        self._waiters: list[Deferred[None]] = []
        self._acquiring = False
        self._next_acquire = 0.0
        self._waiting = 0
        self._last_wait_log = -1e9
        self._pending: set[Deferred[Any]] = set()
        self._closed = False
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="proxy-hub")
        self._shutdown: Any = None
        self._heartbeat: LoopingCall | None = None
        self._beating = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProxyLeaseMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
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
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.start(self.config.heartbeat, now=False).addErrback(
            lambda f: logger.error("Proxy lease heartbeat stopped: %s", f.value)
        )

    async def spider_closed(self) -> None:
        """Release every lease (usage rows closed), then close the hub."""
        self._closed = True
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self._wake()
        if self._pending:
            await maybe_deferred_to_future(DeferredList(list(self._pending), consumeErrors=True))
        ends = []
        for held in list(self._leases.values()):
            if not (held.releasing or held.lost):
                held.releasing = True
                ends.append((held, held.draining or "released", held.counts.take()))
        try:
            if ends:
                batch = [(h.lease, reason, counts) for h, reason, counts in ends]
                results = await maybe_deferred_to_future(self._call(self._release_all, batch))
                self._released_all(results, ends)
            await maybe_deferred_to_future(self._call(self.hub.close))
        except Exception as exc:
            self._hub_failed(exc, "releasing proxy leases at close")
        finally:
            self._stop_pool()

    def _release_all(self, ends: list[tuple[Lease, str, UsageCounts]]) -> list[bool]:
        return [
            self.proxies.release(lease, reason, counts, self.policy)
            for lease, reason, counts in ends
        ]

    def _released_all(
        self, results: list[bool], ends: list[tuple[_Held, str, UsageCounts]]
    ) -> None:
        for (held, reason, _), ok in zip(ends, results, strict=True):
            self._leases.pop(held.lease.lease_id, None)
            self._count_release(held, reason, ok)

    def _stop_pool(self) -> None:
        from twisted.internet import reactor

        if self._shutdown is not None:
            reactor.removeSystemEventTrigger(self._shutdown)
            self._shutdown = None
        if self._pool.started and not self._pool.joined:
            self._pool.stop()

    # --- hub calls, off the reactor thread ----------------------------------------
    def _call(self, func: Callable[..., Any], *args: Any) -> Deferred[Any]:
        from twisted.internet import reactor

        if not self._pool.started:
            self._pool.start()
            self._shutdown = reactor.addSystemEventTrigger("during", "shutdown", self._stop_pool)
        return deferToThreadPool(reactor, self._pool, func, *args)

    def _hub_failed(self, error: Any, doing: str) -> None:
        """Log and count a failed hub call (*error*: an exception or a Failure)."""
        self.stats.inc_value("proxy/hub_errors")
        logger.error(
            "Hub %s failed while %s: %s", self.hub.label, doing, getattr(error, "value", error)
        )

    # --- requests -----------------------------------------------------------------
    async def process_request(self, request: Request) -> None:
        if not self._wants_proxy(request):
            return
        self._finish(request)  # a retried copy still carries its previous attempt
        held = await self._lease_for(request)
        token = next(self._tokens)
        self._attempts[token] = held
        held.assigned += 1
        held.inflight += 1
        if held.assigned >= self.config.rotate_every and held.draining is None:
            held.draining = "rotated"
        request.meta[META_TOKEN] = token
        request.meta["proxy"] = held.lease.url
        request.meta[META_LABEL] = held.lease.label
        request.meta["download_slot"] = held.slot
        self.stats.inc_value("proxy/requests")
        logger.debug("Sending %s through proxy %s", request, held.lease.label)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        held = self._finish(request)
        if held is None:
            return response
        held.counts.requests += 1
        held.counts.bytes += len(response.body)
        retry = None
        if self._response_is_ban(request, response):
            retry = self._banned(request, held, f"status {response.status}")
            self.stats.inc_value(f"proxy/bans/status/{response.status}")
        self._maybe_release(held)
        return retry or response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        held = self._finish(request)
        if held is None:
            return None
        held.counts.requests += 1
        held.counts.failures += 1
        retry = None
        if self._exception_is_ban(request, exception):
            retry = self._banned(request, held, type(exception).__name__)
            self.stats.inc_value(f"proxy/bans/exception/{type(exception).__name__}")
        self._maybe_release(held)
        return retry

    def _wants_proxy(self, request: Request) -> bool:
        if request.meta.get("proxy_lease", True) is False:
            return False
        # A proxy the spider chose itself (not one we set) is left alone.
        return not ("proxy" in request.meta and META_TOKEN not in request.meta)

    def _finish(self, request: Request) -> _Held | None:
        """End this attempt's hold on its lease (once), dropping the credentials header."""
        held = self._attempts.pop(request.meta.get(META_TOKEN, 0), None)
        if held is not None:
            held.inflight -= 1
            request.headers.pop(b"Proxy-Authorization", None)
        return held

    # --- choosing and leasing ------------------------------------------------------
    async def _lease_for(self, request: Request) -> _Held:
        avoid = set(request.meta.get(META_AVOID, ()))
        waited_since = None
        try:
            while True:
                if self._closed:
                    raise IgnoreRequest("the spider is closing: no proxy leases any more")
                held = self._choose(avoid)
                wants_more = held is None or held.inflight > 0
                if wants_more and self._may_acquire() and await self._acquire():
                    continue
                if held is not None:
                    return held
                if waited_since is None:
                    waited_since = self._start_wait()
                await self._wait()
        finally:
            if waited_since is not None:
                self._end_wait(waited_since)

    def _usable(self, held: _Held, now: float) -> bool:
        margin = self.config.lease_ttl / 4
        return not (held.draining or held.lost or held.releasing) and now < held.deadline - margin

    def _choose(self, avoid: set[int]) -> _Held | None:
        now = monotonic()
        usable = [h for h in self._leases.values() if self._usable(h, now)]
        preferred = [h for h in usable if h.lease.proxy_id not in avoid] or usable
        if not preferred:
            return None
        return min(preferred, key=lambda h: (h.inflight, h.lease.lease_id))

    def _may_acquire(self) -> bool:
        return (
            not self._acquiring
            and len(self._leases) < self.config.leases_per_process
            and monotonic() >= self._next_acquire
        )

    async def _acquire(self) -> bool:
        """Lease one more proxy; False when the hub has none free (then poll later)."""
        self._acquiring = True
        started = monotonic()
        try:
            lease = await maybe_deferred_to_future(
                self._call(self.proxies.acquire, self.holder, self.config.lease_ttl)
            )
        except Exception as exc:
            self.stats.inc_value("proxy/hub_errors")
            logger.error("Could not lease a proxy from %s: %s", self.hub.label, exc)
            lease = None
        finally:
            self._acquiring = False
        if lease is None:
            self._next_acquire = monotonic() + self.config.poll_seconds
            self.stats.inc_value("proxy/acquire_none_free")
            self._wake()
            return False
        held = _Held(lease, deadline=started + self.config.lease_ttl)
        self._leases[lease.lease_id] = held
        self.stats.inc_value("proxy/leases_acquired")
        self.stats.max_value("proxy/leases_held_max", len(self._leases))
        logger.info("Leased proxy #%d %s (lease %d)", lease.proxy_id, lease.label, lease.lease_id)
        self._wake()
        return True

    # --- waiting --------------------------------------------------------------------
    def _start_wait(self) -> float:
        self._waiting += 1
        self.stats.inc_value("proxy/requests_waited")
        now = monotonic()
        if now >= self._next_acquire:
            # Not a shortage: a lease of ours is finishing its requests before rotating.
            logger.debug("Waiting for a proxy lease to rotate (%d waiting)", self._waiting)
        elif now - self._last_wait_log >= self.config.wait_log_seconds:
            self._last_wait_log = now
            logger.warning(
                "No proxy free in the hub %s: %d request(s) waiting for a lease "
                "(holding %d of PROXY_LEASES_PER_PROCESS=%d)",
                self.hub.label,
                self._waiting,
                len(self._leases),
                self.config.leases_per_process,
            )
        return now

    def _end_wait(self, since: float) -> None:
        self._waiting -= 1
        waited = monotonic() - since
        self.stats.inc_value("proxy/wait_seconds", round(waited, 3))
        self.stats.max_value("proxy/wait_seconds_max", round(waited, 3))

    async def _wait(self) -> None:
        from twisted.internet import reactor

        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        timer = reactor.callLater(self.config.poll_seconds, self._fire, d)
        try:
            await maybe_deferred_to_future(d)
        finally:
            if timer.active():
                timer.cancel()

    @staticmethod
    def _fire(d: Deferred[None]) -> None:
        if not d.called:
            d.callback(None)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            self._fire(d)

    # --- bans ----------------------------------------------------------------------
    def _response_is_ban(self, request: Request, response: Response) -> bool:
        verdict = self._spider_verdict("response_is_ban", request, response)
        if verdict is not None:
            return verdict
        if response.status in self.config.ban_statuses:
            return True
        markers = self.config.ban_body_markers
        return bool(markers) and any(m.encode() in response.body for m in markers)

    def _exception_is_ban(self, request: Request, exception: Exception) -> bool:
        verdict = self._spider_verdict("exception_is_ban", request, exception)
        if verdict is not None:
            return verdict
        return isinstance(exception, BAN_EXCEPTIONS)

    def _spider_verdict(self, name: str, request: Request, what: Any) -> bool | None:
        method = getattr(self.crawler.spider, name, None)
        if not callable(method):
            return None
        verdict = method(request, what)
        return None if verdict is None else bool(verdict)

    def _banned(self, request: Request, held: _Held, why: str) -> Request | None:
        """Count a ban, end the lease, and return the retry through another proxy."""
        held.counts.bans += 1
        if held.draining != "banned":
            held.draining = "banned"
            logger.warning(
                "Proxy #%d %s looks banned (%s on %s): ending its lease",
                held.lease.proxy_id,
                held.lease.label,
                why,
                request,
            )
        self.stats.inc_value("proxy/bans")
        retries = request.meta.get("proxy_ban_retries", 0)
        limit = request.meta.get("max_proxy_ban_retries", self.config.max_ban_retries)
        if retries >= limit:
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
        retry.meta[META_AVOID] = [*request.meta.get(META_AVOID, ()), held.lease.proxy_id]
        retry.meta.pop("_auth_proxy", None)
        retry.headers.pop(b"Proxy-Authorization", None)
        self.stats.inc_value("proxy/ban_retries")
        logger.debug("Retrying %s through another proxy (retry %d)", request, retries + 1)
        return retry

    # --- ending leases --------------------------------------------------------------
    def _maybe_release(self, held: _Held) -> None:
        if held.inflight > 0 or held.releasing:
            return
        if held.lost:
            self._leases.pop(held.lease.lease_id, None)
            self._wake()
            return
        if not held.draining or self._closed:
            return
        held.releasing = True
        reason, counts = held.draining, held.counts.take()
        d = self._call(self.proxies.release, held.lease, reason, counts, self.policy)
        self._pending.add(d)
        d.addCallback(lambda ok: self._count_release(held, reason, ok))
        d.addErrback(self._hub_failed, f"releasing proxy #{held.lease.proxy_id}")
        d.addBoth(lambda _: self._after_release(held, d))

    def _after_release(self, held: _Held, d: Deferred[Any]) -> None:
        self._pending.discard(d)
        self._leases.pop(held.lease.lease_id, None)
        self._wake()

    def _count_release(self, held: _Held, reason: str, ok: bool) -> None:
        if not ok:
            self.stats.inc_value("proxy/leases_lost")
            logger.warning(
                "Lease %d on proxy %s had already expired when released",
                held.lease.lease_id,
                held.lease.label,
            )
            return
        self.stats.inc_value(f"proxy/leases_released/{reason}")
        logger.info(
            "Released proxy #%d %s (%s after %d request(s))",
            held.lease.proxy_id,
            held.lease.label,
            reason,
            held.assigned,
        )

    # --- heartbeat ------------------------------------------------------------------
    def _beat(self) -> Deferred[Any] | None:
        if self._beating or self._closed:
            return None
        batch = [
            (held, held.counts.take())
            for held in self._leases.values()
            if not (held.releasing or held.lost)
        ]
        if not batch:
            return None
        self._beating = True
        started = monotonic()
        d = self._call(self._renew_all, [(h.lease, c) for h, c in batch])
        d.addCallbacks(self._renewed, self._renew_failed, (batch, started), None, (batch,))
        d.addBoth(self._beat_done)
        return None

    def _renew_all(self, items: list[tuple[Lease, UsageCounts]]) -> list[bool]:
        return [self.proxies.renew(lease, self.config.lease_ttl, counts) for lease, counts in items]

    def _renewed(self, results: list[bool], batch: list[Any], started: float) -> None:
        self.stats.inc_value("proxy/heartbeats")
        for (held, _), ok in zip(batch, results, strict=True):
            if ok:
                held.deadline = started + self.config.lease_ttl
                continue
            held.lost = True
            self.stats.inc_value("proxy/leases_lost")
            logger.warning(
                "Lost the lease on proxy #%d %s: it expired (PROXY_LEASE_TTL=%g s) and "
                "was taken over; no more requests go through it",
                held.lease.proxy_id,
                held.lease.label,
                self.config.lease_ttl,
            )
            self._maybe_release(held)

    def _renew_failed(self, failure: Any, batch: list[Any]) -> None:
        for held, counts in batch:
            held.counts.add(counts)
        self._hub_failed(failure, "renewing proxy leases")

    def _beat_done(self, _: Any) -> None:
        self._beating = False
