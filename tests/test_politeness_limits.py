"""What a host says to slow down, as servers say it, and the caps on it: a Retry-After in
either of its forms (seconds or an HTTP date) holds the host that long;
HOST_RETRY_AFTER_MAX and HOST_CRAWL_DELAY_MAX bound what a host may ask, so that a
Retry-After of an hour or a Crawl-delay of minutes does not stall a crawl. Crawls run
in this process against servers on 127.0.0.1 under host names of their own."""

from __future__ import annotations

import time
from email.utils import formatdate

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.crawls import crawl_site
from tests.hostservers import HostServers, Reply
from tests.test_host_budget import QUIET, SLACK, stored


def backs_off_once(header: str):
    """A server whose first page answers 503 with ``Retry-After: header()``."""

    def answer(server, path, n):
        if path == "/page/0.html" and n == 1:
            return Reply(503, {"Retry-After": header()})
        return None

    return answer


def after_the_back_off(log) -> list[float]:
    """Seconds from the end of the 503 to each request that started after it."""
    (answered,) = [r for r in log if r.status == 503]
    return [r.start - answered.end for r in log if r.start > answered.start]


@deferred_f_from_coro_f
async def test_a_retry_after_date_holds_the_host_until_then(tmp_path):
    # The date form has whole seconds: four ahead is at least three from the answer.
    answer = backs_off_once(lambda: formatdate(time.time() + 4, usegmt=True))
    with HostServers(["dated.test"], latency=0.02, answer=answer) as hosts:
        urls = hosts.urls("dated.test", 4)
        settings = {**hosts.settings(), **QUIET, "ROBOTSTXT_OBEY": False}
        with hosts.resolving():
            await crawl_site(urls, tmp_path / "data", settings)
        later = after_the_back_off(hosts["dated.test"].log())
    assert later and min(later) >= 3.0 - SLACK, sorted(later)
    assert stored(tmp_path / "data") == set(urls)


@deferred_f_from_coro_f
async def test_a_retry_after_past_host_retry_after_max_is_cut_to_it(tmp_path):
    answer = backs_off_once(lambda: "3600")
    with HostServers(["greedy.test"], latency=0.02, answer=answer) as hosts:
        urls = hosts.urls("greedy.test", 3)
        settings = {
            **hosts.settings(),
            **QUIET,
            "ROBOTSTXT_OBEY": False,
            "HOST_RETRY_AFTER_MAX": 2,
            # An hour's wait would end the crawl here, its pages not stored.
            "CLOSESPIDER_TIMEOUT": 30,
        }
        with hosts.resolving():
            crawler = await crawl_site(urls, tmp_path / "data", settings)
        later = after_the_back_off(hosts["greedy.test"].log())
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert stored(tmp_path / "data") == set(urls)
    assert min(later) >= 2.0 - SLACK, sorted(later)


@deferred_f_from_coro_f
async def test_a_crawl_delay_past_host_crawl_delay_max_is_cut_to_it(tmp_path):
    robots = "User-agent: *\nCrawl-delay: 600\n"
    with HostServers(["lazy.test"], latency=0.02, robots=robots) as hosts:
        urls = hosts.urls("lazy.test", 4)
        settings = {
            **hosts.settings(),
            **QUIET,
            "HOST_CRAWL_DELAY_MAX": 1,
            "CLOSESPIDER_TIMEOUT": 30,
        }
        with hosts.resolving():
            crawler = await crawl_site(urls, tmp_path / "data", settings)
        pages = [r.start for r in hosts["lazy.test"].log() if r.path != "/robots.txt"]
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert stored(tmp_path / "data") == set(urls)
    gaps = [b - a for a, b in zip(pages, pages[1:], strict=False)]
    assert len(pages) == 4 and min(gaps) >= 1.0 - SLACK, gaps
