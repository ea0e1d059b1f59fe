"""A spider that follows every link of its start pages to depth 2 and stores nothing.

    scrapy runspider benchmarks/bare_follow.py -a urls=FILE [-a depth=2]

The depth crawl a user would write with Scrapy alone: ``response.css`` for the links,
``response.follow`` for the requests, Scrapy's duplicate filter; links are followed
from pages above the depth only, as ``scrapy crawl site -a depth=N`` does.
"""

import scrapy


class BareFollowSpider(scrapy.Spider):
    name = "bare_follow"

    def __init__(self, urls: str, depth: str = "2", **kwargs):
        super().__init__(**kwargs)
        self.urls = urls
        self.depth = int(depth)

    async def start(self):
        with open(self.urls) as f:
            for line in f:
                yield scrapy.Request(line.strip(), callback=self.parse)

    def parse(self, response):
        if response.meta.get("depth", 0) >= self.depth:
            return
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
