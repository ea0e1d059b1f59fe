"""At INFO, a crawl prints its start, its progress lines, one line per problem URL and
its summary: no version banner, no component lists, no stats dump, no traceback."""

from __future__ import annotations

import re

from demo.run import url_list
from tests.cmdline import run_scrapy
from tests.conftest import run_crawl
from tests.servers import free_port

# What a crawl of the demo's list may print besides its progress lines (one per
# PROGRESS_INTERVAL, so as many as the crawl takes seconds): the start ("Storing
# in"), the list's one bad line, one line for each of the four problem URLs (the 500
# given up, the body over DOWNLOAD_MAXSIZE, the refused connection and that host's
# robots.txt) and the summary (outcomes, bytes stored, catalog, archive, peak RSS,
# "Spider closed"). 404s and 410s are answers, stored, not problems; robots.txt's
# refusal goes to the action log.
MAX_LINES = 1 + 1 + 4 + 6
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def test_a_demo_crawl_with_failing_pages_prints_one_line_per_problem(site, tmp_path):
    refused = f"http://127.0.0.1:{free_port()}/nothing-listens-here"
    oversized = f"{site.base_url}/binary/5000"  # 9,096 bytes, over the limit below
    urls = url_list(site.base_url, tmp_path / "urls.txt")
    urls.write_text(urls.read_text() + f"{oversized}\n{refused}\n")
    result = run_crawl(
        urls,
        tmp_path / "data",
        "-a",
        "depth=1",
        "-s",
        "LOG_QUIET=1",  # as by default (the tests' crawls turn it off)
        "-s",
        "PROGRESS_INTERVAL=1",
        "-s",
        "DOWNLOAD_MAXSIZE=6000",
        "-s",
        "RETRY_TIMES=1",
    )
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if line.strip()]
    # Every line is a log line or one of the summary's printed lines: nothing spills
    # over (a dict dumped over many lines, a traceback's frames).
    assert all(
        STAMP.match(line) or line.startswith(("Catalog ", "Archive ", "Peak RSS: "))
        for line in lines
    )
    others = [line for line in lines if "Progress: " not in line]
    assert len(others) <= MAX_LINES, "\n".join(others)
    robots = refused.replace("/nothing-listens-here", "/robots.txt")
    for url in (f"{site.base_url}/error/14", oversized, refused, robots):
        assert len([line for line in lines if url in line]) == 1, (url, log)
    assert "Storing in" in others[0]
    assert "Spider closed (finished)" in others[-1]
    assert "ProxyLeaseMiddleware" not in log  # off without HUB_URL, as by default


def test_the_shell_says_nothing_of_features_off_by_default(site, tmp_path):
    result = run_scrapy(
        "shell",
        f"{site.base_url}/page/1.html",
        "-s",
        f"DATA_DIR={tmp_path / 'data'}",
        "-c",
        "response.status",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "200"
    for noise in ("PROGRESS_INTERVAL", "ProxyLeaseMiddleware", "Versions", "Enabled "):
        assert noise not in result.stderr, result.stderr
