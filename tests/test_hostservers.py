"""The per-host servers of politeness tests count what they are asked, when, and how
many at once: checked with plain HTTP clients, then with a crawl reaching them by name."""

from __future__ import annotations

import http.client
import threading

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.crawls import crawl_site
from tests.hostservers import HostServers, Reply, max_concurrency, max_in_window


def get(server, path: str) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"{server.name}:{server.port}"})
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def test_window_and_concurrency_helpers():
    assert max_in_window([], 10) == 0
    assert max_in_window([0, 5, 10, 20.5], 10) == 3  # 0, 5, 10: a closed interval
    assert max_in_window([3, 1, 2], 0.5) == 1
    assert max_concurrency([]) == 0
    assert max_concurrency([(0, 1), (1, 2), (2, 3)]) == 1  # one ends as the next starts
    assert max_concurrency([(0, 2), (1, 3), (1.5, 1.6)]) == 3


def test_requests_at_once_overlap_in_the_log_and_sequential_ones_do_not():
    with HostServers(["one.example.com", "two.example.org"], latency=0.3) as hosts:
        one, two = hosts["one.example.com"], hosts["two.example.org"]
        threads = [threading.Thread(target=get, args=(one, f"/p{n}")) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for n in range(3):
            assert get(two, f"/p{n}")[0] == 200
        assert one.max_concurrency() == 3
        assert two.max_concurrency() == 1
        assert one.max_in_window(10) == 3 and two.max_in_window(10) == 3
        assert [r.path for r in two.log()] == ["/p0", "/p1", "/p2"]
        assert all(r.end is None or r.end - r.start >= 0.3 for r in two.log())
        assert hosts.check_polite(window=10, most=3) == [
            "one.example.com: 3 requests in 10 s (at most 3), 3 at once, 3 in all"
        ]
        assert hosts.check_polite(window=10, most=1)[1].startswith("two.example.org: 3 requests")


def test_answer_and_robots_replace_the_replies_they_choose():
    def first_is_429(server, path, n):
        return Reply(429, {"Retry-After": "5"}) if n == 1 and path != "/robots.txt" else None

    with HostServers(["a.example.com"], robots="User-agent: *\nCrawl-delay: 2\n",
                     answer=first_is_429, latency=0) as hosts:  # fmt: skip
        server = hosts["a.example.com"]
        status, body, headers = get(server, "/x")
        assert (status, headers["Retry-After"]) == (429, "5")
        assert get(server, "/x")[0] == 200
        assert get(server, "/robots.txt")[1] == b"User-agent: *\nCrawl-delay: 2\n"
        assert server.hits("/x") == 2 and server.hits() == 3
        assert [r.status for r in server.log()] == [429, 200, 200]


@deferred_f_from_coro_f
async def test_a_crawl_reaches_each_server_by_its_name(tmp_path):
    names = ["www.example.co.uk", "shop.example.com", "other.example.org"]
    with HostServers(names, robots="User-agent: *\nDisallow: /private\n") as hosts:
        urls = [url for name in names for url in hosts.urls(name, 3)]
        urls.append(hosts["shop.example.com"].url("/private/1.html"))
        with hosts.resolving():
            await crawl_site(urls, tmp_path / "data", hosts.settings())
        for name in names:
            server = hosts[name]
            # Each server got its own pages and robots.txt, once each, and nothing else.
            assert server.hits("/robots.txt") == 1
            assert sorted(r.path for r in server.log()) == sorted(
                ["/robots.txt", *(f"/page/{n}.html" for n in range(3))]
            )
