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
    /hold/PATH            what PATH answers, sent only once the gate is open (``hold()``,
                          ``release()``): a request a test keeps in flight until it says so
    /private/N            a page robots.txt forbids
    /robots.txt           Disallow: /private/
    /product/N.html       a shop's product page (the ``products`` example spider); it sends
                          no validators, as most dynamic sites (?ms=MS: after that pause)
    /sitemap.xml          an XML sitemap of the first pages
    /js/N                 a page whose title, text and links appear only after JavaScript
                          runs (?delay=MS: after that pause; &after=load: counted from
                          the load event; ?fetch=1: from /data/N?ms=MS fetched after load,
                          which answers after MS); its
                          image is /img/N.png
    /img/NAME.jpg, .png   an image (the product pages' gallery, /js/N's picture): a
                          small picture of its own per NAME, the same bytes every time
    /data/N               what /js/N?fetch=1 fetches (JSON; ?ms=MS: after that pause)

Pages whose number is a multiple of 50 also link to themselves on ``localhost`` (the
same server under another registered domain) and, by an absolute URL, to the page two
further on.

Run it: ``python -m demo.site --pages 3000 --port 8000``.

One module although past 400 lines: every route is a few lines, and the tests read
the whole site as one table of paths.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import io
import random
import sys
import threading
import time
from collections import Counter
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from crawler.helptext import ToolHelpFormatter

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
BRANDS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay"]
LAST_MODIFIED = formatdate(1_700_000_000, usegmt=True)
# A held request is answered after this long even if the gate stays shut, so that a
# test that forgot to release it does not keep a server thread for good.
HOLD_LIMIT_SECONDS = 600


class Answer:
    def __init__(self, status: int, body: bytes = b"", headers: dict | None = None):
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.body_decoded = body


def image(route: str) -> Answer:
    """A 96 x 64 picture for *route* (``/img/NAME.jpg`` or ``.png``), its colours from
    the name's hash: real image bytes that Pillow and ImagesPipeline read."""
    jpeg = route.endswith(".jpg")
    headers = {"Content-Type": "image/jpeg" if jpeg else "image/png"}
    return Answer(200, image_bytes(route), headers)


@functools.lru_cache(maxsize=256)
def image_bytes(route: str) -> bytes:
    from PIL import Image, ImageDraw

    digest = hashlib.sha1(route.encode()).digest()
    picture = Image.new("RGB", (96, 64), tuple(digest[:3]))
    ImageDraw.Draw(picture).ellipse((24, 8, 72, 56), fill=tuple(digest[3:6]))
    out = io.BytesIO()
    picture.save(out, "JPEG" if route.endswith(".jpg") else "PNG", quality=85)
    return out.getvalue()


