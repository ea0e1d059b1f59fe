"""A crawl over many hosts keeps a bounded number of idle connections and download
slots: the ones of the hosts it met last, so that memory and open sockets do not grow
with the hosts of the last minutes (crawler/connpool.py, crawler/downloader.py)."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest_twisted
from scrapy import signals
from scrapy.utils.defer import deferred_from_coro

from tests.conftest import project_settings
from tests.crawls import crawl_site

HOSTS = 120
SUFFIX = ".pool.test"


class KeepAliveSite:
    """One HTTP/1.1 server on 127.0.0.1 for every name under SUFFIX, counting the
    connections each host name opened and the most open at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.opened: Counter[str] = Counter()
        self.open_now = 0
        self.most_open = 0
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.counted = False

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not self.counted:
                    self.counted = True
                    with site.lock:
                        site.opened[self.headers["Host"].split(":")[0]] += 1
                        site.open_now += 1
                        site.most_open = max(site.most_open, site.open_now)
                body = b"<html><body>a page</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def finish(self) -> None:
                super().finish()
                if self.counted:
                    with site.lock:
                        site.open_now -= 1

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, host: int, path: str) -> str:
        return f"http://h{host:04d}{SUFFIX}:{self.port}{path}"

    def __enter__(self) -> KeepAliveSite:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class MostSlots:
    """Notes the most download slots the crawl's downloader held at once."""

    most = 0

    @classmethod
    def from_crawler(cls, crawler):
        def seen(response, request, spider):
            slots = len(crawler.engine.downloader.slots)
            MostSlots.most = max(MostSlots.most, slots)

        crawler.signals.connect(seen, signal=signals.response_received, weak=False)
        return cls()


@pytest_twisted.ensureDeferred
async def test_a_crawl_over_many_hosts_keeps_the_last_hosts_connections_and_slots_only(
    tmp_path,
):
    from twisted.internet import reactor

    from tests.loopback_resolver import LoopbackResolver

    MostSlots.most = 0
    with KeepAliveSite() as site:
        # One request at a time, in list order: every host once, then the last five
        # hosts again (their connections the most recently used) and the first five
        # (long since closed for others).
        urls = [site.url(n, "/a.html") for n in range(HOSTS)]
        urls += [site.url(n, "/b.html") for n in range(HOSTS - 5, HOSTS)]
        urls += [site.url(n, "/b.html") for n in range(5)]
        settings = {
            "TWISTED_DNS_RESOLVER": "tests.loopback_resolver.LoopbackResolver",
            "LOOPBACK_HOSTS": SUFFIX,
            "ROBOTSTXT_OBEY": False,
            "AUTOTHROTTLE_ENABLED": False,
            "HOST_BUDGET_ENABLED": False,
            "CONCURRENT_REQUESTS": 1,
            "HTTP_IDLE_CONNECTIONS_MAX": 20,
            "DOWNLOAD_SLOTS_MAX": 30,
            "EXTENSIONS": {
                **project_settings(tmp_path)["EXTENSIONS"],
                f"{__name__}.MostSlots": 0,
            },
        }
        old = reactor.nameResolver
        reactor.installResolver(LoopbackResolver(reactor, 0, 60.0, [SUFFIX]))
        try:
            crawler = await deferred_from_coro(crawl_site(urls, tmp_path / "data", settings))
        finally:
            reactor.installNameResolver(old)
    assert crawler.stats.get_value("response_received_count") == HOSTS + 10
    # The idle ones kept and the one in use were open at once, not one a host (and
    # one or two more: an evicted connection's close reaches the server a moment after
    # the next request's new connection may have).
    assert site.most_open <= 24, site.most_open
    # The last hosts' connections were kept and used again; the first hosts' were not.
    last = [f"h{n:04d}{SUFFIX}" for n in range(HOSTS - 5, HOSTS)]
    first = [f"h{n:04d}{SUFFIX}" for n in range(5)]
    assert [site.opened[host] for host in last] == [1] * 5
    assert [site.opened[host] for host in first] == [2] * 5
    assert MostSlots.most <= 31, MostSlots.most


def test_idle_slots_past_the_bound_go_least_recently_used_first_once_their_delay_is_over():
    from time import monotonic

    from scrapy import Request, Spider
    from scrapy.core.downloader import Slot
    from scrapy.utils.test import get_crawler

    from crawler.downloader import AccountingDownloader

    crawler = get_crawler(Spider, {"DOWNLOAD_SLOTS_MAX": 6})
    downloader = AccountingDownloader(crawler)
    now = monotonic()

    def slot(ago: float, delay: float = 0.0) -> Slot:
        made = Slot(1, delay, 0.0)
        made.lastseen = now - ago
        return made

    downloader.slots.update(
        {
            "old1.test": slot(40),
            "old2.test": slot(30),
            "old3.test": slot(20),
            "old4.test": slot(10),  # idle too, but used more lately than the three
            "waiting.test": slot(25, delay=30),  # idle, but its delay is not over
            "busy.test": slot(50),
        }
    )
    downloader.slots["busy.test"].active.add(Request("http://busy.test/"))
    downloader._get_slot(Request("http://new.test/"))
    # 7 slots past a bound of 6: down to 4, the three least recently used idle ones go.
    assert set(downloader.slots) == {"old4.test", "waiting.test", "busy.test", "new.test"}
