"""AutoThrottle during revalidation: 304s let the delay fall as 200s do."""

from __future__ import annotations

from collections import Counter

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import actions
from tests.crawls import crawl_site

THROTTLED = {"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_START_DELAY": 1.0}


@deferred_f_from_coro_f
async def test_revalidation_answered_304_lowers_the_throttle_delay(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(140, 150)]
    await crawl_site(urls, data_dir)
    crawler = await crawl_site(urls, data_dir, THROTTLED, revalidate="1")
    outcomes = Counter(e["outcome"] for e in actions(data_dir) if e["url"] in urls)
    assert outcomes == {"ok": len(urls), "not_modified": len(urls)}
    slots = crawler.engine.downloader.slots
    delays = {key: slot.delay for key, slot in slots.items()}
    assert set(delays) == {"127.0.0.1"}
    # Ten local 304s halve the start delay ten times over; robots.txt's 200 alone
    # (all the stock AutoThrottle heeds here) halves it once.
    assert delays["127.0.0.1"] < 0.1, delays
