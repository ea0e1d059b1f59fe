"""Scrapy's HttpErrorMiddleware, logging the responses it ignores at DEBUG.

Every such response already has its line in the action log (``error`` with ``HTTP
404``, or ``ok`` for a stored 404 or 410) and its count in the stats
(``httperror/response_ignored_status_count/<status>``): an INFO line each made most of
a depth crawl's log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError, HttpErrorMiddleware

logger = logging.getLogger(__name__)


class QuietHttpErrorMiddleware(HttpErrorMiddleware):
    def process_spider_exception(
        self, response: Response, exception: Exception
    ) -> Iterable[Any] | None:
        if not isinstance(exception, HttpError):
            return None
        stats = self.crawler.stats
        stats.inc_value("httperror/response_ignored_count")
        stats.inc_value(f"httperror/response_ignored_status_count/{response.status}")
        logger.debug("Ignoring response %r: its status is not handled by the spider", response)
        return ()
