"""What ``crawler/downloader.py`` and ``crawler/connpool.py`` rely on in Scrapy's (and
Twisted's) internals, on the versions installed: a release that changes one of them
turns a test here red, before a crawl quietly sends inside a back-off, paces twice,
hangs at its close or holds every connection of the last minutes."""

from __future__ import annotations

import inspect

import pytest_twisted
from scrapy import signals
from scrapy.core.downloader import Downloader, Slot
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.core.engine import ExecutionEngine, _Slot
from scrapy.utils.defer import deferred_from_coro
from twisted.web.client import HTTPConnectionPool

from crawler.signals import crawl_closing
from tests.conftest import project_settings, run_crawl, write_urls
from tests.crawls import crawl_site
from tests.hostservers import HostServers

QUIET = {"AUTOTHROTTLE_ENABLED": False, "ROBOTSTXT_OBEY": False, "LOG_LEVEL": "INFO"}


class WireWatch:
    """An extension noting what goes on the wire, the close's start and its end."""

    seen: list[str] = []

    @classmethod
    def from_crawler(cls, crawler):
        seen = cls.seen

        def opened():
            # After the host budgets' spider_opened, which set their own hook.
            downloader = crawler.engine.downloader
            before = downloader.on_wire

            def on_wire(request):
                seen.append(request.url)
                before(request)

            downloader.on_wire = on_wire

        crawler.signals.connect(opened, signal=signals.engine_started, weak=False)
        crawler.signals.connect(lambda: seen.append("closing"), signal=crawl_closing, weak=False)
        crawler.signals.connect(
            lambda: seen.append("closed"), signal=signals.spider_closed, weak=False
        )
        return cls()


def test_the_private_names_the_downloader_uses_are_there():
    download = inspect.signature(Downloader._download)
    assert list(download.parameters) == ["self", "slot", "request"]
    assert inspect.iscoroutinefunction(Downloader._download)
    # The one way from a slot's queue to the wire, and the delay it keeps to.
    assert "self._download(slot, request)" in inspect.getsource(Downloader._wait_for_download)
    process = inspect.getsource(Downloader._process_queue)
    assert "slot.download_delay()" in process and "slot.queue.popleft()" in process
    fields = {"jitter", "delay", "queue", "lastseen", "active", "transferring", "latercall"}
    assert fields <= set(Slot.__dataclass_fields__)
    get_slot = inspect.signature(Downloader._get_slot)
    assert list(get_slot.parameters)[:2] == ["self", "request"]
    # A new slot is made there, and only there (the idle ones are dropped past a bound).
    assert "self.slots[key] = " in inspect.getsource(Downloader._get_slot)
    assert inspect.iscoroutinefunction(_Slot.close)
    assert "_slot" in inspect.getsource(ExecutionEngine.close_spider_async)


def test_the_pool_internals_crawler_connpool_relies_on_are_there():
    """``crawler/connpool.py`` swaps the pool of Scrapy's HTTP/1.1 handler and keeps
    Twisted's per-host lists and timers in step with its own idle list."""
    made = inspect.getsource(HTTP11DownloadHandler.__init__)
    assert "self._pool: HTTPConnectionPool = HTTPConnectionPool(" in made
    assert "self._pool.maxPersistentPerHost" in made and "self._pool._factory" in made
    for name in ("_putConnection", "_removeConnection"):
        assert list(inspect.signature(getattr(HTTPConnectionPool, name)).parameters) == [
            "self",
            "key",
            "connection",
        ]
    pool = HTTPConnectionPool(None)
    assert pool._connections == {} and pool._timeouts == {}
    get = inspect.getsource(HTTPConnectionPool.getConnection)
    assert "self._connections.get(key)" in get and "connections.pop(0)" in get
    put = inspect.getsource(HTTPConnectionPool._putConnection)
    assert "self._connections.setdefault(key, [])" in put and "self._timeouts[connection]" in put
    remove = inspect.getsource(HTTPConnectionPool._removeConnection)
    assert "self._connections[key].remove(connection)" in remove


@pytest_twisted.ensureDeferred
async def test_every_request_is_seen_on_the_wire_and_closing_comes_first(tmp_path):
    """The wire hook is called once per request sent, from the downloader's
    ``_download``; the close starts with :data:`crawl_closing`, before Scrapy's
    ``spider_closed``."""
    seen = WireWatch.seen = []
    with HostServers(["a.test"], latency=0.01) as hosts:
        urls = hosts.urls("a.test", 3)
        settings = {**hosts.settings(), **QUIET}
        settings["EXTENSIONS"] = {
            **project_settings(tmp_path)["EXTENSIONS"],
            f"{__name__}.WireWatch": 0,
        }
        with hosts.resolving():
            await deferred_from_coro(crawl_site(urls, tmp_path / "data", settings))
    assert sorted(seen[:3]) == sorted(urls)
    assert seen[3:] == ["closing", "closed"]


def test_requests_queued_in_a_slot_are_let_go_unsent_at_the_close(tmp_path):
    """A crawl stopped after its first page (CLOSESPIDER_PAGECOUNT) with two requests
    queued in their download slot for its 5 s delay: they are never sent (Scrapy's own
    close would pace them out, one every 5 s), and the next run fetches them."""
    with HostServers(["slow.test"], latency=0.01) as hosts:
        urls = write_urls(tmp_path / "urls.txt", hosts.urls("slow.test", 3))
        settings = ["HOST_BUDGET_ENABLED=0", "DOWNLOAD_DELAY=5", "DOWNLOAD_DELAY_JITTER=0"]
        settings += ["AUTOTHROTTLE_ENABLED=0", "ROBOTSTXT_OBEY=0"]
        args = [a for s in settings for a in ("-s", s)] + hosts.setting_args()
        stopped = run_crawl(urls, tmp_path / "data", *args, "-s", "CLOSESPIDER_PAGECOUNT=1")
        assert stopped.returncode == 75, stopped.stderr[-3000:]
        assert hosts["slow.test"].hits() == 1
        assert "Closing: 2 request(s) waiting to go out are let go unsent" in stopped.stderr
        rerun = run_crawl(urls, tmp_path / "data", *args)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert hosts["slow.test"].hits() == 3
