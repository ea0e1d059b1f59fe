"""Shipping, merging, CATALOG_SEEN, shards and time-based rollover, without Slurm."""

from __future__ import annotations

import sqlite3
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from scrapy.exceptions import UsageError
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.spiderkit.urls import in_shard, parse_shard
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.keys import request_key
from crawler.storage.seen import CatalogWithSeen, SeenCatalogs
from crawler.storage.store import Store, StoreConfig
from slurm.ship import ShipError, Shipper, merge_shipped
from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import write_urls
from tests.crawls import crawl_site
from tests.events import wait_until
from tests.factories import listed_body
from tests.factories import listed_fetch as fetch


def shipped_catalog(shipper: Shipper) -> dict[str, object]:
    with Catalog(shipper.catalog_path, readonly=True) as catalog:
        return {row.url: row for row in catalog.rows()}


def assert_readable(data: Path, rows: dict) -> None:
    for row in rows.values():
        assert DataDir(data).read(row).body == row_body(row)


def row_body(row) -> bytes:
    return listed_body(int(row.url.rsplit("/", 1)[1]))


def test_shipper_ships_closed_archives_then_only_their_rows(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared"
    store = Store(StoreConfig(data_dir=local, rollover_bytes=1))  # one file per fetch
    for n in range(3):
        store.put(fetch(n))
    store.archive.rollover_bytes = 1 << 30
    for n in range(3, 5):
        store.put(fetch(n))
    store.batch.flush()  # rows 3 and 4 committed, their file still open
    shipper = Shipper(local, shared, "job_1_0_p0")

    first = shipper.ship()
    assert len(first.archives) == 3 and first.rows == 3 and first.held_back == 2
    rows = shipped_catalog(shipper)
    assert sorted(rows) == [f"http://example.org/page/{n}" for n in range(3)]
    assert_readable(shared, rows)
    assert (shared / "catalogs" / "job_1_0_p0.fetch_log.jsonl").exists() is False  # no log

    store.close()
    second = shipper.ship()
    assert len(second.archives) == 1  # the three shipped before are not copied again
    rows = shipped_catalog(shipper)
    assert len(rows) == 5
    assert_readable(shared, rows)
    leftovers = [p.name for p in shared.rglob(".*")] + [p.name for p in local.glob(".ship-*")]
    assert leftovers == []


def test_a_zip_tasks_archives_ship_with_their_rows(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared"
    store = Store(StoreConfig(data_dir=local, format="zip", rollover_bytes=1))  # a file each
    for n in range(3):
        store.put(fetch(n))
    store.archive.rollover_bytes = 1 << 30
    store.put(fetch(3))
    store.batch.flush()  # row 3 committed, its zip still open: held back
    shipper = Shipper(local, shared, "job_2_0_p0")
    done = shipper.ship()
    assert (len(done.archives), done.rows, done.held_back) == (3, 3, 1)
    store.close()
    assert shipper.ship().held_back == 0
    # Read as any sqlite3 and zipfile user would: every row's body is in its zip.
    db = sqlite3.connect(f"file:{shared / 'catalogs' / 'job_2_0_p0.db'}?mode=ro", uri=True)
    rows = db.execute("SELECT key, url, archive, bytes FROM artifacts ORDER BY url").fetchall()
    db.close()
    assert [url for _, url, _, _ in rows] == [f"http://example.org/page/{n}" for n in range(4)]
    for n, (key, _, archive, size) in enumerate(rows):
        with zipfile.ZipFile(shared / archive) as zf:
            assert zf.testzip() is None
            body = zf.read(f"{key[:2]}/{key}.html")
        assert body == listed_body(n) and len(body) == size


def test_merge_folds_shipped_catalogs_into_the_shared_one(tmp_path):
    shared = tmp_path / "shared"
    for task in range(2):
        local = tmp_path / f"local{task}"
        store = Store(StoreConfig(data_dir=local, prefix=f"job_1_{task}_p0"))
        for n in range(task * 10, task * 10 + 4):
            store.put(fetch(n))
        store.close()
        Shipper(local, shared, f"job_1_{task}_p0").ship()
    # Same prefix, same second, same pid: same name. Never overwritten.
    store = Store(StoreConfig(data_dir=tmp_path / "clash", prefix="job_1_0_p0"))
    store.put(fetch(99))
    store.close()
    (made,) = (tmp_path / "clash" / "archive").glob("*.warc.gz")
    (taken,) = (shared / "archive").glob("job_1_0_p0-*.warc.gz")
    made.rename(made.with_name(taken.name))  # whatever second each was made in
    with pytest.raises(ShipError, match="exists already"):
        Shipper(tmp_path / "clash", shared, "job_1_9_p0").ship()
    assert merge_shipped(shared) == 8
    assert merge_shipped(shared) == 8  # again, with metadata.db among the inputs
    rows = rows_by_url(shared)
    assert len(rows) == 8
    assert_readable(shared, rows)


def test_seen_catalogs_skip_what_exists_and_ignore_missing_archives(tmp_path):
    shared = tmp_path / "shared"
    local = tmp_path / "local"
    store = Store(StoreConfig(data_dir=local, rollover_bytes=1))
    for n in range(4):
        store.put(fetch(n))
    store.close()
    shipper = Shipper(local, shared, "job_1_0_p0")
    shipper.ship()
    lost = shipped_catalog(shipper)["http://example.org/page/3"]
    (shared / lost.archive).unlink()  # e.g. a file a user deleted

    seen = SeenCatalogs([str(shared / "metadata.db"), str(shared / "catalogs" / "*.db")])
    own = Catalog(tmp_path / "own" / "metadata.db")
    catalog = CatalogWithSeen(own, seen)
    try:
        keys = [fetch(n).key for n in range(6)]
        assert catalog.present(keys) == set(keys[:3])
        assert seen.absent_rows == 1
        row = catalog.get(keys[1])
        assert Path(row.archive).is_absolute()  # readable from any data directory
        assert DataDir(tmp_path / "own").read(row).body == row_body(row)
        assert catalog.get(keys[3]) is None and catalog.get(keys[5]) is None
    finally:
        catalog.close()
    assert not seen.path.exists()


def test_shards_partition_the_list():
    keys = [request_key(f"http://example.org/p/{n}") for n in range(200)]
    for count in (1, 3, 7):
        owners = [[i for i in range(count) if in_shard(k, (i, count))] for k in keys]
        assert all(len(o) == 1 for o in owners)
    assert parse_shard("2/5") == (2, 5) and parse_shard(None) is None
    for bad in ("5/5", "x/2", "1", "-1/3"):
        with pytest.raises(UsageError):
            parse_shard(bad)


def test_time_rollover_closes_files_after_their_rows_commit(tmp_path):
    age = 0.5
    store = Store(StoreConfig(data_dir=tmp_path, rollover_seconds=age, flush_seconds=60))
    started = time.monotonic()
    store.put(fetch(1))

    def rolled_over() -> bool:
        store.tick()
        return not list((tmp_path / "archive").glob("*.writing"))

    wait_until(rolled_over, "the file to roll over", timeout=60)
    assert time.monotonic() - started >= age, "not before its age (it opened after `started`)"
    closed = list((tmp_path / "archive").glob("*.warc.gz"))
    assert len(closed) == 1
    with Catalog(tmp_path / "metadata.db", readonly=True) as catalog:
        assert [r.archive for r in catalog.rows()] == [f"archive/{closed[0].name}"]
    store.close()


@deferred_f_from_coro_f
async def test_crawls_skip_what_other_catalogs_hold_whatever_the_shards(site, tmp_path):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(300, 330)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Two tasks of a 2-way split, then the whole list split 3 ways: nothing refetched.
    for i in range(2):
        await crawl_site(url_file, tmp_path / f"two{i}", shard=f"{i}/2", partition="url")
    assert sum(len(rows_by_url(tmp_path / f"two{i}")) for i in range(2)) == len(urls)
    before = {u: site.counts[u.split(site.base_url)[1]] for u in urls}
    seen = {"CATALOG_SEEN": f"{tmp_path}/two*/metadata.db"}
    await crawl_site(url_file, tmp_path / "three0", seen, shard="0/3", partition="url")
    assert {u: site.counts[u.split(site.base_url)[1]] for u in urls} == before
    assert rows_by_url(tmp_path / "three0") == {}
    assert_rows_readable(tmp_path / "two0", site)


def test_closed_files_ship_by_hard_link_on_one_file_system_the_live_log_by_copy(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared"
    store = Store(StoreConfig(data_dir=local, rollover_bytes=1))
    for n in range(2):
        store.put(fetch(n))
    store.close()
    log = DataDir(local).action_log_path
    log.write_text('{"url": "http://example.org/page/0"}\n')
    shipper = Shipper(local, shared, "job_1_0_p0")

    done = shipper.ship()

    assert len(done.archives) == 2
    for name in done.archives:
        here, there = DataDir(local).archive_dir / name, DataDir(shared).archive_dir / name
        assert there.stat().st_ino == here.stat().st_ino  # no byte copied
    assert_readable(shared, shipped_catalog(shipper))
    shipped_log = DataDir(shared).shipped_action_log("job_1_0_p0")
    assert shipped_log.stat().st_ino != log.stat().st_ino
    with open(log, "a") as f:  # the crawl goes on appending to its log
        f.write('{"url": "http://example.org/page/1"}\n')
    assert shipped_log.read_text().count("\n") == 1


def test_closed_files_ship_by_copy_across_file_systems(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        local, shared = tmp_path / "local", Path(other) / "shared"
        store = Store(StoreConfig(data_dir=local, rollover_bytes=1))
        for n in range(2):
            store.put(fetch(n))
        store.close()
        shipper = Shipper(local, shared, "job_1_0_p0")

        done = shipper.ship()

        assert len(done.archives) == 2
        rows = shipped_catalog(shipper)
        assert len(rows) == 2
        assert_readable(shared, rows)
        assert [p.name for p in shared.rglob(".*")] == []
