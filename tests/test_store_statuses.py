"""Which answers get a catalog row: CATALOG_STORE_STATUSES, and 3xx not followed."""

from __future__ import annotations

import hashlib
import textwrap

from warcio.archiveiterator import ArchiveIterator

from tests.checks import actions, assert_rows_readable, rows_by_url
from tests.cmdline import run_scrapy
from tests.conftest import run_crawl, write_urls


def test_a_redirect_not_followed_is_stored_as_the_3xx_it_is(site, tmp_path, data_dir):
    url = f"{site.base_url}/redirect/176"
    site.reset_counts()
    result = run_crawl(write_urls(tmp_path / "urls.txt", [url]), data_dir, "-s",
                       "REDIRECT_ENABLED=0")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    row = rows_by_url(data_dir)[url]
    assert (row.status, row.final_url, row.bytes) == (301, url, 0)
    assert site.counts["/page/176.html"] == 0, "not followed"
    (archive,) = (data_dir / "archive").glob("*.warc.gz")
    with open(archive, "rb") as f:
        stored = [r for r in ArchiveIterator(f) if r.rec_type == "response"]
    assert [r.http_headers.get_header("Location") for r in stored] == ["/page/176.html"]
    assert [(e["outcome"], e["status"]) for e in actions(data_dir)] == [("ok", 301)]


def test_store_statuses_decide_which_answers_get_a_row(site, tmp_path):
    base = site.base_url
    urls = [f"{base}/page/177.html", f"{base}/missing/177", f"{base}/gone/177"]
    urls.append(f"{base}/error/177")
    url_file = write_urls(tmp_path / "urls.txt", urls)
    statuses = {}
    for name, setting in [("default", ()), ("narrow", ("-s", "CATALOG_STORE_STATUSES=200,404")),
                          ("wide", ("-s", "CATALOG_STORE_STATUSES=200,404,410,500"))]:  # fmt: skip
        data_dir = tmp_path / name
        result = run_crawl(url_file, data_dir, *setting)
        assert result.returncode == 0, result.stderr[-3000:]
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


NOT_MODIFIED_SPIDER = """
    import scrapy

    class AskSpider(scrapy.Spider):
        name = "ask"

        def __init__(self, url, etag, **kwargs):
            super().__init__(**kwargs)
            self.url, self.etag = url, etag

        async def start(self):
            yield scrapy.Request(self.url, headers={"If-None-Match": self.etag})

        def parse(self, response):
            yield {"status": response.status}
"""


def test_a_304_the_crawl_did_not_ask_for_gets_no_row(site, tmp_path, data_dir):
    """304 is the one 3xx not stored: it holds no page (only a revalidation uses it)."""
    spider = tmp_path / "ask.py"
    spider.write_text(textwrap.dedent(NOT_MODIFIED_SPIDER))
    url = f"{site.base_url}/page/178.html"
    etag = '"' + hashlib.sha1(site.payload("/page/178.html")).hexdigest()[:16] + '"'
    result = run_scrapy(
        "runspider", str(spider), "-a", f"url={url}", "-a", f"etag={etag}",
        "-s", f"DATA_DIR={data_dir}", "-s", "AUTOTHROTTLE_ENABLED=0",
        "-s", "HTTPERROR_ALLOW_ALL=1", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert rows_by_url(data_dir) == {}
    assert [(e["outcome"], e["status"]) for e in actions(data_dir)] == [("error", 304)]
