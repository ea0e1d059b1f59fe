"""Stores every response the crawl receives, and skips what is already stored.

``ArchiveMiddleware`` sits at the outer end of the downloader middlewares (after
redirects, retries and decompression have happened), so it sees each request once on
its way out and its final answer once on the way back. Like Scrapy's
``HttpCacheMiddleware`` it only wires: what becomes of a stored request (skipped,
replayed, revalidated) and which answers are stored is the policy's word
(``extensions/archive_policy.py``); looking up, replaying, storing and logging are
the storage extension's parts (``extensions/storage/``).

- On the way out, a request whose key is stored is decided by the policy; a request
  for a key this run is still fetching or storing waits for its row first, so that a
  URL is fetched once. A request not looked up in a batch already (a followed link) is
  looked up in the storage's lookup thread, with the others of its turn of the reactor.
- On the way back, final answers are stored, a 304 to a revalidation refreshes its
  row, and everything else is logged as an error (no row: the next run tries again).
"""

from __future__ import annotations

from scrapy import Request
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import maybe_deferred_to_future

from crawler.downloader import NotSent, TakenOver
from crawler.fetches import response_fetch
from crawler.storage.records import Row
from extensions.archive_policy import Decision
from extensions.storage import (
    CACHED_FLAG,
    CachedRequest,
    StorageExtension,
    catalog_key,
    looked_up,
    unstored,
)


def _is_robots(request: Request) -> bool:
    return request.meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt")


class ArchiveMiddleware:
    def __init__(self, storage: StorageExtension):
        self.storage = storage
        self.policy = storage.policy
        self.session = storage.session
        self.actions = storage.actions
        self.stored = storage.stored
        self.waits = storage.waits
        self.archiver = storage.archiver

    @classmethod
    def from_crawler(cls, crawler) -> ArchiveMiddleware:
        storage = StorageExtension.of(crawler)
        if storage is not None:
            storage.start_writer()
            return cls(storage)
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured  # the extension said so already
        raise NotConfigured("extensions.storage.StorageExtension is not in EXTENSIONS")

    def process_request(self, request: Request) -> Response | None:
        if self.session.catalog is None or _is_robots(request):
            return None
        meta = request.meta
        key = catalog_key(request)
        # The request passed the dupefilter already; where it redirects must be fetched
        # too, even if another request fetched that URL, or its key never gets a row.
        request.dont_filter = True
        if unstored(request):
            self.waits.fetching(key)  # looked up in a batch, or a redirect or retry
            return None
        if meta.get("catalog_revalidating"):
            return None  # a redirect or retry of a revalidation
        return self._looked_up(request, key)

    async def _looked_up(self, request: Request, key: str) -> Response | None:
        while True:
            settling = self.waits.in_flight(key)
            row, parsed = await self._row(key)
            # Committed while it was looked up: not found then, and not in flight now.
            if row is not None or not settling or self.waits.in_flight(key):
                break
        if row is None and self.waits.in_flight(key):
            row, parsed = await self.waits.wait_for_row(key, self._row)
        return await self._answer(request, key, row, parsed)

    async def _row(self, key: str) -> tuple[Row | None, bool]:
        # In the lookup thread: the catalog is never read on the reactor's.
        return await maybe_deferred_to_future(self.stored.row(key))

    async def _answer(
        self, request: Request, key: str, row: Row | None, parsed: bool | None
    ) -> Response | None:
        meta = request.meta
        if row is None and self.actions.seen(key):
            # Met again after this run gave up on it: its error line is its outcome.
            self.actions.duplicate(request)
            raise CachedRequest(f"met again: {request.url}")
        looked_up(request, row is not None)
        decision = Decision.FETCH if row is None else self.policy.when_stored(meta, row, parsed)
        if decision is Decision.SKIP:
            self.actions.cache_hit(request)
            raise CachedRequest(f"already stored: {request.url}")
        if decision is Decision.REVALIDATE:
            request.headers.update(self.policy.validators(row))
            meta["catalog_revalidating"] = True
            meta["catalog_row"] = row
            return None
        if decision is Decision.FETCH and row is not None:
            meta["catalog_row"] = row  # its payload may come back unchanged: a revisit
        if decision is Decision.REPLAY:
            # Read and inflated in the lookup thread too, unless the crawl is stopping.
            reading = self.stored.call(self.session.replay, row)
            if reading is None:
                stored = self.session.replay(row)
            else:
                stored = await maybe_deferred_to_future(reading)
            response = self.archiver.replayed(request, stored)
            if response is not None:
                self.actions.cache_hit(request)
                if self.policy.wants_items(parsed):
                    self.archiver.parsing_stored()
                return response
        self.waits.fetching(key)
        return None

    def process_response(self, request: Request, response: Response) -> Response:
        if not self.storage.storing or _is_robots(request) or CACHED_FLAG in response.flags:
            return response
        meta = request.meta
        status = response.status
        if status == 304 and meta.get("catalog_revalidating"):
            return self._not_modified(request, response)
        if not self.policy.should_store(status):
            self.archiver.failed(request, status=status, error=f"HTTP {status}")
            return response
        fetch = response_fetch(catalog_key(request), request, response)
        self.archiver.store(request, fetch, meta.get("catalog_row"))
        return response

    def _not_modified(self, request: Request, response: Response) -> Response:
        row = request.meta.get("catalog_row")
        fetch = response_fetch(catalog_key(request), request, response)
        if not self.archiver.refresh(request, fetch, row):
            return response
        if request.meta.get("catalog_replay") and row is not None:
            return self.archiver.replay(request, row) or response
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if (
            self.session.log is None
            or isinstance(exception, (CachedRequest, TakenOver, NotSent))
            or _is_robots(request)
        ):
            return None
        if isinstance(exception, IgnoreRequest):
            error = str(exception) or "ignored"
        else:
            error = f"{type(exception).__name__}: {exception}"
        self.archiver.failed(request, error=error)
        return None
