"""Keeps Scrapy's answer to "is this callback a generator with a ``return value``?".

Scrapy reads and parses the source of a generator callback to warn of a ``return
value`` in it, and caches the answer keyed weakly by the bound method: the entry goes
when the bound method it was stored under goes (its request done), so a crawl parsed
the same source again and again, at random: up to 1,700 times in 3,000 pages, ~0.4 ms
each (the history of docs/benchmarks.md). This extension holds one bound method of each of the
spider's generator methods for the whole crawl, so the first answer stays cached.
"""

from __future__ import annotations

import inspect

from scrapy import signals
from scrapy.utils.misc import is_generator_with_return_value


class CallbackCacheExtension:
    def __init__(self, crawler) -> None:
        self.pinned: list = []
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler) -> CallbackCacheExtension:
        return cls(crawler)

    def spider_opened(self, spider) -> None:
        for name, _ in inspect.getmembers(type(spider), inspect.isgeneratorfunction):
            bound = getattr(spider, name)
            try:
                is_generator_with_return_value(bound)
            except (OSError, TypeError, SyntaxError):
                continue  # no source to read: Scrapy says so at the callback, as before
            self.pinned.append(bound)
