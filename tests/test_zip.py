"""ARCHIVE_FORMAT=zip: bodies as zip entries, rows pointing at them, repair after a kill."""

from __future__ import annotations

import shutil
import sqlite3
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from scrapy.exceptions import UsageError
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.formats.base import writing_marker
from crawler.storage.formats.zip import FORMAT as ZIP
from crawler.storage.formats.zip import ZipWriter, extension
from crawler.storage.store import Store, StoreConfig, recover
from crawler.tools.rebuild import Rebuild
from crawler.tools.verify import Verify
from tests.checks import catalog_rows, rows_by_url
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.conftest import ROOT, kill_group, start_crawl, write_urls
from tests.crawls import OnePage, crawl, crawl_site
from tests.events import wait_until
from tests.factories import page_fetch as fetch
from tests.thirdparty import assert_every_row_reads_back

SAMPLES = ROOT / "tests" / "data" / "broken"


def assert_zip_rows_readable(data_dir: Path, site=None) -> dict:
    rows = catalog_rows(data_dir)
    datadir = DataDir(data_dir)
    for row in rows.values():
        assert row.archive.endswith(".zip"), row
        stored = datadir.read(row)
        assert len(stored.body) == row.bytes
        assert dict(stored.warc_headers)["WARC-Payload-Digest"] == row.payload_digest
        if site is not None:
            parts = urlsplit(row.final_url)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            assert stored.body == site.payload(path), row.url
    for path in datadir.archives(ZIP):
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None
    return rows


def test_writer_round_trip_and_zipfile_access(tmp_path):
    writer = ZipWriter(tmp_path / "archive", tmp_path)
    rows = [writer.write_fetch(fetch(n)) for n in range(5)]
    writer.write_revisit(fetch(2, body=b""), refers_to_date=rows[2].fetched_at)
    closed = writer.close()
    assert closed.name.endswith(".zip") and closed.exists()
    with zipfile.ZipFile(closed) as zf:
        names = zf.namelist()
        assert names[0] == f"{rows[0].key[:2]}/{rows[0].key}.html"
        assert zf.read(names[1]) == fetch(1).body
    for n, row in enumerate(rows):
        stored = ZIP.read(closed, row.offset, row.length)
        assert stored.body == fetch(n).body
        assert stored.status == 200 and stored.url == fetch(n).final_url
        assert ("ETag", f'"e{n}"') in stored.headers


def test_revisit_entries_keep_their_metadata_in_the_local_header_only(tmp_path):
    writer = ZipWriter(tmp_path / "archive", tmp_path)
    stored = writer.write_fetch(fetch(1))
    again = fetch(1)
    again.fetched_at += 3600
    revisit = writer.write_unchanged(again, stored)
    writer.write_revisit(fetch(2, body=b""), refers_to_date=stored.fetched_at)
    closed = writer.close()
    with zipfile.ZipFile(closed) as zf:
        assert zf.testzip() is None
        extras = {info.filename.rsplit(".", 1)[1]: info.extra for info in zf.infolist()}
    # The central directory repeats a response's metadata, not a revisit's: half of it.
    assert extras["html"] and extras["revisit"] == b""
    # The archive alone still gives the revisit's row and the 304's refresh back.
    indexed = ZIP.index(closed, tmp_path)
    assert indexed.rows == [stored, revisit]
    assert [t[0] for t in indexed.touches] == [fetch(2).key]


def test_extension_follows_the_content_type():
    assert extension("text/html; charset=utf-8") == ".html"
    assert extension("application/json") == ".json"
    assert extension(None) == ".bin"
    assert extension("application/x-unknown-thing") == ".bin"


@pytest.mark.parametrize("damage", ["partial_entry", "partial_directory", "garbage"])
def test_repair_rewrites_the_central_directory(tmp_path, damage):
    writer = ZipWriter(tmp_path / "archive", tmp_path)
    rows = [writer.write_fetch(fetch(n)) for n in range(4)]
    writer.abandon()
    open_path = writer.path
    good = open_path.stat().st_size
    with open(open_path, "ab") as f:
        if damage == "partial_entry":
            # A fifth entry cut short, as a kill mid-write leaves it.
            other = ZipWriter(tmp_path / "other", tmp_path)
            other.write_fetch(fetch(9))
            other.abandon()
            f.write(other.path.read_bytes()[:100])
        elif damage == "partial_directory":
            f.write(b"PK\x01\x02" + b"\0" * 20)
        else:
            f.write(b"\x00garbage")
    repair = ZIP.repair(open_path, tmp_path)
    assert repair.path == open_path and not writing_marker(open_path).exists()
    assert repair.records == 4
    assert [r.key for r in repair.indexed.rows] == [r.key for r in rows]
    with zipfile.ZipFile(repair.path) as zf:
        assert zf.testzip() is None
        assert len(zf.namelist()) == 4
    assert (repair.cut_file is not None) == (damage != "partial_directory")
    for n, row in enumerate(rows):
        assert ZIP.read(repair.path, row.offset, row.length).body == fetch(n).body
    assert repair.path.stat().st_size > good  # the new central directory


