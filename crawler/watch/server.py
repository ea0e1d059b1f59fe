"""The HTTP side of ``scrapy job serve``: a read-only page of the live view.

On 127.0.0.1 unless told otherwise (``--bind``); whoever may reach another address
must bring the token (``?token=...`` on the page's URL, which its script passes on, or
an ``Authorization: Bearer`` header), compared in constant time. GET and HEAD only;
every answer is ``no-store``, sends no referrer (the token is in the URL) and may load
nothing from elsewhere. The view is built at most once per half refresh, whoever asks:
a page left open in many browsers reads the hub no more often.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from crawler.hub.errors import HubError
from crawler.watch.model import JobView
from crawler.watch.page import SCRIPT, render_main, render_page

logger = logging.getLogger(__name__)

HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; "
        "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    ),
}


def is_loopback(address: str) -> bool:
    """Whether *address* (an IP or ``localhost``) is reachable from this machine only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class LiveViews:
    """The page's parts, built from a fresh view at most every ``refresh / 2`` seconds
    (one at a time: matplotlib draws on one thread)."""

    def __init__(self, make_view: Callable[[], JobView], refresh: float) -> None:
        self.make_view = make_view
        self.refresh = refresh
        self._lock = threading.Lock()
        self._built = -1e9
        self._view: JobView | None = None
        self._main = ""

    def current(self) -> tuple[JobView, str]:
        """The view, and its ``<main>`` HTML; HubError when the hub cannot be read."""
        with self._lock:
            if self._view is None or time.monotonic() - self._built >= self.refresh / 2:
                view = self.make_view()
                self._main = render_main(view)
                self._view, self._built = view, time.monotonic()
            return self._view, self._main


class LiveServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], views: LiveViews, token: str | None) -> None:
        super().__init__(address, _Handler)
        self.views = views
        self.token = token

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in ("0.0.0.0", "::"):  # every address: the one a reader types is the name
            host = socket.gethostname()
        shown = f"[{host}]" if ":" in str(host) else host
        query = f"?token={self.token}" if self.token else ""
        return f"http://{shown}:{port}/{query}"


class _Handler(BaseHTTPRequestHandler):
    server: LiveServer
    server_version = "research-crawler-live"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def _refuse(self) -> None:
        self._send(405, "text/plain", b"read-only: GET and HEAD only\n", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _answer(self, head: bool) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/live.js":  # the same script for everyone: no data in it
            self._send(200, "text/javascript", SCRIPT.encode(), head=head)
            return
        if parts.path not in ("/", "/view"):
            self._send(404, "text/plain", b"not found: the page is at /\n", head=head)
            return
        if not self._allowed(parts.query):
            self._send(
                403, "text/plain", b"a token is required: open the URL `scrapy job serve` printed\n"
            )
            return
        try:
            view, main = self.server.views.current()
        except HubError as exc:
            self._send(503, "text/plain", f"the hub cannot be read: {exc}\n".encode(), head=head)
            return
        refresh = self.server.views.refresh
        body = main if parts.path == "/view" else render_page(view, refresh, main)
        self._send(200, "text/html; charset=utf-8", body.encode(), head=head)

    def _allowed(self, query: str) -> bool:
        token = self.server.token
        if not token:
            return True
        given = parse_qs(query).get("token", [""])[0]
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = given or auth[len("Bearer ") :].strip()
        return hmac.compare_digest(given.encode(), token.encode())

    def _send(
        self,
        status: int,
        kind: str,
        body: bytes,
        extra: dict[str, str] | None = None,
        head: bool = False,
    ) -> None:
        self.send_response(status)
        for name, value in {**HEADERS, **(extra or {}), "Content-Type": kind}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's naming
        """No access log: request lines hold the token."""


def serve(
    make_view: Callable[[], JobView],
    bind: str,
    port: int,
    token: str | None,
    refresh: float,
    say: Callable[[str], None],
) -> None:
    """Serve the page until SIGINT or SIGTERM; *say* is told its URL once it listens
    (OSError when the address cannot be had)."""
    server = LiveServer((bind, port), LiveViews(make_view, refresh), token)

    def stop(signum, frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        say(server.url)
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
