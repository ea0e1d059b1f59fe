"""Scrapy's UrlLengthMiddleware, with each dropped URL written to the action log.

Scrapy drops a request whose URL is longer than ``URLLENGTH_LIMIT`` before it is
scheduled, and logs the whole URL at INFO: a listed URL would leave no line in the
action log, and a URL of a megabyte would fill the log. Here it gets an ``error``
line, and the log a shortened URL.
"""

from __future__ import annotations

import logging

from scrapy import Request
from scrapy.http import Response
from scrapy.spidermiddlewares.urllength import UrlLengthMiddleware

from crawler.signals import send_action, short_url
from crawler.storage.keys import request_key

logger = logging.getLogger(__name__)


class LoggedUrlLengthMiddleware(UrlLengthMiddleware):
    def get_processed_request(self, request: Request, response: Response | None) -> Request | None:
        if len(request.url) <= self.maxlength:
            return request
        meta = request.meta
        if "catalog_key" not in meta:
            meta["catalog_key"] = request_key(request.url, request.method, request.body)
            meta["catalog_url"] = request.url
        error = f"URL of {len(request.url):,} characters, longer than URLLENGTH_LIMIT ({self.maxlength:,})"
        send_action(self.crawler, request, "error", error=error)
        logger.warning("Ignoring %s: %s", short_url(request.url), error)
        self.crawler.stats.inc_value("urllength/request_ignored_count")
        return None
