"""Turns a gzip body that did not arrive whole into a retried error.

A response without ``Content-Length`` ends when the server closes the connection, so
a connection lost mid-body looks like a complete response to the downloader, and
Scrapy's gunzip returns what it could decode of a cut stream. Stored, that would be a
page cut short under status 200. ``TruncatedGzipMiddleware`` sits between the
downloader and ``HttpCompressionMiddleware`` (so it sees the body still compressed)
and checks that the gzip stream reaches its end; one that does not is retried like a
lost connection, and once retries are used up it is an ``error`` (never a row).
"""

from __future__ import annotations

import logging
import zlib

from isal import isal_zlib
from scrapy import Request
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from crawler.signals import send_action

logger = logging.getLogger(__name__)
GZIP = frozenset({b"gzip", b"x-gzip"})
_CHUNK = 1 << 20


def gzip_complete(body: bytes, max_size: int = 0) -> bool:
    """Whether every gzip member ``body`` starts reaches its end (its trailer read).

    Inflated a chunk at a time and thrown away, so the check holds no more than one
    chunk of output in memory whatever the body expands to; past ``max_size`` bytes
    (0: no limit) it stops and says True, leaving the body to the decompression's own
    size limit. ISA-L: several times zlib's speed, on the crawl's thread.
    """
    data = body
    size = 0
    while data:
        inflater = isal_zlib.decompressobj(31)
        try:
            size += len(inflater.decompress(data, _CHUNK))
            while inflater.unconsumed_tail and not inflater.eof:
                if max_size and size > max_size:
                    return True
                size += len(inflater.decompress(inflater.unconsumed_tail, _CHUNK))
        except (isal_zlib.error, zlib.error):
            return True  # not a gzip stream cut short: left to the decompression
        if not inflater.eof:
            return False
        data = inflater.unused_data.lstrip(b"\0")  # some servers pad with zeros
    return True


class TruncatedGzipMiddleware:
    def __init__(self, crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self.max_size = crawler.settings.getint("DOWNLOAD_MAXSIZE")

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        encodings = response.headers.getlist("Content-Encoding")
        if request.method == "HEAD" or not encodings or not response.body:
            return response
        outermost = encodings[-1].split(b",")[-1].strip().lower()
        max_size = request.meta.get("download_maxsize", self.max_size)
        if outermost not in GZIP or gzip_complete(response.body, max_size):
            return response
        reason = (
            f"truncated gzip body: the connection ended after {len(response.body)} bytes, "
            "inside the compressed stream"
        )
        self.stats.inc_value("downloader/truncated_gzip")
        retry = get_retry_request(request, spider=self.crawler.spider, reason="truncated gzip body")
        if retry is not None:
            send_action(self.crawler, request, "retry", status=response.status, error=reason)
            return retry
        send_action(self.crawler, request, "error", status=response.status, error=reason)
        raise IgnoreRequest(f"{response.url}: {reason}")
