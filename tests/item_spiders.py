"""Spiders that yield items of every kind, for the item table tests.

Crawls started as subprocesses find them with ``-s SPIDER_MODULES=spiders,tests.item_spiders``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import scrapy

from crawler.spiderkit.urls import UrlList


class PageItem(scrapy.Item):
    url = scrapy.Field()
    title = scrapy.Field()
    words = scrapy.Field(sqlite_type="INTEGER")


@dataclass
class LinkOut:
    """One link of a page; several per page."""

    url: str
    target: str
    position: int
    anchors: list[str] = field(default_factory=list)


class ByUrl(scrapy.Item):
    """Named table and natural key."""

    catalog_table = "pages_by_url"
    catalog_key = ("url",)
    url = scrapy.Field()
    size = scrapy.Field()


class ItemsSpider(scrapy.Spider):
    """One PageItem, one dict with nested values and a LinkOut per link, per page.

    ``-a variant=extra``: the dict gains a field; ``-a variant=v2``: that, and no links. ``-a bad=SUBSTRING``: on pages whose
    URL contains it, the dict holds a value no column can store.
    """

    name = "items"

    def __init__(self, urls: str, variant: str = "", bad: str = "", fail: str = "", **kwargs):
        super().__init__(**kwargs)
        self.url_list = UrlList(urls)
        self.variant = variant or os.environ.get("ITEMS_VARIANT", "")
        self.bad = bad
        self.fail = fail  # on pages whose URL contains it, raise after the first item

    async def start(self):
        for _number, url, problem in self.url_list:
            if not problem:
                yield scrapy.Request(url)

    def parse(self, response):
        title = response.css("title::text").get()
        yield PageItem(url=response.url, title=title, words=len(response.text.split()))
        if self.fail and self.fail in response.url:
            raise ValueError("the parser broke")
        record = {"url": response.url, "meta": {"status": response.status, "tags": ["a", "b"]}}
        if self.variant in ("extra", "v2"):
            record["length"] = len(response.body)
        if self.bad and self.bad in response.url:
            record["meta"] = object()
        yield record
        if self.variant == "v2":
            return
        for position, href in enumerate(response.css("a::attr(href)").getall()):
            yield LinkOut(response.url, response.urljoin(href), position, [href])
        yield ByUrl(url=response.url, size=len(response.body))
