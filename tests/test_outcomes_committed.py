"""A run whose storage failed reports what it committed, not what it fetched (a real
kill of the archive writer process mid-crawl)."""

from __future__ import annotations

import os
import re
import signal

from tests.conftest import start_crawl, write_urls
from tests.events import committed_rows
from tests.faults import wait_for_rows, writer_pid

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
