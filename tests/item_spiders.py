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


# Items whose tables would be the catalog's own (``ShapesSpider``, shape "reserved").
@dataclass
class Artifacts:
    url: str


@dataclass
class Totals:
    url: str


@dataclass
class SqliteMaster:
    url: str


@dataclass
class CatalogTableArtifacts:
    catalog_table = "artifacts"
    url: str


@dataclass
class PageLogItem:
    catalog_table = "_page_log"
    url: str


@dataclass
class SequenceItem:
    catalog_table = "sqlite_sequence"
    url: str


@dataclass
class KeyIndexItem:
    """Named like the index of ByUrl's natural key (tables and indexes share names)."""

    catalog_table = "pages_by_url_by_key"
    url: str


MIXED = (1, None, "text", 2.5, b"\x00\xff")
RESERVED_ITEMS = (
    KeyIndexItem,
    Artifacts,
    Totals,
    SqliteMaster,
    CatalogTableArtifacts,
    PageLogItem,
    SequenceItem,
)


class ShapesSpider(scrapy.Spider):
    """Items of awkward shapes, one set per ``-a shape=``, and a PageItem per page:

    - ``reserved``: one item of each class in RESERVED_ITEMS;
    - ``case``: a dict with fields ``title`` and ``Title``;
    - ``floats``: dicts holding NaN, Infinity and bytes, bare and in lists;
    - ``mixed``: a dict whose ``value`` is of another type on each page (MIXED).
    """

    name = "shapes"

    def __init__(self, urls: str, shape: str = "reserved", **kwargs):
        super().__init__(**kwargs)
        self.url_list = UrlList(urls)
        self.shape = shape

    async def start(self):
        for _number, url, problem in self.url_list:
            if not problem:
                yield scrapy.Request(url)

    def parse(self, response):
        title = response.css("title::text").get()
        yield PageItem(url=response.url, title=title, words=len(response.text.split()))
        yield from getattr(self, f"shape_{self.shape}")(response.url, title)

    def shape_reserved(self, url, title):
        yield ByUrl(url=url, size=1)
        for cls in RESERVED_ITEMS:
            yield cls(url)
        yield {"url": url, "ok": 1}

    def shape_case(self, url, title):
        yield {"url": url, "title": title, "Title": title.upper()}

    def shape_plain(self, url, title):
        yield {"url": url, "title": title}

    def shape_mixed(self, url, title):
        number = int(url.rsplit("/", 1)[1].split(".")[0])
        yield {"url": url, "value": MIXED[number % len(MIXED)]}

    def shape_floats(self, url, title):
        yield {"url": url, "nan": float("nan"), "inf": float("inf"), "blob": url.encode()}
        yield {"url": url, "nan": [float("nan")], "inf": [float("-inf")], "blob": None}


class ArtifactsSpider(ShapesSpider):
    """A spider whose plain dicts would go to the catalog's table ``artifacts``."""

    name = "artifacts"

    def shape_reserved(self, url, title):
        yield {"url": url, "title": title}
