"""Scrapy responses rebuilt from stored records."""

from __future__ import annotations

from scrapy.http import Headers, Request, Response
from scrapy.responsetypes import responsetypes

from crawler.storage.records import StoredRecord


def wire(text: str) -> bytes:
    """A header name or value as the bytes that came over the wire."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # never came as bytes (a browser's header): as UTF-8
        return text.encode("utf-8")


def build_response(
    stored: StoredRecord, request: Request, flags: list[str] | None = None
) -> Response:
    """The response the crawl saw: same class, url, status, headers and body."""
    headers = Headers()
    for name, value in stored.headers:
        # Stored headers are the wire's bytes read as latin-1 (as warcio and FastWARC
        # read them); Scrapy would encode a str as UTF-8.
        headers.appendlist(wire(name), wire(value))
    cls = responsetypes.from_args(headers=headers, url=stored.url, body=stored.body)
    return cls(
        url=stored.url,
        status=stored.status,
        headers=headers,
        body=stored.body,
        request=request,
        flags=flags or [],
    )
