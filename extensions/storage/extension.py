"""The crawl's storage: :class:`StorageExtension` owns the run's data directory.

It opens the :class:`~crawler.storage.session.StorageSession` when the spider opens
(lock, repair, catalog, action log, archive writer process; the run's settings to
``runs.jsonl``), watches the writer process, and closes the session at the end with
its summary; it hands the run's counts to the stats once a second, and stops the
crawl, once, when storing fails.

What the crawl does with the session is its parts' work, which the other components
reach through it, never each other:

- ``actions`` (:class:`~extensions.storage.actions.ActionRecorder`): the one writer of
  the action log in the crawl's process, and the counts of its lines;
- ``stored`` (:class:`~extensions.storage.stored.StoredPages`): which requests' pages
  are stored and parsed; stored start requests and listed URLs dropped in batches
  (``middlewares/resume.py``, ``crawler.spiderkit.start``);
- ``waits`` (:class:`~extensions.storage.waits.RowWaits`): a request for a key this
  run is still fetching or storing waits for its row, so that a URL is fetched once;
- ``archiver`` (:class:`~extensions.storage.archiving.Archiver`): answers to the
  writer, stored answers replayed (``middlewares/archive.py``, the media pipelines).

What becomes of a stored request is the policy's word (``ARCHIVE_POLICY``,
``extensions/archive_policy.py``).
"""

from __future__ import annotations

import logging

from scrapy import signals
from scrapy.exceptions import CloseSpider, NotConfigured, UsageError
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet import task

from crawler import signals as crawler_signals
from crawler.hub.db import hub_url
from crawler.runsettings import crawl_settings
from crawler.storage.errors import CatalogError, SettingError, StoreError
from crawler.storage.runcounts import RunCounts, error_causes, outcomes_line
from crawler.storage.session import SessionConfig, StorageSession
from extensions.archive_policy import ArchivePolicy
from extensions.storage.actions import ActionRecorder
from extensions.storage.archiving import Archiver
from extensions.storage.stored import StoredPages
from extensions.storage.waits import RowWaits

logger = logging.getLogger(__name__)
# How often counts kept here reach the stats.
COUNTS_SECONDS = 1.0


