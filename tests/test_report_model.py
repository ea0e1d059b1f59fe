"""What the report states, checked claim by claim against the data it summarises, without
HTML (``crawler/report/model.py``): "no stored row" only for URLs that have none, active
time from the attempts, limits in rounded units, a bad line of the URL list no host's."""

from __future__ import annotations

from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.report.build import ReportBuilder
from crawler.report.logread import IDLE_GAP_SECONDS, read_action_log
from crawler.report.model import (
    Pace,
    duration,
    failing_hosts,
    host_interval,
    interval_text,
    problems,
)
from crawler.report.sources import HubHost
from crawler.storage.actionlog import BAD_LINE_KIND, ROBOTS_KIND, ActionLog
from tests.conftest import write_urls
from tests.crawls import crawl_site

START = 1_800_000_000.0


def write_log(path, lines) -> None:
    log = ActionLog(path)
    for ts, url, key, outcome, extra in lines:
        log.write(url, key, outcome, ts=ts, **extra)
    log.close()


def by_cause(found) -> dict:
    return {p.cause: p for p in found}


def test_no_stored_row_is_said_only_of_urls_without_one(tmp_path):
    path = tmp_path / "fetch_log.jsonl"
    e500 = {"status": 500, "error": "500 Internal Server Error"}
    write_log(path, [
        # a 503 once, then the page: retried, stored
        (START, "http://a.test/flaky", "k-flaky", "retry", {"status": 503, "error": "HTTP 503"}),
        (START + 1, "http://a.test/flaky", "k-flaky", "ok", {"status": 200}),
        # two URLs given up after 500s; one of them stored by a later run
        (START + 2, "http://a.test/e1", "k-e1", "retry", e500),
        (START + 3, "http://a.test/e1", "k-e1", "error", {"status": 500, "error": "HTTP 500"}),
        (START + 4, "http://a.test/e2", "k-e2", "error", {"status": 500, "error": "HTTP 500"}),
        (START + 5, "http://a.test/private", "k-p", "error", {"error": "Forbidden by robots.txt"}),
    ])  # fmt: skip
    stats = read_action_log(path)
    found = by_cause(problems(stats, stored={"k-flaky", "k-e2"}))
    assert found["HTTP 503"].given_up == 0
    assert "no stored row" not in found["HTTP 503"].fate
    assert "asks for them again" not in found["HTTP 503"].fate
    assert found["HTTP 503"].fate == "No URL was given up with it: each failed attempt was retried."
    assert found["HTTP 500"].given_up == 2 and found["HTTP 500"].attempts == 3
    assert found["HTTP 500"].fate == (
        "2 URLs given up with it: 1 stored since, 1 without a stored row, which the next "
        "run of the same list asks for again."
    )
    # Stored since, both: nothing is said to be fetched again.
    both = by_cause(problems(stats, stored={"k-e1", "k-e2"}))["HTTP 500"]
    assert both.fate == "2 URLs given up with it, all stored since by a later attempt."
    none = by_cause(problems(stats, stored=set()))["HTTP 500"]
    assert "none of them has a stored row" in none.fate
    assert found[ROBOTS_KIND].fate == "Never fetched; the next run asks robots.txt again."
    assert all("Not stored" not in p.advice for p in found.values())


def test_a_bad_line_of_the_url_list_is_no_hosts_failure(tmp_path):
    path = tmp_path / "fetch_log.jsonl"
    write_log(path, [
        (START, "this line is not a URL", None, "error",
         {"error": "urls.txt:14: contains white space: 'this line is not a URL'"}),
        (START, "ftp://example.com/file", None, "error",
         {"error": "urls.txt:15: not an absolute http(s) URL: 'ftp://example.com/file'"}),
        (START + 1, "http://a.test/x", "k-x", "error", {"status": 500, "error": "HTTP 500"}),
    ])  # fmt: skip
    stats = read_action_log(path)
    assert [host for host, _ in failing_hosts(stats)] == ["a.test"]
    found = by_cause(problems(stats, stored=set()))
    assert found[BAD_LINE_KIND].attempts == 2 and found[BAD_LINE_KIND].hosts == 0
    assert found["HTTP 500"].hosts == 1


