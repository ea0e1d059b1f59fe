"""Every listed URL ends in the action log with exactly one final outcome line,
whichever component gave up on it."""

from __future__ import annotations

import gzip
import re
from collections import Counter

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import actions
from tests.conftest import run_crawl, write_urls
from tests.crawls import crawl_site
from tests.rawserver import RawServer, response

FINAL = {"ok", "cache_hit", "not_modified", "error"}


def chain(path: str) -> bytes:
    n = int(path.rsplit("/", 1)[1])
    return response("302 Found", [(b"Location", b"/chain/%d" % (n + 1))])


def test_every_listed_url_ends_with_one_outcome(tmp_path, data_dir):
    server = RawServer(
        {
            "/ok": response(headers=[(b"Content-Type", b"text/html")], body=b"<p>fine</p>"),
            "/loop": response("302 Found", [(b"Location", b"/loop")]),
            **{f"/chain/{n}": chain for n in range(10)},
            "/badgzip": response(
                headers=[(b"Content-Encoding", b"gzip"), (b"Content-Type", b"text/html")],
                body=b"this is not gzip" * 8,
            ),
            "/bomb": response(
                headers=[(b"Content-Encoding", b"gzip"), (b"Content-Type", b"text/plain")],
                body=gzip.compress(b"\0" * 3_000_000),
            ),
        }
    )
    long_url = server.url("/ok?q=" + "x" * 5000)
    listed = [
        server.url("/ok"),
        server.url("/loop"),
        server.url("/chain/0"),
        server.url("/badgzip"),
        server.url("/bomb"),
        long_url,
    ]
    result = run_crawl(
        write_urls(tmp_path / "u.txt", listed),
        data_dir,
        "-s", "ROBOTSTXT_OBEY=0",
        "-s", "REDIRECT_MAX_TIMES=3",
        "-s", "DOWNLOAD_MAXSIZE=1000000",
        "-s", "URLLENGTH_LIMIT=2083",
        "-s", "RETRY_ENABLED=0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    finals: dict[str, list[dict]] = {url: [] for url in listed}
    for line in actions(data_dir):
        if line["outcome"] in FINAL:
            finals[line["url"]].append(line)
    assert {url: len(lines) for url, lines in finals.items()} == dict.fromkeys(listed, 1)
    outcome = {
        url: (lines[0]["outcome"], lines[0].get("error") or "") for url, lines in finals.items()
    }
    assert outcome[server.url("/ok")][0] == "ok"
    for url in listed[1:]:
        assert outcome[url][0] == "error" and outcome[url][1], (url, outcome[url])
    assert "redirect" in outcome[server.url("/loop")][1]
    assert "redirect" in outcome[server.url("/chain/0")][1]
    assert server.counts["/chain/4"] == 0  # three redirects followed, then given up
    assert "URLLENGTH_LIMIT" in outcome[long_url][1]
    # Counted, and said at the end; no traceback, no URL of 5,000 characters.
    assert re.search(r"'progress/list_done': 6\b", result.stderr)
    summary = re.search(r"Outcomes of this run: (.*)", result.stderr).group(1)
    assert summary.startswith("1 ok, 0 cache_hit, 0 not_modified, 0 retry, 5 error ("), summary
    assert ", 0 item_error" in summary, summary
    assert "Traceback" not in result.stderr
    assert "x" * 1000 not in result.stderr


def test_ignored_statuses_are_not_log_noise(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/missing/3", f"{site.base_url}/gone/4", f"{site.base_url}/page/5.html"]
    result = run_crawl(write_urls(tmp_path / "u.txt", urls), data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ignoring response" not in result.stderr
    assert re.search(r"'httperror/response_ignored_count': 2\b", result.stderr)
    lines = {a["url"]: a for a in actions(data_dir)}
    assert (lines[urls[0]]["outcome"], lines[urls[0]]["status"]) == ("ok", 404)


def final_lines_per_key(data_dir, since: int = 0) -> Counter:
    return Counter(e["key"] for e in actions(data_dir)[since:] if e["outcome"] in FINAL)


def logged(data_dir) -> int:
    return len(actions(data_dir)) if data_dir.exists() else 0


@deferred_f_from_coro_f
async def test_a_depth_crawl_logs_one_final_line_per_key_each_run(site, tmp_path, data_dir):
    # Listed pages link to each other and to pages linked again from elsewhere, met
    # in whatever order the downloads finish.
    listed = [f"{site.base_url}/page/{n}.html" for n in range(200, 240)]
    url_file = write_urls(tmp_path / "urls.txt", listed)
    first = await crawl_site(url_file, data_dir, depth="2")
    once = final_lines_per_key(data_dir)
    assert len(once) > 50 and set(once.values()) == {1}, once.most_common(3)
    # Pages met again (higher up, while in flight or stored: how many depends on the
    # order the downloads finish in; tests/test_fetch_once.py makes one for certain)
    # are counted as such, not logged again.
    assert first.stats.get_value("catalog/cache_hits", 0) == 0, first.stats.get_stats()
    before = logged(data_dir)
    resumed = await crawl_site(url_file, data_dir, depth="2")
    again = final_lines_per_key(data_dir, before)
    assert set(again) == set(once) and set(again.values()) == {1}, again.most_common(3)
    stored = [e for e in actions(data_dir)[:before] if e["outcome"] == "ok"]
    assert resumed.stats.get_value("catalog/cache_hits") == len(stored)


@deferred_f_from_coro_f
async def test_duplicate_list_lines_are_counted_and_the_list_adds_up(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(210, 215)]
    listed = [*urls, urls[1], urls[3], urls[1]]
    url_file = write_urls(tmp_path / "urls.txt", listed)
    for run in range(2):  # fetched, then all stored
        before = logged(data_dir)
        crawler = await crawl_site(url_file, data_dir)
        stats = crawler.stats
        lines = final_lines_per_key(data_dir, before)
        assert len(lines) == len(urls) and set(lines.values()) == {1}, (run, lines)
        assert stats.get_value("progress/list_total") == len(listed)
        assert stats.get_value("progress/list_done") == len(listed), (run, stats.get_stats())
        assert stats.get_value("catalog/duplicates") == 3, (run, stats.get_stats())
