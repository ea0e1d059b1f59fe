"""Host budgets across crawls: two crawls sharing a hub keep a host to one process's
limits; a Retry-After stops every crawl asking the host; robots.txt is fetched once and
its Crawl-delay kept to. Crawls run in this process, on one reactor, each with its own
data directory and its own connection to the hub, as two processes would."""

from __future__ import annotations

import json
import time

import pytest_twisted
from twisted.internet.defer import DeferredList

from crawler.storage.actionlog import read as read_log
from tests.crawls import crawl_site
from tests.hostservers import HostServers, Reply, max_concurrency, max_in_window

# The server logs when a request arrives, not when the crawl let it go: connection
# set-up and a loaded machine move each arrival by up to tenths of a second.
SLACK = 0.2
QUIET = {
    "AUTOTHROTTLE_ENABLED": False,
    "DOWNLOAD_DELAY_JITTER": 0,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "RETRY_TIMES": 1,
}


def stored(data_dir) -> set[str]:
    import sqlite3

    with sqlite3.connect(data_dir / "metadata.db") as db:
        return {url for (url,) in db.execute("select url from artifacts where status = 200")}


async def crawl_together(urls: list[str], tmp_path, settings: dict, crawls: int = 2) -> list:
    """*crawls* crawls at once, each of every other URL of *urls*."""
    from scrapy.utils.defer import deferred_from_coro

    runs = [
        deferred_from_coro(crawl_site(urls[i::crawls], tmp_path / f"data{i}", settings))
        for i in range(crawls)
    ]
    results = await DeferredList(runs, fireOnOneErrback=True, consumeErrors=True)
    return [crawler for _, crawler in results]


@pytest_twisted.ensureDeferred
async def test_two_crawls_share_one_host_budget(tmp_path):
    with HostServers(["one.test"], latency=0.05) as hosts:
        urls = hosts.urls("one.test", 12)
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": f"sqlite:///{tmp_path}/hub.db",
            "DOWNLOAD_DELAY": 0.5,
            "ROBOTSTXT_OBEY": False,
        }
        with hosts.resolving():
            await crawl_together(urls, tmp_path, settings)
        server = hosts["one.test"]
        starts = [r.start for r in server.log()]
        # One crawl alone would send a request every 0.5 s; two, twice as many.
        assert max_in_window(starts, 2.0) <= 5, starts
        assert server.max_concurrency() == 1
    assert stored(tmp_path / "data0") | stored(tmp_path / "data1") == set(urls)


@pytest_twisted.ensureDeferred
async def test_retry_after_holds_every_crawl_then_all_is_stored(tmp_path):
    def first_is_429(server, path, n):
        if path == "/page/0.html" and n == 1:
            return Reply(429, {"Retry-After": "3"})
        return None

    with HostServers(["busy.test"], latency=0.02, answer=first_is_429) as hosts:
        urls = hosts.urls("busy.test", 8)
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": f"sqlite:///{tmp_path}/hub.db",
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "ROBOTSTXT_OBEY": False,
        }
        with hosts.resolving():
            await crawl_together(urls, tmp_path, settings)
        log = hosts["busy.test"].log()
    answered = next(r for r in log if r.status == 429)
    after = [r.start - answered.end for r in log if r.start > answered.start]
    assert after and min(after) >= 3.0 - SLACK, after
    assert stored(tmp_path / "data0") | stored(tmp_path / "data1") == set(urls)
    # One line per wait episode says who waited and why.
    lines = [
        e
        for i in (0, 1)
        for e in read_log(tmp_path / f"data{i}" / "fetch_log.jsonl")
        if e["outcome"] == "host_wait"
    ]
    assert any("Retry-After" in e["reason"] for e in lines), json.dumps(lines, indent=1)
    assert all(e["host"] == "busy.test" and e["key"] is None for e in lines)


@pytest_twisted.ensureDeferred
async def test_crawl_delay_holds_the_cluster_and_robots_is_fetched_once(tmp_path):
    robots = "User-agent: *\nCrawl-delay: 1\nDisallow: /private/\n"
    with HostServers(["slow.test"], latency=0.02, robots=robots) as hosts:
        urls = hosts.urls("slow.test", 6) + [hosts["slow.test"].url("/private/x.html")]
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": f"sqlite:///{tmp_path}/hub.db",
        }
        with hosts.resolving():
            await crawl_together(urls, tmp_path, settings, crawls=3)
        server = hosts["slow.test"]
        pages = [r.start for r in server.log() if r.path != "/robots.txt"]
        assert server.hits("/robots.txt") == 1
        assert server.hits("/private/x.html") == 0
        gaps = [b - a for a, b in zip(pages, pages[1:], strict=False)]
        assert len(pages) == 6 and min(gaps) >= 1.0 - SLACK, gaps
    assert set().union(*(stored(tmp_path / f"data{i}") for i in range(3))) == set(urls[:6])


