"""The request meta keys a spider may set: ``catalog_revalidate`` and ``catalog_key``."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import actions, catalog_rows, rows_by_url
from tests.crawls import crawl as crawl_with


class PlanSpider(scrapy.Spider):
    name = "plan"

    def __init__(self, plan, revalidate=False, **kwargs):
        super().__init__(**kwargs)
        self.plan = plan
        self.revalidate = revalidate

    async def start(self):
        for url, meta in self.plan:
            yield scrapy.Request(url, meta=meta)

    def parse(self, response):
        yield {"url": response.url}


async def crawl(data_dir, plan: list, revalidate: bool = False):
    return await crawl_with(PlanSpider, data_dir, plan=plan, revalidate=revalidate)


def outcomes(data_dir, since: int) -> Counter:
    return Counter((e["url"].rsplit("/", 1)[1], e["outcome"]) for e in actions(data_dir)[since:])


@deferred_f_from_coro_f
async def test_catalog_revalidate_overrides_the_spiders_attribute(site, data_dir):
    a, b = (f"{site.base_url}/page/{n}.html" for n in (180, 181))
    await crawl(data_dir, [[a, {}], [b, {}]])
    etags = {u: r.etag for u, r in rows_by_url(data_dir).items()}

    site.reset_counts()
    seen = len(actions(data_dir))
    await crawl(data_dir, [[a, {"catalog_revalidate": True}], [b, {}]])
    assert site.request_headers["/page/180.html"]["If-None-Match"] == etags[a]
    assert site.counts["/page/181.html"] == 0
    assert outcomes(data_dir, seen) == {
        ("180.html", "not_modified"): 1,
        ("181.html", "cache_hit"): 1,
    }

    site.reset_counts()
    seen = len(actions(data_dir))
    await crawl(data_dir, [[a, {"catalog_revalidate": False}], [b, {}]], revalidate=True)
    assert site.counts["/page/180.html"] == 0
    assert site.request_headers["/page/181.html"]["If-None-Match"] == etags[b]
    assert outcomes(data_dir, seen) == {
        ("180.html", "cache_hit"): 1,
        ("181.html", "not_modified"): 1,
    }


@deferred_f_from_coro_f
async def test_catalog_key_is_used_instead_of_the_computed_one(site, data_dir):
    key = hashlib.sha256(b"my own key for page 182").hexdigest()
    url = f"{site.base_url}/page/182.html"
    await crawl(data_dir, [[url, {"catalog_key": key}]])
    rows = catalog_rows(data_dir)
    assert list(rows) == [key] and rows[key].url == url
    assert [(e["key"], e["outcome"]) for e in actions(data_dir)] == [(key, "ok")]


@deferred_f_from_coro_f
async def test_another_url_under_a_stored_key_is_not_fetched(site, data_dir, caplog):
    key = hashlib.sha256(b"my own key for page 183").hexdigest()
    a, b, c = (f"{site.base_url}/page/{n}.html" for n in (183, 184, 185))
    await crawl(data_dir, [[a, {"catalog_key": key}]])
    site.reset_counts()
    caplog.clear()
    await crawl(data_dir, [[b, {"catalog_key": key}], [c, {}]])
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert site.counts["/page/184.html"] == 0
    assert actions(data_dir)[1]["key"] == key and actions(data_dir)[1]["outcome"] == "cache_hit"
    assert set(rows_by_url(data_dir)) == {a, c}
