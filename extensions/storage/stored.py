"""Which requests' answers are stored, asked in batches: :class:`StoredPages`.

A part of the storage extension (``extensions/storage/extension.py``). A resumed crawl
of a list of millions must skip what is stored at a cost close to nothing: start
requests (``middlewares/resume.py``) and listed URLs before they become requests
(``crawler.spiderkit.start``) are looked up with one catalog query a batch, and the
ones the policy skips are logged as cache hits in one write. Whether a stored page has
this spider's items decides whether it is replayed for them (``ARCHIVE_POLICY``). The
query of a batch runs in a thread (:meth:`StoredPages.in_thread`): the reactor keeps
fetching while the catalog is searched.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from scrapy import Request
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads
from twisted.internet.defer import Deferred
from twisted.python.threadpool import ThreadPool

from crawler.storage.batchlookup import BatchLookup
from crawler.storage.items import StoredParsed
from crawler.storage.records import Row
from crawler.storage.session import StorageSession
from extensions.archive_policy import ArchivePolicy, Decision
from extensions.storage.actions import ActionRecorder
from extensions.storage.requests import catalog_key, looked_up

T = TypeVar("T")


class StoredPages:
    """Which requests' pages are stored, and parsed for this spider; the stored ones
    among start requests and listed URLs dropped as cache hits, a batch per query."""

    def __init__(self, session: StorageSession, policy: ArchivePolicy, actions: ActionRecorder):
        self.session = session
        self.policy = policy
        self.actions = actions
        self.spider_name = ""
        # One thread of its own for the batch queries: the reactor's pool would spread
        # them over its threads, each a malloc arena of its own that keeps what a
        # batch's sets took (RSS measured growing with the list).
        self._pool: ThreadPool | None = None
        self._trigger = None
        # Its connections to the catalogs, from the data directory's opening on.
        self.batch_lookup: BatchLookup | None = None
        # Single keys asked in this turn of the reactor, with who waits for each.
        self._rows_asked: list[tuple[str, Deferred]] = []

    def open(self) -> None:
        """The session is open: connect the batch lookups to its catalogs."""
        self.batch_lookup = BatchLookup(self.session.catalog)

    def lookup(self, key: str) -> Row | None:
        return self.session.lookup(key)

    async def in_thread(self, keys: list[str]) -> StoredParsed | None:
        """:meth:`_stored_parsed` in the lookup thread; None when the catalog is not
        open (or closed meanwhile: the crawl is stopping)."""
        asked = self.ask(keys)
        return None if asked is None else await maybe_deferred_to_future(asked)

    def ask(self, keys: list[str]) -> Deferred | None:
        """:meth:`in_thread`, started now: the caller goes on (keys the next batch)
        while the catalog is searched."""
        return self.call(self._stored_parsed, keys)

    def row(self, key: str) -> Deferred:
        """``(row, parsed)`` of ``key``: its catalog row (None: not stored) and whether
        its items of this spider are stored, asked in the lookup thread together with
        the other keys asked in this turn of the reactor (a page's links reach the
        downloader together)."""
        from twisted.internet import reactor

        asked = Deferred()
        self._rows_asked.append((key, asked))
        if len(self._rows_asked) == 1:
            reactor.callLater(0, self._ask_rows)
        return asked

    def _ask_rows(self) -> None:
        asked, self._rows_asked = self._rows_asked, []
        spider = self.spider_name if self.policy.parse_stored else None
        found = self.call(self._rows, list({key for key, _ in asked}), spider)
        if found is None:  # the catalog is closed: the crawl is stopping
            for _, waiter in asked:
                waiter.callback((None, False))
            return

        def answer(result) -> None:
            rows, parsed, elsewhere = result
            for key, waiter in asked:
                row = rows.get(key)
                if row is None and key in elsewhere:
                    # A row of another data directory (CATALOG_SEEN): never parsed here.
                    try:
                        row = self.session.lookup(key)
                    except Exception:
                        waiter.errback()
                        continue
                    waiter.callback((row, spider is None))
                else:
                    waiter.callback((row, key in parsed))

        def failed(failure) -> None:
            for _, waiter in asked:
                waiter.errback(failure)

        found.addCallbacks(answer, failed)

    def _rows(self, keys: list[str], spider: str | None):
        return self._asked(lambda lookup: lookup.rows(keys, spider), ({}, set(), set()))

    def _asked(self, ask: Callable[[BatchLookup], T], closed: T) -> T:
        """``ask`` of the batch lookup's connections (in the lookup thread); ``closed``
        when they are closed, before the query or under it."""
        lookup = self.batch_lookup
        if lookup is None:
            return closed
        try:
            return ask(lookup)
        except sqlite3.ProgrammingError:
            if self.batch_lookup is None:  # closed under the query
                return closed
            raise

    def call(self, f, *args) -> Deferred | None:
        """``f(*args)`` in the lookup thread (a stored page's read too); None when the
        catalog is not open."""
        from twisted.internet import reactor

        if self.batch_lookup is None:
            return None
        if self._pool is None:
            self._pool = ThreadPool(1, 1, name="catalog-lookup")
            self._pool.start()
            # A crawl stopped at once (a second signal) never closes the storage: its
            # thread would keep the process from exiting.
            self._trigger = reactor.addSystemEventTrigger("during", "shutdown", self._stop_pool)
        return threads.deferToThreadPool(reactor, self._pool, f, *args)

    def close(self) -> None:
        """Stop the lookup thread (once its query, if any, is done), then close its
        connections."""
        from twisted.internet import reactor

        trigger, self._trigger = self._trigger, None
        if trigger is not None:
            reactor.removeSystemEventTrigger(trigger)
        self._stop_pool()
        lookup, self.batch_lookup = self.batch_lookup, None
        if lookup is not None:
            lookup.close()

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()

    def _stored_parsed(self, keys: list[str]) -> StoredParsed | None:
        """The stored ones among ``keys``, and those of them whose items of this spider
        are stored (all of them when the policy does not parse stored pages), through
        the batch lookup's connections; None when they are closed."""
        spider = self.spider_name if self.policy.parse_stored else None
        return self._asked(lambda lookup: lookup.stored_parsed(keys, spider), None)

    async def filter_start_async(self, requests: list[Request]) -> list[Request]:
        """:meth:`filter_start`, the catalog asked in a thread."""
        keys = self._unchecked_keys(requests)
        if not keys:
            return requests
        found = await self.in_thread(keys)
        return requests if found is None else self.filter_start(requests, found)

    def _unchecked_keys(self, requests: list[Request]) -> list[str]:
        """The keys of the requests of a batch to look up (none with no catalog open)."""
        if self.session.catalog is None:
            return []
        return [catalog_key(r) for r in requests if not r.meta.get("catalog_checked")]

    def filter_start(
        self, requests: list[Request], found: StoredParsed | None = None
    ) -> list[Request]:
        """Drop the stored ones among a batch of start requests, with one query, or
        as ``found`` says (those checked already, by ``crawler.spiderkit.start``,
        pass as they are)."""
        if found is None:
            keys = self._unchecked_keys(requests)
            found = self._stored_parsed(keys) if keys else None
            if found is None:
                return requests
        present, parsed = found.stored, found.parsed
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
        self.actions.cache_hits(hits)
        return out

    def ask_listed(self, listed: list[tuple[str, str]]) -> Deferred | None:
        """The catalog asked, in the lookup thread, for a batch of listed ``(url, key)``
        (the URL and key of the GET request a spider would build), to be answered with
        :meth:`skip_listed`; None when nothing may be skipped here (no catalog open, or
        the policy does not skip a plain request): build them all."""
        if self.session.catalog is None or self.policy.when_stored({}) is not Decision.SKIP:
            return None
        return self.ask([key for _, key in listed])

    def skip_listed(
        self, listed: list[tuple[str, str]], found: StoredParsed | None
    ) -> tuple[set[str], set[str]] | None:
        """Of a batch of listed ``(url, key)`` and what :meth:`ask_listed` found, the
        keys that are stored, as ``(skipped, kept)``: the skipped ones are logged as
        cache hits and counted here, so that no request is built for them; the kept
        ones are stored pages the policy replays. None when nothing was found out."""
        if found is None:
            return None
        present, parsed = found.stored, found.parsed
        # A plain listed request's decision depends on whether its page is parsed alone.
        skip_parsed = self.policy.when_stored({}, parsed=True) is Decision.SKIP
        skip_unparsed = self.policy.when_stored({}, parsed=False) is Decision.SKIP
        if skip_parsed and skip_unparsed:
            kept = set()
        elif skip_parsed:
            kept = present - parsed
        elif skip_unparsed:
            kept = present & parsed
        else:
            kept = present
        skipped = present - kept
        if skipped:
            self.actions.cache_hits([(url, key) for url, key in listed if key in skipped])
        return skipped, kept
