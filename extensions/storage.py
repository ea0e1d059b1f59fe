"""The crawl's storage: :class:`StorageExtension` owns the run's data directory.

It opens the :class:`~crawler.storage.session.StorageSession` when the spider opens
(lock, repair, catalog, action log, archive writer process; the run's settings to
``runs.jsonl``) and closes it at the end with its summary; it keeps the counters
(``actions/<outcome>``, ``archive/stored``...) and adds them to the stats once a
second; it is the one writer of the action log in the crawl's process, behind one
failure guard (the writer process logs ``ok`` once a row is committed); and it stops
the crawl, once, when storing fails.

The other components use its public API, never each other: the downloader
middleware (``middlewares/archive.py``) looks up, replays and stores through it,
``middlewares/resume.py`` and ``crawler.spiderkit.start`` skip stored start requests
in batches (:meth:`StorageExtension.filter_start`, :meth:`StorageExtension.skip_stored`),
``middlewares/items.py`` reports a page's items, ``scrapy shell`` closes it. What
becomes of a stored request is the policy's word (``ARCHIVE_POLICY``,
``extensions/archive_policy.py``).

A request for a key this run is still fetching or storing waits for its row
(:meth:`StorageExtension.wait_for_row`): the archive writer reports each commit and
the waiters look again then, so that a URL is fetched once.
"""

from __future__ import annotations

import logging
import os
import time

from scrapy import Request, signals
from scrapy.exceptions import CloseSpider, IgnoreRequest, NotConfigured, UsageError
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet import defer, task

from crawler import signals as crawler_signals
from crawler.hub.db import hub_url
from crawler.reparse.responses import build_response
from crawler.runsettings import crawl_settings
from crawler.storage.actionlog import NOT_FINAL, OUTCOMES, Outcome
from crawler.storage.errors import CatalogError, SettingError, StoreError
from crawler.storage.items import parsed_keys
from crawler.storage.keys import request_key
from crawler.storage.records import Fetch, Row
from crawler.storage.session import SessionConfig, StorageSession
from crawler.storage.unsettled import UnsettledKeys
from extensions.archive_policy import ArchivePolicy, Decision

logger = logging.getLogger(__name__)
# How often counts kept here reach the stats.
COUNTS_SECONDS = 1.0
# Response flag of an answer replayed from the archive.
CACHED_FLAG = "cached"


class CachedRequest(IgnoreRequest):
    """The request's answer is already stored."""


def catalog_key(request: Request) -> str:
    """The request's catalog key, kept on its meta with the URL it was listed as."""
    meta = request.meta
    key = meta.get("catalog_key")
    if key is None:
        key = meta["catalog_key"] = request_key(request.url, request.method, request.body)
        meta["catalog_url"] = request.url
    return key


def looked_up(request: Request, stored: bool) -> None:
    """Note on ``request`` that its key was looked up (``catalog_checked``) and whether
    it was stored (``catalog_cached``): one not stored is not looked up again."""
    request.meta["catalog_checked"] = True
    request.meta["catalog_cached"] = stored


def unstored(request: Request) -> bool:
    """Whether ``request`` was looked up and found not stored (see :func:`looked_up`)."""
    meta = request.meta
    return bool(meta.get("catalog_checked")) and not meta.get("catalog_cached")


