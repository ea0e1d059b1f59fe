"""Stops and failures: signals, a full disk, exit statuses."""

from __future__ import annotations

import resource
import signal
import subprocess
import time

from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import ROOT, crawl_command, crawl_env, run_crawl, start_crawl, write_urls


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


def _stop_with(signals_to_send, site, tmp_path, data_dir):
    urls = [f"{site.base_url}/slow/{n}?ms=100" for n in range(200)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    proc = start_crawl(
        url_file,
        data_dir,
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=2",
        log_path=tmp_path / "crawl.log",
    )
    deadline = time.monotonic() + 60
    log = tmp_path / "crawl.log"
    while "Storing in" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    for sig in signals_to_send:
        proc.send_signal(sig)
        time.sleep(0.05)
    code = proc.wait(timeout=120)
    return code, log.read_text(), urls, url_file


def test_sigusr1_stops_gracefully_and_a_rerun_resumes(site, tmp_path, data_dir):
    code, log, urls, url_file = _stop_with([signal.SIGUSR1], site, tmp_path, data_dir)
    assert code == 75, log
    assert "Received SIGUSR1" in log
    assert "(shutdown)" in log
    kept = assert_rows_readable(data_dir, site)
    assert 0 < len(kept) < len(urls)
    assert not list((data_dir / "archive").glob("*.open"))  # closed properly
    resumed = run_crawl(url_file, data_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert set(rows_by_url(data_dir)) == set(urls)


def test_a_second_signal_forces_a_stop_that_keeps_committed_rows_valid(site, tmp_path, data_dir):
    code, log, urls, url_file = _stop_with(
        [signal.SIGTERM, signal.SIGTERM], site, tmp_path, data_dir
    )
    assert code != 0, log
    assert "forcing unclean shutdown" in log.lower() or "Received SIGTERM twice" in log, log
    assert_rows_readable(data_dir, site)
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
