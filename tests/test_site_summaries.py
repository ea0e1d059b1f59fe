"""The ``site`` spider's page summaries: off while crawling, made by re-parsing or on request."""

from __future__ import annotations

import sqlite3

from tests.checks import catalog_rows
from tests.cmdline import run_scrapy
from tests.conftest import run_crawl, write_urls


def tables(data_dir) -> set[str]:
    conn = sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def summarized(data_dir) -> set[str]:
    if "page_summary" not in tables(data_dir):
        return set()
    conn = sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT url FROM page_summary")}
    finally:
        conn.close()


def pages(site) -> tuple[list[str], list[str]]:
    html = [f"{site.base_url}/page/{n}.html" for n in range(6)]
    other = [f"{site.base_url}/binary/{n}" for n in range(2)]
    return html, other


def test_a_list_crawl_stores_every_page_and_reparse_summarizes_them(site, tmp_path, data_dir):
    html, other = pages(site)
    result = run_crawl(write_urls(tmp_path / "urls.txt", html + other), data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(catalog_rows(data_dir)) == len(html + other)
    assert summarized(data_dir) == set()

    result = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summarized(data_dir) == set(html)


def test_summaries_at_crawl_time_on_request(site, tmp_path, data_dir):
    html, other = pages(site)
    url_file = write_urls(tmp_path / "urls.txt", html + other)
    result = run_crawl(url_file, data_dir, "-a", "summaries=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(catalog_rows(data_dir)) == len(html + other)
    assert summarized(data_dir) == set(html)
