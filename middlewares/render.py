"""Sends the requests that need JavaScript to a browser (scrapy-playwright); the rest
stay on Scrapy's downloader.

A request is rendered when its meta says so (``meta["render"]``: true, or a wait
spec), when its URL matches ``RENDER_URL_PATTERNS``, or when the spider has a true
``render`` attribute (``-a render=1``). ``addons/render.py`` installs this middleware
and scrapy-playwright's download handlers only when rendering is on.

For each rendered request this middleware sets scrapy-playwright's meta keys: the page
methods that wait (``Wait``) and then capture the main document's raw answer (status,
headers, body as the server sent them) into ``meta["render_source"]``, and the browser
context: one shared context, or with a proxy lease one context per lease, created with
the lease's proxy and closed once the lease is rotated or banned. ``render_source`` is
the storage's meta key for an answer captured by another downloader
(middlewares/archive.py): the archive stores the raw answer as the ``response`` record
and the rendered DOM (the body the spider parses) as a ``conversion`` record, which
the catalog row points at.

Request meta keys: ``render`` (bool or wait spec), ``render_wait`` (wait spec),
``render_page_methods`` (scrapy-playwright ``PageMethod``s run after the wait, e.g. a
click; the DOM is taken after them).
Stats: ``render/requests``, ``render/responses``, ``render/errors/<type>``,
``render/contexts_closed``.
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro

from crawler.render import RenderConfig, RenderConfigError, Wait, flag
from crawler.signals import send_action

if TYPE_CHECKING:
    from crawler.hub.leases import LeaseView

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = "render"
# The meta key that marks an attempt this middleware sent to the browser (popped once).
_META_CONTEXT = "_render_context"


class RenderMiddleware:
    def __init__(self, crawler):
        try:
            self.config = RenderConfig.from_settings(crawler.settings, crawler.spider)
        except RenderConfigError as exc:
            raise NotConfigured(str(exc)) from exc
        if not self.config.enabled:
            raise NotConfigured(
                "rendering is off (RENDER_ENABLED, RENDER_URL_PATTERNS, -a render=1)"
            )
        self.crawler = crawler
        self.stats = crawler.stats
        self.render_all = flag(getattr(crawler.spider, "render", False))
        self.inflight: Counter[str] = Counter()
        self.lease_contexts: dict[str, LeaseView] = {}
        # Browser contexts of leases, as their pages report them, so that one can be
        # closed when its lease ends (scrapy-playwright has no public lookup by name).
        self.browser_contexts: dict[str, object] = {}
        self._proxy_mw = None

    @classmethod
    def from_crawler(cls, crawler) -> RenderMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        return mw

    def spider_opened(self) -> None:
        from middlewares.proxy_lease import ProxyLeaseMiddleware

        self._proxy_mw = self.crawler.get_downloader_middleware(ProxyLeaseMiddleware)
        how = "every request" if self.render_all else "chosen requests"
        logger.info("Rendering %s with Chromium (%s)", how, self._browser_name())

    def _browser_name(self) -> str:
        launch = self.crawler.settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
        return launch.get("executable_path") or "Playwright's own"

    # -- choosing --------------------------------------------------------------------

    def wait_for(self, request: Request) -> Wait | None:
        """How to render ``request``, or None to leave it to Scrapy's downloader."""
        meta = request.meta
        if meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt"):
            return None
        if urlsplit(request.url).scheme not in ("http", "https"):
            return None
        chosen, spec = _meta_choice(meta.get("render"))
        if chosen is False:
            return None
        pattern_wait = self.config.wait_for(request.url)
        if not (chosen or pattern_wait or self.render_all):
            return None
        spec = meta.get("render_wait", spec)
        if spec is not None:
            return Wait.parse(spec)
        return pattern_wait or self.config.wait

    # -- downloader middleware -------------------------------------------------------

    def process_request(self, request: Request) -> None:
        meta = request.meta
        self._done(request)  # a retried copy still carries its previous attempt
        try:
            wait = self.wait_for(request)
        except RenderConfigError as exc:
            logger.error("%s: %s; fetching it without a browser", request, exc)
            self.stats.inc_value("render/bad_wait")
            wait = None
        if wait is None:
            return None  # Scrapy's downloader (or the spider's own playwright=True)
        capture = MainDocumentCapture()
        meta.pop("render_source", None)
        meta["playwright"] = True
        meta["playwright_page_event_handlers"] = {
            "response": capture.on_response,
            "crash": partial(self._on_crash, request),
        }
        name, kwargs = self._context(request)
        meta["playwright_page_methods"] = [
            _page_method(self._remember_context, name),
            _page_method(capture.wait, wait, self.config.timeout_ms),
            *meta.get("render_page_methods", ()),
            _page_method(capture.finish, meta),
        ]
        meta["playwright_context"] = name
        meta["playwright_context_kwargs"] = kwargs
        meta[_META_CONTEXT] = name
        self.inflight[name] += 1
        self.stats.inc_value("render/requests")
        logger.debug("Rendering %s in context %s", request, name)
        self._sweep()
        return None

    def process_response(self, request: Request, response: Response) -> Response:
        if self._done(request) and "playwright" in response.flags:
            self.stats.inc_value("render/responses")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        name = self._done(request)
        if name is not None:
            kind = type(exception).__name__
            self.stats.inc_value(f"render/errors/{kind}")
            logger.warning(
                "Rendering %s failed in context %s: %s: %s",
                request,
                name,
                kind,
                str(exception).splitlines()[0] if str(exception) else "",
            )
        return None

    def _done(self, request: Request) -> str | None:
        """End this attempt's hold on its context (once); closes contexts no longer used."""
        name = request.meta.pop(_META_CONTEXT, None)
        if name is not None:
            self.inflight[name] -= 1
            self._sweep()
        return name

    async def _on_crash(self, request: Request, page) -> None:
        """A crashed page is closed, so that whatever waits on it fails now and
        scrapy-playwright renders the request again in a new page (RetryMiddleware
        retries it if that fails too) instead of waiting for a timeout, or for ever."""
        self.stats.inc_value("render/page_crashes")
        logger.warning("Browser page crashed while rendering %s: closing it, retrying", request)
        send_action(self.crawler, request, "retry", error="browser page crashed")
        try:
            await page.close()
        except Exception as exc:  # already closed
            logger.debug("Closing a crashed page: %s", exc)

    # -- contexts and proxy leases -------------------------------------------------------

    def _context(self, request: Request) -> tuple[str, dict]:
        meta = request.meta
        proxy = meta.get("proxy")
        if not proxy:
            return DEFAULT_CONTEXT, {}
        # The browser carries the proxy; Scrapy's HttpProxyMiddleware must not also add
        # a Proxy-Authorization header (the browser would send it on to the site).
        meta["render_proxy"] = meta.pop("proxy")
        request.headers.pop(b"Proxy-Authorization", None)
        lease = self._proxy_mw.lease_for(request) if self._proxy_mw is not None else None
        if lease is None:
            return f"proxy-{urlsplit(proxy).netloc}", {"proxy": browser_proxy(proxy)}
        name = f"lease-{lease.lease_id}"
        self.lease_contexts[name] = lease
        return name, {"proxy": browser_proxy(proxy)}

    def _sweep(self) -> None:
        """Close the contexts of leases that were rotated, banned or lost, once idle."""
        for name, lease in list(self.lease_contexts.items()):
            if not lease.alive and self.inflight[name] <= 0:
                del self.lease_contexts[name]
                del self.inflight[name]
                deferred_from_coro(self._close_context(name))

    def _remember_context(self, page, name: str) -> None:
        if name in self.lease_contexts:
            self.browser_contexts[name] = page.context

    async def _close_context(self, name: str) -> None:
        context = self.browser_contexts.pop(name, None)
        if context is None:
            return
        try:
            # scrapy-playwright forgets a context when it closes.
            await context.close()
        except Exception as exc:  # the browser may be gone already
            logger.debug("Closing browser context %s: %s", name, exc)
            return
        self.stats.inc_value("render/contexts_closed")
        logger.info("Closed browser context %s: its proxy lease ended", name)


