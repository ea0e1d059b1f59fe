"""Keeps each redirect the crawl follows, so that the archive can store it.

Scrapy's RedirectMiddleware (600) answers a redirect with a new request and drops
the redirect response. Sitting inside it (610), this middleware sees every response
first and keeps a redirect on the request's meta (``archive_hops``), which the new
request inherits; the archive middleware hands the chain to the writer with the final
answer, and each redirect becomes its own ``response`` record, so that replay tools
resolve the listed URL (as browsertrix, Heritrix and ``wget --warc-file`` archive
redirects).
"""

from __future__ import annotations

import time

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import Response

from crawler.fetches import HIDDEN_HEADERS, HOPS_META, header_list
from crawler.storage.records import Hop


class RedirectHopsMiddleware:
    def __init__(self, crawler) -> None:
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off")

    @classmethod
    def from_crawler(cls, crawler) -> RedirectHopsMiddleware:
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Response:
        if 300 <= response.status < 400 and b"Location" in response.headers:
            hop = Hop(
                url=response.url,
                status=response.status,
                headers=header_list(response.headers),
                body=response.body,
                request_headers=header_list(request.headers, HIDDEN_HEADERS),
                fetched_at=time.time(),
                method=request.method,
                request_body=request.body,
            )
            # A new list: the redirected request's meta is a copy of this one's.
            request.meta[HOPS_META] = [*request.meta.get(HOPS_META, ()), hop]
        return response
