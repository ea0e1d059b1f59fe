"""What the crawl does with a request whose answer is stored, and which answers it stores.

:class:`ArchivePolicy` is to ``middlewares/archive.py`` what Scrapy's
``HTTPCACHE_POLICY`` is to its ``HttpCacheMiddleware``: a plain object, chosen by
the ``ARCHIVE_POLICY`` setting (a dotted path), that the middleware and the storage
extension ask and never second-guess. It reads request meta and catalog rows and
touches nothing: no catalog, no archive, no stats.

Request meta keys: ``catalog_replay`` (answer a stored request from the archive: a
depth crawl needs the links of stored pages) and ``catalog_revalidate`` (or the
spider attribute ``revalidate``: send it with the stored validators).

A spider that yields items gets them for every page of its list: a stored page this
spider has no items for is replayed and parsed, never fetched
(``CATALOG_ITEMS_PARSE_STORED``); with a feed (``-o``) every stored page is, so that
the feed of a resumed crawl holds the items of every page.
"""

from __future__ import annotations

import os
from enum import Enum

from crawler.storage.records import Fetch, Row


class Decision(Enum):
    """What becomes of a request."""

    FETCH = "fetch"  # sent, its answer stored
    SKIP = "skip"  # not sent: logged as a cache hit and dropped
    REPLAY = "replay"  # answered from the archive
    REVALIDATE = "revalidate"  # sent with the stored validators; a 304 refreshes the row


class ArchivePolicy:
    """Stored requests are skipped unless their meta asks for a replay or a
    revalidation, or the spider's items of the page are wanted; final answers
    (``CATALOG_STORE_STATUSES``) are stored."""

    def __init__(
        self,
        store_statuses: frozenset[int],
        parse_stored: bool = False,
        feeds: bool = False,
        dedup: bool = True,
    ):
        self.store_statuses = store_statuses
        # Stored pages without this spider's items are parsed (with a feed: all of them).
        self.parse_stored = parse_stored
        self.parse_all = parse_stored and feeds
        # ARCHIVE_DEDUP: a refetched payload equal to its key's stored one is a revisit.
        self.dedup = dedup
        self.revalidate = False

    @classmethod
    def from_crawler(cls, crawler, store_statuses: frozenset[int]) -> ArchivePolicy:
        settings = crawler.settings
        parse_stored = settings.getbool("CATALOG_ITEMS_ENABLED") and settings.getbool(
            "CATALOG_ITEMS_PARSE_STORED", True
        )
        dedup = (settings.get("ARCHIVE_DEDUP") or "url").lower() != "off"
        return cls(store_statuses, parse_stored, bool(settings.getdict("FEEDS")), dedup)

    def spider_opened(self, spider) -> None:
        self.revalidate = bool(getattr(spider, "revalidate", False))

    def when_stored(self, meta: dict, row: Row | None = None, parsed: bool = True) -> Decision:
        """The decision for a request whose key is stored: the one place that says a
        stored URL is skipped. ``row`` is None when a batch lookup only said that the
        key is present (the request then meets its row in the middleware); ``parsed``
        says whether the spider's items of the page are stored."""
        if meta.get("catalog_revalidate", self.revalidate):
            if row is not None and not (row.etag or row.last_modified):
                return Decision.FETCH  # no validators: fetched again
            return Decision.REVALIDATE
        if meta.get("catalog_replay") or self.wants_items(parsed):
            return Decision.REPLAY
        return Decision.SKIP

    def wants_items(self, parsed: bool) -> bool:
        """Whether a stored page is parsed for the spider's items."""
        return self.parse_all or (self.parse_stored and not parsed)

    def validators(self, row: Row) -> dict[str, str]:
        """The conditional headers that revalidate ``row``."""
        headers = {}
        if row.etag:
            headers["If-None-Match"] = row.etag
        if row.last_modified:
            headers["If-Modified-Since"] = row.last_modified
        return headers

    def revisit_of(self, fetch: Fetch, stored: Row | None) -> Row | None:
        """``stored`` (the row of ``fetch``'s key the request met) when ``fetch`` may
        bring the very payload its record holds, else None: the writer compares the
        digests, with the one it computes for the record anyway, and keeps an equal
        payload as a revisit of it. A row of another data directory (CATALOG_SEEN: its
        ``archive`` is absolute) is never referred to: this one's archive would not
        hold it."""
        if (
            stored is None
            or not self.dedup
            or stored.status != fetch.status
            or stored.rendered
            or fetch.rendered_body is not None
            or not stored.payload_digest
            or os.path.isabs(stored.archive)
        ):
            return None
        return stored

    def should_store(self, status: int) -> bool:
        """Whether an answer is final and gets a row (others are logged as errors)."""
        return status in self.store_statuses
