"""``scrapy catalog report``: requests per second per host against its limit, for the
busiest hosts, and the hosts in back-off, from the action logs, the run's settings and
the hub's host table."""

from __future__ import annotations

import re
from html import unescape

from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.hub import Hub
from crawler.hub.hostbudget import HostBudgetStore
from crawler.report import logread
from crawler.report.build import ReportBuilder
from crawler.report.logread import LogStats, read_action_log
from crawler.storage.actionlog import ActionLog
from tests.crawls import crawl_site
from tests.hostservers import HostServers, Reply

START = 1_800_000_000.0


def stats_of(html: str) -> dict[str, float]:
    return {
        unescape(name): float(value)
        for name, value in re.findall(r'data-stat="([^"]+)" data-value="([^"]+)"', html)
    }


def write_log(path, lines) -> None:
    log = ActionLog(path)
    for ts, url, outcome, extra in lines:
        log.write(url, None if outcome == "host_wait" else "k" + url, outcome, ts=ts, **extra)
    log.close()


def synthetic_log(path) -> None:
    lines = []
    # fast.test: 5 requests a second for 10 s; calm.test: one a second for 30 s.
    lines += [(START + i / 5, f"http://fast.test/{i}", "ok", {}) for i in range(50)]
    lines += [(START + i, f"http://calm.test:8080/{i}", "ok", {}) for i in range(30)]
    lines += [(START + 1, "http://fast.test/1", "cache_hit", {})]  # not a request
    lines += [
        (START + 2, "http://calm.test:8080/2", "retry", {"status": 429}),
        (START + 8, "http://calm.test:8080/3", "host_wait",
         {"host": "calm.test", "reason": "concurrency 1; back-off (HTTP 429, Retry-After: 5 s)",
          "elapsed_ms": 5000.0}),
        (START + 9, "http://slow.test/0", "host_wait",
         {"host": "slow.test", "reason": "Crawl-delay 4 s; concurrency 8", "elapsed_ms": 3000.0}),
        (START + 9, "http://slow.test/0", "ok", {}),
        (START + 13, "http://slow.test/1", "ok", {}),
    ]  # fmt: skip
    write_log(path, lines)


def test_requests_per_host_peaks_crawl_delays_and_back_offs_from_the_log(tmp_path):
    synthetic_log(tmp_path / "fetch_log.jsonl")
    rates = read_action_log(tmp_path / "fetch_log.jsonl").rates
    assert rates.requests == {"fast.test": 50, "calm.test": 31, "slow.test": 2}
    assert rates.busiest(2) == ["fast.test", "calm.test"]
    assert rates.width == 10 and rates.peak("fast.test") == 5.0
    assert rates.peak("calm.test") == 1.1  # 10 a bin, and the retry
    assert rates.crawl_delays == {"slow.test": 4.0}
    calm = rates.waits["calm.test"]
    assert (calm.backoffs, calm.seconds, calm.last_backoff) == (
        1, 5.0, "back-off (HTTP 429, Retry-After: 5 s)",
    )  # fmt: skip
    assert rates.waits["slow.test"].backoffs == 0


def test_hosts_binned_stay_bounded_and_keep_the_busiest(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "MAX_RATE_HOSTS", 3)
    monkeypatch.setattr(logread, "MAX_HOST_BINS", 4)
    lines = [(START + i, f"http://h{i % 6}.test/{i}", "ok", {}) for i in range(60)]
    lines += [(START + 60 + i, "http://big.test/", "ok", {}) for i in range(80)]
    write_log(tmp_path / "fetch_log.jsonl", lines)
    rates = read_action_log(tmp_path / "fetch_log.jsonl").rates
    assert len(rates.bins) == 3 and rates.busiest(1) == ["big.test"]
    assert rates.dropped >= 4 and rates.requests["big.test"] == 80
    # 8 bins of 10 s would be too many: 4 of 20 s.
    assert all(len(bins) <= 4 for bins in rates.bins.values()) and rates.width == 20
    assert rates.peak("big.test") == 1.0
    merged = LogStats()
    merged.merge(read_action_log(tmp_path / "fetch_log.jsonl"))
    assert merged.rates.requests["big.test"] == 80 and len(merged.rates.bins) <= 3


def test_the_page_shows_each_hosts_peak_against_its_limit(tmp_path):
    data = tmp_path / "data"
    synthetic_log(data / "fetch_log.jsonl")
    html = ReportBuilder(data, settings=[("DOWNLOAD_DELAY", "0.5")]).render()
    stats = stats_of(html)
    assert stats["hostreq:fast.test"] == 50 and stats["hostpeak:fast.test"] == 5.0
    assert stats["hostlimit:fast.test"] == 2.0 and stats["hostratio:fast.test"] == 2.5
    assert stats["hostlimit:slow.test"] == 0.25  # its Crawl-delay, above DOWNLOAD_DELAY
    assert stats["backoffs:calm.test"] == 1 and "backoffs:fast.test" not in stats
    figure = html[html.index('id="plot-host-rates"') :]
    figure = figure[: figure.index("</figure>")]
    # A line and a dashed limit for each of the three hosts.
    assert len(set(re.findall(r'id="host-rates-mark-(\d+)"', figure))) == 6
    assert "Retry-After: 5 s" in html
    unlimited = stats_of(ReportBuilder(data, settings=[("DOWNLOAD_DELAY", "0")]).render())
    assert unlimited["hostlimit:fast.test"] == 0 and unlimited["hostlimit:slow.test"] == 0.25


def test_hosts_in_back_off_now_come_from_the_hubs_host_table(tmp_path):
    data = tmp_path / "data"
    synthetic_log(data / "fetch_log.jsonl")
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub_url) as hub:
        HostBudgetStore(hub).back_off("calm.test", 300, "HTTP 503, Retry-After: 300 s")
    html = ReportBuilder(data, hub_url=hub_url, settings=[("DOWNLOAD_DELAY", "0.5")]).render()
    left = stats_of(html)["backoff:calm.test"]
    assert 200 < left <= 300
    assert "HTTP 503, Retry-After: 300 s" in html


@deferred_f_from_coro_f
async def test_a_crawls_report_shows_its_hosts_limits_and_back_offs(tmp_path):
    def first_page_429(server, path, n):
        if server.name == "limited.example.net" and path == "/page/0.html" and n == 1:
            return Reply(429, {"Retry-After": "1"})
        return None

    names = ["busy.example.org", "slow.example.com", "limited.example.net"]
    with HostServers(names, latency=0, answer=first_page_429) as hosts, hosts.resolving():
        hosts["slow.example.com"].robots = "User-agent: *\nCrawl-delay: 1\n"
        urls = hosts.urls(names[0], 6) + hosts.urls(names[1], 3) + hosts.urls(names[2], 2)
        settings = {**hosts.settings(), "DOWNLOAD_DELAY": 0.2, "DOWNLOAD_DELAY_JITTER": 0}
        await crawl_site(urls, tmp_path / "data", settings)
    stats = stats_of(ReportBuilder(tmp_path / "data").render())
    # Requests as the servers counted them (robots.txt is not an action-log line).
    for name in names:
        pages = sum(1 for r in hosts[name].log() if r.path != "/robots.txt")
        assert stats[f"hostreq:{name}"] == pages
    assert stats["hostlimit:busy.example.org"] == 5.0  # the run's DOWNLOAD_DELAY
    assert stats["hostlimit:slow.example.com"] == 1.0  # its Crawl-delay
    assert stats["backoffs:limited.example.net"] == 1
