"""What the archive stores of a Scrapy response: :func:`response_fetch`.

The inverse of :func:`crawler.reparse.responses.build_response`. Request meta keys:
``catalog_url`` (the URL as listed), ``archive_hops`` (the redirects followed, kept by
``middlewares/redirect_hops.py``) and ``render_source``: set by a downloader that hands
the spider something other than what the server sent (a browser hands over the DOM it
rendered). It holds the server's answer as plain data (``url``, ``status``,
``headers``, ``body``, ``request_headers``), or None when none was captured; that
answer is stored as the response and the response's body as what was rendered from it.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.http import Response, TextResponse
from scrapy.http.request import NO_CALLBACK

from crawler.storage.records import ORIG_PREFIX, Fetch, Headers, Hop

# Request meta key: the server's answer, as plain data, when a downloader hands the
# spider something else (a browser hands over the DOM it rendered; see
# :func:`captured_fetch`).
SOURCE_META = "render_source"
HIDDEN_REQUEST_HEADERS = frozenset({"proxy-authorization", "authorization"})
HIDDEN_HEADERS = frozenset(name.encode() for name in HIDDEN_REQUEST_HEADERS)
# Request meta key: the redirects followed so far (middlewares/redirect_hops.py).
HOPS_META = "archive_hops"


def header_list(headers, hidden: frozenset[bytes] = frozenset()) -> Headers:
    """Scrapy headers as the archive keeps them, without the ``hidden`` ones."""
    # dict.items: Scrapy's Headers.items() normalises every key and value again, which
    # cost more than everything else the middleware does per response.
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, values in dict.items(headers)
        if name.lower() not in hidden
        for value in values
    ]


def hops_before(request: Request, response: Response) -> list[Hop]:
    """The redirects followed to reach ``response`` (middlewares/redirect_hops.py),
    not ``response`` itself, which may be a redirect the crawl did not follow."""
    hops = request.meta.get(HOPS_META, [])
    if hops and hops[-1].url == response.url and hops[-1].status == response.status:
        return hops[:-1]
    return list(hops)


def response_fetch(key: str, request: Request, response: Response) -> Fetch:
    """What the archive stores of a response."""
    meta = request.meta
    if SOURCE_META in meta:
        return captured_fetch(key, request, response, meta[SOURCE_META])
    return Fetch(
        key=key,
        url=meta.get("catalog_url", request.url),
        final_url=response.url,
        method=request.method,
        request_headers=header_list(request.headers, HIDDEN_HEADERS),
        request_body=request.body,
        status=response.status,
        response_headers=header_list(response.headers),
        body=response.body,
        redirects=hops_before(request, response),
        # A media pipeline's download: no callback, so no items to wait for.
        parsed=request.callback is not NO_CALLBACK,
    )


def captured_fetch(key: str, request: Request, response: Response, source: dict | None) -> Fetch:
    """A response made from a server's answer (``source``, see the module's docstring):
    that answer, and the response's body as what was rendered from it."""
    rendered = response.body
    if isinstance(response, TextResponse):
        rendered_type = f"text/html; charset={response.encoding}"
    else:
        rendered_type = response.headers.get("Content-Type", b"text/html").decode("latin-1")
    if source is None:  # nothing captured: store the rendered body as the answer
        source = {"url": response.url, "status": response.status, "body": rendered}
        source["headers"] = [("Content-Type", rendered_type)]
        source["request_headers"] = []
        rendered = None
    return Fetch(
        key=key,
        url=request.meta.get("catalog_url", request.url),
        final_url=source["url"],
        method=request.method,
        request_headers=[
            (n, v) for n, v in source["request_headers"] if n.lower() not in HIDDEN_REQUEST_HEADERS
        ],
        request_body=request.body,
        status=source["status"],
        # The body was handed over decoded, as Scrapy does.
        response_headers=[
            (ORIG_PREFIX + n if n.lower() == "content-encoding" else n, v)
            for n, v in source["headers"]
        ],
        body=source["body"],
        rendered_body=rendered,
        rendered_type=rendered_type,
    )
