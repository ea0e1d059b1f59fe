"""Start requests from a URL list, with the stored URLs skipped before a Request exists.

    async def start(self):
        urls = UrlList(self.urls)
        async for request in listed_requests(self, urls, lambda url: scrapy.Request(url)):
            yield request

A resumed crawl of a list of millions spends its time on the URLs it skips. Building
a ``scrapy.Request`` for each (its URL escaping alone was half of the cost) and
passing it through the spider middlewares was most of that time, so the list is read
in batches here: each line is keyed with the key its request would get, the catalog
is asked once per batch, in a thread (``StoredPages.ask_listed``; ``skip_listed`` logs
and counts the cache hits), while the next batch is keyed, and requests are built only
for the rest, marked as checked so that the storage middlewares do not look them up
again.

Any spider of the project can use it; the ``site`` spider does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator

from scrapy import Request
from scrapy.exceptions import UsageError
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task, threads
from w3lib.url import safe_url_string

from crawler import signals as crawler_signals
from crawler.partition import PartitionError, check_mode, shard_of
from crawler.spiderkit.urls import UrlList, check_url
from crawler.storage.keys import plain_key, request_key

logger = logging.getLogger(__name__)

# Lines keyed and looked up at a time: one catalog query and one action-log write per
# batch, and the reactor runs between batches (a batch takes a few milliseconds).
BATCH = 2000


def listed_key(text: str) -> tuple[str, str | None, str | None]:
    """``(url, key, problem)`` of a list line: the URL a ``scrapy.Request`` built from
    it holds and that request's key (``request_key(scrapy.Request(text).url)``), or
    why the line is not a URL to fetch (``url`` is then ``text``, ``key`` None)."""
    key = plain_key(text)
    if key is not None:
        return text, key, None
    problem = check_url(text)
    if problem:
        return text, None, problem
    try:
        url = safe_url_string(text, "utf-8")  # what scrapy.Request does to it
    except ValueError as exc:
        return text, None, f"not a URL ({exc})"
    return url, request_key(url), None


async def listed_requests(
    spider,
    urls: UrlList,
    make: Callable[[str], Request],
    *,
    shard: tuple[int, int] | None = None,
    partition: str | None = None,
    skip_stored: bool = True,
    batch: int = BATCH,
    thread: bool = False,
) -> AsyncIterator[Request]:
    """The requests ``make(url)`` builds for the lines of ``urls`` that are not stored.

    ``skip_stored=False`` builds a request for every line (a depth crawl replays the
    stored start pages; a revalidating crawl fetches them again); they still carry
    their key, so that nothing keys them twice. ``shard``: only the lines that fall in
    shard I of N, split by ``partition`` (``domain``, ``host`` or ``url``; default the
    ``CRAWL_PARTITION`` setting, see ``crawler/partition.py``). Bad lines are logged with ``file:line``, counted
    (``SPIDER/bad_lines``) and written to the action log as errors.

    The next batch is keyed while the catalog is searched for this one. ``thread=True``:
    it is read and keyed in a thread instead, and handed over, so that a list on a
    slow pipe never holds up the reactor. Off by default: on a loaded 2-core machine
    it skipped slower and used more CPU (``benchmarks.bench_resume`` measures both);
    always on for a list whose batches block (``urls.blocking``: a job's work queue,
    leased from the hub).
    """
    from twisted.internet import reactor  # imported late: Scrapy installs it

    from extensions.storage import StorageExtension, looked_up  # the project's storage side

    crawler = spider.crawler
    archive = StorageExtension.of(crawler) if skip_stored else None
    try:
        mode = check_mode(partition or crawler.settings.get("CRAWL_PARTITION"))
    except PartitionError as exc:
        raise UsageError(str(exc)) from None
    batches = urls.batches(batch)
    thread = thread or getattr(urls, "blocking", False)
    pending = threads.deferToThread(_next_keyed, batches, shard, mode) if thread else None
    # A job's work queue: told of each batch gone through (the stored ones are done).
    gone_through = getattr(urls, "gone_through", None)

    async def keyed_in_thread():
        nonlocal pending
        keyed = await maybe_deferred_to_future(pending)
        if keyed is not None:
            pending = threads.deferToThread(_next_keyed, batches, shard, mode)
        return keyed

    keyed = await keyed_in_thread() if thread else _next_keyed(batches, shard, mode)
    while keyed is not None:
        listed, bad = keyed
        for number, text, problem in bad:
            _bad_line(spider, urls, number, text, problem)
        asked = archive.stored.ask_listed(listed) if archive is not None and listed else None
        if not thread:
            # Keyed here while the catalog is searched for this batch (SQLite lets go
            # of the GIL while it searches).
            keyed = _next_keyed(batches, shard, mode)
        if asked is None:
            # Let the reactor run (progress, stop signals, the counts) between batches.
            await maybe_deferred_to_future(task.deferLater(reactor, 0))
            stored = None
        else:
            stored = archive.stored.skip_listed(listed, await maybe_deferred_to_future(asked))
        skipped, kept = stored if stored is not None else ((), ())
        if gone_through is not None:
            whole = shard is None and all(key in skipped for _, key in listed)
            gone_through(stored is not None and whole)
        for url, key in listed:
            if key in skipped:
                continue
            request = make(url)
            meta = request.meta
            checked = stored is not None
            if request.url != url or request.method != "GET" or request.body:
                # Not the request that was looked up: its own key decides, looked up
                # by the storage middlewares.
                key = request_key(request.url, request.method, request.body)
                checked = False
            meta["catalog_key"] = key
            meta["catalog_url"] = request.url
            if checked:
                # Looked up with its batch: the middlewares need not ask again (a
                # stored one meets its row there, to be replayed).
                looked_up(request, key in kept)
            yield request
        if thread:
            keyed = await keyed_in_thread()


def _next_keyed(
    batches: Iterator[list[tuple[int, str, str | None]]],
    shard: tuple[int, int] | None,
    mode: str = "url",
) -> tuple[list[tuple[str, str]], list[tuple[int, str, str]]] | None:
    """The next batch as ``(url, key)`` of the lines to fetch (in the shard) and
    ``(line number, text, problem)`` of the bad ones; None at the end of the list."""
    entries = next(batches, None)
    if entries is None:
        return None
    listed: list[tuple[str, str]] = []
    bad: list[tuple[int, str, str]] = []
    for number, text, problem in entries:
        if problem is None:
            key = plain_key(text)
            if key is not None:  # most lines of most lists
                url = text
            else:
                url, key, problem = listed_key(text)
        if problem:
            bad.append((number, text, problem))
        elif shard is None or shard_of(url, key, mode, shard[1]) == shard[0]:
            listed.append((url, key))
    return listed, bad


def checked_lines(urls: UrlList) -> Iterator[tuple[int, str, str | None]]:
    """The entries of ``urls`` as a crawl checks them: ``(line number, text, problem)``,
    ``problem`` None for a URL a crawl fetches (``scrapy job create`` loads only those)."""
    for entries in urls.batches(BATCH):
        for number, text, problem in entries:
            if problem is None:
                problem = listed_key(text)[2]
            yield number, text, problem


def fetchable_lines(urls: UrlList, skipped: Callable[[str], None]) -> Iterator[str]:
    """The lines of ``urls`` a crawl would fetch (what a work queue is loaded with); each
    other line is told to ``skipped`` as the crawl tells it, ``Skipped line FILE:N: ...``."""
    for number, text, problem in checked_lines(urls):
        if problem:
            skipped(f"Skipped line {bad_line(urls, number, text, problem)}")
        else:
            yield text


def bad_line(urls: UrlList, number: int, text: str, problem: str) -> str:
    """What is said of a bad line: its file and number, why, and the line."""
    return f"{urls.name}:{number}: {problem}: {text[:200]!r}"


def _bad_line(spider, urls: UrlList, number: int, text: str, problem: str) -> None:
    message = bad_line(urls, number, text, problem)
    logger.warning("Skipped line %s", message)
    crawler = spider.crawler
    crawler.stats.inc_value(f"{spider.name}/bad_lines")
    crawler.signals.send_catch_log(
        crawler_signals.action, url=text, key=None, outcome="error", error=message
    )
