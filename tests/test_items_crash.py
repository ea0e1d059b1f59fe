"""kill -9 at any moment: a page has its row and all of its items, or neither."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
from collections import Counter
from urllib.parse import urlsplit

import pytest

from tests.checks import catalog_rows
from tests.conftest import ROOT, crawl_command, crawl_env, kill_group, run_crawl, write_urls
from tests.faults import wait_for_rows

PAGES = 200
ARGS = (
    "-s",
    "SPIDER_MODULES=spiders,tests.item_spiders",
    "-s",
    "CATALOG_BATCH_SIZE=7",
    "-s",
    "ARCHIVE_ROLLOVER_BYTES=60000",
    "-s",
    "CONCURRENT_REQUESTS_PER_DOMAIN=4",
)
TABLES = ("page_item", "items", "link_out", "pages_by_url")


def start(url_file, data_dir, log_path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            crawl_command(url_file, data_dir, *ARGS, spider="items"),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def item_keys(data_dir) -> dict[str, Counter]:
    """Per table, how many items each catalog key has (read with plain sqlite3)."""
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return {
            t: Counter(k for (k,) in conn.execute(f"SELECT _key FROM {t}"))
            if t in names
            else Counter()
            for t in TABLES
        }


def assert_pages_have_exactly_their_items(site, data_dir) -> int:
    rows = catalog_rows(data_dir)
    items = item_keys(data_dir)
    for table, counts in items.items():
        assert set(counts) <= set(rows), f"{table}: items of pages without a row"
    for key, row in rows.items():
        links = site.payload(urlsplit(row.final_url).path).decode().count("<a ")
        expected = {"page_item": 1, "items": 1, "link_out": links, "pages_by_url": 1}
        got = {t: items[t][key] for t in TABLES}
        assert got == expected, f"{row.url}: {got} != {expected}"
    return len(rows)


@pytest.fixture
def url_file(site, tmp_path):
    urls = [f"{site.base_url}/slow/{n}?ms=40" for n in range(PAGES)]
    return write_urls(tmp_path / "urls.txt", urls)


def finish(site, url_file, data_dir) -> None:
    result = run_crawl(url_file, data_dir, *ARGS, spider="items", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert assert_pages_have_exactly_their_items(site, data_dir) == PAGES


def test_kill_minus_9_of_the_whole_tree_then_resume(site, url_file, tmp_path, data_dir):
    seen = []
    for attempt, rows in enumerate((15, 70, 130)):
        proc = start(url_file, data_dir, tmp_path / f"crawl{attempt}.log")
        seen.append(wait_for_rows(data_dir, rows, proc))
        kill_group(proc, signal.SIGKILL)
        assert_pages_have_exactly_their_items(site, data_dir)
    assert any(0 < n < PAGES for n in seen), seen
    finish(site, url_file, data_dir)


def test_kill_minus_9_of_the_crawl_alone_then_the_next_run_at_once(
    site, url_file, tmp_path, data_dir
):
    for attempt, rows in enumerate((20, 90)):
        proc = start(url_file, data_dir, tmp_path / f"crawl{attempt}.log")
        wait_for_rows(data_dir, rows, proc)
        os.kill(proc.pid, signal.SIGKILL)  # the writer process lives on, and ends
        proc.wait(timeout=60)
    finish(site, url_file, data_dir)


def test_a_full_disk_keeps_pages_and_items_together(site, url_file, tmp_path, data_dir):
    import resource

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    # Writes fail as on a full disk, in the archive or in the catalog's WAL, whichever first.
    result = subprocess.run(
        crawl_command(url_file, data_dir, *ARGS, spider="items"),
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=limit_file_size,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert 0 < assert_pages_have_exactly_their_items(site, data_dir) < PAGES
    finish(site, url_file, data_dir)
