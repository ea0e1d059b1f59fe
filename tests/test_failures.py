"""Stops and failures: a full disk, exit statuses (signals: test_signals.py)."""

from __future__ import annotations

import resource
import signal
import subprocess

from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import ROOT, crawl_command, crawl_env, run_crawl, write_urls


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_stops_with_a_clear_error_and_loses_nothing(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(300)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data_dir.mkdir(parents=True)
    # A file-size limit makes writes fail as on a full disk (EFBIG instead of ENOSPC).
    result = subprocess.run(
        # Without item tables, whose rows make the catalog's WAL reach the limit first.
        crawl_command(
            url_file, data_dir, "-s", "CATALOG_BATCH_SIZE=20", "-s", "CATALOG_ITEMS_ENABLED=0"
        ),
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=_limit_file_size(150_000),
    )
    assert result.returncode == 1, result.stderr
    assert "File too large" in result.stderr
    assert "rows committed so far are intact" in result.stderr
    assert ".warc.gz" in result.stderr  # names the file
    kept = assert_rows_readable(data_dir, site)
    assert 0 < len(kept) < len(urls)
    resumed = run_crawl(url_file, data_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert set(rows_by_url(data_dir)) == set(urls)
    assert_rows_readable(data_dir, site)


def test_a_finished_crawl_exits_0_and_an_interrupted_one_75(site, tmp_path, data_dir):
    url_file = write_urls(
        tmp_path / "urls.txt", [f"{site.base_url}/page/{n}.html" for n in range(40)]
    )
    limited = run_crawl(url_file, data_dir, "-s", "CLOSESPIDER_PAGECOUNT=5")
    assert limited.returncode == 75, limited.stderr
    assert run_crawl(url_file, data_dir).returncode == 0