def _meta_choice(value) -> tuple[bool | None, str | dict | None]:
    """``meta["render"]`` as (render it?, wait spec): None leaves it to the settings."""
    if value is None:
        return None, None
    if isinstance(value, bool | int):
        return bool(value), None
    if isinstance(value, str) and value.strip().lower() in _FLAGS:
        return flag(value), None
    return True, value


_FLAGS = {"0", "1", "true", "false", "yes", "no", "on", "off"}


def browser_proxy(url: str) -> dict:
    """Playwright's ``proxy`` option for a proxy URL (credentials apart)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    out = {"server": f"{parts.scheme}://{parts.hostname}:{parts.port or 80}"}
    if parts.username:
        out["username"] = unquote(parts.username)
        out["password"] = unquote(parts.password or "")
    return out


def _page_method(method, *args, **kwargs):
    from scrapy_playwright.page import PageMethod

    return PageMethod(method, *args, **kwargs)


class MainDocumentCapture:
    """Keeps the main frame's last navigation response; after the wait, copies what
    the server sent (status, headers, body, and the browser's request headers) into
    ``meta["render_source"]`` (None when the page had no such response)."""

    def __init__(self) -> None:
        self.response = None

    def on_response(self, response) -> None:
        if response.request.is_navigation_request() and response.frame.parent_frame is None:
            self.response = response

    async def wait(self, page, wait: Wait, timeout_ms: int) -> None:
        """The wait condition; none on an error page (a 403 from a proxy, a 404), which
        would never meet it: it is handed over as it is, at once."""
        if self.response is not None and self.response.status >= 400:
            return
        if wait.selector:
            await page.wait_for_selector(wait.selector, state="attached", timeout=timeout_ms)
        if wait.network_idle:
            from playwright.async_api import TimeoutError as PlaywrightTimeoutError

            try:
                await page.wait_for_load_state("networkidle", timeout=timeout_ms)
            except PlaywrightTimeoutError:
                # A page that polls or streams never goes quiet: what it shows now.
                logger.info("%s: the network never went idle; its DOM as it is", page.url)
        if wait.timeout_ms:
            await page.wait_for_timeout(wait.timeout_ms)

    async def finish(self, page, meta: dict) -> None:
        response = self.response
        if response is None:
            meta["render_source"] = None
            return
        meta["render_source"] = {
            "url": response.url,
            "status": response.status,
            "headers": [(h["name"], h["value"]) for h in await response.headers_array()],
            "body": await response.body(),
            "request_headers": [
                (h["name"], h["value"]) for h in await response.request.headers_array()
            ],
        }
