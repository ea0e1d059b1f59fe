"""The storage side's Scrapy components, each built from ``get_crawler`` as Scrapy's own
tests build theirs, over real data directories."""

from __future__ import annotations

import inspect
import logging

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f, deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from crawler.storage.datadir import DataDir
from crawler.storage.keys import request_key
from crawler.storage.store import Store, StoreConfig
from extensions.archive_cache import ArchiveCacheStorage
from extensions.dupefilter import SpillingDupeFilter
from extensions.progress import ProgressExtension
from extensions.storage import CACHED_FLAG, CachedRequest, StorageExtension
from middlewares.archive import ArchiveMiddleware
from tests.checks import actions, catalog_rows
from tests.conftest import project_settings
from tests.factories import listed_body, listed_fetch
from tests.polling import wait_until_async


@pytest.fixture
def stored(data_dir) -> DataDir:
    """A data directory holding pages 0-2 (``tests.factories.listed_fetch``)."""
    store = Store(StoreConfig(data_dir=data_dir))
    for n in range(3):
        store.put(listed_fetch(n))
    store.close()
    return DataDir(data_dir)


def archive_middleware(data_dir, **settings) -> tuple[ArchiveMiddleware, Spider]:
    """The middleware over its storage extension, as a crawl builds them."""
    crawler = get_crawler(Spider, project_settings(data_dir, **settings))
    spider = Spider.from_crawler(crawler, name="t")
    storage = StorageExtension.of(crawler)
    storage.spider_opened(spider)
    mw = ArchiveMiddleware.from_crawler(crawler)
    mw.crawler = crawler
    mw.spider_closed = storage.spider_closed
    return mw, spider


async def sent(mw: ArchiveMiddleware, request: Request):
    """What the middleware answers ``request`` on its way out (a request not looked up
    yet is looked up in the storage's thread)."""
    answer = mw.process_request(request)
    return await answer if inspect.iscoroutine(answer) else answer


def page(url: str, body: bytes, request: Request, status: int = 200, **headers) -> HtmlResponse:
    return HtmlResponse(url, status=status, body=body, headers=headers, request=request)


# -- ArchiveMiddleware ----------------------------------------------------------------------


@deferred_f_from_coro_f
async def test_archive_middleware_stores_final_answers_and_logs_the_rest(data_dir):
    mw, spider = archive_middleware(data_dir)
    ok = Request("http://example.org/ok")
    failed = Request("http://example.org/failed")
    for request in (ok, failed):
        assert await sent(mw, request) is None  # nothing stored: sent
    answer = page(ok.url, b"<html>ok</html>", ok, ETag='"v1"')
    assert mw.process_response(ok, answer) is answer
    mw.process_response(failed, page(failed.url, b"oops", failed, status=500))
    mw.spider_closed(spider, "finished")

    stats = mw.crawler.stats
    assert stats.get_value("archive/stored") == 1
    assert stats.get_value("catalog/rows_committed") == 1
    (row,) = catalog_rows(data_dir).values()
    assert (row.key, row.url, row.etag) == (request_key(ok.url), ok.url, '"v1"')
    assert DataDir(data_dir).read(row).body == b"<html>ok</html>"
    outcomes = {(a["url"], a["outcome"], a["status"]) for a in actions(data_dir)}
    assert outcomes == {(ok.url, "ok", 200), (failed.url, "error", 500)}


