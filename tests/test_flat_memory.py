"""A crawl's memory does not grow with its list, and its bookkeeping is exact.

A resumed crawl of the ``site`` spider over a generated list of 200,000 URLs, 99% of
them stored by an earlier run (rows put in the catalog directly: storing them through
a crawl would take minutes), the others answered by a download handler that makes each
answer in memory (no sockets: only the crawl's own structures grow). Every URL gets its
final line, and the process's RSS is taken as the 10,000th URL is fetched and as the
last one is.
"""

from __future__ import annotations

import psutil
import pytest
from scrapy.core.downloader.handlers.base import BaseDownloadHandler
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.actionlog import ActionLog, read
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.keys import request_key
from crawler.storage.runcounts import RunCounts
from crawler.storage.session import SessionConfig, StorageSession
from crawler.storage.store import StoreConfig
from extensions.storage.actions import ActionRecorder
from tests.crawls import crawl_site

MIB = 1 << 20
FIRST, LAST = 10_000, 200_000
FETCHED_EVERY = 100  # the URLs not stored: every 100th
# What 190,000 more final lines may add. Each key once cost a Python set entry (its
# hash, the set's table: 21 MiB of growth measured here); now it costs 2.5 to 5 bytes
# of Bloom filter and 32 bytes on disk (3.2 MiB of growth measured, the rest being the
# allocator's slack and Scrapy's own). 8 MiB: room for that, far under the set's.
GROWTH_MIB = 8

rss_at: dict[int, int] = {}


class AnswersInMemory(BaseDownloadHandler):
    """Answers every request 404 at once, without a socket; notes the process's RSS
    as it answers the FIRST-th and the last URL of the list."""

    async def download_request(self, request):
        n = int(request.url.rsplit("/", 1)[1])
        if n in (FIRST, LAST - FETCHED_EVERY):
            rss_at[n] = psutil.Process().memory_info().rss
        return HtmlResponse(request.url, status=404, body=b"gone", request=request)


def url(n: int) -> str:
    return f"http://h{n % 1000}.example/p/{n}"


def store_all_but_every(data_dir, every: int) -> None:
    """Catalog rows, as a run that stored them leaves them, for the URLs but every
    ``every``-th (in the order of crawler.storage.catalog.COLUMNS)."""
    data_dir.mkdir(parents=True)
    with Catalog(DataDir(data_dir).catalog_path) as catalog, catalog.transaction():
        catalog.upsert_values(
            [
                (request_key(url(n)), url(n), url(n), 200, "text/html", 4, None, None,
                 "2026-01-01T00:00:00.000000Z", "archive/a.warc.gz", n, 100, None, "GET", 0)
                for n in range(LAST)
                if n % every
            ]
        )  # fmt: skip


SETTINGS = {
    "DOWNLOAD_HANDLERS": {"http": f"{__name__}.AnswersInMemory"},
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "LOG_LEVEL": "ERROR",
}


@deferred_f_from_coro_f
async def test_rss_does_not_grow_with_the_list(tmp_path):
    data = tmp_path / "data"
    store_all_but_every(data, FETCHED_EVERY)
    crawler = await crawl_site([url(n) for n in range(LAST)], data, SETTINGS)
    stats = crawler.stats
    assert stats.get_value("actions/cache_hit") == LAST - LAST // FETCHED_EVERY
    assert stats.get_value("progress/list_done") == LAST
    growth = (rss_at[LAST - FETCHED_EVERY] - rss_at[FIRST]) / MIB
    print(f"RSS growth from {FIRST:,} to {LAST:,} URLs: {growth:.1f} MiB")
    assert growth < GROWTH_MIB


class OneHash(str):
    """A key whose Python hash is every other one's."""

    def __hash__(self) -> int:
        return 7


def test_keys_of_one_python_hash_each_get_their_final_line(tmp_path):
    session = StorageSession(SessionConfig(StoreConfig(tmp_path)))
    session.log = ActionLog(session.datadir.action_log_path)
    counts = RunCounts()
    actions = ActionRecorder(session, counts, fail=pytest.fail)
    urls = [f"http://example.org/{n}" for n in range(4)]
    keys = [OneHash(request_key(u)) for u in urls]
    assert len({hash(k) for k in keys}) == 1 and len(set(map(str, keys))) == 4
    actions.record_action(urls[0], keys[0], "error", error="HTTP 500")  # fetched
    actions.cache_hits(list(zip(urls[1:], keys[1:], strict=True)))  # skipped as stored
    actions.cache_hits(list(zip(urls, keys, strict=True)))  # met again: duplicates
    session.log.close()
    counts.close()
    lines = read(session.datadir.action_log_path)
    assert [(line["url"], line["outcome"]) for line in lines] == [
        (urls[0], "error"),
        *((u, "cache_hit") for u in urls[1:]),
    ]
