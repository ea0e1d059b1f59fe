"""When the crawl's process alone dies, its writer process commits what reached it.

Nothing is committed by size or by the clock here (a batch of 1,000 rows, a flush
every hour), so every row found afterwards was committed by the writer on noticing
that the crawl was gone.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

from tests.checks import assert_rows_readable, catalog_rows, rows_by_url
from tests.conftest import kill_group, run_crawl, start_crawl, write_urls
from tests.events import committed_rows, log_text, wait_until
from tests.thirdparty import assert_every_row_reads_back

NO_COMMIT = ("-s", "CATALOG_BATCH_SIZE=1000", "-s", "CATALOG_FLUSH_SECONDS=3600")
# Scrapy logs "Scraped from <200 URL>" at DEBUG once a page's item left the pipelines,
# when the page's row and item have been handed to the writer (its "ok" line waits for
# the commit, which nothing triggers here).
DEBUG = ("-s", "LOG_LEVEL=DEBUG", "-a", "summaries=1")


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(proc.name), cmdline))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ok_lines(data_dir: Path) -> list[dict]:
    text = log_text(data_dir / "fetch_log.jsonl")
    return [e for e in map(json.loads, text.splitlines()) if e["outcome"] == "ok"]


def test_the_writer_commits_what_reached_it_when_the_crawl_dies(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(160, 190)]
    urls.insert(2, f"{site.base_url}/hold/page/190.html")  # the crawl cannot finish
    url_file = write_urls(tmp_path / "urls.txt", urls)
    site.reset_counts()
    site.hold()
    try:
        log = tmp_path / "crawl.log"
        proc = start_crawl(url_file, data_dir, *NO_COMMIT, *DEBUG, log_path=log)
        try:
            wait_until(
                lambda: log_text(log).count("Scraped from <200") >= 12, "12 pages", proc=proc
            )
            assert committed_rows(data_dir) == 0 and not ok_lines(data_dir)
            writers = [pid for pid, cmd in children(proc.pid) if "writer" in cmd]
            assert len(writers) == 1, children(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)  # the crawl alone, not its writer
            proc.wait(timeout=60)
            wait_until(lambda: not alive(writers[0]), "the writer to exit")
        finally:
            kill_group(proc)
    finally:
        site.release()
    stored = {e["key"] for e in ok_lines(data_dir)}
    assert len(stored) >= 10
    assert set(catalog_rows(data_dir)) == stored
    assert_rows_readable(data_dir, site)
    assert_every_row_reads_back(data_dir, site)
    with sqlite3.connect(data_dir / "metadata.db") as conn:
        summarised = {k for (k,) in conn.execute("SELECT _key FROM page_summary")}
    assert summarised == stored  # each committed page with its item, no item without one

    before = rows_by_url(data_dir)
    resumed = run_crawl(url_file, data_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert set(rows_by_url(data_dir)) == set(urls)
    assert all(site.counts[u.split(site.base_url, 1)[1]] == 1 for u in before)
