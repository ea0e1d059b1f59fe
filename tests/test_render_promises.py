"""Rendering promises: error pages are handed over at once, RENDER_TIMEOUT bounds
navigations and waits, and every page is closed after its request, success or failure.

Each crawl allows one browser page at a time (RENDER_MAX_PAGES=1): a page left open
would leave the next request waiting for ever, so the crawl finishing is itself
evidence, and scrapy-playwright's counts of pages opened and closed must agree.
"""

from __future__ import annotations

import importlib.util
import os

from scrapy.statscollectors import StatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.render import BrowserNotFoundError, find_browser
from tests.checks import actions, rows_by_url
from tests.crawls import crawl_site
from tests.servers import need

ONE_PAGE = {"RENDER_MAX_PAGES": 1, "CONCURRENT_REQUESTS": 1}


def need_chromium() -> None:
    if importlib.util.find_spec("scrapy_playwright") is None:
        need("scrapy-playwright is not installed (pip install scrapy-playwright)")
    try:
        find_browser(os.environ.get("CHROMIUM_PATH"))
    except BrowserNotFoundError:
        need("Chromium is not installed (Debian: apt-get install chromium)")


async def render_crawl(urls: list[str], data_dir, settings: dict) -> StatsCollector:
    """A crawl rendering every request, one browser page at a time; its stats."""
    crawler = await crawl_site(urls, data_dir, {**ONE_PAGE, **settings}, render="1")
    return crawler.stats


@deferred_f_from_coro_f
async def test_error_pages_are_handed_over_at_once(site, data_dir):
    need_chromium()
    base = site.base_url
    urls = [f"{base}/js/190", f"{base}/missing/191", f"{base}/gone/192", f"{base}/js/193"]
    # The JS pages meet the wait; an error page never would, and waiting for it would
    # end in RENDER_TIMEOUT's error, with no row.
    stats = await render_crawl(
        urls, data_dir, {"RENDER_WAIT": "selector=[data-ready]", "RENDER_TIMEOUT": 20}
    )
    rows = rows_by_url(data_dir)
    assert {u: (r.status, r.rendered) for u, r in rows.items()} == {
        urls[0]: (200, 1),
        urls[1]: (404, 1),
        urls[2]: (410, 1),
        urls[3]: (200, 1),
    }
    assert not [k for k in stats.get_stats() if k.startswith("render/errors/")]
    assert stats.get_value("playwright/page_count") == len(urls)
    assert stats.get_value("playwright/page_count/closed") == len(urls)


@deferred_f_from_coro_f
async def test_render_timeout_bounds_navigations_and_waits(site, data_dir):
    need_chromium()
    base = site.base_url
    never_ready = f"{base}/js/194?delay=3600000"  # its selector never appears
    never_loads = f"{base}/hold/page/195.html"  # its server never answers
    urls = [never_ready, never_loads, f"{base}/js/196?delay=3600000"]
    site.hold()
    try:
        stats = await render_crawl(
            urls,
            data_dir,
            {"RENDER_WAIT": "selector=[data-ready]", "RENDER_TIMEOUT": 2, "RETRY_ENABLED": False},
        )
    finally:
        site.release()
    assert rows_by_url(data_dir) == {}
    errors = {e["url"]: e["error"] for e in actions(data_dir) if e["outcome"] == "error"}
    assert set(errors) == set(urls)
    assert all("Timeout 2000ms exceeded" in error for error in errors.values()), errors
    # A failed request's page is closed too: each of the three got the one page in turn.
    assert stats.get_value("playwright/page_count") == len(urls)
    assert stats.get_value("playwright/page_count/closed") == len(urls)
