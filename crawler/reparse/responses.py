"""Scrapy responses rebuilt from stored records."""

from __future__ import annotations

from scrapy.http import Headers, Request, Response
from scrapy.responsetypes import responsetypes

from crawler.storage.records import StoredRecord

# What Scrapy's responsetypes reads of the headers to choose a response class.
_CONTENT_HEADERS = frozenset({"content-type", "content-encoding", "content-disposition"})
# The class each set of those headers gives, when the headers alone decide it: asking
# responsetypes took a second Headers built per response (a re-parse builds thousands
# of responses a second). Bounded: a Content-Disposition can name a file per page.
_CLASSES: dict[tuple[tuple[str, str], ...], type[Response]] = {}
_MOST_CLASSES = 256


def wire(text: str) -> bytes:
    """A header name or value as the bytes that came over the wire."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # never came as bytes (a browser's header): as UTF-8
        return text.encode("utf-8")


def response_class(stored: StoredRecord, pairs: list[tuple[bytes, bytes]]) -> type[Response]:
    """The class ``responsetypes`` gives the stored response (``pairs``: its headers
    as bytes)."""
    key = tuple((n.lower(), v) for n, v in stored.headers if n.lower() in _CONTENT_HEADERS)
    cls = _CLASSES.get(key)
    if cls is not None:
        return cls
    headers = Headers(pairs)
    cls = responsetypes.from_headers(headers)
    if cls is Response:  # the URL or the body decides: asked for each response
        return responsetypes.from_args(headers=headers, url=stored.url, body=stored.body)
    if len(_CLASSES) < _MOST_CLASSES:
        _CLASSES[key] = cls
    return cls


def build_response(
    stored: StoredRecord, request: Request, flags: list[str] | None = None
) -> Response:
    """The response the crawl saw: same class, url, status, headers and body."""
    # Stored headers are the wire's bytes read as latin-1 (as warcio and FastWARC read
    # them); Scrapy would encode a str as UTF-8. The response builds its Headers from
    # these pairs, once.
    pairs = [(wire(name), wire(value)) for name, value in stored.headers]
    return response_class(stored, pairs)(
        url=stored.url,
        status=stored.status,
        headers=pairs,
        body=stored.body,
        request=request,
        flags=flags or [],
    )


def release(response: Response) -> None:
    """Let ``response``'s parsed tree go now that its callback is done with it.

    A text response and the selector it caches refer to each other, so without this
    the page's whole lxml tree waits for the cyclic garbage collector, which frees a
    few dozen pages' trees at a time, long after they left the CPU's caches (~2% of a
    re-parse's time, the history of docs/benchmarks.md). A later ``response.selector`` builds it
    again."""
    if getattr(response, "_cached_selector", None) is not None:
        response._cached_selector = None
