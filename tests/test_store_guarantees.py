"""Promises of the storage core that only show after a kill: what the next run's
recovery keeps, cuts and clears, read back with sqlite3 and plain file reads."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import replace

from crawler.storage.actionlog import ActionLog
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.items import ItemRow, PageItems, parsed_at_now
from crawler.storage.records import fetch_row
from crawler.storage.store import Store, StoreConfig, index_missing, recover
from tests.factories import page_fetch


def query(data_dir, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(f"file:{data_dir}/metadata.db?mode=ro", uri=True)) as c:
        return c.execute(sql).fetchall()


def test_recovery_never_puts_an_older_fetch_over_a_newer_row(tmp_path):
    fetch = page_fetch(1)
    older = fetch_row(fetch, "archive/a.warc.gz", 0, 100, "sha1:A")
    newer = replace(older, fetched_at="2030-01-01T00:00:00Z", archive="archive/b.warc.gz")
    with Catalog(tmp_path / "metadata.db") as catalog:
        assert index_missing(catalog, [newer], []) == 1
        assert index_missing(catalog, [older], []) == 0
        assert catalog.get(fetch.key).archive == "archive/b.warc.gz"


def test_recovery_cuts_a_torn_action_log_line_so_the_next_line_stands_alone(tmp_path):
    data_dir = tmp_path / "data"
    path = DataDir(data_dir).action_log_path
    log = ActionLog(path)
    log.write("http://example.org/1", "k1", "ok", status=200)
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"ts": "2026-01-01T00:00:00", "url": "http://exa')  # a kill mid-write
    assert recover(DataDir(data_dir)).log_cut.startswith(b'{"ts"')
    log = ActionLog(path)
    log.write("http://example.org/2", "k2", "ok", status=200)
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["k1", "k2"]


def test_recovery_removes_the_marker_of_a_file_a_kill_never_created(tmp_path):
    data_dir = tmp_path / "data"
    datadir = DataDir(data_dir)
    datadir.archive_dir.mkdir(parents=True)
    marker = datadir.archive_dir / "crawl-20260101000000-1-00001.warc.gz.writing"
    marker.touch()  # killed between the marker and the file
    recover(datadir)
    assert not marker.exists()
    assert datadir.open_archives() == []


def test_items_of_a_page_this_run_did_not_store_are_dropped_unless_they_replace(tmp_path):
    data_dir = tmp_path / "data"
    store = Store(StoreConfig(data_dir, items=True, batch_size=1))
    stored, unstored = page_fetch(1), page_fetch(2)
    store.put(stored)

    def page(fetch, replace=False) -> PageItems:
        return PageItems(fetch.key, "s", [ItemRow("thing", {"n": 1})], parsed_at_now(), replace)

    store.page_items(page(stored))
    store.page_items(page(unstored))  # a response not stored (its status, say)
    store.close()
    assert query(data_dir, "SELECT _key FROM thing") == [(stored.key,)]
    assert store.items.dropped_pages == 1
