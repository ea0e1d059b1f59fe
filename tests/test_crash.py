"""A crawl killed with SIGKILL at random moments loses nothing it committed."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.checks import actions, assert_rows_readable, response_records, rows_by_url
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls

PAGES = 300


@pytest.mark.parametrize("archive_format", ["warc", "zip"])
def test_kill_minus_9_at_random_moments_then_resume(site, tmp_path, data_dir, archive_format):
    rng = random.Random()
    urls = [f"{site.base_url}/slow/{n}?ms=50" for n in range(PAGES)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Small batches and rollovers: more commits and file switches to be killed in.
    args = (
        "-s",
        "CATALOG_BATCH_SIZE=7",
        "-s",
        "ARCHIVE_ROLLOVER_BYTES=60000",
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=4",
        "-s",
        f"ARCHIVE_FORMAT={archive_format}",
    )
    committed = []
    for attempt in range(3):
        proc = start_crawl(url_file, data_dir, *args, log_path=tmp_path / f"crawl{attempt}.log")
        time.sleep(rng.uniform(1.5, 4.0))
        kill_group(proc, signal.SIGKILL)
        # Before any repair: every committed row points at a complete record
        # holding the served bytes (open files included).
        committed.append(len(assert_rows_readable(data_dir, site)))
    # The kills landed mid-crawl, after some rows were committed.
    print("rows committed at each kill:", committed)
    assert any(0 < n < PAGES for n in committed), committed
    result = run_crawl(url_file, data_dir, *args, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = assert_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    assert len(rows) == PAGES
    # Records that reached the disk were indexed on restart, not fetched again:
    # every page has exactly one complete response record across the archives.
    records = response_records(data_dir)
    assert {key: n for key, n in records.items() if n != 1} == {}
    assert set(records) == set(rows)
    assert not list((data_dir / "archive").glob("*.writing"))
    oks = [e for e in actions(data_dir) if e["outcome"] == "ok"]
    assert len(oks) >= PAGES
