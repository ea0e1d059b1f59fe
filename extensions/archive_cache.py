"""An HTTP cache storage over the catalog and archive (read-only).

``HttpCacheMiddleware`` asks it for each request; it answers with the stored response
when the request's key is in the catalog (the response the crawl saw: class, final
URL, status, headers, body) and None otherwise, so Scrapy's cache semantics apply
(``HTTPCACHE_IGNORE_MISSING`` drops misses instead of fetching them). It never
writes: the crawl's ``ArchiveMiddleware`` stores.

Replay a whole crawl offline::

    scrapy crawl SPIDER -s HTTPCACHE_ENABLED=1 \\
        -s HTTPCACHE_STORAGE=extensions.archive_cache.ArchiveCacheStorage \\
        -s HTTPCACHE_IGNORE_MISSING=1 -s ARCHIVE_ENABLED=0

``scrapy shell URL`` (commands/shell.py) sets this up by itself; see ARCHIVE_SHELL.
"""

from __future__ import annotations

import logging
from pathlib import Path

from scrapy.http import Request, Response

from crawler.archive import ArchiveError, read_any, resolve
from crawler.catalog import Catalog, CatalogError
from crawler.keys import request_key
from crawler.responses import build_response

logger = logging.getLogger(__name__)


class ArchiveCacheStorage:
    """``HTTPCACHE_STORAGE`` backend reading DATA_DIR's catalog and archive."""

    def __init__(self, settings):
        self.data_dir = Path(settings.get("DATA_DIR") or "data")
        self.catalog_path = self.data_dir / "metadata.db"
        self.catalog: Catalog | None = None
        self.stats = None

    def open_spider(self, spider) -> None:
        crawler = getattr(spider, "crawler", None)
        self.stats = crawler.stats if crawler is not None else None
        try:
            self.catalog = Catalog(self.catalog_path, readonly=True)
        except CatalogError as exc:
            logger.warning("No stored responses to answer from: %s", exc)
            self.catalog = None
            return
        logger.info("Answering cached requests from %s", self.catalog_path)

    def close_spider(self, spider) -> None:
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)

    def retrieve_response(self, spider, request: Request) -> Response | None:
        if self.catalog is None:
            return None
        key = request.meta.get("catalog_key") or request_key(
            request.url, request.method, request.body
        )
        row = self.catalog.get(key)
        if row is None:
            self._inc("httpcache/archive_miss")
            return None
        try:
            stored = read_any(resolve(self.data_dir, row.archive), row.offset, row.length)
        except (ArchiveError, OSError) as exc:
            logger.warning("Stored copy of %s unreadable, treated as a miss: %s", request.url, exc)
            self._inc("httpcache/archive_read_errors")
            return None
        self._inc("httpcache/archive_hit")
        return build_response(stored, request)

    def store_response(self, spider, request: Request, response: Response) -> None:
        """Read-only: the crawl's ArchiveMiddleware stores responses."""
