"""A crawl killed with SIGKILL at random moments loses nothing it committed, and every
row names a file that holds its record, at every instant."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest

from crawler.storage.datadir import DataDir
from tests.checks import actions, assert_rows_readable, response_records, rows_by_url
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls
from tests.faults import committed_rows, kill_moments, wait_for_rows
from tests.thirdparty import assert_every_row_reads_back, sqlite_rows_without_body

# Each kill lands at a moment of its own (in a commit, a rollover, between them), of the
# whole tree or of the crawl alone in turn; the list is long enough that the crawl is
# never done before the last kill.
PAGES = 200
KILLS = 8


def test_kill_minus_9_at_8_random_moments_then_resume(site, tmp_path, data_dir):
    with kill_moments() as rng:
        kill_at_random_moments_then_resume(rng, site, tmp_path, data_dir)


def kill_at_random_moments_then_resume(rng, site, tmp_path, data_dir):
    urls = [f"{site.base_url}/slow/{n}?ms=10" for n in range(PAGES)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Small batches and rollovers (a file every dozen records or so): more commits and
    # file switches to be killed in, in each run between two kills.
    args = (
        *("-s", "CATALOG_BATCH_SIZE=7", "-s", "ARCHIVE_ROLLOVER_BYTES=20000"),
        *("-s", "CONCURRENT_REQUESTS_PER_DOMAIN=8"),
    )
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        procs.append(
            start_crawl(url_file, data_dir, *args, log_path=tmp_path / f"{len(procs)}.log")
        )
        return procs[-1]

    killed_at = []
    try:
        proc = start()
        for kill in range(KILLS):
            # A moment chosen by the catalog's progress, never by the clock.
            target = committed_rows(data_dir) + rng.randint(1, 15)
            wait_for_rows(data_dir, target, proc)
            if kill % 2 == 0:
                kill_group(proc)  # a node failure, an OOM kill of the group
            else:
                os.kill(proc.pid, signal.SIGKILL)  # the crawl alone: its writer goes on
                proc.wait(timeout=60)
            # Before the next run can repair or index anything: what the kill left.
            killed_at.append(assert_every_row_reads_back(data_dir, site))
            proc = start()  # while the old writer of a crawl killed alone may still run
        assert proc.wait(timeout=300) == 0, (tmp_path / f"{len(procs) - 1}.log").read_text()[-3000:]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
    print("rows committed at each kill:", killed_at)
    assert len(killed_at) == KILLS, killed_at
    assert_every_row_reads_back(data_dir, site)
    result = run_crawl(url_file, data_dir, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = assert_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    # Records that reached the disk were indexed on restart, not fetched again:
    # every page has exactly one complete response record across the archives.
    records = response_records(data_dir)
    assert {key: n for key, n in records.items() if n != 1} == {}
    assert set(records) == set(rows)
    assert not DataDir(data_dir).open_archives()
    assert not list((data_dir / "archive").glob("*.writing"))
    oks = [e["key"] for e in actions(data_dir) if e["outcome"] == "ok"]
    assert len(oks) == len(set(oks)), "a page logged ok twice"


@pytest.mark.parametrize("fmt", ["zip", "sqlite"])
def test_a_killed_crawl_of_another_format_resumes_with_every_url_stored_once(
    site, tmp_path, data_dir, fmt
):
    with kill_moments() as rng:
        kill_a_crawl_then_resume(rng, site, tmp_path, data_dir, fmt)


def kill_a_crawl_then_resume(rng, site, tmp_path, data_dir, fmt):
    urls = [f"{site.base_url}/slow/{n}?ms=10" for n in range(200)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Small rollovers: kills also land while one file closes and the next opens.
    args = ("-s", "CATALOG_BATCH_SIZE=7", "-s", f"ARCHIVE_FORMAT={fmt}")
    args += ("-s", "ARCHIVE_ROLLOVER_BYTES=200000")
    for attempt in range(4):
        proc = start_crawl(url_file, data_dir, *args, log_path=tmp_path / f"{attempt}.log")
        target = committed_rows(data_dir) + rng.randint(5, 30)
        wait_for_rows(data_dir, target, proc)
        if attempt % 2 == 0:
            kill_group(proc)
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the crawl alone: its writer goes on
            proc.wait(timeout=60)
        # Read with no code of the project's (for sqlite, the sqlite3 shell alone).
        assert_every_row_reads_back(data_dir, site)
        if fmt == "sqlite":
            assert sqlite_rows_without_body(data_dir) == []
    result = run_crawl(url_file, data_dir, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = assert_rows_readable(data_dir, site)
    if fmt == "sqlite":
        assert sqlite_rows_without_body(data_dir) == []
    assert set(rows_by_url(data_dir)) == set(urls)
    records = response_records(data_dir)
    assert {key: n for key, n in records.items() if n != 1} == {}
    assert set(records) == set(rows)
    assert not DataDir(data_dir).open_archives()
