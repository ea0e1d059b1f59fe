"""A spider that fetches a URL list and does nothing with the pages.

    scrapy runspider benchmarks/bare.py -a urls=FILE

Run from the project root it gets the project's settings, storage included (turn it
off with ``-s ARCHIVE_ENABLED=0``); run from elsewhere it gets Scrapy's defaults.
The stat ``bench/crawl_cpu_seconds`` is the CPU time of the crawl's own process (not
of the writer process) from the opening of the spider to its closing.
"""

import resource

import scrapy
from scrapy import signals


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class BareSpider(scrapy.Spider):
    name = "bare"

    def __init__(self, urls: str, **kwargs):
        super().__init__(**kwargs)
        self.urls = urls
        self.cpu_at_open = 0.0

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.opened, signal=signals.spider_opened)
        return spider

    def opened(self, spider):
        self.cpu_at_open = _cpu_seconds()

    async def start(self):
        with open(self.urls) as f:
            for line in f:
                yield scrapy.Request(line.strip(), callback=self.parse)

    def parse(self, response):
        return None

    def closed(self, reason):
        crawl_cpu = _cpu_seconds() - self.cpu_at_open
        self.crawler.stats.set_value("bench/crawl_cpu_seconds", round(crawl_cpu, 3))
