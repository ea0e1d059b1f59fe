"""Whether what came back through a proxy says the proxy is banned, down or failing.

An answer is a ban when its status is one of ``PROXY_BAN_STATUSES`` or its body holds
one of ``PROXY_BAN_BODY_MARKERS`` (a spider may decide instead with
``response_is_ban(request, response)`` / ``exception_is_ban(request, exception)``,
None for the default). A timeout or a refused or dropped connection is the proxy's
fault, not the target's, when:

- the proxy is *down*: a fresh TCP connection to it fails too (``PROBE_TIMEOUT``);
- it is *failing*: it failed so ``PROXY_BAN_FAILED_HOSTS`` times in a row for hosts
  that answered through other routes (another proxy, or direct) in the last
  ``ROUTE_WINDOW`` seconds, or for that many different hosts in a row. A response
  through the proxy resets its count.

So a slow or refusing target never bans the proxy that went to it, and a proxy that
accepts connections but resets or stalls every request is banned on a one-host crawl.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.exceptions import (
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
)
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import error as txerror
from twisted.web.client import ResponseFailed, ResponseNeverReceived

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

# A live proxy on the network accepts a connection in milliseconds; one that has not
# within this many seconds is down (or unreachable) for the request that failed on it.
PROBE_TIMEOUT = 5.0
# A host that answered through another route this recently is up: a failure on it is
# the proxy's.
ROUTE_WINDOW = 60.0
# Hosts remembered as answering, at most (the oldest go first).
ROUTES_KEPT = 4096

# Errors that say "this proxy refuses or drops us": connection refused or reset, timeouts.
# Built on first use: importing Scrapy's HTTP/1.1 handler here, deep in the loading of
# the settings' middlewares, costs ~0.07 s (its deprecated-class shims call
# inspect.stack()), also in crawls without proxies; the download handler imports it
# anyway, at a shallower depth.
_BAN_EXCEPTIONS: tuple[type[BaseException], ...] | None = None


def ban_exceptions() -> tuple[type[BaseException], ...]:
    global _BAN_EXCEPTIONS
    if _BAN_EXCEPTIONS is None:
        from scrapy.core.downloader.handlers.http11 import TunnelError

        _BAN_EXCEPTIONS = (
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
            # Scrapy's HTTP/1.1 handler raises these in place of Twisted's errors above.
            DownloadTimeoutError,
            DownloadConnectionRefusedError,
            DownloadFailedError,
        )
    return _BAN_EXCEPTIONS


@dataclass(frozen=True)
class BanRules:
    """The PROXY_BAN_* settings."""

    statuses: tuple[int, ...] = (403, 407, 429)
    body_markers: tuple[str, ...] = ()
    failed_hosts: int = 2


@dataclass
class _Failures:
    hosts: set[str] = field(default_factory=set)
    where_others_answer: int = 0


class ProxyBanJudge:
    """Ban verdicts on what came back through a proxy (see the module's docstring)."""

    def __init__(self, crawler: Crawler, rules: BanRules) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.rules = rules
        self._failures: dict[int, _Failures] = {}
        # Per host: when it last answered, and through which proxy (None: direct).
        self._answered: dict[str, tuple[float, int | None]] = {}

    def answered(self, request: Request, response: Response, proxy_id: int | None) -> bool:
        """*response* came through *proxy_id* (None: direct): whether it is a ban."""
        if proxy_id is not None:
            self._failures.pop(proxy_id, None)  # it answered: its failures were the hosts'
        self._route_answered(urlparse_cached(request).hostname or "", proxy_id)
        verdict = self._spider_verdict("response_is_ban", request, response)
        if verdict is not None:
            return verdict
        if response.status in self.rules.statuses:
            return True
        markers = self.rules.body_markers
        return bool(markers) and any(m.encode() in response.body for m in markers)

    async def failed(
        self, request: Request, exception: Exception, proxy_id: int, proxy_url: str
    ) -> str | None:
        """Why *exception* through the proxy bans it (it is down or failing), or None:
        the target's failure, or not a ban."""
        name = type(exception).__name__
        verdict = self._spider_verdict("exception_is_ban", request, exception)
        if verdict is not None:
            return f"looks banned: {name}" if verdict else None
        if not isinstance(exception, ban_exceptions()):
            return None
        if not await self._answers(proxy_url):
            self.stats.inc_value("proxy/down")
            return (
                f"is down: {name}, and a fresh connection to the proxy fails too "
                "(the proxy's failure, not the target's)"
            )
        return self._failing(request, name, proxy_id)

    def _failing(self, request: Request, name: str, proxy_id: int) -> str | None:
        host = urlparse_cached(request).hostname or ""
        failures = self._failures.setdefault(proxy_id, _Failures())
        failures.hosts.add(host)
        if self._answers_elsewhere(host, proxy_id):
            failures.where_others_answer += 1
        limit = self.rules.failed_hosts
        if failures.where_others_answer >= limit:
            del self._failures[proxy_id]
            return f"is failing: {name} {limit} times in a row where other routes get answers"
        if len(failures.hosts) >= limit:
            del self._failures[proxy_id]
            return f"is failing: {name} for {limit} different hosts in a row"
        self.stats.inc_value(f"proxy/target_failures/{name}")
        logger.debug(
            "%s on %s through proxy #%d, which answers: the target's failure, not a ban",
            name,
            request,
            proxy_id,
        )
        return None

    def _route_answered(self, host: str, proxy_id: int | None) -> None:
        if host in self._answered:
            del self._answered[host]  # to the end: the oldest go first
        elif len(self._answered) >= ROUTES_KEPT:
            del self._answered[next(iter(self._answered))]
        self._answered[host] = (monotonic(), proxy_id)

    def _answers_elsewhere(self, host: str, proxy_id: int) -> bool:
        seen = self._answered.get(host)
        return seen is not None and seen[1] != proxy_id and monotonic() - seen[0] <= ROUTE_WINDOW

    async def _answers(self, proxy_url: str) -> bool:
        """Whether the proxy accepts a TCP connection within PROBE_TIMEOUT seconds."""
        from twisted.internet import reactor
        from twisted.internet.endpoints import HostnameEndpoint, connectProtocol
        from twisted.internet.protocol import Protocol

        self.stats.inc_value("proxy/probes")
        parts = urlsplit(proxy_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        endpoint = HostnameEndpoint(reactor, parts.hostname or "", port, timeout=PROBE_TIMEOUT)
        try:
            protocol = await maybe_deferred_to_future(connectProtocol(endpoint, Protocol()))
        except Exception:  # refused, unreachable, timed out: all say "down"
            return False
        protocol.transport.loseConnection()
        return True

    def _spider_verdict(self, name: str, request: Request, what: Any) -> bool | None:
        method = getattr(self.crawler.spider, name, None)
        if not callable(method):
            return None
        verdict = method(request, what)
        return None if verdict is None else bool(verdict)