class StorageExtension:
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
        # ARCHIVE_DEDUP: a refetched payload equal to its key's stored one is a revisit.
        self._dedup = self.config.store.dedup != "off"
        # What runs.jsonl records of this run, as plain text: the storage core takes
        # no Scrapy settings. `scrapy shell` stores pages but is no run of a spider.
        self.run_settings = None
        self.run_arguments = crawler.settings.getdict("SPIDER_ARGUMENTS")
        if crawler.settings.getbool("ARCHIVE_RUNS_LOG", True):
            self.run_settings = crawl_settings(
                crawler.settings.copy_to_dict().items(), hub_url(crawler.settings)
            )
        # Per-response counts are kept here and added to the stats once a second (and
        # at the end): Scrapy's stats collector hooks every attribute access, which
        # cost more per response than counting here (docs/benchmarks.md).
        self._counts: dict[str, int] = {}
        self._pusher = task.LoopingCall(self._push_counts)
        # Keys fetched or stored by this run but not yet committed, and the requests
        # waiting for their rows (a commit comes at least every CATALOG_FLUSH_SECONDS).
        self._unsettled = UnsettledKeys()
        self._waiting: dict[str, list[defer.Deferred]] = {}
        self._wake_call = None
        self._settle_seconds = 2 * self.config.store.flush_seconds + 10
        self._failed = False
        self._log_failed = False
        self.storing = False  # the writer has opened the store
        self.spider_name = ""
        # Keys with a final line in this run's action log (as hashes: a resumed list
        # of millions adds one each), so that a URL met again is counted as a
        # duplicate (``catalog/duplicates``) instead of logged a second time.
        self._finished: set[int] = set()
        # What the writer had found unchanged at the last count (session.unchanged()).
        self._unchanged = (0, 0)
        # Rows handed to the writer (fetches stored, 304s refreshed, records made): those
        # it has not reported committed are the run's storage lag (rows_pending()).
        self._rows_sent = 0
        # The run's last error line: (time, URL, what it says), for the live views.
        self.last_error: tuple[float, str, str] | None = None

    @classmethod
    def from_crawler(cls, crawler) -> StorageExtension:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext._on_action_signal, signal=crawler_signals.action)
        crawler.signals.connect(ext.request_dropped, signal=signals.request_dropped)
        return ext

    @classmethod
    def of(cls, crawler) -> StorageExtension | None:
        """The crawl's storage extension (None when ARCHIVE_ENABLED is off)."""
        try:
            return crawler.get_extension(cls)
        except RuntimeError:  # asked before Scrapy built the extensions
            return None

    # -- life cycle ----------------------------------------------------------------

    def start_writer(self) -> None:
        """Start the archive writer process, so that it loads while Scrapy starts up
        (the downloader middleware calls it as the engine is built); it opens the
        store in spider_opened, once the data directory is recovered."""
        self.session.start_writer(on_commit=self._committed)

    def spider_opened(self, spider) -> None:
        self.policy.spider_opened(spider)
        self.spider_name = spider.name
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
        self._watch_writer(False)
        try:
            summary = self.session.close()
        except StoreError as exc:
            self._fail(f"The archive writer failed: {exc}")
            summary = None
        self._wake()  # waiters find no catalog: their requests are fetched
        self._count_unchanged()  # those of the last commit, from the writer's summary
        self._push_counts()
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
        get = self.stats.get_value
        counts = ", ".join(f"{get(f'actions/{outcome}', 0):,} {outcome}" for outcome in OUTCOMES)
        if self._failed and self.session.writer is None:
            # What was committed, not what was fetched: the rest is fetched again.
            counts = (
                f"storage failed, {self.session.rows_committed:,} rows committed "
                f"(of {get('actions/ok', 0):,} fetched ok: the next run indexes the others "
                "from the archive, or fetches them again), " + counts.split(", ", 1)[1]
            )
        total = get("progress/list_total")
        done = f"{get('progress/list_done', 0):,}" + (f" of {total:,}" if total else "")
        duplicates = f"{get('catalog/duplicates', 0):,} duplicates (URLs met again)"
        return f"Outcomes of this run: {counts}; {duplicates}; listed URLs done: {done}."

    def rows_pending(self) -> int:
        """Rows handed to the writer that it has not reported committed yet: the run's
        storage lag (a commit comes every CATALOG_BATCH_SIZE rows or
        CATALOG_FLUSH_SECONDS)."""
        writer = self.session.writer
        if writer is None:
            return 0
        return max(self._rows_sent - writer.rows_committed, 0)

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

    # -- the action log and the counters -----------------------------------------------

    def _on_action_signal(self, signal=None, sender=None, **kwargs) -> None:
        self.record_action(**kwargs)

    def record_action(
        self, url: str, key: str | None, outcome: str, depth: int = 0, **fields
    ) -> None:
        """One line of the action log, counted (``actions/<outcome>``)."""
        if key is not None and outcome not in NOT_FINAL:
            self._finished.add(hash(key))
        if outcome == Outcome.ERROR:
            said = fields.get("error") or f"HTTP {fields.get('status')}"
            self.last_error = (time.time(), url, str(said))
        self._count(outcome, depth)
        log = self.session.log
        if log is not None:
            self._append(log.write, url, key, outcome, **fields)

    def record(self, request: Request, outcome: Outcome, **fields) -> None:
        """The final (or retried) outcome of one attempt of ``request``."""
        crawler_signals.mark_final(request, outcome)
        self.record_action(outcome=outcome, **self._fields(request, **fields))

    def _cache_hits(self, hits: list[tuple[str, str]]) -> None:
        """``(url, key)`` of stored requests skipped: logged in one write, counted."""
        if not hits:
            return
        listed = len(hits)
        hits = [hit for hit in hits if self.first_sight(hit[1])]
        self._inc("progress/list_done", listed)
        if len(hits) < listed:
            self._inc("catalog/duplicates", listed - len(hits))
        if not hits:
            return
        self._append(self.session.log.write_cache_hits, hits)
        for name in ("catalog/cache_hits", "actions/cache_hit"):
            self._inc(name, len(hits))

    def first_sight(self, key: str) -> bool:
        """Whether ``key`` has no final line in this run's log yet; it has one now."""
        hashed = hash(key)
        if hashed in self._finished:
            return False
        self._finished.add(hashed)
        return True

    def seen(self, key: str) -> bool:
        """Whether ``key`` has its final line in this run's log."""
        return hash(key) in self._finished

    def duplicate(self, request: Request) -> None:
        """``request`` is for a key this run has logged already: counted, not logged."""
        crawler_signals.mark_final(request, Outcome.CACHE_HIT)
        self._inc("catalog/duplicates")
        if request.meta.get("depth", 0) == 0:
            self._inc("progress/list_done")

    def request_dropped(self, request: Request, spider=None) -> None:
        # Dropped by the duplicate filter: a URL met again (a duplicate list line).
        if "catalog_key" in request.meta:
            self.duplicate(request)

    def _append(self, write, *args, **kwargs) -> None:
        """The one way to the action log: after a failure (a full disk would fail every
        write), one message and no more writes."""
        if self._log_failed:
            return
        try:
            write(*args, **kwargs)
        except OSError as exc:
            self._log_failed = True
            self._fail(
                f"writing the action log {self.session.datadir.action_log_path} failed: "
                f"{exc.strerror or exc}; rows committed so far are intact, the next run "
                "repairs the log and resumes"
            )

    def _inc(self, name: str, count: int = 1) -> None:
        counts = self._counts
        counts[name] = counts.get(name, 0) + count

    def _count(self, outcome: str, depth: int) -> None:
        self._inc(f"actions/{outcome}")
        if outcome not in NOT_FINAL and depth == 0:
            self._inc("progress/list_done")

    def _push_counts(self) -> None:
        counts, self._counts = self._counts, {}
        for name, count in counts.items():
            self.stats.inc_value(name, count)
        if self.storing:
            self._check_writer()

    def _fields(self, request: Request, **fields) -> dict:
        meta = request.meta
        if "download_latency" in meta and "elapsed_ms" not in fields:
            fields["elapsed_ms"] = meta["download_latency"] * 1000
        if meta.get("proxy_label"):
            fields["proxy"] = meta["proxy_label"]
        return {**crawler_signals.attempt_fields(request), **fields}

    # -- stored requests -----------------------------------------------------------------

    def lookup(self, key: str) -> Row | None:
        return self.session.lookup(key)

    def filter_start(self, requests: list[Request]) -> list[Request]:
        """Drop the stored ones among a batch of start requests, with one query
        (those checked already, by ``crawler.spiderkit.start``, pass as they are)."""
        if self.session.catalog is None:
            return requests
        unchecked = [r for r in requests if not r.meta.get("catalog_checked")]
        if not unchecked:
            return requests
        present = self.session.present([catalog_key(r) for r in unchecked])
        parsed = self.parsed(present)
        out = []
        hits = []
        for request in requests:
            meta = request.meta
            if meta.get("catalog_checked"):
                out.append(request)
                continue
            key = meta["catalog_key"]
            cached = key in present
            looked_up(request, cached)
            if cached and self.policy.when_stored(meta, parsed=key in parsed) is Decision.SKIP:
                # The hot path of a resumed crawl: logged and counted once per batch.
                hits.append((meta.get("catalog_url", request.url), key))
            else:
                out.append(request)
        self._cache_hits(hits)
        return out

    def skip_stored(self, listed: list[tuple[str, str]]) -> tuple[set[str], set[str]] | None:
        """Of a batch of listed ``(url, key)`` (the URL and key of the GET request a
        spider would build), the keys that are stored, as ``(skipped, kept)``: the
        skipped ones are logged as cache hits and counted here, so that no request is
        built for them; the kept ones are stored pages the policy replays. None when
        nothing may be skipped here (no catalog open, or the policy does not skip a
        plain request): build them all."""
        if self.session.catalog is None or self.policy.when_stored({}) is not Decision.SKIP:
            return None
        present = self.session.present([key for _, key in listed])
        parsed = self.parsed(present)
        kept = {
            key
            for key in present
            if self.policy.when_stored({}, parsed=key in parsed) is not Decision.SKIP
        }
        skipped = present - kept
        if skipped:
            self._cache_hits([(url, key) for url, key in listed if key in skipped])
        return skipped, kept

    def parsed(self, keys: set[str] | list[str]) -> set[str]:
        """The ones among stored ``keys`` whose items of this spider are stored; all of
        them when the policy does not parse stored pages (nothing to ask)."""
        if not keys or not self.policy.parse_stored:
            return set(keys)
        return parsed_keys(self.session.catalog.conn, self.spider_name, list(keys))

    def parsing_stored(self) -> None:
        """A stored page replayed for this spider's items."""
        self._inc("items/stored_pages_parsed")

    def cache_hit(self, request: Request) -> None:
        """A stored request skipped or replayed: logged and counted (once a run)."""
        if self.seen(catalog_key(request)):
            self.duplicate(request)
            return
        self._inc("catalog/cache_hits")
        self.record(request, Outcome.CACHE_HIT)

    def replay(self, request: Request, row: Row) -> Response | None:
        """The stored answer to ``request``; None when it cannot be read (counted in
        ``archive/read_errors``), which callers treat as not stored."""
        stored = self.session.replay(row)
        if stored is None:
            self._inc("archive/read_errors")
            return None
        self._inc("archive/replayed")
        return build_response(stored, request, flags=[CACHED_FLAG])

    # -- keys in flight --------------------------------------------------------------------

    def fetching(self, key: str) -> None:
        """``key`` is being fetched: a request for it waits for its row."""
        self._unsettled.fetching(key)

    def in_flight(self, key: str) -> bool:
        return key in self._unsettled

    async def wait_for_row(self, key: str) -> Row | None:
        """The row of a key this run is fetching or storing, once the writer commits
        it; None when its fetch stored nothing, or after a while."""
        from twisted.internet import reactor

        self._inc("catalog/waits_for_writer")
        deadline = time.monotonic() + self._settle_seconds
        row = None
        while row is None and key in self._unsettled and self.session.catalog is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            woken = defer.Deferred()
            self._waiting.setdefault(key, []).append(woken)
            woken.addTimeout(left, reactor)
            try:
                await maybe_deferred_to_future(woken)
            except defer.TimeoutError:
                break
            if self.session.catalog is not None:
                row = self.session.lookup(key)
        return row

    def _committed(self) -> None:
        self._count_unchanged()
        # Called while the writer's replies are read, maybe in the middle of a send:
        # the waiters run on their own turn of the reactor.
        if self._waiting and self._wake_call is None:
            from twisted.internet import reactor

            self._wake_call = reactor.callLater(0, self._wake)

    def _wake(self, key: str | None = None) -> None:
        """Wake the requests waiting for ``key`` (for every key: after a commit)."""
        if key is None:
            self._wake_call = None
            waiting, self._waiting = self._waiting, {}
            woken = [d for ds in waiting.values() for d in ds]
        else:
            woken = self._waiting.pop(key, [])
        for d in woken:
            if not d.called:
                d.callback(None)

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

    # -- storing -------------------------------------------------------------------------

    def store(self, request: Request, fetch: Fetch, stored: Row | None = None) -> None:
        """Hand an answer to the writer; it logs ``ok`` once the row is committed, or
        ``unchanged`` when the payload is the one of the key's ``stored`` row (kept as
        a revisit of it). The writer compares the digests, with the one it computes
        for the record anyway: this thread hashes no body. The answer is counted
        ``ok`` here, and moved to ``unchanged`` when the writer says so
        (:meth:`_count_unchanged`)."""
        size = len(fetch.body)
        action = self._fields(
            request, outcome=Outcome.OK, status=fetch.status, bytes=size, ts=time.time()
        )
        depth = action.pop("depth")
        try:
            self.session.put(fetch, action, self._may_be_unchanged(fetch, stored))
        except StoreError as exc:
            self.failed(request, status=fetch.status, error=f"not stored: {exc}")
            self._fail(str(exc))
            return
        crawler_signals.mark_final(request, Outcome.OK)
        self._rows_sent += 1
        self._finished.add(hash(fetch.key))
        self._unsettled.stored(fetch.key)
        self._inc("archive/stored")
        self._inc("archive/stored_bytes", size)
        self._count(Outcome.OK, depth)

    def _may_be_unchanged(self, fetch: Fetch, stored: Row | None) -> Row | None:
        """``stored`` when ``fetch`` may bring the very payload its record holds (the
        writer compares the digests), else None. A row of another data directory
        (CATALOG_SEEN: its ``archive`` is absolute) is never referred to: this one's
        archive would not hold it."""
        if (
            stored is None
            or not self._dedup
            or stored.status != fetch.status
            or stored.rendered
            or fetch.rendered_body is not None
            or not stored.payload_digest
            or os.path.isabs(stored.archive)
        ):
            return None
        return stored

    def _count_unchanged(self) -> None:
        """Move the answers the writer found unchanged since the last call from the
        ``ok`` counters to the ``unchanged`` ones."""
        count, size = self.session.unchanged()
        new, new_bytes = count - self._unchanged[0], size - self._unchanged[1]
        if not new:
            return
        self._unchanged = (count, size)
        for name, by in (
            ("archive/revisits", new),
            ("actions/unchanged", new),
            ("actions/ok", -new),
            ("archive/stored", -new),
            ("archive/stored_bytes", -new_bytes),
        ):
            self._inc(name, by)

    def refresh(self, request: Request, fetch: Fetch, row: Row | None) -> bool:
        """A 304 to a revalidation: the row's validators and time refreshed."""
        try:
            self.session.touch(fetch, row.fetched_at if row else None)
        except StoreError as exc:
            self._fail(str(exc))
            return False
        self._rows_sent += 1
        self._inc("catalog/not_modified")
        self.record(request, Outcome.NOT_MODIFIED, status=304, bytes=0)
        return True

    def failed(self, request: Request, **fields) -> None:
        """An attempt that stored nothing: an ``error`` line; a later request for its
        key fetches it."""
        key = catalog_key(request)
        self._unsettled.failed(key)
        self._wake(key)
        self.record(request, Outcome.ERROR, **fields)

    def item_error(self, url: str, key: str, message: str) -> None:
        """An item of a stored page that could not be stored."""
        self.record_action(url, key, Outcome.ITEM_ERROR, error=message)

    def store_made(self, fetch: Fetch) -> None:
        """Store a record the crawl made rather than fetched (an image's thumbnail,
        ``pipelines/archive_images.py``): archived and cataloged as a fetch is, with no
        action-log line, since nothing was fetched (``archive/made``). Raises
        StoreError when the writer cannot take it (the crawl stops, as for a fetch)."""
        fetch.parsed = False
        try:
            self.session.put(fetch)
        except StoreError as exc:
            self._fail(str(exc))
            raise
        self._rows_sent += 1
        self._inc("archive/made")
