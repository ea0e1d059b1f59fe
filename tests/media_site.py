"""A site of documents and images for the media pipeline tests, and its spider.

:class:`MediaSite` serves small valid files made here: ``/doc/N.pdf`` (PDF),
``/img/N.png`` (even N, RGBA PNG) and ``/img/N.jpg`` (odd N, JPEG), and listing
pages ``/list/I.html`` linking documents ``I*DOCS_PER_PAGE...`` and images
``I*IMAGES_PER_PAGE...`` (a query is ignored, so that a second crawl lists them on
pages of other keys). It counts the requests per path, and drops the connection
mid-body of the paths in ``broken``. :class:`MediaSpider` yields one
item per listing page with their ``file_urls`` and ``image_urls``; crawls started as
subprocesses find it with ``-s SPIDER_MODULES=spiders,tests.media_site``.
"""

from __future__ import annotations

import io
import re
import socket
import sys
import threading
import time
from collections import Counter
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import scrapy

from crawler.spiderkit.urls import UrlList

DOCS_PER_PAGE = 30
IMAGES_PER_PAGE = 10
THUMBS = {"small": (24, 24), "big": (60, 60)}
MEDIA_SETTINGS = {
    "ITEM_PIPELINES": {
        "pipelines.archive_files.ArchiveFilesPipeline": 1,
        "pipelines.archive_images.ArchiveImagesPipeline": 2,
        "pipelines.catalog.CatalogPipeline": 1000,
    },
    "FILES_STORE": "archive://",
    "IMAGES_STORE": "archive://",
    "IMAGES_THUMBS": THUMBS,
}


def pdf(n: int) -> bytes:
    """A one-page PDF saying ``Document n``, its cross-reference table exact."""
    text = f"BT /F1 12 Tf 20 100 Td (Document {n}) Tj ET " + "% padding\n" * (n % 50)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text.encode()),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    )
    return out.getvalue()


def image_size(n: int) -> tuple[int, int]:
    return 40 + n % 7 * 10, 30 + n % 5 * 12


@cache
def image(n: int) -> bytes:
    """Image ``n``: an RGBA PNG for even ``n``, a JPEG for odd ones."""
    from PIL import Image

    picture = Image.new("RGBA", image_size(n), (n * 37 % 256, n * 11 % 256, 200, 180))
    out = io.BytesIO()
    if n % 2:
        picture.convert("RGB").save(out, "JPEG", quality=80)
    else:
        picture.save(out, "PNG")
    return out.getvalue()


def image_path(n: int) -> str:
    return f"/img/{n}.{'jpg' if n % 2 else 'png'}"


def listing(page: int) -> bytes:
    docs = range(page * DOCS_PER_PAGE, (page + 1) * DOCS_PER_PAGE)
    images = range(page * IMAGES_PER_PAGE, (page + 1) * IMAGES_PER_PAGE)
    links = "".join(f'<a href="/doc/{n}.pdf">doc {n}</a>\n' for n in docs)
    links += "".join(f'<img src="{image_path(n)}">\n' for n in images)
    return f"<html><body><h1>Listing {page}</h1>\n{links}</body></html>".encode()


_ROUTE = re.compile(r"/(list|doc|img)/(\d+)\.(html|pdf|png|jpg)\Z")
TYPES = {"html": "text/html; charset=utf-8", "pdf": "application/pdf"}
TYPES |= {"png": "image/png", "jpg": "image/jpeg"}


class MediaSite:
    """The site on 127.0.0.1; ``delay`` seconds before each document or image."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        # Paths whose connection drops mid-body (headers and half the body sent).
        self.broken: set[str] = set()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.base_url = ""

    def payload(self, path: str) -> bytes:
        """What the site serves at ``path`` (its query ignored); raises KeyError."""
        match = _ROUTE.match(path.split("?", 1)[0])
        if match is None:
            raise KeyError(path)
        kind, n, ext = match.group(1), int(match.group(2)), match.group(3)
        if kind == "list" and ext == "html":
            return listing(n)
        if kind == "doc" and ext == "pdf":
            return pdf(n)
        if kind == "img" and image_path(n).endswith(ext):
            return image(n)
        raise KeyError(path)

    def media_requests(self) -> int:
        """Requests for documents and images so far."""
        with self._lock:
            return sum(c for p, c in self.counts.items() if p.startswith(("/doc/", "/img/")))

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?", 1)[0]
        with self._lock:
            self.counts[path] += 1
        try:
            body = self.payload(path)
        except KeyError:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if self.delay and not path.startswith("/list/"):
            time.sleep(self.delay)
        handler.send_response(200)
        handler.send_header("Content-Type", TYPES[path.rsplit(".", 1)[1]])
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if path in self.broken:
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        handler.wfile.write(body)

    def start(self) -> str:
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                site._serve(self)

            def log_message(self, format, *args) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
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
    # A backlog for every connection of a crawl at once (http.server's 5 drops the
    # rest, and their retries back off for seconds).
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A crawl killed mid-request drops its connections: not the site's error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class MediaSpider(scrapy.Spider):
    """One item per listed page: its documents as ``file_urls``, its images as
    ``image_urls``; the pipelines keep them in the archive."""

    name = "media"
    custom_settings = MEDIA_SETTINGS

    def __init__(self, urls: str, **kwargs):
        super().__init__(**kwargs)
        self.url_list = UrlList(urls)

    async def start(self):
        for _number, url, problem in self.url_list:
            if not problem:
                yield scrapy.Request(url)

    def parse(self, response):
        yield {
            "page": response.url,
            "file_urls": [response.urljoin(h) for h in response.css("a::attr(href)").getall()],
            "image_urls": [response.urljoin(s) for s in response.css("img::attr(src)").getall()],
        }
