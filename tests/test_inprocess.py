"""In-process crawls (pytest-twisted, asyncio reactor): what callbacks see."""

from __future__ import annotations

import scrapy
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from extensions.storage import CACHED_FLAG
from tests.conftest import project_settings
from tests.crawls import WatchesScheduler


class Recorder(scrapy.Spider):
    name = "recorder"

    def __init__(self, urls, replay=False, **kwargs):
        super().__init__(**kwargs)
        self.urls = urls
        self.replay = replay
        self.seen = {}

    async def start(self):
        for url in self.urls:
            yield scrapy.Request(url, meta={"catalog_replay": self.replay})

    def parse(self, response):
        self.seen[response.url] = (type(response), response.body, response.flags, response.text)


# Scrapy's own tests wrap coroutines so: they await asyncio futures, which a plain
# Deferred-driven coroutine (pytest_twisted.ensureDeferred) cannot.
@deferred_f_from_coro_f
async def test_a_replayed_page_is_the_response_the_crawl_saw(site, data_dir):
    urls = [f"{site.base_url}/latin1/31", f"{site.base_url}/gzip/32"]
    first = get_crawler(Recorder, project_settings(data_dir))
    await first.crawl_async(urls=urls)
    live = first.spider.seen
    assert set(live) == set(urls)
    assert first.stats.get_value("archive/stored") == 2

    site.reset_counts()
    second = get_crawler(Recorder, project_settings(data_dir))
    await second.crawl_async(urls=urls, replay=True)
    replayed = second.spider.seen
    assert site.counts["/latin1/31"] == 0 and site.counts["/gzip/32"] == 0
    for url in urls:
        cls, body, flags, text = replayed[url]
        assert CACHED_FLAG in flags
        assert (cls, body, text) == live[url][:2] + (live[url][3],)
        assert cls is HtmlResponse
    assert "café" in replayed[urls[0]][3]
    assert second.stats.get_value("archive/replayed") == 2
    assert second.stats.get_value("catalog/cache_hits") == 2


class SchedulerWatch(WatchesScheduler, Recorder):
    """Notes the most requests the scheduler held at once."""


@deferred_f_from_coro_f
async def test_a_long_list_is_fed_to_the_scheduler_as_it_drains_not_all_at_once(site, data_dir):
    urls = [f"{site.base_url}/page/{n % 400}.html?v={n}" for n in range(1000)]
    settings = dict(project_settings(data_dir), CONCURRENT_REQUESTS=4)
    crawler = get_crawler(SchedulerWatch, settings)
    await crawler.crawl_async(urls=urls)
    assert len(crawler.spider.seen) == len(urls)  # nothing lost by waiting
    assert crawler.stats.get_value("archive/stored") == len(urls)
    # Scrapy alone would have held most of the list (memory that grows with it).
    assert crawler.spider.most_scheduled <= 8
