"""Every listed URL ends in the action log with exactly one final outcome line,
whichever component gave up on it."""

from __future__ import annotations

import gzip
import re

from tests.checks import actions
from tests.conftest import run_crawl, write_urls
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
    assert "1 ok, 0 cache_hit, 0 not_modified, 0 retry, 5 error, 0 item_error" in result.stderr
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