@deferred_f_from_coro_f
async def test_archive_middleware_drops_or_replays_what_is_stored(stored):
    # Items or not, the spider of a crawl that parses stored pages gets them replayed
    # (tests/test_items_stored.py): here they are skipped.
    mw, spider = archive_middleware(stored.root, CATALOG_ITEMS_PARSE_STORED=False)
    url = "http://example.org/page/1"
    with pytest.raises(CachedRequest):
        await sent(mw, Request(url))
    replayed = await sent(mw, Request(url, meta={"catalog_replay": True}))
    assert isinstance(replayed, HtmlResponse) and CACHED_FLAG in replayed.flags
    assert replayed.body == listed_body(1)
    start = [Request(f"http://example.org/page/{n}") for n in range(2, 5)]
    assert [r.url for r in mw.storage.stored.filter_start(start)] == [
        "http://example.org/page/3",
        "http://example.org/page/4",
    ]
    mw.spider_closed(spider, "finished")
    stats = mw.crawler.stats
    # The replayed request is the URL met again: answered, counted, not logged twice.
    assert stats.get_value("catalog/cache_hits") == 2
    assert stats.get_value("catalog/duplicates") == 1
    assert stats.get_value("archive/replayed") == 1
    hits = [a["url"] for a in actions(stored.root) if a["outcome"] == "cache_hit"]
    assert sorted(hits) == [url, "http://example.org/page/2"]


@deferred_f_from_coro_f
async def test_archive_middleware_revalidates_and_refreshes_on_304(stored):
    # A row without validators cannot be revalidated: the page is fetched again.
    mw, spider = archive_middleware(stored.root)
    key = request_key("http://example.org/page/0")
    assert catalog_rows(stored.root)[key].etag is None
    request = Request("http://example.org/page/0", meta={"catalog_revalidate": True})
    assert await sent(mw, request) is None
    assert b"If-None-Match" not in request.headers and "catalog_revalidating" not in request.meta
    mw.spider_closed(spider, "finished")

    # Give the row validators, then revalidate: a 304 refreshes the row, keeps the body.
    store = Store(StoreConfig(data_dir=stored.root))
    store.put(listed_fetch(0, response_headers=[("ETag", '"e0"')]))
    store.close()
    before = catalog_rows(stored.root)[key]
    mw, spider = archive_middleware(stored.root)
    request = Request("http://example.org/page/0", meta={"catalog_revalidate": True})
    assert await sent(mw, request) is None
    assert request.headers[b"If-None-Match"] == b'"e0"'
    mw.process_response(request, page(request.url, b"", request, status=304, ETag='"e1"'))
    mw.spider_closed(spider, "finished")
    after = catalog_rows(stored.root)[key]
    assert after.etag == '"e1"' and after.fetched_at > before.fetched_at
    assert stored.read(after).body == listed_body(0)
    assert mw.crawler.stats.get_value("catalog/not_modified") == 1


def test_archive_middleware_is_off_with_archive_enabled_off(data_dir):
    crawler = get_crawler(Spider, project_settings(data_dir, ARCHIVE_ENABLED=False))
    assert StorageExtension.of(crawler) is None
    with pytest.raises(NotConfigured, match="ARCHIVE_ENABLED"):
        StorageExtension.from_crawler(crawler)
    with pytest.raises(NotConfigured):
        ArchiveMiddleware.from_crawler(crawler)


# -- ArchiveCacheStorage --------------------------------------------------------------------


def test_archive_cache_storage_answers_stored_requests_only(stored):
    crawler = get_crawler(Spider, project_settings(stored.root))
    spider = Spider.from_crawler(crawler, name="t")
    storage = ArchiveCacheStorage(crawler.settings)
    storage.open_spider(spider)
    hit = storage.retrieve_response(spider, Request("http://example.org/page/2"))
    miss = storage.retrieve_response(spider, Request("http://example.org/page/9"))
    storage.close_spider(spider)
    assert hit.body == listed_body(2) and hit.status == 200 and hit.url.endswith("/page/2")
    assert miss is None
    assert crawler.stats.get_value("httpcache/archive_hit") == 1
    assert crawler.stats.get_value("httpcache/archive_miss") == 1


def test_archive_cache_storage_treats_an_unreadable_record_as_a_miss(stored):
    row = catalog_rows(stored.root)[request_key("http://example.org/page/1")]
    with open(stored.resolve(row.archive), "r+b") as f:
        f.seek(row.offset + 10)
        f.write(b"\xff" * 20)
    crawler = get_crawler(Spider, project_settings(stored.root))
    spider = Spider.from_crawler(crawler, name="t")
    storage = ArchiveCacheStorage(crawler.settings)
    storage.open_spider(spider)
    assert storage.retrieve_response(spider, Request("http://example.org/page/1")) is None
    storage.close_spider(spider)
    assert crawler.stats.get_value("httpcache/archive_read_errors") == 1