class StorageExtension:
    """Owns the run's storage session: opens it with the spider, watches the writer
    process, closes it with the run's summary, and stops the crawl once when storing
    fails."""

    def __init__(self, crawler):
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off")
        self.crawler = crawler
        self.stats = crawler.stats
        try:
            self.config = SessionConfig.from_settings(crawler.settings)
        except SettingError as exc:
            # A usage error: `scrapy crawl` prints its one line and exits 2.
            raise UsageError(str(exc)) from None
        policy = load_object(crawler.settings.get("ARCHIVE_POLICY") or ArchivePolicy)
        self.policy: ArchivePolicy = build_from_crawler(policy, crawler, self.config.store_statuses)
        self.session = StorageSession(self.config)
        # What runs.jsonl records of this run, as plain text: the storage core takes
        # no Scrapy settings. `scrapy shell` stores pages but is no run of a spider.
        self.run_settings = None
        self.run_arguments = crawler.settings.getdict("SPIDER_ARGUMENTS")
        if crawler.settings.getbool("ARCHIVE_RUNS_LOG", True):
            self.run_settings = crawl_settings(
                crawler.settings.copy_to_dict().items(), hub_url(crawler.settings)
            )
        self.counts = RunCounts()
        self._pusher = task.LoopingCall(self._push_counts)
        self.actions = ActionRecorder(self.session, self.counts, self._fail)
        self.stored = StoredPages(self.session, self.policy, self.actions)
        # A commit comes at least every CATALOG_FLUSH_SECONDS.
        settle_seconds = 2 * self.config.store.flush_seconds + 10
        self.waits = RowWaits(self.session, self.counts, settle_seconds)
        self.archiver = Archiver(self.session, self.policy, self.actions, self.waits, self._fail)
        self._failed = False
        self.storing = False  # the writer has opened the store

    @classmethod
    def from_crawler(cls, crawler) -> StorageExtension:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.actions.on_signal, signal=crawler_signals.action)
        crawler.signals.connect(ext.actions.request_dropped, signal=signals.request_dropped)
        return ext

    @classmethod
    def of(cls, crawler) -> StorageExtension | None:
        """The crawl's storage extension (None when ARCHIVE_ENABLED is off)."""
        try:
            return crawler.get_extension(cls)
        except RuntimeError:  # asked before Scrapy built the extensions
            return None

    def rows_pending(self) -> int:
        """Rows handed to the writer that it has not reported committed yet: the run's
        storage lag (a commit comes every CATALOG_BATCH_SIZE rows or
        CATALOG_FLUSH_SECONDS)."""
        writer = self.session.writer
        if writer is None:
            return 0
        return max(self.counts.rows_sent - writer.rows_committed, 0)

    @property
    def last_error(self) -> tuple[float, str, str] | None:
        """The run's last error line: (time, URL, what it says)."""
        return self.actions.last_error

    # -- life cycle ----------------------------------------------------------------

    def start_writer(self) -> None:
        """Start the archive writer process, so that it loads while Scrapy starts up
        (the downloader middleware calls it as the engine is built); it opens the
        store in spider_opened, once the data directory is recovered."""
        self.session.start_writer(on_commit=self._committed)

    def spider_opened(self, spider) -> None:
        self.policy.spider_opened(spider)
        self.stored.spider_name = spider.name
        self.start_writer()
        datadir = self.session.datadir
        try:
            recovery = self.session.open(spider.name, self.run_settings, self.run_arguments)
        except (StoreError, CatalogError, OSError) as exc:
            self._fail(f"cannot open the data directory {datadir.root}: {exc}")
            # The engine is not running yet: this stops it before its first request
            # (robots.txt included).
            raise CloseSpider("storage_error") from None
        if recovery.indexed_rows:
            self.stats.set_value("catalog/recovered_rows", recovery.indexed_rows)
        self.stored.open()
        self.storing = True
        self._watch_writer(True)
        self._pusher.start(COUNTS_SECONDS, now=False)
        logger.info("Storing in %s (catalog %s)", datadir.root, datadir.catalog_path)

    def spider_closed(self, spider=None, reason: str = "finished") -> None:
        self.close()

    def close(self) -> None:
        """Drain the writer, commit, release the data directory; log the summary."""
        if self._pusher.running:
            self._pusher.stop()
        self._push_counts()
        self.storing = False
        self.stored.close()
        self._watch_writer(False)
        try:
            summary = self.session.close()
        except StoreError as exc:
            self._fail(f"The archive writer failed: {exc}")
            summary = None
        self.waits.wake()  # waiters find no catalog: their requests are fetched
        self.counts.unchanged(*self.session.unchanged())  # the last commit's
        self._push_counts()
        self.counts.close()
        for name, mib in self.session.peak.items():
            self.stats.set_value(f"process/{name}", mib)  # process/peak_rss_mib...
        if self.session.recovery is None:
            return  # it never opened: its error said it all
        logger.info("%s", self.outcomes())
        parsed = self.stats.get_value("items/stored_pages_parsed")
        if parsed:
            logger.info("Parsed %d stored pages from the archive for their items", parsed)
        if summary:
            self.stats.set_value("catalog/rows_committed", summary["rows_committed"])
            # What storing cost besides the crawl's own process (benchmarks read it).
            self.stats.set_value("archive/writer_cpu_seconds", round(summary["cpu_seconds"], 3))
            logger.info("%s", self.session.summary(summary).text())

    def outcomes(self) -> str:
        """The run's outcomes so far, as its end summary says them."""
        # What was committed, once the writer failed: the rest is fetched again.
        failed = self._failed and self.session.writer is None
        committed = self.session.rows_committed if failed else None
        causes = error_causes(self.stats.get_stats())
        return outcomes_line(self.stats.get_value, committed, causes)

    def _fail(self, message: str) -> None:
        """Log a storage failure once; the crawl stops and exits 1 (``archive/error``)."""
        if self._failed:
            return
        self._failed = True
        logger.error("%s", message)
        self.stats.set_value("archive/error", message)
        engine = self.crawler.engine
        if engine is not None and engine.spider is not None and engine.running:
            deferred_from_coro(engine.close_spider_async(reason="storage_error"))

    # -- the writer process and the counts ----------------------------------------------

    def _committed(self) -> None:
        self.counts.unchanged(*self.session.unchanged())
        self.waits.committed()

    def _push_counts(self) -> None:
        for name, count in self.counts.drain().items():
            self.stats.inc_value(name, count)
        if self.storing:
            self._check_writer()

    def _watch_writer(self, on: bool) -> None:
        """Read the writer's replies (commits, errors) as they come."""
        from twisted.internet import reactor

        watcher = self.session.writer_watcher(self._check_writer)
        if watcher is not None:
            (reactor.addReader if on else reactor.removeReader)(watcher)

    def _check_writer(self) -> None:
        try:
            self.session.check()
        except StoreError as exc:
            self._watch_writer(False)
            self._fail(f"The archive writer failed: {exc}")
