"""``scrapy reparse SPIDER --follow``: parse each page a running crawl commits.

A crawl appends every page whose row it commits to the page log (``_page_log``, in
the row's own transaction). The follower reads the log after its saved position,
parses those pages on every core, and writes their items together with its new
position (``_follow_progress``) in one transaction: stopped, restarted or killed, it
neither misses nor repeats a page. It stops on SIGINT/SIGTERM after the batch in
hand, or, with ``until_idle``, once the data directory is not locked by a crawl and
nothing new was logged for that many seconds.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from crawler.reparse.plan import ReparseConfig, plan
from crawler.reparse.runner import Problem, Reparser, init_worker, run_in_worker
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.items import ItemTableWriter

logger = logging.getLogger(__name__)

BATCH_PAGES = 1000


@dataclass
class FollowSummary:
    pages: int = 0
    items: int = 0
    batches: int = 0
    stats: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"Followed the crawl: {self.pages:,} pages parsed into {self.items:,} items "
            f"in {self.batches:,} batches",
            f"errors: {self.stats['reparse/errors/corrupt']:,} corrupt records, "
            f"{self.stats['reparse/errors/callback']:,} callback exceptions, "
            f"{self.stats['reparse/errors/item']:,} items not stored",
        ]


class Follow:
    def __init__(self, config: ReparseConfig, until_idle: float | None = None, poll: float = 0.5):
        self.config = config
        self.until_idle = until_idle
        self.poll = poll
        self.datadir = DataDir(config.data_dir)
        self.stopping = False

    def stop(self, *_args) -> None:
        self.stopping = True

    def run(self) -> FollowSummary:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.stop)
        config = self.config
        init = (config.spider, config.callback, config.spider_args, config.settings, True)
        Reparser(*init)  # fail fast on a bad spider or callback
        workers = config.worker_count
        summary = FollowSummary()
        writer = ItemTableWriter(self.datadir.catalog_path)
        ctx = multiprocessing.get_context("spawn")
        # The workers ignore the signals: the parent finishes its batch, then stops them.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        pool = ctx.Pool(workers, initializer=init_worker, initargs=init)
        signal.signal(signal.SIGINT, previous)
        try:
            self._loop(writer, pool, summary)
        finally:
            pool.terminate()
            pool.join()
            writer.close()
        return summary

    def _loop(self, writer: ItemTableWriter, pool, summary: FollowSummary) -> None:
        position = writer.follow_position(self.config.spider)
        idle_since = time.monotonic()
        while not self.stopping:
            logged = writer.logged_rows(position, BATCH_PAGES)
            if not logged:
                if self._idle_done(idle_since):
                    return
                time.sleep(self.poll)
                continue
            pages, position = self._parse(pool, logged, summary)
            summary.items += writer.write(pages, (self.config.spider, position, len(logged)))
            summary.pages += len(logged)
            summary.batches += 1
            idle_since = time.monotonic()

    def _idle_done(self, idle_since: float) -> bool:
        if self.until_idle is None:
            return False
        if not self.datadir.is_free():  # a crawl holds the data directory
            return False
        return time.monotonic() - idle_since >= self.until_idle

    def _parse(self, pool, logged: list[tuple[int, str]], summary: FollowSummary):
        """Parse one batch of logged pages; returns their PageItems and the last seq."""
        keys = [key for _, key in logged]
        with Catalog(self.datadir.catalog_path, readonly=True) as catalog:
            rows = []
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                rows += catalog.rows(f"key IN ({', '.join('?' * len(chunk))})", chunk)
        rows.sort(key=lambda row: (row.archive, row.offset))
        tasks = list(plan(rows, self.datadir.root, self.config.chunk_rows))
        for task in tasks:
            # A file still written to has its .open name.
            task.path = str(self.datadir.resolve(os.path.relpath(task.path, self.datadir.root)))
        pages = []
        for result in pool.imap(run_in_worker, tasks):
            summary.stats.update(result.stats)
            for problem in result.problems:
                summary.problems.append(problem)
                logger.error("%s", problem.message)
            pages += result.pages
        return pages, logged[-1][0]
