"""``DATA_DIR/runs.jsonl``: each storing crawl appends what it ran with, passwords
redacted; the reader takes the last whole line."""

from __future__ import annotations

import json
import os
import socket

from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.runlog import append_run, last_run
from tests.checks import rows_by_url
from tests.cmdline import run_scrapy
from tests.crawls import crawl_site
from tests.hubs import pg_schema_url


@deferred_f_from_coro_f
async def test_a_crawl_records_its_settings_without_passwords(tmp_path, site):
    url, drop = pg_schema_url("runlog")
    # Trust authentication ignores the password, which must still never be written.
    hub_url = url.replace("postgresql://postgres@", "postgresql://postgres:runs-s3cret@")
    assert "runs-s3cret" in hub_url
    data_dir = tmp_path / "data"
    urls = [f"{site.base_url}/page/{n}.html" for n in range(3)]
    settings = {
        "HUB_URL": hub_url,
        "PROXY_ENABLED": "False",
        "PROXY_NOTE": "http://me:proxy-s3cret@127.0.0.1:3128",
        "CONCURRENT_REQUESTS": "7",
    }
    try:
        await crawl_site(urls, data_dir, settings)
    finally:
        drop()
    text = (data_dir / "runs.jsonl").read_text()
    assert "s3cret" not in text
    lines = text.splitlines()
    assert len(lines) == 1
    run = json.loads(lines[0])
    assert run["spider"] == "site" and run["host"] == socket.gethostname()
    assert run["pid"] == os.getpid()  # the crawl's process (this one: it ran in process)
    assert run["started"].endswith("Z")
    assert run["settings"]["CONCURRENT_REQUESTS"] == "7"
    assert run["settings"]["DATA_DIR"] == str(data_dir)
    assert run["settings"]["HUB_URL"].startswith("postgresql://postgres:***@127.0.0.1")
    assert run["settings"]["PROXY_NOTE"] == "http://me:***@127.0.0.1:3128"


def test_the_last_whole_line_is_the_latest_run(tmp_path):
    path = tmp_path / "runs.jsonl"
    assert last_run(path) is None
    append_run(path, "first", {"CONCURRENT_REQUESTS": "1"})
    append_run(path, "second", {"CONCURRENT_REQUESTS": "2"})
    assert last_run(path)["spider"] == "second"
    with open(path, "a") as f:
        f.write('{"started": "2026-')  # a killed run's torn line
    assert last_run(path)["settings"] == {"CONCURRENT_REQUESTS": "2"}


def test_a_crawl_records_its_arguments_and_a_shell_session_is_no_run(tmp_path, site):
    import re

    from tests.conftest import run_crawl, write_urls
    from tests.test_report import run_report

    data_dir = tmp_path / "data"
    urls = write_urls(tmp_path / "u.txt", [f"{site.base_url}/page/{n}.html" for n in range(3)])
    crawled = run_crawl(urls, data_dir, "-a", "depth=2")
    assert crawled.returncode == 0, crawled.stderr
    shell = run_scrapy(
        "shell", f"{site.base_url}/page/300.html", "-s", f"DATA_DIR={data_dir}", "-c", "1"
    )
    assert shell.returncode == 0, shell.stderr
    assert rows_by_url(data_dir).get(f"{site.base_url}/page/300.html")  # it stored
    runs = [json.loads(line) for line in (data_dir / "runs.jsonl").read_text().splitlines()]
    assert [run["spider"] for run in runs] == ["site"]
    assert runs[0]["arguments"] == {"urls": str(urls), "depth": "2"}
    report = tmp_path / "report.html"
    result = run_report(data_dir, report)
    assert result.returncode == 0, result.stderr
    html = report.read_text()
    assert re.search(r'data-setting="-a depth">2<', html), "the report shows no -a depth"


def test_a_crawl_records_its_peak_memory_in_runs_jsonl_and_its_summary(tmp_path, site):
    from tests.conftest import run_crawl, write_urls

    data_dir = tmp_path / "data"
    urls = write_urls(tmp_path / "u.txt", [f"{site.base_url}/page/{n}.html" for n in range(3)])
    crawled = run_crawl(urls, data_dir)
    assert crawled.returncode == 0, crawled.stderr
    lines = (data_dir / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the end is added to the run's own line
    run = json.loads(lines[0])
    # A Python process with Scrapy loaded holds tens of MiB; so does the writer.
    assert 20 < run["peak_rss_mib"] < 2000
    assert 10 < run["children_peak_rss_mib"] < 2000
    assert run["ended"] > run["started"]
    assert (
        f"Peak RSS: {run['peak_rss_mib']:,.1f} MiB (crawl process), "
        f"{run['children_peak_rss_mib']:,.1f} MiB" in crawled.stderr
    )
    assert f"'process/peak_rss_mib': {run['peak_rss_mib']}" in crawled.stderr
