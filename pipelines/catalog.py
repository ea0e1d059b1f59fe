"""CatalogPipeline: every item into a table of the catalog database.

The rows are built here (``crawler/itemrows.py`` says which table and columns) and
handed to ``middlewares.items.ItemPagesMiddleware``, which sends a page's items to
the writer process once the page is complete: nothing touches SQLite on the crawl's
thread. Keep this pipeline last, so that it stores what the other pipelines made of
an item.
"""

from __future__ import annotations

import logging

from scrapy import signals
from scrapy.exceptions import NotConfigured

from crawler.itemrows import ItemFieldError, item_row
from middlewares.items import ItemPagesMiddleware

logger = logging.getLogger(__name__)


class CatalogPipeline:
    def __init__(self, crawler):
        if not crawler.settings.getbool("CATALOG_ITEMS_ENABLED"):
            # Without a message Scrapy says nothing: off by choice (the setting, or
            # a spider whose callbacks yield no items), not worth a warning.
            raise NotConfigured
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off: items have no catalog to go to")
        self.crawler = crawler
        self.stats = crawler.stats
        self.pages: ItemPagesMiddleware | None = None
        self.spider_name = ""
        self._said_nan: set[tuple[str, str]] = set()

    @classmethod
    def from_crawler(cls, crawler):
        pipeline = cls(crawler)
        crawler.signals.connect(pipeline.spider_opened, signal=signals.spider_opened)
        return pipeline

    def spider_opened(self, spider) -> None:
        self.spider_name = spider.name
        self.pages = self.crawler.get_spider_middleware(ItemPagesMiddleware)
        if self.pages is None:
            logger.warning(
                "CatalogPipeline stores nothing: add %s to SPIDER_MIDDLEWARES",
                "middlewares.items.ItemPagesMiddleware",
            )

    def process_item(self, item):
        pages = self.pages
        if pages is None:
            return item
        page = pages.page_of(item)
        if page is None:
            self.stats.inc_value("items/not_from_a_page")
            return item
        try:
            row = item_row(item, self.spider_name)
        except ItemFieldError as exc:
            self._bad_item(item, page, exc)
            pages.item_stored(item, None)
            return item
        if row.nan_fields:
            self._nan(item, page, row.nan_fields)
        pages.item_stored(item, row)
        return item

    def _nan(self, item, page, fields: tuple[str, ...]) -> None:
        self.stats.inc_value("items/nan_as_null", len(fields))
        cls = type(item).__name__
        for name in fields:
            if (cls, name) in self._said_nan:
                continue
            self._said_nan.add((cls, name))
            logger.warning(
                "spider %r, item class %s, field %r, page %s: NaN stored as NULL (JSON null "
                "in a list or dict); said once per field, counted in items/nan_as_null",
                self.spider_name,
                cls,
                name,
                page.url,
            )

    def _bad_item(self, item, page, exc: ItemFieldError) -> None:
        message = exc.describe(self.spider_name, item, page.url)
        logger.error("%s", message)
        self.stats.inc_value("items/errors")
        self.pages.log_item_error(page, message)
