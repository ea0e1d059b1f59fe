"""Turns rendering on: scrapy-playwright's handlers, the render middleware, a browser.

Listed in ``ADDONS`` (crawler/settings.py). It does nothing unless rendering is asked
for (``RENDER_ENABLED``, ``RENDER_URL_PATTERNS`` or a spider with a true ``render``
attribute, as ``-a render=1`` gives the site spider), so a crawl that renders nothing
starts no browser, no Playwright driver and no extra middleware. When rendering is
asked for and no Chromium is found, the crawl stops before it starts with a message
naming the ways to get one.
"""

from __future__ import annotations

import importlib.util
import logging

from scrapy.exceptions import UsageError

from crawler.render import (
    BrowserNotFoundError,
    RenderConfig,
    RenderConfigError,
    ResourceBlocker,
    find_browser,
)
from crawler.storage import formats

logger = logging.getLogger(__name__)

HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
MIDDLEWARE = "middlewares.render.RenderMiddleware"
# After ProxyLeaseMiddleware (740), which leases the proxy a context is bound to, and
# before HttpProxyMiddleware (750), which must not see the proxy of a rendered request.
MIDDLEWARE_ORDER = 745
# Chromium's shared memory is /dev/shm, often 64 MB in containers: too small.
CHROMIUM_ARGS = ["--disable-dev-shm-usage"]


class RenderAddon:
    def __init__(self, crawler=None):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler) -> RenderAddon:
        return cls(crawler)

    def update_settings(self, settings) -> None:
        spider = getattr(self.crawler, "spider", None)
        try:
            config = RenderConfig.from_settings(settings, spider)
        except RenderConfigError as exc:
            raise UsageError(str(exc)) from None
        if not config.enabled:
            return
        fmt = formats.FORMATS.get((settings.get("ARCHIVE_FORMAT") or formats.DEFAULT).lower())
        if fmt is not None and not fmt.keeps_rendered:
            # (An unknown format is the storage's to refuse.)
            keeping = " or ".join(f.name for f in formats.FORMATS.values() if f.keeps_rendered)
            raise UsageError(
                f"rendering needs ARCHIVE_FORMAT={keeping} ({fmt.name} archives keep one body)"
            )
        if importlib.util.find_spec("scrapy_playwright") is None:
            raise UsageError(
                "Rendering needs scrapy-playwright: pip install scrapy-playwright "
                "(no `playwright install` needed with Debian's chromium)"
            )
        try:
            executable = find_browser(config.chromium_path)
        except BrowserNotFoundError as exc:
            raise UsageError(str(exc)) from None
        apply(settings, config, executable)


def apply(settings, config: RenderConfig, executable: str | None) -> None:
    """scrapy-playwright's settings for ``config`` (values set on the command line win)."""
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    handlers.update(http=HANDLER, https=HANDLER)
    # Over the project's own HTTP handler (crawler/settings.py), under a spider's or a
    # command line's.
    settings.set("DOWNLOAD_HANDLERS", handlers, "project")
    launch = {"headless": not config.headed, "args": list(CHROMIUM_ARGS)}
    if executable:
        launch["executable_path"] = executable
    launch.update(settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS"))
    settings.set("PLAYWRIGHT_LAUNCH_OPTIONS", launch, "addon")
    settings.set("PLAYWRIGHT_BROWSER_TYPE", "chromium", "addon")
    settings.set("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT", config.max_pages, "addon")
    settings.set("PLAYWRIGHT_MAX_CONTEXTS", config.max_contexts, "addon")
    settings.set("PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT", config.timeout_ms, "addon")
    if config.blocked:
        settings.set("PLAYWRIGHT_ABORT_REQUEST", ResourceBlocker(config.blocked), "addon")
    # A page or browser crash fails that request; RetryMiddleware tries it again.
    retry = settings.getlist("RETRY_EXCEPTIONS")
    if "playwright.async_api.Error" not in retry:
        settings.set(
            "RETRY_EXCEPTIONS",
            [*retry, "playwright.async_api.Error"],
            settings.getpriority("RETRY_EXCEPTIONS"),
        )
    settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", MIDDLEWARE, MIDDLEWARE_ORDER)
    # MemoryUsage, counting the browser's processes too (memusage/max, MEMUSAGE_*_MB).
    settings.set_in_component_priority_dict(
        "EXTENSIONS", "scrapy.extensions.memusage.MemoryUsage", None
    )
    settings.set_in_component_priority_dict(
        "EXTENSIONS", "extensions.tree_memory.TreeMemoryUsage", 0
    )
    logger.info(
        "Rendering on: Chromium %s (%s), %d page(s) per context, at most %d contexts",
        executable or "(Playwright's own)",
        "headed" if config.headed else "headless",
        config.max_pages,
        config.max_contexts,
    )
