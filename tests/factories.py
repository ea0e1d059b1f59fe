"""Fetches and rows for tests: one factory, and the few shapes the tests use."""

from __future__ import annotations

from crawler.storage.keys import request_key
from crawler.storage.records import Fetch

BODY = "<html><body>caf\u00e9</body></html>".encode()
TS = 1_700_000_000.25


def fetch(
    key: str = "k1", body: bytes = BODY, status: int = 200, ts: float = TS, **fields
) -> Fetch:
    """A fetch as the crawl hands it over: its headers say the body came chunked, with
    a stale Content-Length (the archive must describe the stored payload instead), and
    a credential is among the request headers. ``fields`` override any field."""
    values = {
        "key": key,
        "url": f"http://example.org/{key}",
        "final_url": f"http://example.org/{key}/final",
        "method": "GET",
        "request_headers": [("User-Agent", "t"), ("Proxy-Authorization", "x")],
        "request_body": b"",
        "status": status,
        "response_headers": [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "3"),
            ("ETag", '"abc"'),
        ],
        "body": body,
        "fetched_at": ts,
    }
    values.update(fields)
    return Fetch(**values)


def page_fetch(n: int, body: bytes | None = None, ts: float = 1_700_000_000.0) -> Fetch:
    """Page ``n`` of a site: key ``n`` in 64 hex digits, redirected to ``.html``, an ETag
    of its own, fetched ``n`` seconds after ``ts``."""
    return fetch(
        f"{n:064x}",
        body if body is not None else f"<html><body>page {n}</body></html>".encode() * 20,
        ts=ts + n,
        url=f"http://example.org/page/{n}",
        final_url=f"http://example.org/page/{n}.html",
        request_headers=[("Accept", "*/*")],
        response_headers=[("Content-Type", "text/html; charset=utf-8"), ("ETag", f'"e{n}"')],
    )


def listed_fetch(n: int, url: str | None = None, **fields) -> Fetch:
    """Page ``n`` (at ``url``) as a list names it: its key is the URL's, as a crawl
    computes it."""
    url = url or f"http://example.org/page/{n}"
    values = {
        "url": url,
        "final_url": url,
        "request_headers": [("Host", "example.org")],
        "response_headers": [("Content-Type", "text/html")],
    }
    values.update(fields)
    return fetch(request_key(url), listed_body(n), **values)


def listed_body(n: int) -> bytes:
    return f"<html>page {n}</html>".encode()


def rendered_fetch(key: str = "k" * 64) -> Fetch:
    """A page a browser rendered: the server's HTML, and the DOM after the script ran."""
    return fetch(
        key,
        b"<html><div id='content'></div></html>",
        url="http://h/js/1",
        final_url="http://h/js/1",
        request_headers=[("User-Agent", "x")],
        response_headers=[("Content-Type", "text/html"), ("ETag", '"e1"')],
        rendered_body=b"<html><div id='content'><h1>Rendered 1</h1></div></html>",
    )