def test_per_proxy_budgets_make_each_proxy_one_visitor(tmp_path):
    """HOST_BUDGET_PER_PROXY: a host reached through two leased proxies has a budget per
    proxy, so it sees two visitors at DOWNLOAD_DELAY each, never more. (A process of its
    own: proxy leases run as in the proxy tests.)"""
    import shutil

    from crawler.hub import Hub
    from crawler.hub.hostbudget import HostBudgetStore
    from tests.conftest import run_crawl, write_urls
    from tests.hubs import open_proxies
    from tests.proxy_servers import TinyProxy
    from tests.servers import need

    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    proxies = [TinyProxy(f"visitor-{n}", tmp_path) for n in range(2)]
    hub = f"sqlite:///{tmp_path}/hub.db"
    try:
        for proxy in proxies:
            proxy.start()
        with open_proxies(hub) as pool:
            pool.add([proxy.url for proxy in proxies])
        with HostServers(["127.0.0.1"], latency=0.02) as hosts:
            urls = hosts.urls("127.0.0.1", 12)
            settings = {
                **QUIET,
                "HUB_URL": hub,
                "HOST_BUDGET_PER_PROXY": True,
                "PROXY_LEASES_PER_PROCESS": 2,
                "PROXY_ROTATE_EVERY": 1000,
                "DOWNLOAD_DELAY": 1.0,
                "ROBOTSTXT_OBEY": False,
            }
            args = [a for k, v in settings.items() for a in ("-s", f"{k}={v}")]
            done = run_crawl(write_urls(tmp_path / "urls.txt", urls), tmp_path / "data", *args)
            assert done.returncode == 0, done.stderr[-3000:]
            starts = [r.start for r in hosts["127.0.0.1"].log()]
    finally:
        for proxy in proxies:
            proxy.stop()
    with Hub.open(hub) as opened:
        keys = {state.key for state in HostBudgetStore.open(opened).hosts()}
    assert keys == {f"127.0.0.1 via {proxy.url}" for proxy in proxies}
    assert max_in_window(starts, 1.0 - SLACK) == 2, starts
    assert stored(tmp_path / "data") == set(urls)


@pytest_twisted.ensureDeferred
async def test_back_offs_do_not_spend_retries_and_lose_no_url(tmp_path):
    backoffs = QUIET["RETRY_TIMES"] + 2  # more back-offs than the retries a request has

    def backs_off(server, path, n):
        if path in ("/page/0.html", "/page/1.html") and n <= backoffs:
            return Reply(429, {"Retry-After": "1"})
        return None

    with HostServers(["busy.test"], latency=0.01, answer=backs_off) as hosts:
        urls = hosts.urls("busy.test", 4)
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": f"sqlite:///{tmp_path}/hub.db",
            "ROBOTSTXT_OBEY": False,
        }
        with hosts.resolving():
            (crawler,) = await crawl_together(urls, tmp_path, settings, crawls=1)
        hits = hosts["busy.test"].hits
        assert [hits("/page/0.html"), hits("/page/1.html")] == [backoffs + 1] * 2
    assert stored(tmp_path / "data0") == set(urls)
    assert crawler.stats.get_value("retry/backoff_count") == 2 * backoffs
    assert not crawler.stats.get_value("retry/max_reached")
    retries = [
        e for e in read_log(tmp_path / "data0" / "fetch_log.jsonl") if e["outcome"] == "retry"
    ]
    assert len(retries) == 2 * backoffs
    assert all("Retry-After: 1 s" in e["error"] for e in retries), retries
    # Each attempt has its number, back-offs included.
    first = sorted(e["attempt"] for e in retries if e["url"] == urls[0])
    assert first == list(range(1, backoffs + 1))


@pytest_twisted.ensureDeferred
async def test_requests_waiting_for_a_host_leave_room_for_other_hosts(tmp_path):
    """Requests waiting for a host that another process holds do not take up the crawl's
    CONCURRENT_REQUESTS: the other host's pages are fetched meanwhile, and never more
    than CONCURRENT_REQUESTS at once, before or after the held host is given back."""
    from crawler.hub import Hub
    from crawler.hub.hostbudget import HostAsk, HostBudgetStore

    hub_url = f"sqlite:///{tmp_path}/hub.db"
    held_for = 6.0
    with HostServers(["held.test", "free.test"], latency=0.2) as hosts:
        urls = hosts.urls("held.test", 2) + hosts.urls("free.test", 72)
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": hub_url,
            "CONCURRENT_REQUESTS": 2,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "ROBOTSTXT_OBEY": False,
        }
        with Hub.open(hub_url) as hub:
            (taken,) = HostBudgetStore.open(hub).take(
                [HostAsk("held.test", 0, 2, slots=2)], "another process", held_for
            )
        assert len(taken.slots) == 2
        given_back = time.monotonic() + held_for
        with hosts.resolving():
            await crawl_together(urls, tmp_path, settings, crawls=1)
        free, held = hosts["free.test"].log(), hosts["held.test"].log()
    assert len(held) == 2 and min(r.start for r in held) >= given_back - SLACK
    # Before the held host came back, the other's pages went, two at a time.
    assert min(r.start for r in free) < given_back - 2.0, [r.start - given_back for r in free]
    # ...and went on after it: the held host's requests waited for room.
    assert max(r.start for r in free) > given_back + 0.5
    spans = [(r.start, r.end) for r in free + held]
    assert max_concurrency(spans) == 2
    assert stored(tmp_path / "data0") == set(urls)


