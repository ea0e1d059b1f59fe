"""A generated web site served on 127.0.0.1, for the demo and the tests.

Every answer is a pure function of its path (and of ``bump`` calls), so a test can
ask :func:`DemoSite.payload` what the server meant to send. Paths:

    /                     index linking to the first pages
    /page/N.html          HTML page with links, ETag and Last-Modified (304 on match)
    /redirect/N           301 to /page/N.html
    /missing/N, /gone/N   404, 410
    /error/N              500 every time
    /flaky/N              503 on the first request, then a page
    /gzip/N, /chunked/N   a page sent gzip-encoded, or chunked
    /binary/N             random bytes, application/octet-stream
    /latin1/N             an ISO-8859-1 page
    /slow/N               a page sent after a delay (?ms=...)
    /private/N            a page robots.txt forbids
    /robots.txt           Disallow: /private/

Run it: ``python -m demo.site --pages 3000 --port 8000``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import random
import threading
import time
from collections import Counter
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

WORDS = [
    "archive",
    "crawler",
    "record",
    "catalog",
    "harvest",
    "index",
    "query",
    "parse",
    "page",
    "link",
    "site",
    "data",
    "research",
    "network",
    "server",
    "response",
    "request",
    "storage",
    "digest",
    "offset",
    "batch",
    "resume",
]
LAST_MODIFIED = formatdate(1_700_000_000, usegmt=True)


class Answer:
    def __init__(self, status: int, body: bytes = b"", headers: dict | None = None):
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.body_decoded = body


class DemoSite:
    def __init__(self, pages: int = 3000, page_bytes: int = 3000, seed: int = 0):
        self.pages = pages
        self.page_bytes = page_bytes
        self.seed = seed
        self.counts: Counter[str] = Counter()
        self.versions: Counter[str] = Counter()
        self.request_headers: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.base_url = ""

    # -- content -------------------------------------------------------------------

    def page_html(self, n: int, version: int = 0, encoding: str = "utf-8") -> bytes:
        rng = random.Random(self.seed * 1_000_003 + n * 7 + version)
        links = [rng.randrange(self.pages) for _ in range(8)]
        title = f"Page {n}" + (f" v{version}" if version else "")
        parts = [
            "<!DOCTYPE html>\n<html lang='en'><head>",
            f"<meta charset='{encoding}'><title>{title}</title>",
            f"<meta name='description' content='Demo page number {n}'>",
            "</head><body>",
            f"<h1>{title}</h1>",
            "<ul>"
            + "".join(f"<li><a href='/page/{k}.html'>page {k}</a></li>" for k in links)
            + "</ul>",
        ]
        if n % 50 == 0:
            parts.append(f"<a href='/redirect/{(n + 1) % self.pages}'>moved</a>")
            parts.append(f"<a href='/missing/{n}'>missing</a>")
            parts.append(f"<a href='/private/{n}'>private</a>")
        if encoding != "utf-8":
            parts.append("<p>caf\u00e9 na\u00efve fa\u00e7ade</p>")
        size = len("".join(parts))
        while size < self.page_bytes:
            sentence = " ".join(rng.choice(WORDS) for _ in range(12))
            parts.append(f"<p>{sentence}.</p>\n")
            size += len(sentence) + 9
        parts.append("</body></html>\n")
        return "".join(parts).encode(encoding)

    def payload(self, path: str) -> bytes:
        """What the server means by ``path``: the body after any content coding."""
        return self.answer(path, {}, count=False).body_decoded

    def answer(self, path: str, headers: dict, count: bool = True) -> Answer:
        parts = urlsplit(path)
        route = parts.path
        query = parse_qs(parts.query)
        if count:
            with self._lock:
                self.counts[route] += 1
                self.request_headers[route] = headers
        seen = self.counts[route]
        version = self.versions[route]
        segs = route.strip("/").split("/")
        kind = segs[0] if segs else ""
        arg = segs[1].split(".")[0] if len(segs) > 1 else "0"
        n = int(arg) if arg.isdigit() else 0
        ans = self._route(kind, n, version, seen, query, route)
        ans.body_decoded = ans.body
        if kind == "gzip" and ans.status == 200:
            ans.body = gzip.compress(ans.body, mtime=0)
            ans.headers["Content-Encoding"] = "gzip"
        return ans

    def _page(self, n: int, version: int, headers: dict | None = None, encoding="utf-8") -> Answer:
        body = self.page_html(n, version, encoding)
        charset = "iso-8859-1" if encoding == "latin-1" else "utf-8"
        return Answer(
            200,
            body,
            {
                "Content-Type": f"text/html; charset={charset}",
                "ETag": '"' + hashlib.sha1(body).hexdigest()[:16] + '"',
                "Last-Modified": LAST_MODIFIED,
                **(headers or {}),
            },
        )

    def _route(self, kind, n, version, seen, query, route) -> Answer:
        if route == "/":
            links = "".join(
                f"<a href='/page/{k}.html'>{k}</a> " for k in range(min(20, self.pages))
            )
            return Answer(
                200, f"<html><body>{links}</body></html>".encode(), {"Content-Type": "text/html"}
            )
        if route == "/robots.txt":
            return Answer(
                200, b"User-agent: *\nDisallow: /private/\n", {"Content-Type": "text/plain"}
            )
        if kind in ("page", "gzip", "chunked", "private") and 0 <= n < self.pages:
            return self._page(n, version)
        if kind == "latin1":
            return self._page(n, version, encoding="latin-1")
        if kind == "slow":
            time.sleep(int(query.get("ms", ["500"])[0]) / 1000)
            return self._page(n % self.pages, version)
        if kind == "redirect":
            return Answer(301, b"", {"Location": f"/page/{n % self.pages}.html"})
        if kind == "flaky":
            return Answer(503, b"busy") if seen <= 1 else self._page(n % self.pages, version)
        if kind == "error":
            return Answer(500, b"server error", {"Content-Type": "text/plain"})
        if kind == "gone":
            return Answer(410, b"gone", {"Content-Type": "text/plain"})
        if kind == "binary":
            rng = random.Random(n)
            body = bytes(rng.randrange(256) for _ in range(4096 + n))
            return Answer(200, body, {"Content-Type": "application/octet-stream"})
        return Answer(404, b"<html><body>not found</body></html>", {"Content-Type": "text/html"})

    def bump(self, path: str) -> None:
        """Change the content behind ``path`` (new body, new ETag)."""
        with self._lock:
            self.versions[urlsplit(path).path] += 1

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()

    # -- serving -------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        site = self

        class Handler(_Handler):
            demo = site

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    demo: DemoSite

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        ans = self.demo.answer(self.path, dict(self.headers.items()))
        etag = ans.headers.get("ETag")
        if ans.status == 200 and etag and self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", ans.headers.get("Last-Modified", LAST_MODIFIED))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(ans.status)
        for name, value in ans.headers.items():
            self.send_header(name, value)
        if self.path.startswith("/chunked/") and ans.status == 200:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(ans.body), 1000):
                chunk = ans.body[i : i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(ans.body)))
        self.end_headers()
        self.wfile.write(ans.body)

    def log_message(self, format, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--page-bytes", type=int, default=3000)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    site = DemoSite(args.pages, args.page_bytes)
    print(site.start(args.port), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        site.stop()


if __name__ == "__main__":
    main()
