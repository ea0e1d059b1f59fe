"""A crawl gives its spider's items for every page of its list: stored pages it has
no items for are parsed from the archive, never fetched (``CATALOG_ITEMS_PARSE_STORED``)."""

from __future__ import annotations

import sqlite3
import threading
from threading import main_thread

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from demo.site import DemoSite
from extensions.storage import StorageExtension
from spiders.products import ProductsSpider
from tests.cmdline import read_jsonl, run_scrapy
from tests.conftest import write_urls
from tests.crawls import crawl, crawl_site

PRODUCTS = 12


@pytest.fixture
def shop():
    """A server of this test's own: its request counts are this test's alone."""
    demo = DemoSite(pages=50, page_bytes=2000, seed=5)
    demo.start()
    yield demo
    demo.stop()


def product_urls(shop: DemoSite, numbers=range(PRODUCTS)) -> list[str]:
    return [f"{shop.base_url}/product/{n}.html" for n in numbers]


def skus(data_dir) -> list[str]:
    """The ``product`` table as a third-party reader sees it."""
    conn = sqlite3.connect(data_dir / "metadata.db")
    try:
        return sorted(sku for (sku,) in conn.execute("SELECT sku FROM product"))
    except sqlite3.OperationalError:  # no such table: no product item was stored
        return []
    finally:
        conn.close()


def product_requests(shop: DemoSite) -> int:
    """Product pages served (robots.txt is asked for whenever a page is fetched)."""
    return sum(n for path, n in shop.counts.items() if path.startswith("/product/"))


def expected_skus(numbers=range(PRODUCTS)) -> list[str]:
    return sorted(f"SKU-{n:06d}" for n in numbers)


async def crawl_products(tmp_path, data_dir, urls: list[str], settings: dict | None = None):
    listed = write_urls(tmp_path / "products.txt", urls)
    return await crawl(ProductsSpider, data_dir, settings, urls=str(listed))


@deferred_f_from_coro_f
async def test_products_after_site_gives_every_item_without_a_request(shop, tmp_path, data_dir):
    urls = product_urls(shop)
    await crawl_site(urls, data_dir)
    assert skus(data_dir) == []  # the site spider stores pages, no product items
    shop.reset_counts()
    crawler = await crawl_products(tmp_path, data_dir, urls)
    assert skus(data_dir) == expected_skus()
    assert sum(shop.counts.values()) == 0, shop.counts  # counted at the server
    assert crawler.stats.get_value("items/stored_pages_parsed") == PRODUCTS
    # A second run: every page has its items, so all are skipped, none parsed again.
    crawler = await crawl_products(tmp_path, data_dir, urls)
    assert crawler.stats.get_value("items/stored_pages_parsed") is None
    assert crawler.stats.get_value("catalog/cache_hits") == PRODUCTS
    assert skus(data_dir) == expected_skus() and sum(shop.counts.values()) == 0


@deferred_f_from_coro_f
async def test_a_page_stored_by_the_shell_gets_its_items(shop, tmp_path, data_dir):
    urls = product_urls(shop)
    result = run_scrapy("shell", urls[1], "-s", f"DATA_DIR={data_dir}", "-c", "response.status")
    assert result.returncode == 0, result.stderr
    assert shop.counts["/product/1.html"] == 1
    crawler = await crawl_products(tmp_path, data_dir, urls)
    assert skus(data_dir) == expected_skus()
    assert shop.counts["/product/1.html"] == 1  # parsed from the archive
    assert product_requests(shop) == PRODUCTS
    assert crawler.stats.get_value("items/stored_pages_parsed") == 1


@deferred_f_from_coro_f
async def test_the_feed_of_a_resumed_crawl_holds_every_item(shop, tmp_path, data_dir):
    urls = product_urls(shop)
    await crawl_products(tmp_path, data_dir, urls[: PRODUCTS // 2])  # the first run
    shop.reset_counts()
    out = tmp_path / "out.jsonl"
    await crawl_products(tmp_path, data_dir, urls, {"FEEDS": {str(out): {"format": "jsonl"}}})
    assert sorted(item["sku"] for item in read_jsonl(out)) == expected_skus()
    assert product_requests(shop) == PRODUCTS - PRODUCTS // 2  # only the new ones
    assert skus(data_dir) == expected_skus()  # parsed again: replaced, not doubled


@deferred_f_from_coro_f
async def test_turned_off_stored_pages_are_skipped(shop, tmp_path, data_dir):
    urls = product_urls(shop)
    await crawl_site(urls, data_dir)
    shop.reset_counts()
    off = {"CATALOG_ITEMS_PARSE_STORED": False}
    out = tmp_path / "out.jsonl"
    crawler = await crawl_products(
        tmp_path, data_dir, urls, {**off, "FEEDS": {str(out): {"format": "jsonl"}}}
    )
    assert skus(data_dir) == [] and read_jsonl(out) == []
    assert sum(shop.counts.values()) == 0
    assert crawler.stats.get_value("catalog/cache_hits") == PRODUCTS
    assert crawler.stats.get_value("items/stored_pages_parsed") is None


class CountsCatalogQueries(ProductsSpider):
    """Notes the statements its crawl runs on the catalog's connection from its start
    (the data directory is open by then), each with whether it ran on the reactor's
    thread."""

    queries: list[tuple[str, bool]]

    async def start(self):
        self.queries = []
        # The batch lookups read the catalog through a connection of their own.
        catalog = StorageExtension.of(self.crawler).stored.batch_lookup.catalog
        catalog.conn.set_trace_callback(
            lambda sql: self.queries.append((sql, threading.current_thread() is main_thread()))
        )
        async for request in super().start():
            yield request


@deferred_f_from_coro_f
async def test_a_start_batch_of_an_item_spider_is_one_catalog_query(shop, tmp_path, data_dir):
    urls = product_urls(shop)
    await crawl_products(tmp_path, data_dir, urls)  # stored, with their items
    listed = write_urls(tmp_path / "products.txt", urls)
    crawler = await crawl(CountsCatalogQueries, data_dir, urls=str(listed))
    assert crawler.stats.get_value("catalog/cache_hits") == PRODUCTS
    # One batch of start requests: stored and parsed asked together, in a thread while
    # the reactor goes on.
    assert len(crawler.spider.queries) == 1, crawler.spider.queries
    ((_, on_reactor),) = crawler.spider.queries
    assert not on_reactor