class DemoSite:
    def __init__(self, pages: int = 3000, page_bytes: int = 3000, seed: int = 0):
        self.pages = pages
        self.page_bytes = page_bytes
        self.seed = seed
        self.counts: Counter[str] = Counter()
        self.versions: Counter[str] = Counter()
        self.request_headers: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._gate = threading.Event()
        self._gate.set()
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
            if self.base_url:
                port = urlsplit(self.base_url).port
                parts.append(f"<a href='http://localhost:{port}/page/{n}.html'>elsewhere</a>")
                parts.append(f"<a href='{self.base_url}/page/{(n + 2) % self.pages}.html'>on</a>")
        if encoding != "utf-8":
            parts.append("<p>caf\u00e9 na\u00efve fa\u00e7ade</p>")
        size = len("".join(parts))
        while size < self.page_bytes:
            sentence = " ".join(rng.choice(WORDS) for _ in range(12))
            parts.append(f"<p>{sentence}.</p>\n")
            size += len(sentence) + 9
        parts.append("</body></html>\n")
        return "".join(parts).encode(encoding)

    def product(self, n: int, version: int = 0) -> dict:
        """The facts behind ``/product/N.html`` (what a correct parser extracts)."""
        rng = random.Random(self.seed * 7_000_003 + n * 13 + version)
        cents = rng.randrange(500, 100_000)
        colors = rng.sample(["red", "green", "blue", "black", "white", "grey"], 3)
        return {
            "sku": f"SKU-{n:06d}",
            "name": f"{rng.choice(BRANDS)} {rng.choice(WORDS).title()} {n}"
            + (f" v{version}" if version else ""),
            "brand": rng.choice(BRANDS),
            "price": cents / 100,
            "old_price": (cents + 1000) / 100 if n % 3 == 0 else None,
            "currency": "EUR",
            "availability": "InStock" if n % 7 else "OutOfStock",
            "rating": round(rng.uniform(1, 5), 1),
            "review_count": rng.randrange(0, 500),
            "category": ["Shop", rng.choice(WORDS).title(), rng.choice(WORDS).title()],
            "colors": colors,
            "sizes": ["S", "M", "L"] if n % 2 else [],
            "seller": f"Seller {n % 17}",
            "related": [rng.randrange(self.pages) for _ in range(4)],
        }

    def product_html(self, n: int, version: int = 0) -> bytes:
        p = self.product(n, version)
        rng = random.Random(n)
        old = f"<s class='old-price'>{p['old_price']:.2f}</s>" if p["old_price"] else ""
        crumbs = "".join(f"<li><a href='/c/{c.lower()}'>{c}</a></li>" for c in p["category"])
        parts = [
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
            f"<title>{p['name']} | Demo Shop</title>",
            f"<meta name='description' content='Buy {p['name']}'>",
            "</head><body>",
            f"<nav class='breadcrumb'><ol>{crumbs}</ol></nav>",
            f"<div class='product' data-sku='{p['sku']}' itemscope>",
            f"<h1 class='product-title' itemprop='name'>{p['name']}</h1>",
            f"<span class='brand' itemprop='brand'>{p['brand']}</span>",
            "<div class='price-box'>",
            f"<span class='price' itemprop='price' content='{p['price']:.2f}'>"
            f"{p['price']:.2f} &euro;</span>{old}",
            f"<meta itemprop='priceCurrency' content='{p['currency']}'>",
            f"<link itemprop='availability' href='https://schema.org/{p['availability']}'>",
            "</div>",
            f"<div class='rating' data-rating='{p['rating']}'>"
            f"<span class='count'>{p['review_count']} reviews</span></div>",
            "<ul class='gallery'>"
            + "".join(f"<li><img src='/img/{p['sku']}-{i}.jpg' alt=''></li>" for i in range(3))
            + "</ul>",
            "<ul class='colors'>" + "".join(f"<li>{c}</li>" for c in p["colors"]) + "</ul>",
            "<select class='sizes'>"
            + "".join(f"<option>{s}</option>" for s in p["sizes"])
            + "</select>",
            f"<div class='seller'>Sold by <a href='/seller/{p['seller']}'>{p['seller']}</a></div>",
            "<div class='shipping'>Free shipping over 50 &euro;</div>",
            "<table class='specs'>"
            + f"<tr><th>SKU</th><td>{p['sku']}</td></tr>"
            + f"<tr><th>Brand</th><td>{p['brand']}</td></tr>"
            + "<tr><th>Weight</th><td>1.2 kg</td></tr></table>",
            "<div class='description' itemprop='description'><p>"
            + " ".join(rng.choice(WORDS) for _ in range(40))
            + "</p></div>",
            "<ul class='related'>"
            + "".join(f"<li><a href='/product/{k}.html'>product {k}</a></li>" for k in p["related"])
            + "</ul>",
            "<div class='reviews'>",
        ]
        size = sum(map(len, parts))
        i = 0
        while size < self.page_bytes:
            text = " ".join(rng.choice(WORDS) for _ in range(30))
            review = (
                f"<div class='review'><span class='author'>user{i}</span>"
                f"<span class='stars'>{1 + i % 5}</span><p>{text}</p></div>\n"
            )
            parts.append(review)
            size += len(review)
            i += 1
        parts.append("</div></div></body></html>\n")
        return "".join(parts).encode()

    def payload(self, path: str) -> bytes:
        """What the server means by ``path``: the body after any content coding."""
        return self.answer(path, {}, serving=False).body_decoded

    def answer(self, path: str, headers: dict, serving: bool = True) -> Answer:
        parts = urlsplit(path)
        route = parts.path
        query = parse_qs(parts.query)
        if serving:
            with self._lock:
                self.counts[route] += 1
                self.request_headers[route] = headers
        if route.startswith("/hold/"):
            if serving:
                self._gate.wait(HOLD_LIMIT_SECONDS)
            route = route[len("/hold") :]
        seen = self.counts[route]
        version = self.versions[route]
        segs = route.strip("/").split("/")
        kind = segs[0] if segs else ""
        arg = segs[1].split(".")[0] if len(segs) > 1 else "0"
        n = int(arg) if arg.isdigit() else 0
        ans = self._route(kind, n, version, seen, query if serving else {}, route)
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

    def js_page(
        self, n: int, delay_ms: int = 0, after_load: bool = False, fetch: bool = False
    ) -> Answer:
        """A page that is empty until its script runs (the tests' rendering target)."""
        fill = (
            "function fill() {"
            f"document.title = 'JS page {n}';"
            "var c = document.getElementById('content');"
            f"c.innerHTML = '<h1>Rendered {n}</h1><p class=\"js\">made by script</p>'"
            f" + '<a href=\"/js/{(n + 1) % self.pages}\">next</a>';"
            "c.setAttribute('data-ready', '1');"
            "}"
        )
        if fetch:
            start = f"fetch('/data/{n}?ms={delay_ms}').then(function (r) {{ return r.json(); }}).then(fill);"
        else:
            start = f"setTimeout(fill, {delay_ms});"
        if after_load or fetch:
            start = f"window.addEventListener('load', function () {{ {start} }});"
        script = fill + start
        body = (
            "<!DOCTYPE html><html><head><title></title></head><body>"
            f"<div id='content'></div><img src='/img/{n}.png'>"
            f"<script>{script}</script></body></html>"
        ).encode()
        return Answer(200, body, {"Content-Type": "text/html; charset=utf-8"})

    def _route(self, kind, n, version, seen, query, route) -> Answer:
        if route == "/":
            links = "".join(
                f"<a href='/page/{k}.html'>{k}</a> " for k in range(min(20, self.pages))
            )
            return Answer(
                200, f"<html><body>{links}</body></html>".encode(), {"Content-Type": "text/html"}
            )
        if route == "/sitemap.xml":
            urls = "".join(
                f"<url><loc>/page/{k}.html</loc></url>" for k in range(min(20, self.pages))
            )
            body = (
                "<?xml version='1.0' encoding='UTF-8'?>\n"
                f"<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>{urls}</urlset>\n"
            ).encode()
            return Answer(200, body, {"Content-Type": "application/xml"})
        if route == "/robots.txt":
            return Answer(
                200, b"User-agent: *\nDisallow: /private/\n", {"Content-Type": "text/plain"}
            )
        if kind in ("page", "gzip", "chunked", "private") and 0 <= n < self.pages:
            return self._page(n, version)
        if kind == "product" and 0 <= n < self.pages:
            time.sleep(int(query.get("ms", ["0"])[0]) / 1000)
            body = self.product_html(n, version)
            return Answer(200, body, {"Content-Type": "text/html; charset=utf-8"})
        if kind == "js":
            return self.js_page(
                n,
                int(query.get("delay", ["0"])[0]),
                after_load=query.get("after") == ["load"],
                fetch=query.get("fetch") == ["1"],
            )
        if kind == "img" and route.endswith((".jpg", ".png")):
            return image(route)
        if kind == "data":
            time.sleep(int(query.get("ms", ["0"])[0]) / 1000)
            return Answer(200, b'{"n": %d}' % n, {"Content-Type": "application/json"})
        if kind == "latin1":
            return self._page(n, version, encoding="latin-1")
        if kind == "slow":
            time.sleep(int(query.get("ms", ["0"])[0]) / 1000)
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

    def hold(self) -> None:
        """Shut the gate: requests for /hold/... wait until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        """Open the gate: held requests are answered, new ones at once."""
        self._gate.set()

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()

    # -- serving -------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        site = self

        class Handler(_Handler):
            demo = site

        self._server = _Server(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog is 5: crawls opening more connections at once
    # than that lose their SYNs, and the kernel sends them again 1, 3, 7, 15, 31 s
    # later, so a few pages take tens of seconds for no fault of the crawl's.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        # A crawl killed mid-request drops its connections: not the site's error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


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
        prog="python -m demo.site", description=__doc__, formatter_class=ToolHelpFormatter
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
