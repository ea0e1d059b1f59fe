"""One origin server per host name on 127.0.0.1, each logging when every request it
got started and ended: what politeness tests measure ("never two at once", "at most
21 requests in any 10 s").

Every host name gets a server of its own (its own port, its own request log), and
crawls reach it under its name through ``tests/loopback_resolver.py``: Scrapy's
``TWISTED_DNS_RESOLVER`` answers 127.0.0.1 for the listed names, so that the crawl's
per-host slots, robots.txt and registered domains work on the names as on real sites.

    from tests.hostservers import HostServers, Reply

    with HostServers(["a.example.com", "b.example.org"], latency=0.05) as hosts:
        urls = hosts.urls("a.example.com", 10) + hosts.urls("b.example.org", 3)
        # in-process (Scrapy installs a resolver only when it starts the reactor):
        with hosts.resolving():
            await crawl_site(urls, data_dir, {**hosts.settings(), ...})
        # a process:  scrapy crawl site ... *hosts.setting_args()
        server = hosts["a.example.com"]
        server.max_in_window(10.0)    # most requests started within any 10 s
        server.max_concurrency()      # most requests in progress at one instant
        server.hits("/robots.txt")    # requests of one path
        hosts.check_polite(window=10.0, most=21)  # [] or what broke, per host

A server answers ``/robots.txt`` with ``robots`` (404 when None), any other path with
a small HTML page without links, after sleeping ``latency`` seconds (so that two
requests in flight at once overlap in the log). ``answer`` replaces the reply for the
requests it chooses: ``answer(server, path, n)`` (``n``, the path's request count,
from 1) returns a ``Reply`` (status, headers, body) or None for the usual one:

    def first_is_429(server, path, n):
        return Reply(429, {"Retry-After": "5"}) if n == 1 and path != "/robots.txt" else None

Times are ``time.monotonic()`` of this process (``Request.start``/``end``), with the
wall clock beside them (``Request.wall``) to compare with action-log timestamps.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class Request:
    path: str
    start: float  # time.monotonic() when the request line was read
    end: float | None  # ... when the reply was ready to write; None while in progress
    wall: float  # time.time() at the start
    status: int


Answer = Callable[["HostServer", str, int], "Reply | None"]


class HostServer:
    """The server of one host name; ``requests`` is its log, in order of arrival."""

    def __init__(
        self,
        name: str,
        *,
        robots: str | None = None,
        latency: float = 0.05,
        answer: Answer | None = None,
    ) -> None:
        self.name = name
        self.robots = robots
        self.latency = latency
        self.answer = answer
        self.requests: list[Request] = []
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                start, wall = time.monotonic(), time.time()
                with server._lock:
                    server.counts[self.path] += 1
                    n = server.counts[self.path]
                reply = server._reply(self.path, n)
                # Logged as in progress (no end yet) before anything is answered, so that
                # a client that has read its reply finds the request in the log.
                with server._lock:
                    index = len(server.requests)
                    server.requests.append(Request(self.path, start, None, wall, reply.status))
                if server.latency:
                    time.sleep(server.latency)
                # Ended once the answer is ready, before it is written: logged after the
                # write, a client that read its reply could start its next request before
                # this thread got the lock, and sequential requests looked concurrent.
                with server._lock:
                    server.requests[index] = Request(
                        self.path, start, time.monotonic(), wall, reply.status
                    )
                self.send_response(reply.status)
                headers = {"Content-Type": "text/html", **reply.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                self.wfile.flush()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _reply(self, path: str, n: int) -> Reply:
        if self.answer is not None:
            chosen = self.answer(self, path, n)
            if chosen is not None:
                return chosen
        if path == "/robots.txt":
            if self.robots is None:
                return Reply(404, {"Content-Type": "text/plain"}, b"")
            return Reply(200, {"Content-Type": "text/plain"}, self.robots.encode())
        body = f"<html><body><p>{self.name} {path}</p></body></html>".encode()
        return Reply(200, {}, body)

    # --- addresses ------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.name}:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    # --- the log ----------------------------------------------------------------------
    def log(self) -> list[Request]:
        """The requests so far, by start time."""
        with self._lock:
            return sorted(self.requests, key=lambda r: r.start)

    def hits(self, path: str | None = None) -> int:
        """Requests received (of ``path`` only, when given), finished or not."""
        with self._lock:
            return self.counts[path] if path is not None else sum(self.counts.values())

    def max_in_window(self, window: float = 10.0) -> int:
        """The most requests that started within any ``window`` seconds (a closed
        interval: requests exactly ``window`` apart count together)."""
        return max_in_window([r.start for r in self.log()], window)

    def max_concurrency(self) -> int:
        """The most requests in progress at one instant (one that ends as another
        starts does not overlap it)."""
        return max_concurrency([(r.start, r.end) for r in self.log()])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


class HostServers:
    """A server per host name (a context manager: started, then stopped)."""

    def __init__(self, names: Iterable[str], **options) -> None:
        """``options`` go to every :class:`HostServer` (``robots``, ``latency``,
        ``answer``); change one server's after, e.g. ``hosts["a.com"].robots = ...``."""
        self.servers = {name: HostServer(name, **options) for name in names}

    def __enter__(self) -> HostServers:
        for server in self.servers.values():
            server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers.values():
            server.stop()

    def __getitem__(self, name: str) -> HostServer:
        return self.servers[name]

    def __iter__(self):
        return iter(self.servers.values())

    def urls(self, name: str, count: int, prefix: str = "/page/") -> list[str]:
        """``count`` distinct page URLs of host ``name``."""
        return [self.servers[name].url(f"{prefix}{n}.html") for n in range(count)]

    def settings(self) -> dict[str, str]:
        """The settings that make a crawl reach these servers by their names."""
        return {
            "TWISTED_DNS_RESOLVER": "tests.loopback_resolver.LoopbackResolver",
            "LOOPBACK_HOSTS": ",".join(self.servers),
        }

    @contextmanager
    def resolving(self) -> Iterator[None]:
        """These names resolve on this process's reactor while the block runs, for
        in-process crawls: ``scrapy crawl`` installs the resolver that
        :meth:`settings` names, a crawl on a test's reactor does not."""
        from twisted.internet import reactor

        from tests.loopback_resolver import LoopbackResolver

        # The name resolver is put back, not the simple one installResolver returns:
        # reinstalled, that one resolves IPv4 only, and later crawls of this process
        # (another test on the same worker) could not fetch http://[::1]/.
        old = reactor.nameResolver
        reactor.installResolver(LoopbackResolver(reactor, 0, 60.0, list(self.servers)))
        try:
            yield
        finally:
            reactor.installNameResolver(old)

    def setting_args(self) -> list[str]:
        """:meth:`settings` as ``-s KEY=VALUE`` arguments of ``scrapy crawl``."""
        return [arg for key, value in self.settings().items() for arg in ("-s", f"{key}={value}")]

    def check_polite(self, window: float = 10.0, most: int = 21) -> list[str]:
        """What broke politeness, one line per host: more than ``most`` requests in a
        ``window``, or two requests at once; empty when every host was kept to it."""
        problems = []
        for server in self:
            busiest, overlap = server.max_in_window(window), server.max_concurrency()
            if busiest > most or overlap > 1:
                problems.append(
                    f"{server.name}: {busiest} requests in {window:g} s (at most {most}), "
                    f"{overlap} at once, {len(server.log())} in all"
                )
        return problems


def max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` within any closed interval ``window`` long."""
    ordered = sorted(times)
    return max((bisect_right(ordered, t + window) - i for i, t in enumerate(ordered)), default=0)


def max_concurrency(spans: list[tuple[float, float | None]]) -> int:
    """The most ``(start, end)`` spans open at one instant; an end at the instant of a
    start closes first; an end of None is still open."""
    inf = float("inf")
    events = sorted(
        [(inf if end is None else end, -1) for _, end in spans] + [(s, 1) for s, _ in spans]
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