# -- ProgressExtension ----------------------------------------------------------------------


def test_progress_line_counts_the_list(caplog):
    crawler = get_crawler(Spider, {"PROGRESS_INTERVAL": 5})
    extension = ProgressExtension.from_crawler(crawler)
    for name, value in {
        "progress/list_total": 200,
        "progress/list_done": 50,
        "catalog/cache_hits": 30,
        "actions/ok": 20,
        "actions/error": 3,
        "actions/retry": 1,
    }.items():
        crawler.stats.set_value(name, value)
    with caplog.at_level(logging.INFO, logger="extensions.progress"):
        extension.log()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("Progress: list 50/200 (25.0%), ")
    assert "30 cache hits, 3 errors, 1 retries, ETA" in line


def test_progress_is_off_at_interval_zero(caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(NotConfigured) as off:
        ProgressExtension.from_crawler(get_crawler(Spider, {"PROGRESS_INTERVAL": 0}))
    assert not off.value.args  # off on purpose: no warning from Scrapy
    assert "PROGRESS_INTERVAL is 0" in caplog.text


# -- SpillingDupeFilter ---------------------------------------------------------------------


def test_dupefilter_reads_its_settings_and_spills():
    crawler = get_crawler(Spider, {"DUPEFILTER_MEMORY_FINGERPRINTS": 3})
    dupes = SpillingDupeFilter.from_crawler(crawler)
    urls = [f"http://example.org/{n}" for n in range(10)]
    assert not any(dupes.request_seen(Request(u)) for u in urls)
    assert dupes.in_memory < 3 and dupes.spilled >= 7
    assert all(dupes.request_seen(Request(u)) for u in urls)
    dupes.close("finished")


# -- ResumeSpiderMiddleware -----------------------------------------------------------------


class ListSpider(Spider):
    name = "list"

    def __init__(self, urls, **kwargs):
        super().__init__(**kwargs)
        self.urls = urls
        self.parsed: list[str] = []

    async def start(self):
        for url in self.urls:
            yield Request(url)

    def parse(self, response):
        self.parsed.append(response.url)


@deferred_f_from_coro_f
async def test_resume_drops_stored_start_requests_before_the_scheduler(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(40, 50)]
    store = Store(StoreConfig(data_dir=data_dir))
    for url in urls[:6]:
        store.put(listed_fetch(0, url))
    store.close()
    site.reset_counts()
    # Stored pages this spider has no items for would be parsed from the archive.
    settings = project_settings(data_dir, CATALOG_ITEMS_PARSE_STORED=False)
    crawler = get_crawler(ListSpider, settings)
    await crawler.crawl_async(urls=urls)
    assert sorted(crawler.spider.parsed) == sorted(urls[6:])
    assert all(site.counts[f"/page/{n}.html"] == 0 for n in range(40, 46))
    assert crawler.stats.get_value("catalog/cache_hits") == 6
    assert crawler.stats.get_value("scheduler/enqueued") == 4  # the stored six never were


def test_no_component_reaches_into_the_archive_middleware():
    """Components use the storage extension's API; only the settings name the middleware."""
    import ast

    from tests.conftest import ROOT

    importers = []
    for folder in ("crawler", "middlewares", "extensions", "pipelines", "commands", "spiders"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                if "middlewares.archive" in names:
                    importers.append(str(path.relative_to(ROOT)))
    assert importers == []


# -- ArchivePolicy ----------------------------------------------------------------------------


def test_archive_policy_decides_what_becomes_of_a_stored_request():
    from crawler.storage.records import Row
    from extensions.archive_policy import ArchivePolicy, Decision

    policy = ArchivePolicy(frozenset({200, 404}))
    assert policy.when_stored({}) is Decision.SKIP
    assert policy.when_stored({"catalog_replay": True}) is Decision.REPLAY
    assert policy.when_stored({}, parsed=False) is Decision.SKIP  # not parsing stored pages
    items = ArchivePolicy(frozenset({200}), parse_stored=True)
    assert items.when_stored({}, parsed=False) is Decision.REPLAY  # the spider's items wanted
    assert items.when_stored({}, parsed=True) is Decision.SKIP
    feed = ArchivePolicy(frozenset({200}), parse_stored=True, feeds=True)
    assert feed.when_stored({}, parsed=True) is Decision.REPLAY  # -o: every page's items
    revalidate = {"catalog_revalidate": True}
    assert policy.when_stored(revalidate) is Decision.REVALIDATE
    row = Row("k", "u", "u", 200, None, 1, None, None, "t", "a", 0, 1, None)
    assert policy.when_stored(revalidate, row) is Decision.FETCH  # no validators
    row.etag = '"e"'
    assert policy.when_stored(revalidate, row) is Decision.REVALIDATE
    assert policy.validators(row) == {"If-None-Match": '"e"'}
    assert policy.should_store(404) and not policy.should_store(500)


class ReplayEverything:
    """A policy of a crawl that parses its stored pages again instead of skipping them."""

    def __init__(self, store_statuses):
        from extensions.archive_policy import ArchivePolicy

        self.base = ArchivePolicy(store_statuses)

    def __getattr__(self, name):
        return getattr(self.base, name)

    def when_stored(self, meta, row=None, parsed=True):
        from extensions.archive_policy import Decision

        return Decision.REPLAY


@deferred_f_from_coro_f
async def test_archive_policy_setting_plugs_another_policy(stored):
    policy = f"{__name__}.ReplayEverything"
    mw, spider = archive_middleware(stored.root, ARCHIVE_POLICY=policy)
    start = [Request(f"http://example.org/page/{n}") for n in range(2, 4)]
    assert len(mw.storage.stored.filter_start(start)) == 2  # nothing skipped
    replayed = await sent(mw, Request("http://example.org/page/1"))
    assert replayed.body == listed_body(1) and CACHED_FLAG in replayed.flags
    mw.spider_closed(spider, "finished")


@deferred_f_from_coro_f
async def test_a_request_for_a_key_in_flight_waits_for_its_commit(data_dir):
    # Rows are committed one by one (no items to wait for), but a waiter that is not
    # woken by the commit waits 2 x CATALOG_FLUSH_SECONDS + 10 s, then fetches again.
    mw, spider = archive_middleware(
        data_dir, CATALOG_BATCH_SIZE=1, CATALOG_FLUSH_SECONDS=30, CATALOG_ITEMS_ENABLED=False
    )
    ok, failed = Request("http://example.org/ok"), Request("http://example.org/failed")
    for request in (ok, failed):
        assert await sent(mw, request) is None  # sent: now in flight
    # Started as Scrapy starts them: looked up (in the lookup thread), then waiting.
    ok_again = deferred_from_coro(mw.process_request(Request(ok.url)))
    failed_again = deferred_from_coro(mw.process_request(Request(failed.url)))
    await wait_until_async(
        lambda: mw.crawler.stats.get_value("catalog/waits_for_writer") == 2,
        "both requests waiting for the writer",
    )
    mw.process_response(ok, page(ok.url, b"<html>ok</html>", ok))
    mw.process_response(failed, page(failed.url, b"oops", failed, status=500))
    with pytest.raises(CachedRequest):  # woken by the commit: the row is there
        await maybe_deferred_to_future(ok_again)
    # Woken by the failure: its error line is the URL's outcome in this run.
    with pytest.raises(CachedRequest):
        await maybe_deferred_to_future(failed_again)
    mw.spider_closed(spider, "finished")
    stats = mw.crawler.stats
    assert stats.get_value("catalog/waits_for_writer") == 2
    assert stats.get_value("catalog/duplicates") == 2
    outcomes = sorted((a["url"], a["outcome"]) for a in actions(data_dir))
    assert outcomes == [(failed.url, "error"), (ok.url, "ok")]
