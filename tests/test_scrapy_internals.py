"""What ``crawler/downloader.py`` relies on in Scrapy's internals, on the Scrapy installed:
a Scrapy release that changes one of them turns a test here red, before a crawl quietly
sends inside a back-off, paces twice or hangs at its close."""

from __future__ import annotations

import inspect

import pytest_twisted
from scrapy import signals
from scrapy.core.downloader import Downloader, Slot
from scrapy.core.engine import ExecutionEngine, _Slot
from scrapy.utils.defer import deferred_from_coro

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
    assert {"jitter", "delay", "queue", "lastseen"} <= set(Slot.__dataclass_fields__)
    get_slot = inspect.signature(Downloader._get_slot)
    assert list(get_slot.parameters)[:2] == ["self", "request"]
    assert inspect.iscoroutinefunction(_Slot.close)
    assert "_slot" in inspect.getsource(ExecutionEngine.close_spider_async)


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
