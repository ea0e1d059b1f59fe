"""A run whose storage failed reports what it committed, not what it fetched (a real
kill of the archive writer process mid-crawl)."""

from __future__ import annotations

import os
import re
import signal

from tests.conftest import run_crawl, start_crawl, write_urls
from tests.events import committed_rows
from tests.faults import wait_for_rows, writer_pid
from tests.polling import wait_until

BATCH = 10


def test_outcomes_of_a_run_whose_writer_died_count_committed_rows(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(300)]
    log_path = tmp_path / "crawl.log"
    crawl = start_crawl(
        write_urls(tmp_path / "urls.txt", urls), data_dir,
        "-s", f"CATALOG_BATCH_SIZE={BATCH}", "-s", "CATALOG_FLUSH_SECONDS=0.1",
        "-s", "DOWNLOAD_DELAY=0.02", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1",
        log_path=log_path,
    )  # fmt: skip
    try:
        writer = writer_pid(crawl.pid)
        wait_for_rows(data_dir, 20, crawl)
        os.kill(writer, signal.SIGKILL)
        assert crawl.wait(timeout=120) == 1, log_path.read_text()[-3000:]
    finally:
        if crawl.poll() is None:
            os.killpg(crawl.pid, signal.SIGKILL)
            crawl.wait()
    log = log_path.read_text()
    outcomes = [line for line in log.splitlines() if "Outcomes of this run" in line]
    assert len(outcomes) == 1, log[-3000:]
    found = re.search(
        r"storage failed, ([\d,]+) rows committed \(of ([\d,]+) fetched ok", outcomes[0]
    )
    assert found, outcomes[0]
    said, fetched = (int(n.replace(",", "")) for n in found.groups())
    stored = committed_rows(data_dir)
    # Never more than is stored. The writer reports each commit before it makes the next
    # one, so the kill may land after a commit it had no time to report: that commit, of
    # at most one batch, is the most the summary can miss.
    assert stored - BATCH <= said <= stored <= fetched, (said, stored, fetched, outcomes[0])


def test_a_revisiting_run_whose_writer_died_counts_its_revisits_on_both_sides(
    site, tmp_path, data_dir
):
    # Products send no validators: fetched again with revalidate=1, each comes back
    # unchanged and is stored as a revisit (a row the writer commits, an `unchanged` line).
    urls = write_urls(
        tmp_path / "urls.txt", [f"{site.base_url}/product/{n}.html?ms=10" for n in range(300)]
    )
    args = ("-s", f"CATALOG_BATCH_SIZE={BATCH}", "-s", "CATALOG_FLUSH_SECONDS=0.1")
    first = run_crawl(urls, data_dir, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    log_path = tmp_path / "again.log"
    crawl = start_crawl(
        urls, data_dir, *args, "-a", "revalidate=1",
        "-s", "DOWNLOAD_DELAY=0.02", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1",
        log_path=log_path,
    )  # fmt: skip
    try:
        writer = writer_pid(crawl.pid)
        wait_until(lambda: unchanged_lines(data_dir) >= 30, "revisits committed", proc=crawl)
        os.kill(writer, signal.SIGKILL)
        assert crawl.wait(timeout=120) == 1, log_path.read_text()[-3000:]
    finally:
        if crawl.poll() is None:
            os.killpg(crawl.pid, signal.SIGKILL)
            crawl.wait()
    (outcomes,) = [line for line in log_path.read_text().splitlines() if "Outcomes of" in line]
    found = re.search(r"([\d,]+) rows committed \(of ([\d,]+) fetched", outcomes)
    assert found, outcomes
    said, handed = (int(n.replace(",", "")) for n in found.groups())
    # The rows it says it committed are among the answers it says it handed over.
    assert unchanged_lines(data_dir) - BATCH <= said <= handed, outcomes


def unchanged_lines(data_dir) -> int:
    path = data_dir / "fetch_log.jsonl"
    return path.read_text().count('"outcome": "unchanged"') if path.exists() else 0
