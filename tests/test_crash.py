"""A crawl killed with SIGKILL at random moments loses nothing it committed."""

from __future__ import annotations

import random
import signal

import pytest

from tests.checks import actions, assert_rows_readable, response_records, rows_by_url
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls
from tests.events import committed_rows, wait_until

PAGES = 300


@pytest.mark.parametrize("archive_format", ["warc", "zip"])
def test_kill_minus_9_at_random_moments_then_resume(site, tmp_path, data_dir, archive_format):
    rng = random.Random()
    urls = [f"{site.base_url}/slow/{n}?ms=50" for n in range(PAGES)]
    # Held in flight until the end: no run can finish before it is killed.
    held = f"{site.base_url}/hold/page/{PAGES}.html"
    urls.insert(2, held)
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
    site.reset_counts()
    site.hold()
    try:
        for attempt in range(3):
            # Killed at a random moment: once a random number of further rows is
            # committed, then a random number of further responses later.
            target = committed_rows(data_dir) + rng.randint(1, 60)
            log = tmp_path / f"crawl{attempt}.log"
            proc = start_crawl(url_file, data_dir, *args, log_path=log)
            try:
                wait_until(lambda n=target: committed_rows(data_dir) >= n, "rows", proc=proc)
                served = sum(site.counts.values()) + rng.randint(0, 20)
                wait_until(lambda n=served: sum(site.counts.values()) >= n, "responses", proc=proc)
            finally:
                kill_group(proc, signal.SIGKILL)
            # Before any repair: every committed row points at a complete record
            # holding the served bytes (open files included).
            rows = assert_rows_readable(data_dir, site)
            assert len(rows) >= target and held not in rows_by_url(data_dir)
    finally:
        site.release()
    result = run_crawl(url_file, data_dir, *args, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = assert_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    assert len(rows) == PAGES + 1
    # Records that reached the disk were indexed on restart, not fetched again:
    # every page has exactly one complete response record across the archives.
    records = response_records(data_dir)
    assert {key: n for key, n in records.items() if n != 1} == {}
    assert set(records) == set(rows)
    assert not list((data_dir / "archive").glob("*.open"))
    oks = [e for e in actions(data_dir) if e["outcome"] == "ok"]
    assert len(oks) >= PAGES
