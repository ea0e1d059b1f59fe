"""The ``site`` spider: fetch a list of URLs, optionally following links.

    scrapy crawl site -a urls=urls.txt [-a depth=N] [-a revalidate=1] [-a render=1]
                                       [-a summaries=1]
    scrapy crawl site -s JOB=NAME      (the URLs of the job's work queue)

``-a render=1`` renders every page in a browser (middlewares/render.py).

A crawl fetches and stores; page summaries (``PageSummary`` items, the
``page_summary`` table) come from ``scrapy reparse site`` or ``--follow``, where the
spider is built with the ``REPARSING`` setting on, so that parsing never slows
fetching. ``-a summaries=1`` yields them at crawl time, through the pipelines.

Storage needs nothing from this spider: the project's middlewares store every
response and skip what is stored, for any spider of the project.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import scrapy
from scrapy import signals
from scrapy.exceptions import UsageError
from scrapy.http import HtmlResponse, TextResponse
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task
from twisted.internet.threads import deferToThread

from crawler.domains import registered_domain
from crawler.partition import PartitionError, check_mode
from crawler.spiderkit.parsers import hrefs, page_summary
from crawler.spiderkit.start import BATCH as START_BATCH
from crawler.spiderkit.start import listed_requests
from crawler.spiderkit.urls import UrlList, parse_shard
from crawler.spillset import SpillingMap, SpillingSet, temp_dir

if TYPE_CHECKING:
    from crawler.spiderkit.jobqueue import JobQueueUrls

logger = logging.getLogger(__name__)


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _spill_error(what: str):
    def error(action: str, exc: Exception) -> Exception:
        return OSError(
            f"site spider: cannot {action} the temporary database of {what} in "
            f"{temp_dir()} ({exc}); free space there or point SQLITE_TMPDIR elsewhere"
        )

    return error


class SiteSpider(scrapy.Spider):
    name = "site"
    # Breadth-first, so that a page is first met at its smallest depth.
    custom_settings = {
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    }
    # List lines keyed and looked up in the catalog at a time (crawler/spiderkit/start.py).
    start_batch = START_BATCH
    # Key the next batch in a thread while this one is looked up (see listed_requests).
    start_thread = False
    # A depth crawl's list domains held in memory; the rest in a temporary file.
    domains_in_memory = 100_000
    # A depth crawl's URLs whose depth is held in memory; the rest in a temporary file.
    depths_in_memory = 100_000

    def __init__(
        self,
        urls: str | None = None,
        depth: str = "0",
        revalidate: str = "0",
        shard: str | None = None,
        partition: str | None = None,
        render: str = "0",
        summaries: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.render = _flag(render)  # read by middlewares/render.py and addons/render.py
        # -a shard=I/N: only the listed URLs whose key falls in shard I of N (followed
        # links are not sharded).
        self.shard = parse_shard(shard)
        # -a partition=domain|host|url: how shards split the list; None: CRAWL_PARTITION.
        try:
            self.partition = check_mode(partition, "-a partition") if partition else None
        except PartitionError as exc:
            raise UsageError(str(exc)) from None
        try:
            self.depth = int(depth)
        except ValueError:
            raise UsageError(f"-a depth takes a whole number, not {depth!r}") from None
        if self.depth < 0:
            raise UsageError(f"-a depth takes a number of 0 or more, not {self.depth}")
        self.revalidate = _flag(revalidate)
        # None: decided in from_crawler (on when re-parsing, off when crawling).
        self.summaries: bool | None = None if summaries is None else _flag(summaries)
        # None: the work queue of the crawl's job (-s JOB=NAME), taken in from_crawler.
        self.url_list: UrlList | JobQueueUrls | None = UrlList(urls) if urls else None
        # The registered domains of the list (depth crawls only): links to others are
        # not followed. A list of millions of sites spills them to a temporary file.
        self.domains = SpillingSet(self.domains_in_memory, 8, _spill_error("the list's domains"))
        # Smallest depth each listed or followed URL was met at (depth crawls only):
        # concurrent downloads can meet a page deeper first, and its links must still be
        # followed when it is met again higher up, or the pages reached would depend on
        # timing. Spills too: a list of millions is millions of URLs at depth 0.
        self.depths = SpillingMap(self.depths_in_memory, 8, _spill_error("URL depths"))

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        # Checked before the spider opens its list: a refused crawl leaves nothing open.
        try:
            partition = check_mode(crawler.settings.get("CRAWL_PARTITION"))
        except PartitionError as exc:
            raise UsageError(str(exc)) from None
        spider = super().from_crawler(crawler, *args, **kwargs)
        if spider.partition is None:
            spider.partition = partition
        if spider.url_list is None:
            spider.url_list = spider._job_queue(crawler)
        if spider.summaries is None:
            spider.summaries = crawler.settings.getbool("REPARSING")
        if type(spider) is SiteSpider and not spider.summaries and not crawler.settings.frozen:
            # Its callbacks yield no items: no page waits for a report of its items
            # (one message to the writer per page spared), its row is committed as
            # it comes. Not for a subclass, whose callbacks may yield items; and a
            # -s CATALOG_ITEMS_ENABLED on the command line still wins.
            crawler.settings.set("CATALOG_ITEMS_ENABLED", False, priority="spider")
        return spider

    def _job_queue(self, crawler) -> JobQueueUrls:
        # The hub is imported only by a crawl of a job: every spider of the project
        # extends this one, and a crawl of a URL list or a re-parse has no use for it
        # (0.1 G instructions of a process's start-up under callgrind).
        from crawler.hub.db import hub_url
        from crawler.hub.workqueue import unit_holders
        from crawler.spiderkit.jobqueue import JobQueueUrls
        from crawler.storage.datadir import DataDir

        job = crawler.settings.get("JOB") or os.environ.get("HUB_JOB")
        if not job:
            raise UsageError(
                "give the URL list: -a urls=PATH (one URL per line; - reads standard "
                "input), or -s JOB=NAME to crawl a job's work queue"
            )
        holders = unit_holders(crawler.settings)
        queue = JobQueueUrls(
            hub_url(crawler.settings, required=True),
            job,
            holders,
            crawler.settings.getint("WORK_MAX_ATTEMPTS"),
        )

        def lost(batches) -> None:
            for batch, keys in batches:
                queue.lost_keys |= keys
                crawler.stats.inc_value("work/leases_lost")
                logger.warning(
                    "Lease of batch %d (%s) was lost: it expired and another holder took "
                    "it over; its %d URLs are not fetched here any more",
                    batch.lease_id,
                    batch.unit or "any URLs",
                    len(batch.urls),
                )

        # Hub calls block: in a thread, the loop waiting for each before the next.
        renewing = task.LoopingCall(lambda: deferToThread(queue.renew).addCallback(lost))

        log = DataDir.from_settings(crawler.settings).action_log_path
        since = [0]  # this run's lines start there

        def opened() -> None:
            since[0] = log.stat().st_size if log.exists() else 0
            renewing.start(queue.ttl / 3, now=False)

        async def stopped() -> None:
            # Once the storage has drained and committed: a batch is done only when
            # the crawl finished and stored it (what `scrapy crawl` exits 0 for).
            if renewing.running:
                renewing.stop()
            stats = crawler.stats
            ok = stats.get_value("finish_reason") == "finished" and not stats.get_value(
                "archive/error"
            )
            await maybe_deferred_to_future(deferToThread(queue.finish, ok, log, since[0]))

        crawler.signals.connect(opened, signal=signals.spider_opened, weak=False)
        crawler.signals.connect(stopped, signal=signals.engine_stopped, weak=False)
        return queue

    async def start(self):
        from crawler.spiderkit.jobqueue import JobQueueUrls

        if isinstance(self.url_list, JobQueueUrls):
            pending = await maybe_deferred_to_future(deferToThread(self.url_list.pending))
            self.crawler.stats.set_value("progress/list_total", pending)
        elif self.url_list.path != "-":
            deferToThread(self.url_list.count).addCallback(
                lambda n: self.crawler.stats.set_value("progress/list_total", n)
            )
        # Stored URLs are skipped before a request is built for them, unless their
        # pages are needed again: replayed for their links (depth), or revalidated.
        skip = not self.depth and not self.revalidate
        async for request in listed_requests(
            self,
            self.url_list,
            self._start_request,
            shard=self.shard,
            partition=self.partition,
            skip_stored=skip,
            batch=self.start_batch,
            thread=self.start_thread,
        ):
            yield request

    def closed(self, reason: str) -> None:
        self.domains.close()
        self.depths.close()

    def _start_request(self, url: str) -> scrapy.Request:
        if self.depth:
            self.domains.add(registered_domain(urlsplit(url).hostname))
            self.depths[url] = 0
        return scrapy.Request(url, callback=self.parse, meta={"catalog_replay": self.depth > 0})

    def parse(self, response):
        # Not a generator function: for one, Scrapy reads the callback's source to warn
        # of a `return value`, and its cache of the answer is keyed weakly by the bound
        # method, so it forgets it whenever the request holding that one is gone (up to
        # 0.4 ms a page, at random; the history of docs/benchmarks.md).
        if self.summaries and isinstance(response, HtmlResponse):
            return self._summary_and_links(response)
        if self.depth:
            return self.follow_links(response)
        return ()

    def _summary_and_links(self, response: HtmlResponse) -> Iterator:
        yield page_summary(response)
        yield from self.follow_links(response)

    def follow_links(self, response) -> Iterator[scrapy.Request]:
        depth = response.meta.get("depth", 0)
        if depth >= self.depth or not isinstance(response, TextResponse):
            return
        replay = depth + 1 < self.depth
        for href in hrefs(response):
            url = response.urljoin(href.strip()).split("#", 1)[0]
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                continue
            if registered_domain(parts.hostname) not in self.domains:
                continue
            met = self.depths.get(url)
            if met is not None and met <= depth + 1:
                continue
            self.depths[url] = depth + 1
            yield scrapy.Request(
                url,
                callback=self.parse,
                meta={"catalog_replay": replay},
                # Met again, higher up: the dupefilter would drop it.
                dont_filter=met is not None,
            )
