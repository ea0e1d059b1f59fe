"""One headless Chromium for a test module's pages (the report, the documentation site).

Playwright's sync API refuses a thread whose asyncio loop runs (pytest-twisted's), and
wants every call from the thread that started it: the browser gets one thread of its
own, and each call runs a function there with a fresh browser context.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from crawler.render import BrowserNotFoundError, find_browser
from tests.servers import need

T = TypeVar("T")


def chromium_path() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        need("Playwright is not installed (pip install scrapy-playwright)")
    try:
        return find_browser(os.environ.get("CHROMIUM_PATH"))
    except BrowserNotFoundError:
        need("Chromium is not installed (Debian: apt-get install chromium)")


class Chromium:
    """Started on first use; ``close()`` it when the module is done."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(1)
        self.playwright = self.browser = None

    def run(self, fn: Callable[..., T], *args, width: int = 1280, height: int = 900) -> T:
        """``fn(context, *args)`` in the browser's thread, in a context of its own with a
        window *width* x *height* px."""
        return self.pool.submit(self._run, fn, args, width, height).result(timeout=300)

    def _run(self, fn, args, width: int, height: int):
        if self.browser is None:
            from playwright.sync_api import sync_playwright

            executable = chromium_path()
            self.playwright = sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=executable, args=["--no-sandbox"], headless=True
            )
        context = self.browser.new_context(viewport={"width": width, "height": height})
        try:
            return fn(context, *args)
        finally:
            context.close()

    def close(self) -> None:
        def stop():
            if self.browser is not None:
                self.browser.close()
                self.playwright.stop()

        self.pool.submit(stop).result(timeout=120)
        self.pool.shutdown()
