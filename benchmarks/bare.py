"""A spider that fetches a URL list and does nothing with the pages.

    scrapy runspider benchmarks/bare.py -a urls=FILE

Run from the project root it gets the project's settings, storage included (turn it
off with ``-s ARCHIVE_ENABLED=0``); run from elsewhere it gets Scrapy's defaults.
"""

import scrapy


class BareSpider(scrapy.Spider):
    name = "bare"

    def __init__(self, urls: str, **kwargs):
        super().__init__(**kwargs)
        self.urls = urls

    async def start(self):
        with open(self.urls) as f:
            for line in f:
                yield scrapy.Request(line.strip(), callback=self.parse)

    def parse(self, response):
        return None
