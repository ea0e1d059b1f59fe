"""Which page each item came from, and when a page's items are complete.

The archive middleware hands a response to the writer process before its callback
runs; the writer holds the page's catalog row until this middleware reports the
page's items (``PageItems``), then commits row and items in one transaction. This
middleware wraps each callback's output: every item it lets through is owned by the
page, and once the output is exhausted (or failed) and every owned item has left the
item pipelines (stored by ``pipelines.catalog.CatalogPipeline``, or dropped), the
page's items go to the writer. A page that yields nothing sends an empty report,
which releases its row.

On start, pages whose records a killed run left without a row (indexed again by the
recovery) are answered from the archive and parsed, so that they get their items; so
are the pages whose items were stored while a download of theirs failed (the media
pipelines say so: :meth:`ItemPagesMiddleware.download_failed`), so that the download
is tried again, as a failed page is fetched again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured

from crawler.signals import LISTED_META
from crawler.storage.catalog import Catalog
from crawler.storage.errors import StoreError
from crawler.storage.items import (
    ItemRow,
    PageItems,
    incomplete_pages,
    parsed_at_now,
    unparsed_recovered,
)
from extensions.storage import CACHED_FLAG, StorageExtension

logger = logging.getLogger(__name__)


@dataclass
class _Page:
    key: str
    url: str
    replace: bool
    log: bool = False
    rows: list[ItemRow] = field(default_factory=list)
    outstanding: int = 0
    exhausted: bool = False
    incomplete: bool = False  # a download of its items failed


class ItemPagesMiddleware:
    """Spider middleware: ties items to their page and reports complete pages."""

    def __init__(self, crawler):
        settings = crawler.settings
        if not settings.getbool("CATALOG_ITEMS_ENABLED"):
            # Without a message Scrapy says nothing: off by choice (the setting, or
            # a spider whose callbacks yield no items), not worth a warning.
            raise NotConfigured
        if not settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off: items have no catalog to go to")
        self.crawler = crawler
        self.stats = crawler.stats
        # id(item) -> the pages that yielded it and whose item has not left the
        # pipelines yet (a list: one object may be yielded more than once).
        self._owner: dict[int, list[_Page]] = {}
        self.storage: StorageExtension | None = None
        self.session = None
        self.spider_name = ""

    @classmethod
    def from_crawler(cls, crawler):
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.item_left, signal=signals.item_dropped)
        crawler.signals.connect(mw.item_left, signal=signals.item_error)
        return mw

    def spider_opened(self, spider) -> None:
        self.spider_name = spider.name
        self.storage = StorageExtension.of(self.crawler)
        self.session = self.storage.session if self.storage is not None else None

    # -- the callback's output -------------------------------------------------------

    def _open(self, response) -> _Page | None:
        meta = response.meta if response.request is not None else {}
        key = meta.get("catalog_key")
        if key is None or self.session is None:
            return None
        return _Page(
            key, response.url, CACHED_FLAG in response.flags, bool(meta.get("catalog_recovered"))
        )

    def _owns(self, page: _Page, out) -> bool:
        if isinstance(out, Request):
            return False
        self._owner.setdefault(id(out), []).append(page)
        page.outstanding += 1
        return True

    def process_spider_output(self, response, result):
        page = self._open(response)
        if page is None:
            yield from result
            return
        try:
            for out in result:
                self._owns(page, out)
                yield out
        finally:
            self._exhausted(page)

    async def process_spider_output_async(self, response, result):
        page = self._open(response)
        if page is None:
            async for out in result:
                yield out
            return
        try:
            async for out in result:
                self._owns(page, out)
                yield out
        finally:
            self._exhausted(page)

    def _exhausted(self, page: _Page) -> None:
        page.exhausted = True
        self._maybe_send(page)

    # -- items leaving the pipelines ---------------------------------------------------

    def page_of(self, item) -> _Page | None:
        """The page ``item`` came from (None: not from a stored page's callback)."""
        pages = self._owner.get(id(item))
        return pages[0] if pages else None

    def item_stored(self, item, row: ItemRow | None) -> None:
        """The catalog pipeline's word on ``item``: its row, or None (not storable)."""
        pages = self._owner.get(id(item))
        if not pages:
            return
        page = pages.pop(0)
        if not pages:
            del self._owner[id(item)]
        if row is not None:
            page.rows.append(row)
        page.outstanding -= 1
        self._maybe_send(page)

    def download_failed(self, item) -> None:
        """A download of ``item`` failed and got no row: its page is parsed again by the
        next crawl, which tries it again."""
        page = self.page_of(item)
        if page is not None:
            page.incomplete = True

    def item_left(self, item, response=None, spider=None, **kwargs) -> None:
        """An item dropped, or failed, in the pipelines: it is not stored."""
        self.item_stored(item, None)

    def log_item_error(self, page: _Page, message: str) -> None:
        """An ``item_error`` line in the action log, for an item of ``page``."""
        if self.storage is not None:
            self.storage.actions.item_error(page.url, page.key, message)

    def _maybe_send(self, page: _Page) -> None:
        if not page.exhausted or page.outstanding:
            return
        parsed_at = parsed_at_now()
        items = PageItems(
            page.key,
            self.spider_name,
            page.rows,
            parsed_at,
            page.replace,
            page.log,
            page.incomplete,
        )
        if page.incomplete:
            self.stats.inc_value("items/pages_incomplete")
            logger.warning(
                "A download of the items of %s failed: the next crawl parses the page "
                "again from the archive and tries it again",
                page.url,
            )
        try:
            self.session.page_items(items)
        except StoreError as exc:
            # The storage extension reports the writer's failure and stops the crawl.
            logger.debug("Items of %s not stored: %s", page.url, exc)
            self.stats.inc_value("items/pages_not_stored")
            return
        self.stats.inc_value("items/pages_reported")

    # -- pages a killed run left without items -----------------------------------------

    async def process_start(self, start):
        for request in self._unparsed():
            yield request
        async for request in start:
            yield request

    def _unparsed(self) -> list[Request]:
        # Every recovered page not parsed yet, this run's and those a run killed before
        # it parsed them left; then those whose downloads are to be tried again.
        if self.session is None:
            return []
        with Catalog(self.session.datadir.catalog_path, readonly=True) as catalog:
            todo = unparsed_recovered(catalog.conn, self.spider_name)
            incomplete = incomplete_pages(catalog.conn, self.spider_name)
        if todo:
            logger.warning("Parsing %d pages a killed run stored without their items", len(todo))
            self.stats.set_value("items/recovered_pages", len(todo))
        if incomplete:
            logger.warning(
                "Parsing %d stored pages again: downloads of their items failed before",
                len(incomplete),
            )
            self.stats.set_value("items/incomplete_pages", len(incomplete))
        recovered = [_replay(key, url, catalog_recovered=True) for key, url in todo]
        return recovered + [_replay(key, url) for key, url in incomplete]


def _replay(key: str, url: str, **meta) -> Request:
    """A request for a stored page, answered from the archive to be parsed: no URL of
    the crawl's list (its own request, if listed, is one)."""
    meta = {"catalog_replay": True, "catalog_key": key, "catalog_url": url, **meta}
    return Request(url, dont_filter=True, meta={LISTED_META: False, **meta})
