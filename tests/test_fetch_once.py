"""A URL is fetched once, even when a depth crawl meets it again higher up while its
first fetch is in flight or waiting for the writer's commit."""

from __future__ import annotations

import threading

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

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
    await crawl_site([server.url("/a"), server.url("/b")], data_dir, settings, depth="2")
    assert {path: server.counts[path] for path in ("/a", "/b", "/c", "/p", "/q")} == dict.fromkeys(
        ("/a", "/b", "/c", "/p", "/q"), 1
    )
    assert set(response_records(data_dir).values()) == {1}
    lines = [a for a in actions(data_dir) if a["url"] == server.url("/p")]
    # One line: met again, /p is counted as a duplicate, not logged a second time.
    assert [a["outcome"] for a in lines] == ["ok"]
    # Met at depth 2 its links are not followed; met again at depth 1 they are, from
    # the stored copy: /q is reached.
    assert server.counts["/q"] == 1
