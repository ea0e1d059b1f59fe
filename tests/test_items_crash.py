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

from crawler.storage.datadir import DataDir
from crawler.storage.items import ItemRow, PageItems, parsed_at_now, unparsed_recovered
from crawler.storage.store import Store, StoreConfig, recover
from tests.checks import catalog_rows
from tests.conftest import ROOT, crawl_command, crawl_env, kill_group, run_crawl, write_urls
from tests.events import wait_for_log
from tests.factories import page_fetch
from tests.faults import committed_rows, kill_moments, wait_for_rows
from tests.polling import wait_until
from tests.thirdparty import assert_every_row_reads_back

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


def start(url_file, data_dir, log_path, args=ARGS) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            crawl_command(url_file, data_dir, *args, spider="items"),
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


def assert_pages_have_exactly_their_items(site, data_dir, after_a_kill: bool = False) -> int:
    """Each page with a row has all of its items. ``after_a_kill``: a page a recovery
    indexed from the archive may have none yet, if it is listed to be parsed."""
    rows = catalog_rows(data_dir)
    items = item_keys(data_dir)
    to_parse = set()
    if after_a_kill:
        with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
            to_parse = {key for key, _ in unparsed_recovered(conn, "items")}
    for table, counts in items.items():
        assert set(counts) <= set(rows), f"{table}: items of pages without a row"
    for key, row in rows.items():
        links = site.payload(urlsplit(row.final_url).path).decode().count("<a ")
        expected = {"page_item": 1, "items": 1, "link_out": links, "pages_by_url": 1}
        got = {t: items[t][key] for t in TABLES}
        if key in to_parse and not any(got.values()):
            continue
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
    with kill_moments() as rng:
        for attempt in range(3):
            proc = start(url_file, data_dir, tmp_path / f"crawl{attempt}.log")
            seen.append(
                wait_for_rows(data_dir, committed_rows(data_dir) + rng.randint(5, 60), proc)
            )
            kill_group(proc, signal.SIGKILL)
            assert_every_row_reads_back(data_dir, site)
            assert_pages_have_exactly_their_items(site, data_dir, after_a_kill=True)
    assert any(0 < n < PAGES for n in seen), seen
    finish(site, url_file, data_dir)


def test_kill_minus_9_of_the_crawl_alone_then_the_next_run_at_once(
    site, url_file, tmp_path, data_dir
):
    with kill_moments() as rng:
        for attempt in range(2):
            proc = start(url_file, data_dir, tmp_path / f"crawl{attempt}.log")
            wait_for_rows(data_dir, committed_rows(data_dir) + rng.randint(10, 70), proc)
            os.kill(proc.pid, signal.SIGKILL)  # the writer process lives on, and ends
            proc.wait(timeout=60)
            assert_every_row_reads_back(data_dir, site)
    finish(site, url_file, data_dir)


def open_archive_bytes(data_dir) -> int:
    files = [m.with_suffix("") for m in (data_dir / "archive").glob("*.writing")]
    return sum(f.stat().st_size for f in files if f.exists())  # a marker comes first


def test_pages_indexed_by_a_run_killed_before_it_parsed_them_get_their_items(
    site, url_file, tmp_path, data_dir
):
    # No commit but on close: what the kills leave is known, whatever the timing.
    held = (*ARGS, "-s", "CATALOG_BATCH_SIZE=100000", "-s", "CATALOG_FLUSH_SECONDS=3600",
            "-s", "ARCHIVE_ROLLOVER_BYTES=100000000")  # fmt: skip
    proc = start(url_file, data_dir, tmp_path / "crawl0.log", held)
    # Records on disk past the file buffer, none of them with a row.
    wait_until(lambda: open_archive_bytes(data_dir) > 40_000, "records on disk", proc=proc)
    kill_group(proc, signal.SIGKILL)
    assert committed_rows(data_dir) == 0
    log = tmp_path / "crawl1.log"
    proc = start(url_file, data_dir, log, held)
    # Its recovery indexed them; killed before it commits the items of any.
    wait_for_log(log, "stored without their items", proc)
    kill_group(proc, signal.SIGKILL)
    indexed = committed_rows(data_dir)
    assert indexed > 0 and item_keys(data_dir)["page_item"] == Counter()
    assert_every_row_reads_back(data_dir, site)
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
    assert_every_row_reads_back(data_dir, site)
    finish(site, url_file, data_dir)


def test_pages_a_recovery_indexed_stay_to_parse_when_the_run_that_indexed_them_is_killed(
    tmp_path,
):
    data_dir = tmp_path / "data"
    fetches = [page_fetch(n) for n in range(3)]

    def parsed(fetch, replace=False) -> PageItems:
        item = ItemRow("thing", {"n": 1})
        return PageItems(fetch.key, "items", [item], parsed_at_now(), replace=replace)

    store = Store(StoreConfig(data_dir, items=True, batch_size=1))
    for fetch in fetches:
        store.put(fetch)
    store.page_items(parsed(fetches[0]))  # committed with its item
    store.abandon()  # killed: two records in the archive, no row, no items

    def unparsed() -> set[str]:
        with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
            return {key for key, _ in unparsed_recovered(conn, "items")}

    assert recover(DataDir(data_dir), items=True).indexed_rows == 2
    assert unparsed() == {fetches[1].key, fetches[2].key}
    # The run that indexed them is killed before it parses them: the next run's
    # recovery finds nothing to index, and the pages are still there to parse.
    assert recover(DataDir(data_dir), items=True).indexed_rows == 0
    assert unparsed() == {fetches[1].key, fetches[2].key}
    store = Store(StoreConfig(data_dir, items=True, batch_size=1))
    store.page_items(parsed(fetches[1], replace=True))  # answered from the archive
    store.close()
    assert unparsed() == {fetches[2].key}


@pytest.mark.parametrize("fmt", ["warc", "zip", "sqlite"])
def test_a_recovery_lists_pages_to_parse_and_indexes_downloads_as_downloads(tmp_path, fmt):
    data_dir = tmp_path / "data"
    page, download, made = page_fetch(0), page_fetch(1), page_fetch(2)
    download.parsed = made.parsed = False  # a media pipeline's download, a thumbnail
    store = Store(StoreConfig(data_dir, items=True, format=fmt, batch_size=100))
    for fetch in (page, download, made):
        store.put(fetch)
    # Killed with the records on disk (the sqlite format's bodies are in its file once
    # flushed) and no row committed.
    store.archive.flush()
    store.abandon()
    assert recover(DataDir(data_dir), items=True).indexed_rows == 3
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
        assert {key for key, _ in unparsed_recovered(conn, "items")} == {page.key}
        assert conn.execute("SELECT count(*) FROM artifacts").fetchone()[0] == 3
