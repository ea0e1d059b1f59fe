"""Scrapy responses rebuilt from stored records."""

from __future__ import annotations

from scrapy.http import Headers, Request, Response
from scrapy.responsetypes import responsetypes

from crawler.storage.records import StoredRecord


def build_response(
    stored: StoredRecord, request: Request, flags: list[str] | None = None
) -> Response:
    """The response the crawl saw: same class, url, status, headers and body."""
    headers = Headers()
    for name, value in stored.headers:
        headers.appendlist(name, value)
    cls = responsetypes.from_args(headers=headers, url=stored.url, body=stored.body)
    return cls(
        url=stored.url,
        status=stored.status,
        headers=headers,
        body=stored.body,
        request=request,
        flags=flags or [],
    )
