"""`scrapy reparse SPIDER --follow` beside a crawl: killed and restarted, every page once."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time

from tests.checks import catalog_rows
from tests.conftest import ROOT, crawl_env, kill_group, start_crawl, write_urls

PAGES = 150
MODULES = ("-s", "SPIDER_MODULES=spiders,tests.item_spiders")


def follower(data_dir, log_path, *args) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "scrapy", "reparse", "items", "--follow", "--workers", "2"]
            + ["-s", f"DATA_DIR={data_dir}", *MODULES, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def followed(data_dir) -> int:
    path = data_dir / "metadata.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        try:
            got = conn.execute("SELECT pages FROM _follow_progress WHERE spider = 'items'")
        except sqlite3.OperationalError:
            return 0
        row = got.fetchone()
        return row[0] if row else 0


def wait_until(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_follow_killed_and_restarted_parses_every_page_once(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/slow/{n}?ms=40" for n in range(PAGES)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    crawl = start_crawl(
        url_file,
        data_dir,
        "-a",
        "summaries=1",
        "-s",
        "CATALOG_BATCH_SIZE=5",
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=4",
        log_path=tmp_path / "crawl.log",
    )
    at_kill = []
    try:
        for attempt, pages in enumerate((10, 60)):
            proc = follower(data_dir, tmp_path / f"follow{attempt}.log")
            wait_until(lambda p=pages: followed(data_dir) >= p, f"{pages} pages followed")
            kill_group(proc, signal.SIGKILL)
            at_kill.append(followed(data_dir))
        # SIGTERM: it finishes the batch in hand and exits cleanly.
        proc = follower(data_dir, tmp_path / "follow-term.log")
        wait_until(
            lambda: followed(data_dir) > at_kill[-1] or followed(data_dir) == PAGES,
            "more pages followed",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "follow-term.log").read_text()[-3000:]
        last = follower(data_dir, tmp_path / "follow-last.log", "--until-idle", "1")
        assert crawl.wait(timeout=300) == 0
        assert last.wait(timeout=300) == 0, (tmp_path / "follow-last.log").read_text()[-3000:]
    finally:
        kill_group(crawl, signal.SIGKILL)

    print("pages followed at each kill:", at_kill)
    assert at_kill[0] < PAGES, at_kill  # killed while the crawl was still going
    rows = catalog_rows(data_dir)
    assert len(rows) == PAGES
    # Each page read once across the four followers, and its items there.
    assert followed(data_dir) == PAGES
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        parsed = [
            k for (k,) in conn.execute("SELECT _key FROM _item_pages WHERE _spider = 'items'")
        ]
        page_items = [k for (k,) in conn.execute("SELECT _key FROM page_item")]
        summaries = conn.execute("SELECT count(*) FROM page_summary").fetchone()[0]
    assert sorted(parsed) == sorted(rows)
    assert sorted(page_items) == sorted(rows)
    assert summaries == PAGES  # the crawl's own items, beside the follower's