def test_active_time_counts_an_attempt_on_its_way(tmp_path):
    path = tmp_path / "fetch_log.jsonl"
    write_log(path, [
        (START, "http://a.test/0", "k0", "ok", {"status": 200, "elapsed_ms": 50.0}),
        (START + 1, "http://a.test/1", "k1", "ok", {"status": 200, "elapsed_ms": 50.0}),
        # a slow page: no line for 75 s, while it was on its way
        (START + 76, "http://a.test/slow", "k2", "ok", {"status": 200, "elapsed_ms": 75_000.0}),
        (START + 77, "http://a.test/3", "k3", "ok", {"status": 200, "elapsed_ms": 50.0}),
        # then nothing on its way for 100 s: a stall, left out
        (START + 177, "http://a.test/4", "k4", "ok", {"status": 200, "elapsed_ms": 50.0}),
    ])  # fmt: skip
    pace = Pace.of(read_action_log(path))
    assert 76 <= pace.active <= 79, pace
    assert pace.pages == 5 and pace.pages_per_second == 5 / pace.active
    assert IDLE_GAP_SECONDS < 100


def test_durations_read_as_a_reader_counts():
    assert [duration(s) for s in (0.536, 59.96, 77, 3725)] == ["0.5 s", "1m00s", "1m17s", "1h02m"]


def test_limits_read_in_rounded_units():
    assert interval_text(0.0256066) == "26 ms"
    assert interval_text(0.0045) == "4.5 ms"
    assert interval_text(0.5) == "0.5 s"
    assert interval_text(2.0) == "2 s"
    assert interval_text(1.2549) == "1.25 s"
    assert host_interval(0.0256066).why == "DOWNLOAD_DELAY 26 ms"
    budget = HubHost("a.test", 0.0256066, 1, None, 0.0, None)
    assert host_interval(0.0, None, budget).why == "hub budget: one per 26 ms"
    assert host_interval(0.25, 2.0).why == "Crawl-delay 2 s"
    assert host_interval(0.0).seconds == 0.0


@deferred_f_from_coro_f
async def test_a_real_crawl_checked_claim_by_claim(site, tmp_path):
    """The demo site: a 500 every time (given up, no row), a 503 once (retried, then
    stored), a bad line of the list; then a 503 given up at once (no retries) in one run
    and stored by the next."""
    data_dir = tmp_path / "data"
    base = site.base_url
    urls = [f"{base}/page/1.html", f"{base}/error/31", f"{base}/flaky/931", "not a URL"]
    await crawl_site(write_urls(tmp_path / "urls.txt", urls), data_dir)
    report = ReportBuilder(data_dir).collect()
    found = by_cause(problems(report.total, report.stored))
    assert found["HTTP 503"].given_up == 0, "flaky/931 was retried and stored"
    assert "no stored row" not in found["HTTP 503"].fate
    assert found["HTTP 500"].fate.startswith("1 URL given up with it, and it has no stored row")
    assert [host for host, _ in failing_hosts(report.total)] == ["127.0.0.1"]
    assert found[BAD_LINE_KIND].hosts == 0

    flaky = write_urls(tmp_path / "flaky.txt", [f"{base}/flaky/932"])
    await crawl_site(flaky, data_dir, {"RETRY_TIMES": "0"})  # the 503 is final: no row
    report = ReportBuilder(data_dir).collect()
    fate = by_cause(problems(report.total, report.stored))["HTTP 503"].fate
    assert fate.startswith("1 URL given up with it, and it has no stored row"), fate
    await crawl_site(flaky, data_dir)  # the page this time: stored
    report = ReportBuilder(data_dir).collect()
    fate = by_cause(problems(report.total, report.stored))["HTTP 503"].fate
    assert fate == "1 URL given up with it, all stored since by a later attempt.", fate
