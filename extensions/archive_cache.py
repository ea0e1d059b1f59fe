"""An HTTP cache storage over the catalog and archive (read-only).

``HttpCacheMiddleware`` asks it for each request; it answers with the stored response
when the request's key is in the catalog (the response the crawl saw: class, final
URL, status, headers, body) and None otherwise, so Scrapy's cache semantics apply
(``HTTPCACHE_IGNORE_MISSING`` drops misses instead of fetching them). It never
writes: the crawl's ``ArchiveMiddleware`` stores. Both replay through a
:class:`~crawler.storage.session.StorageSession`.

Replay a whole crawl offline::

    scrapy crawl SPIDER -s HTTPCACHE_ENABLED=1 \\
        -s HTTPCACHE_STORAGE=extensions.archive_cache.ArchiveCacheStorage \\
        -s HTTPCACHE_IGNORE_MISSING=1 -s ARCHIVE_ENABLED=0

``scrapy shell URL`` (commands/shell.py) sets this up by itself; see ARCHIVE_SHELL.
"""

from __future__ import annotations

import logging

from scrapy.http import Request, Response

from crawler.reparse.responses import build_response
from crawler.storage.datadir import DataDir
from crawler.storage.errors import CatalogError
from crawler.storage.keys import request_key
from crawler.storage.session import StorageSession

logger = logging.getLogger(__name__)


class ArchiveCacheStorage:
    """``HTTPCACHE_STORAGE`` backend reading DATA_DIR's catalog and archive."""

    def __init__(self, settings):
        self.session = StorageSession.reading(DataDir.from_settings(settings))
        self.stats = None

    def open_spider(self, spider) -> None:
        crawler = getattr(spider, "crawler", None)
        self.stats = crawler.stats if crawler is not None else None
        try:
            self.session.open_readonly()
        except CatalogError as exc:
            logger.warning("No stored responses to answer from: %s", exc)
            return
        logger.info("Answering cached requests from %s", self.session.datadir.catalog_path)

    def close_spider(self, spider) -> None:
        self.session.close()

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)

    def retrieve_response(self, spider, request: Request) -> Response | None:
        if self.session.catalog is None:
            return None
        key = request.meta.get("catalog_key") or request_key(
            request.url, request.method, request.body
        )
        row = self.session.lookup(key)
        if row is None:
            self._inc("httpcache/archive_miss")
            return None
        stored = self.session.replay(row)
        if stored is None:  # unreadable: a miss
            self._inc("httpcache/archive_read_errors")
            return None
        self._inc("httpcache/archive_hit")
        return build_response(stored, request)

    def store_response(self, spider, request: Request, response: Response) -> None:
        """Read-only: the crawl's ArchiveMiddleware stores responses."""