@pytest_twisted.ensureDeferred
async def test_requests_waiting_for_robots_txt_leave_it_room(tmp_path):
    """More requests of a host than CONCURRENT_REQUESTS wait for its robots.txt before the
    gates: the robots.txt request still gets through them, and every page is stored."""
    with HostServers(["robots.test"], latency=0.02, robots="User-agent: *\n") as hosts:
        urls = hosts.urls("robots.test", 8)
        settings = {**hosts.settings(), **QUIET, "CONCURRENT_REQUESTS": 2}
        with hosts.resolving():
            await crawl_together(urls, tmp_path, settings, crawls=1)
        assert hosts["robots.test"].hits("/robots.txt") == 1
    assert stored(tmp_path / "data0") == set(urls)


@pytest_twisted.ensureDeferred
async def test_a_graceful_stop_sends_and_logs_no_request_waiting_for_its_host(tmp_path):
    """Requests parked at a host's gate when a graceful stop begins are never sent: no
    action line, no error, and the next run fetches them; each URL is stored once."""
    from scrapy.utils.defer import deferred_from_coro

    data_dir = tmp_path / "data"
    with HostServers(["paced.test"], latency=0.02) as hosts:
        urls = hosts.urls("paced.test", 12)
        settings = {
            **hosts.settings(),
            **QUIET,
            "DOWNLOAD_DELAY": 0.5,
            "CONCURRENT_REQUESTS": 4,  # up to 8 requests parked at the gate
            "ROBOTSTXT_OBEY": False,
        }
        server = hosts["paced.test"]
        with hosts.resolving():
            await deferred_from_coro(stop_once_fetching(urls, data_dir, settings, server))
            sent = server.hits()
            assert sent < len(urls) // 2, f"{sent} requests sent after a graceful stop"
            lines = read_log(data_dir / "fetch_log.jsonl")
            assert [e["outcome"] for e in lines] == ["ok"] * sent, lines
            assert len(stored(data_dir)) == sent
            await deferred_from_coro(crawl_site(urls, data_dir, settings))
        assert server.hits() == len(urls)  # the second run fetched only what was not sent
    assert stored(data_dir) == set(urls)


async def stop_once_fetching(urls, data_dir, settings, server) -> None:
    """The site spider over *urls*, stopped gracefully (as by SIGTERM) once *server* got
    two requests."""
    import asyncio

    from scrapy.crawler import CrawlerRunner
    from scrapy.settings import Settings

    from spiders.site import SiteSpider
    from tests.conftest import project_settings, write_urls

    values = Settings(project_settings(data_dir))
    values.setdict({"DATA_DIR": str(data_dir), **settings}, priority="cmdline")
    crawler = CrawlerRunner(values).create_crawler(SiteSpider)
    listed = write_urls(data_dir.parent / "urls.txt", urls)
    running = asyncio.ensure_future(crawler.crawl_async(urls=str(listed)))
    while server.hits() < 2:
        await asyncio.sleep(0.05)
    await crawler.stop_async()
    await running


@pytest_twisted.ensureDeferred
async def test_start_requests_are_read_ahead_while_requests_wait_at_the_gates(tmp_path):
    """Requests parked at their host's gate do not make the downloader back out, and
    Scrapy's engine then reads one start request per reactor turn: the crawl reads on
    until twice CONCURRENT_REQUESTS wait in the scheduler, so that the gates have the
    next requests to ask slots for. Every URL is stored all the same."""
    from scrapy.utils.defer import deferred_from_coro

    from crawler.hub import Hub
    from crawler.hub.hostbudget import HostAsk, HostBudgetStore
    from spiders.site import SiteSpider
    from tests.conftest import write_urls
    from tests.crawls import WatchesScheduler, crawl

    class Watched(WatchesScheduler, SiteSpider):
        pass

    hub_url = f"sqlite:///{tmp_path}/hub.db"
    with HostServers(["held.test"], latency=0.02) as hosts:
        urls = hosts.urls("held.test", 6)
        # Another process holds the host a moment: every request waits at its gate.
        with Hub.open(hub_url) as hub:
            (taken,) = HostBudgetStore.open(hub).take(
                [HostAsk("held.test", 0, 1)], "another process", 2.0
            )
        assert taken.slots
        settings = {
            **hosts.settings(),
            **QUIET,
            "HUB_URL": hub_url,
            "CONCURRENT_REQUESTS": 4,
            "ROBOTSTXT_OBEY": False,
        }
        listed = write_urls(tmp_path / "urls.txt", urls)
        with hosts.resolving():
            crawler = await deferred_from_coro(
                crawl(Watched, tmp_path / "data0", settings, urls=str(listed))
            )
    assert crawler.spider.most_scheduled >= 3
    assert stored(tmp_path / "data0") == set(urls)
