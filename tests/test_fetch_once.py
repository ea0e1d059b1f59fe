"""A URL is fetched once, even when a depth crawl meets it again higher up while its
first fetch is in flight or waiting for the writer's commit."""

from __future__ import annotations

import threading

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from spiders.site import SiteSpider
from tests.checks import actions, response_records
from tests.crawls import crawl_site
from tests.rawserver import RawServer, response


def page(*links: str) -> bytes:
    body = "".join(f"<a href='{link}'>{link}</a>" for link in links)
    return response(
        headers=[(b"Content-Type", b"text/html")], body=f"<html><body>{body}</body></html>".encode()
    )


# 1: every URL's depth moves to the spider's temporary file as it is set.
@pytest.mark.parametrize("depths_in_memory", [SiteSpider.depths_in_memory, 1])
@deferred_f_from_coro_f
async def test_a_page_met_again_higher_up_is_fetched_once(data_dir, monkeypatch, depths_in_memory):
    monkeypatch.setattr(SiteSpider, "depths_in_memory", depths_in_memory)
    p_requested = threading.Event()

    def b_after_p(path: str) -> bytes:
        # /b answers once /p has been asked for at depth 2 (through /a and /c), so the
        # crawl meets /p again at depth 1 while that fetch is in flight or uncommitted.
        p_requested.wait(60)
        return page("/p")

    def p(path: str) -> bytes:
        p_requested.set()
        return page("/q")

    server = RawServer({"/a": page("/c"), "/c": page("/p"), "/b": b_after_p, "/p": p, "/q": page()})
    settings = {
        "ROBOTSTXT_OBEY": "0",
        # Rows reach the catalog seconds after their fetch.
        "CATALOG_BATCH_SIZE": "10000",
        "CATALOG_FLUSH_SECONDS": "2",
    }
    crawler = await crawl_site([server.url("/a"), server.url("/b")], data_dir, settings, depth="2")
    assert {path: server.counts[path] for path in ("/a", "/b", "/c", "/p", "/q")} == dict.fromkeys(
        ("/a", "/b", "/c", "/p", "/q"), 1
    )
    assert set(response_records(data_dir).values()) == {1}
    lines = [a for a in actions(data_dir) if a["url"] == server.url("/p")]
    # One line: met again, /p is counted as a duplicate, not logged a second time.
    assert [a["outcome"] for a in lines] == ["ok"]
    assert crawler.stats.get_value("catalog/duplicates") == 1
    # Met at depth 2 its links are not followed; met again at depth 1 they are, from
    # the stored copy: /q is reached.
    assert server.counts["/q"] == 1


@deferred_f_from_coro_f
async def test_followed_links_are_looked_up_and_replayed_off_the_reactor_thread(
    data_dir, monkeypatch
):
    server = RawServer({"/a": page("/b", "/c"), "/b": page("/c"), "/c": page()})
    settings = {"ROBOTSTXT_OBEY": "0"}
    await crawl_site([server.url("/a")], data_dir, settings, depth="2")
    threads = []

    def get(self, key):
        threads.append(threading.current_thread().name)
        return real_get(self, key)

    def rows(self, where="1", params=()):
        threads.append(threading.current_thread().name)
        return real_rows(self, where, params)

    def read(self, row):
        reads.append(threading.current_thread().name)
        return real_read(self, row)

    reads = []
    real_get, real_rows, real_read = Catalog.get, Catalog.rows, DataDir.read
    monkeypatch.setattr(Catalog, "get", get)
    monkeypatch.setattr(Catalog, "rows", rows)
    monkeypatch.setattr(DataDir, "read", read)
    # Again: the stored pages are replayed for their links, which are stored too.
    await crawl_site([server.url("/a")], data_dir, settings, depth="2")
    assert sum(server.counts.values()) == 3  # nothing fetched twice
    assert threads and threading.main_thread().name not in threads
    # /a, /b and /c (depth 0 and 1) replayed for their links, read off the reactor too.
    assert len(reads) == 3 and threading.main_thread().name not in reads


@deferred_f_from_coro_f
async def test_a_depth_crawl_replays_pages_of_another_data_directory_s_catalog(tmp_path):
    # CATALOG_SEEN: pages stored by an earlier crawl elsewhere are neither fetched nor
    # stored again; their links are followed from the other directory's archive.
    server = RawServer({"/a": page("/b"), "/b": page("/c"), "/c": page()})
    settings = {"ROBOTSTXT_OBEY": "0"}
    await crawl_site([server.url("/a")], tmp_path / "one", settings, depth="1")
    assert (server.counts["/a"], server.counts["/b"], server.counts["/c"]) == (1, 1, 0)
    seen = {**settings, "CATALOG_SEEN": str(tmp_path / "one" / "metadata.db")}
    await crawl_site([server.url("/a")], tmp_path / "two", seen, depth="2")
    assert (server.counts["/a"], server.counts["/b"], server.counts["/c"]) == (1, 1, 1)
    outcomes = {a["url"]: a["outcome"] for a in actions(tmp_path / "two")}
    assert outcomes == {
        server.url("/a"): "cache_hit",
        server.url("/b"): "cache_hit",
        server.url("/c"): "ok",
    }
