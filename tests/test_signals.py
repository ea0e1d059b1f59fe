"""Stopping a crawl with signals, as docs/reference/commands.md promises.

SIGINT, SIGTERM and SIGUSR1 stop gracefully: requests in flight finish and are stored,
the archive is closed and the last batch committed, the exit status is 75 and a rerun
resumes. A second signal stops at once. Every step waits for an event: two requests
are held in flight by the site's gate, which the test opens when it chooses.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.checks import actions, assert_rows_readable, rows_by_url
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls
from tests.events import wait_for_log, wait_until

HELD = ["/hold/page/41.html", "/hold/page/42.html"]
# Two downloads at a time: with both held, nothing else can start.
ARGS = (
    "-s",
    "CONCURRENT_REQUESTS=2",
    "-s",
    "CONCURRENT_REQUESTS_PER_DOMAIN=2",
    # Nothing is committed by the clock: rows present after the stop were committed by it.
    "-s",
    "CATALOG_FLUSH_SECONDS=3600",
)


def held_crawl(site, tmp_path: Path, data_dir: Path) -> tuple[subprocess.Popen, list[str], Path]:
    """A crawl whose two download slots are both taken by held requests."""
    base = site.base_url
    urls = [f"{base}/page/{n}.html" for n in range(400, 405)]
    urls += [base + path for path in HELD]
    urls += [f"{base}/page/{n}.html" for n in range(405, 445)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    site.reset_counts()
    site.hold()
    log = tmp_path / "crawl.log"
    proc = start_crawl(url_file, data_dir, *ARGS, log_path=log)
    wait_until(lambda: all(site.counts[p] for p in HELD), "both held requests in flight", proc=proc)
    return proc, urls, url_file


def stop_if_running(proc: subprocess.Popen, bound: float = 120) -> None:
    """After a failed wait: the crawl must not outlive its test."""
    try:
        proc.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        kill_group(proc)


def served(site, urls: list[str]) -> set[str]:
    return {u for u in urls if site.counts[u.split(site.base_url, 1)[1]]}


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name
)
def test_a_signal_stops_gracefully_and_a_rerun_resumes(site, tmp_path, data_dir, sig):
    proc, urls, url_file = held_crawl(site, tmp_path, data_dir)
    try:
        proc.send_signal(sig)
        log = wait_for_log(tmp_path / "crawl.log", f"Received {sig.name}, shutting down", proc)
        assert proc.poll() is None, "a graceful stop waits for the requests in flight"
    finally:
        site.release()
        stop_if_running(proc)
    code = proc.wait(timeout=120)
    log = (tmp_path / "crawl.log").read_text()
    assert code == 75, log[-3000:]
    # Every request the site answered, the held ones included, was stored and committed;
    # the rest of the list was never asked for.
    fetched = served(site, urls)
    assert set(rows_by_url(data_dir)) == fetched
    assert {site.base_url + p for p in HELD} <= fetched
    assert len(fetched) < len(urls)
    assert_rows_readable(data_dir, site)
    assert not list((data_dir / "archive").glob("*.writing")), "the archive was closed"
    assert sorted(e["url"] for e in actions(data_dir) if e["outcome"] == "ok") == sorted(fetched)

    resumed = run_crawl(url_file, data_dir, *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert set(rows_by_url(data_dir)) == set(urls)
    assert all(site.counts[u.split(site.base_url, 1)[1]] == 1 for u in urls), "fetched twice"
    assert_rows_readable(data_dir, site)


def test_a_second_signal_stops_at_once_and_committed_rows_stay_valid(site, tmp_path, data_dir):
    proc, urls, url_file = held_crawl(site, tmp_path, data_dir)
    try:
        proc.send_signal(signal.SIGTERM)
        wait_for_log(tmp_path / "crawl.log", "Received SIGTERM, shutting down", proc)
        proc.send_signal(signal.SIGTERM)
        # At once: it exits with both held requests still unanswered.
        code = proc.wait(timeout=120)
        assert all(site.counts[p] == 1 for p in HELD)
    finally:
        site.release()
        stop_if_running(proc)
    log = (tmp_path / "crawl.log").read_text()
    assert code not in (0, 75), log[-3000:]
    assert "Received SIGTERM twice, forcing unclean shutdown" in log
    rows = assert_rows_readable(data_dir, site)
    assert not {site.base_url + p for p in HELD} & set(rows_by_url(data_dir))
    assert len(rows) < len(urls)

    resumed = run_crawl(url_file, data_dir, *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert set(rows_by_url(data_dir)) == set(urls)
    assert_rows_readable(data_dir, site)
