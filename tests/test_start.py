"""Resumed list crawls skip stored URLs before a Request exists (crawler/spiderkit/start.py).

The crawls run a subclass of the ``site`` spider in process (the project's settings
and middlewares, as in any crawl) while every ``scrapy.Request`` built records its
URL, so that a request built for a stored line and dropped later is seen.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import scrapy
from scrapy.statscollectors import StatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.spiderkit.start import listed_key
from crawler.spiderkit.urls import check_url, in_shard
from crawler.storage.keys import plain_key, request_key
from spiders.site import SiteSpider
from tests.checks import actions, rows_by_url
from tests.conftest import write_urls
from tests.crawls import crawl
from tests.loopback_resolver import LoopbackResolver
from tests.test_keys import _random_url


class CountingSiteSpider(SiteSpider):
    start_batch = 7  # several batches even for a short list


# Pieces of URLs that Scrapy escapes or w3lib canonicalises.
ODD_PIECES = ["a b", "caf\u00e9", "%7e", "%7E", "%C3%A9", "%", "[x]", "|", "a'b", '"', "\u00fc=1"]
ODD_HOSTS = ["B\u00fccher.example", "WWW.Example.ORG", "a.com:80", "a.com:443", "xn--bcher-kva.ex"]


async def counted_crawl(
    urls: Path, data_dir: Path, settings: dict | None = None, **args: str
) -> tuple[StatsCollector, list[str]]:
    """Crawl with the counting spider; returns its stats and the URLs of the requests
    built while it ran (this process builds no other)."""
    built: list[str] = []
    init = scrapy.Request.__init__

    def counting_init(self, url, *a, **kw):
        built.append(url)
        init(self, url, *a, **kw)

    scrapy.Request.__init__ = counting_init
    try:
        crawler = await crawl(CountingSiteSpider, data_dir, settings, urls=str(urls), **args)
    finally:
        scrapy.Request.__init__ = init
    return crawler.stats, built


@contextmanager
def resolving(names: list[str]) -> Iterator[None]:
    """``names`` resolve to 127.0.0.1 on this process's reactor while the block runs
    (``scrapy crawl`` installs TWISTED_DNS_RESOLVER; a crawl on the test's reactor
    does not). The name resolver is put back, as tests.hostservers explains."""
    from twisted.internet import reactor

    old = reactor.nameResolver
    reactor.installResolver(LoopbackResolver(reactor, 0, 60.0, names))
    try:
        yield
    finally:
        reactor.installNameResolver(old)


def test_a_list_line_gets_the_key_of_the_request_scrapy_builds_from_it():
    rng = random.Random(20261201)
    plain = 0
    for n in range(30_000):
        text = _random_url(rng)
        if n % 3 == 0:
            text = text.replace("://", "://" + rng.choice(ODD_HOSTS) + "/", 1).replace(
                "/", "/" + rng.choice(ODD_PIECES), 3
            )
        if check_url(text):
            assert listed_key(text)[2], text
            continue
        try:
            url = scrapy.Request(text).url
        except ValueError:
            assert listed_key(text)[2], text
            continue
        assert listed_key(text) == (url, request_key(url), None), text
        if plain_key(text) is not None:  # taken as it is by the cheap path
            assert (url, plain_key(text)) == (text, request_key(text)), text
            plain += 1
    assert plain > 500  # the cheap path is really exercised


@pytest.mark.parametrize(
    "text",
    [
        "http://a.com/p?a=1&b=2",
        "http://a.com/p?b=2&a=1",
        "http://a.com/p?a-b=1&a=2",  # "-" sorts before "=" as text, after it as a name
        "http://a.com/p?a=2&a=1",
        "http://a.com/p?a=1&a=1",
        "http://a.com/p?=a&b=1",
        "http://a.com/p?a",
        "http://a.com/p?a=",
        "http://a.com/p?a==1",
        "http://a.com/p?a=1&&b=2",
        "http://a.com/p?a=1&b",
        "http://a.com/p?a=1&b=2&c=3",
        "http://a.com/p?c=1&b=2&a=3",
        "https://a.com:443/p?b=1&a=2",
        "http://a.com:8080/p/./q?a=1",
        "http://a.com?x=1",
        "http://a.com/p?",
        "http://a.com",
    ],
)
def test_a_plain_list_line_gets_the_key_of_the_request_scrapy_builds(text):
    url = scrapy.Request(text).url
    assert listed_key(text) == (url, request_key(url), None)
    key = plain_key(text)
    assert key is None or (text, key) == (url, request_key(url))


@pytest.mark.parametrize("thread", [False, True])
@deferred_f_from_coro_f
async def test_a_partly_stored_list_fetches_the_rest_and_builds_no_request_for_the_stored(
    site, tmp_path, data_dir, thread
):
    base = site.base_url
    urls = [f"{base}/page/{n}.html" for n in range(400, 440)]
    stored = urls[::2]
    await counted_crawl(write_urls(tmp_path / "first.txt", stored), data_dir)
    before = len(actions(data_dir))
    site.reset_counts()
    url_file = write_urls(tmp_path / "urls.txt", [*urls, stored[3]])  # one listed twice
    threaded = {"start_thread": "1"} if thread else {}
    stats, built = await counted_crawl(url_file, data_dir, **threaded)
    fetched = {p: c for p, c in site.counts.items() if p.startswith("/page/")}
    assert fetched == {u.removeprefix(base): 1 for u in urls[1::2]}
    assert not set(built) & set(stored), "a request was built for a stored line"
    assert set(urls[1::2]) <= set(built)
    hits = [e for e in actions(data_dir)[before:] if e["outcome"] == "cache_hit"]
    # The line listed twice is one cache hit and one duplicate; both lines are done.
    assert Counter(e["url"] for e in hits) == Counter(stored)
    assert all(e["key"] == request_key(e["url"]) for e in hits)
    assert stats.get_value("catalog/cache_hits") == 20
    assert stats.get_value("catalog/duplicates") == 1
    assert stats.get_value("progress/list_done") == 41
    assert set(rows_by_url(data_dir)) == set(urls)


@deferred_f_from_coro_f
async def test_urls_that_scrapy_escapes_are_recognised_as_stored(site, tmp_path, data_dir):
    port = site.base_url.rsplit(":", 1)[1]
    lines = [
        f"http://127.0.0.1:{port}/page/451.html?b=2&a=1",  # query order
        f"http://127.0.0.1:{port}/page/452.html?q=a%20b",  # an escaped space
        f"http://127.0.0.1:{port}/page/453.html?q=caf\u00e9",  # non-ASCII query
        f"http://127.0.0.1:{port}/missing/caf\u00e9",  # non-ASCII path (404, stored)
        f"http://B\u00fccher.example:{port}/page/455.html",  # IDN host, uppercase
        f"http://UPPER.Example:{port}/page/456.html",  # uppercase host
        f"http://127.0.0.1:{port}/page/x/../457.html",  # a dot segment
        f"http://127.0.0.1:{port}/page/458.html?",  # a bare "?" (Scrapy drops it)
    ]
    url_file = write_urls(tmp_path / "urls.txt", lines)
    settings = {"ROBOTSTXT_OBEY": False}
    site.reset_counts()
    with resolving(["xn--bcher-kva.example", "upper.example"]):
        await counted_crawl(url_file, data_dir, settings)
        assert sum(site.counts.values()) == len(lines)
        assert len(rows_by_url(data_dir)) == len(lines)
        before = len(actions(data_dir))
        site.reset_counts()
        _, built = await counted_crawl(url_file, data_dir, settings)
    assert sum(site.counts.values()) == 0
    assert built == []
    hits = [e for e in actions(data_dir)[before:] if e["outcome"] == "cache_hit"]
    assert sorted(e["url"] for e in hits) == sorted(rows_by_url(data_dir))


@deferred_f_from_coro_f
async def test_a_resumed_shard_fetches_the_unstored_lines_of_its_shard_only(
    site, tmp_path, data_dir
):
    base = site.base_url
    urls = [f"{base}/page/{n}.html" for n in range(460, 500)]
    stored = urls[:20]
    await counted_crawl(write_urls(tmp_path / "first.txt", stored), data_dir)
    before = len(actions(data_dir))
    site.reset_counts()
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # The site is one host: split by key.
    _, built = await counted_crawl(url_file, data_dir, shard="1/3", partition="url")
    mine = [u for u in urls if in_shard(request_key(u), (1, 3))]
    fetched = {p for p, c in site.counts.items() if p.startswith("/page/")}
    assert fetched == {u.removeprefix(base) for u in mine if u not in stored}
    assert not set(built) & set(stored)
    hits = [e["url"] for e in actions(data_dir)[before:] if e["outcome"] == "cache_hit"]
    assert sorted(hits) == sorted(u for u in mine if u in stored)


@deferred_f_from_coro_f
async def test_revalidation_and_depth_build_requests_for_stored_lines(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in (501, 502)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    await counted_crawl(url_file, data_dir)
    site.reset_counts()
    await counted_crawl(url_file, data_dir, revalidate="1")
    assert {p: site.counts[p] for p in ("/page/501.html", "/page/502.html")} == {
        "/page/501.html": 1,
        "/page/502.html": 1,
    }
    site.reset_counts()
    _, built = await counted_crawl(url_file, data_dir, depth="1")
    assert set(urls) <= set(built)  # replayed from the archive, for their links
    assert site.counts["/page/501.html"] == 0
