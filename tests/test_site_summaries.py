"""The ``site`` spider's page summaries: off while crawling, made by re-parsing or on request."""

from __future__ import annotations

import signal
import sqlite3
import time

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import catalog_rows
from tests.cmdline import run_scrapy
from tests.conftest import kill_group, start_crawl, write_urls
from tests.crawls import crawl_site


def column(data_dir, sql: str) -> list:
    """The first column of ``sql``'s rows, read as a third party would (sqlite3)."""
    conn = sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute(sql)]
    finally:
        conn.close()


def tables(data_dir) -> set[str]:
    return set(column(data_dir, "SELECT name FROM sqlite_master WHERE type='table'"))


def summarized(data_dir) -> set[str]:
    if "page_summary" not in tables(data_dir):
        return set()
    return set(column(data_dir, "SELECT url FROM page_summary"))


def pages(site) -> tuple[list[str], list[str]]:
    html = [f"{site.base_url}/page/{n}.html" for n in range(6)]
    other = [f"{site.base_url}/binary/{n}" for n in range(2)]
    return html, other


@deferred_f_from_coro_f
async def test_a_list_crawl_stores_every_page_and_reparse_summarizes_them(site, data_dir):
    html, other = pages(site)
    await crawl_site(html + other, data_dir)
    assert len(catalog_rows(data_dir)) == len(html + other)
    assert summarized(data_dir) == set()

    result = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summarized(data_dir) == set(html)


@deferred_f_from_coro_f
async def test_summaries_at_crawl_time_on_request(site, data_dir):
    html, other = pages(site)
    await crawl_site(html + other, data_dir, summaries="1")
    assert len(catalog_rows(data_dir)) == len(html + other)
    assert summarized(data_dir) == set(html)


def page_log(data_dir) -> list[str]:
    return column(data_dir, "SELECT _key FROM _page_log ORDER BY seq")


def catalog_keys(data_dir) -> list[str]:
    return column(data_dir, "SELECT key FROM artifacts")


@deferred_f_from_coro_f
async def test_a_list_crawl_yields_no_items_yet_logs_every_page_for_a_follower(
    site, tmp_path, data_dir, caplog
):
    """Without summaries no page waits for a report of its items, and no page is
    reported; every committed row still reaches the page log, those a kill -9 left
    to the next run's recovery included, so that a follower parses each page once."""
    urls = [f"{site.base_url}/slow/{n}?ms=40" for n in range(160)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Nothing committed before the kill: the records written so far are indexed by
    # the next run's recovery, the path on which pages could miss the page log.
    crawl = start_crawl(
        url_file,
        data_dir,
        *("-s", "CATALOG_BATCH_SIZE=1000", "-s", "CATALOG_FLUSH_SECONDS=600"),
        *("-s", "CONCURRENT_REQUESTS_PER_DOMAIN=4"),
        log_path=tmp_path / "crawl1.log",
    )
    try:
        deadline = time.monotonic() + 120
        while sum(p.stat().st_size for p in data_dir.glob("archive/*.warc.gz")) < 20_000:
            assert time.monotonic() < deadline, (tmp_path / "crawl1.log").read_text()[-3000:]
            time.sleep(0.05)
    finally:
        kill_group(crawl, signal.SIGKILL)  # the whole tree: the writer too
    assert len(catalog_keys(data_dir)) < len(urls)  # killed mid-crawl

    await crawl_site(url_file, data_dir)
    assert "stored records the catalog lacked" in caplog.text
    keys = catalog_keys(data_dir)
    assert len(keys) == len(urls)
    logged = page_log(data_dir)
    assert sorted(logged) == sorted(keys)  # each page once, recovered ones included
    assert "_item_pages" not in tables(data_dir)  # no page waited for its items

    result = run_scrapy(
        "reparse", "site", "--follow", "--until-idle", "1", "-s", f"DATA_DIR={data_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(column(data_dir, "SELECT _key FROM page_summary")) == sorted(keys)


@deferred_f_from_coro_f
async def test_items_at_crawl_time_stay_on_when_the_command_line_asks(site, data_dir):
    html, _ = pages(site)
    # Set as -s sets it (tests/crawls.py).
    await crawl_site(html, data_dir, {"CATALOG_ITEMS_ENABLED": "1"})
    assert "_item_pages" in tables(data_dir)  # every page reported, without items
    assert sorted(page_log(data_dir)) == sorted(catalog_keys(data_dir))
    assert summarized(data_dir) == set()