def test_recover_indexes_committed_and_uncommitted_entries(tmp_path):
    config = StoreConfig(data_dir=tmp_path, format="zip", batch_size=1000, flush_seconds=3600)
    store = Store(config)
    for n in range(6):
        store.put(fetch(n))
    store.batch.flush()
    store.put(fetch(6))  # written, never committed: the kill comes first
    store.abandon()
    datadir = config.datadir
    assert datadir.open_archives()
    result = recover(datadir)
    assert len(result.repairs) == 1 and result.indexed_rows == 1
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        assert catalog.count() == 7
    assert_zip_rows_readable(tmp_path)


def test_killed_sample_is_repaired(tmp_path):
    datadir = DataDir(tmp_path)
    datadir.archive_dir.mkdir(parents=True)
    shutil.copy(SAMPLES / "killed.zip.open", datadir.archive_dir / "sample.zip.open")
    result = recover(datadir)
    assert result.indexed_rows == 2
    (repair,) = result.repairs
    assert repair.path == datadir.archive_dir / "sample.zip" and repair.cut_file is not None
    with zipfile.ZipFile(repair.path) as zf:
        assert zf.testzip() is None and len(zf.namelist()) == 2
    assert_zip_rows_readable(tmp_path)


@deferred_f_from_coro_f
async def test_crawl_stores_zip_bodies(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/{k}" for k in ("page/1.html", "gzip/2", "binary/5", "redirect/4")]
    feed = {str(tmp_path / "crawl.jsonl"): {"format": "jsonl"}}  # -o crawl.jsonl
    await crawl_site(urls, data_dir, {"ARCHIVE_FORMAT": "zip", "FEEDS": feed}, summaries="1")
    rows = assert_zip_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    (archive,) = DataDir(data_dir).archives(ZIP)
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
    for row in rows.values():
        assert f"{row.key[:2]}/{row.key}{extension(row.content_type)}" in names
    # Re-parse and rebuild read zip archives as they read WARCs.
    out = tmp_path / "re.jsonl"
    reparse = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}", "-o", str(out))
    assert reparse.returncode == 0, reparse.stderr
    assert canon(read_jsonl(out)) == canon(read_jsonl(tmp_path / "crawl.jsonl"))
    rebuilt = Rebuild(data_dir, tmp_path / "rebuilt.db").run()
    with Catalog(rebuilt.path, readonly=True) as catalog:
        assert {r.key: r for r in catalog.rows()} == rows
    assert Verify(data_dir).run().ok


@deferred_f_from_coro_f
async def test_bad_archive_format_is_refused(site, data_dir):
    with pytest.raises(UsageError, match="ARCHIVE_FORMAT='tar': give one of warc, zip, sqlite"):
        await crawl(OnePage, data_dir, {"ARCHIVE_FORMAT": "tar"}, url=f"{site.base_url}/page/1")


def _rows_committed(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


@deferred_f_from_coro_f
async def test_killed_zip_crawl_is_repaired_and_resumed(site, tmp_path, data_dir, caplog):
    urls = [f"{site.base_url}/slow/{n}?ms=100" for n in range(300, 360)]
    # A request held in flight: the crawl cannot finish before it is killed.
    urls.insert(1, f"{site.base_url}/hold/page/360.html")
    url_file = write_urls(tmp_path / "urls.txt", urls)
    site.hold()
    try:
        proc = start_crawl(
            url_file,
            data_dir,
            "-s",
            "ARCHIVE_FORMAT=zip",
            "-s",
            "CATALOG_BATCH_SIZE=3",
            "-s",
            "CONCURRENT_REQUESTS=4",
            log_path=tmp_path / "crawl.log",
        )
        try:
            wait_until(lambda: _rows_committed(data_dir / "metadata.db") >= 6, "6 rows", proc=proc)
        finally:
            kill_group(proc)
    finally:
        site.release()
    assert _rows_committed(data_dir / "metadata.db") >= 6, (tmp_path / "crawl.log").read_text()
    assert list((data_dir / "archive").glob("*.zip.writing"))
    assert_every_row_reads_back(data_dir, site)  # as the kill left them, before any repair
    await crawl_site(url_file, data_dir, {"ARCHIVE_FORMAT": "zip"})
    assert "left open by a killed run" in caplog.text
    assert not list((data_dir / "archive").glob("*.writing"))
    rows = assert_zip_rows_readable(data_dir, site)
    assert {r.url for r in rows.values()} == set(urls)
