"""Scrapy's cached answer about a generator callback outlives the requests."""

from __future__ import annotations

import gc

import scrapy
from scrapy.utils.misc import _generator_callbacks_cache
from scrapy.utils.test import get_crawler

from extensions.callback_cache import CallbackCacheExtension


class GeneratorSpider(scrapy.Spider):
    name = "generator"

    def parse(self, response):
        yield {"url": response.url}

    def parse_other(self, response):
        yield from ()

    def plain(self, response):
        return None


def _drop_cached_bound_methods(spider) -> None:
    # What a crawl does: each request holds its own bound method, gone when it is done.
    for name in ("parse", "parse_other"):
        _generator_callbacks_cache[getattr(spider, name)] = False
    gc.collect()


def test_the_answer_stays_cached_while_the_spider_is_open():
    crawler = get_crawler(GeneratorSpider)
    spider = GeneratorSpider.from_crawler(crawler)
    extension = CallbackCacheExtension.from_crawler(crawler)
    extension.spider_opened(spider)
    _drop_cached_bound_methods(spider)
    assert spider.parse in _generator_callbacks_cache
    assert spider.parse_other in _generator_callbacks_cache
    assert [m.__name__ for m in extension.pinned] == ["parse", "parse_other"]
    # Its pins are what keep the answers: released, they go with the requests.
    extension.pinned.clear()
    _drop_cached_bound_methods(spider)
    assert spider.parse not in _generator_callbacks_cache
