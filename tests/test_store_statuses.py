"""Which answers get a catalog row: CATALOG_STORE_STATUSES, and 3xx not followed."""

from __future__ import annotations

import hashlib

import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from warcio.archiveiterator import ArchiveIterator

from tests.checks import actions, assert_rows_readable, rows_by_url
from tests.crawls import crawl, crawl_site


@deferred_f_from_coro_f
async def test_a_redirect_not_followed_is_stored_as_the_3xx_it_is(site, data_dir):
    url = f"{site.base_url}/redirect/176"
    site.reset_counts()
    await crawl_site([url], data_dir, {"REDIRECT_ENABLED": "0"})
    row = rows_by_url(data_dir)[url]
    assert (row.status, row.final_url, row.bytes) == (301, url, 0)
    assert site.counts["/page/176.html"] == 0, "not followed"
    (archive,) = (data_dir / "archive").glob("*.warc.gz")
    with open(archive, "rb") as f:
        stored = [r for r in ArchiveIterator(f) if r.rec_type == "response"]
    assert [r.http_headers.get_header("Location") for r in stored] == ["/page/176.html"]
    assert [(e["outcome"], e["status"]) for e in actions(data_dir)] == [("ok", 301)]


@deferred_f_from_coro_f
async def test_store_statuses_decide_which_answers_get_a_row(site, tmp_path):
    base = site.base_url
    urls = [f"{base}/page/177.html", f"{base}/missing/177", f"{base}/gone/177"]
    urls.append(f"{base}/error/177")
    statuses = {}
    for name, setting in [("default", {}), ("narrow", {"CATALOG_STORE_STATUSES": "200,404"}),
                          ("wide", {"CATALOG_STORE_STATUSES": "200,404,410,500"})]:  # fmt: skip
        data_dir = tmp_path / name
        await crawl_site(urls, data_dir, setting)
        assert_rows_readable(data_dir, site)
        statuses[name] = {u.rsplit("/", 2)[1]: r.status for u, r in rows_by_url(data_dir).items()}
        if name == "narrow":
            gone = [e for e in actions(data_dir) if e["url"] == f"{base}/gone/177"]
            assert [(e["outcome"], e["status"], e["error"]) for e in gone] == [
                ("error", 410, "HTTP 410")
            ]
    assert statuses == {
        "default": {"page": 200, "missing": 404, "gone": 410},
        "narrow": {"page": 200, "missing": 404},
        # A 500 is retried first; with 500 stored, its last answer gets a row.
        "wide": {"page": 200, "missing": 404, "gone": 410, "error": 500},
    }


class AskSpider(scrapy.Spider):
    name = "ask"

    def __init__(self, url, etag, **kwargs):
        super().__init__(**kwargs)
        self.url, self.etag = url, etag

    async def start(self):
        yield scrapy.Request(self.url, headers={"If-None-Match": self.etag})

    def parse(self, response):
        yield {"status": response.status}


@deferred_f_from_coro_f
async def test_a_304_the_crawl_did_not_ask_for_gets_no_row(site, data_dir):
    """304 is the one 3xx not stored: it holds no page (only a revalidation uses it)."""
    url = f"{site.base_url}/page/178.html"
    etag = '"' + hashlib.sha1(site.payload("/page/178.html")).hexdigest()[:16] + '"'
    await crawl(AskSpider, data_dir, {"HTTPERROR_ALLOW_ALL": "1"}, url=url, etag=etag)
    assert rows_by_url(data_dir) == {}
    assert [(e["outcome"], e["status"]) for e in actions(data_dir)] == [("error", 304)]
