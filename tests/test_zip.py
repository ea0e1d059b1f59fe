"""ARCHIVE_FORMAT=zip: bodies as zip entries, rows pointing at them, repair after a kill."""

from __future__ import annotations

import shutil
import sqlite3
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.archive import Fetch, read_any, resolve
from crawler.catalog import Catalog
from crawler.catalog_tools import Rebuild, Verify
from crawler.store import Store, StoreConfig, recover
from crawler.ziparchive import ZipArchiveWriter, extension, repair_open_zip
from tests.checks import catalog_rows, rows_by_url
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.conftest import ROOT, kill_group, run_crawl, start_crawl, write_urls
from tests.events import wait_until

SAMPLES = ROOT / "tests" / "data" / "broken"


def fetch(n: int, body: bytes | None = None, ts: float = 1_700_000_000.0) -> Fetch:
    body = body if body is not None else f"<html><body>page {n}</body></html>".encode() * 20
    return Fetch(
        key=f"{n:064x}",
        url=f"http://example.org/page/{n}",
        final_url=f"http://example.org/page/{n}.html",
        method="GET",
        request_headers=[("Accept", "*/*")],
        request_body=b"",
        status=200,
        response_headers=[("Content-Type", "text/html; charset=utf-8"), ("ETag", f'"e{n}"')],
        body=body,
        fetched_at=ts + n,
    )


def abandon(writer: ZipArchiveWriter) -> None:
    """What a kill leaves: the bytes written so far, no central directory."""
    writer.flush()
    writer._file.close()


def assert_zip_rows_readable(data_dir: Path, site=None) -> dict:
    rows = catalog_rows(data_dir)
    for row in rows.values():
        assert row.archive.endswith(".zip"), row
        stored = read_any(resolve(data_dir, row.archive), row.offset, row.length)
        assert len(stored.body) == row.bytes
        assert dict(stored.warc_headers)["WARC-Payload-Digest"] == row.payload_digest
        if site is not None:
            parts = urlsplit(row.final_url)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            assert stored.body == site.payload(path), row.url
    for path in (data_dir / "archive").glob("*.zip"):
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None
    return rows


def test_writer_round_trip_and_zipfile_access(tmp_path):
    writer = ZipArchiveWriter(tmp_path / "archive", tmp_path)
    rows = [writer.write_fetch(fetch(n)) for n in range(5)]
    writer.write_revisit(fetch(2, body=b""), refers_to_date=rows[2].fetched_at)
    closed = writer.close()
    assert closed.name.endswith(".zip") and closed.exists()
    with zipfile.ZipFile(closed) as zf:
        names = zf.namelist()
        assert names[0] == f"{rows[0].key[:2]}/{rows[0].key}.html"
        assert zf.read(names[1]) == fetch(1).body
    for n, row in enumerate(rows):
        stored = read_any(closed, row.offset, row.length)
        assert stored.body == fetch(n).body
        assert stored.status == 200 and stored.url == fetch(n).final_url
        assert ("ETag", f'"e{n}"') in stored.headers


def test_extension_follows_the_content_type():
    assert extension("text/html; charset=utf-8") == ".html"
    assert extension("application/json") == ".json"
    assert extension(None) == ".bin"
    assert extension("application/x-unknown-thing") == ".bin"


@pytest.mark.parametrize("damage", ["partial_entry", "partial_directory", "garbage"])
def test_repair_rewrites_the_central_directory(tmp_path, damage):
    writer = ZipArchiveWriter(tmp_path / "archive", tmp_path)
    rows = [writer.write_fetch(fetch(n)) for n in range(4)]
    abandon(writer)
    open_path = writer.path.with_name(writer.name + ".open")
    good = open_path.stat().st_size
    with open(open_path, "ab") as f:
        if damage == "partial_entry":
            # A fifth entry cut short, as a kill mid-write leaves it.
            other = ZipArchiveWriter(tmp_path / "other", tmp_path)
            other.write_fetch(fetch(9))
            abandon(other)
            f.write(other.path.with_name(other.name + ".open").read_bytes()[:100])
        elif damage == "partial_directory":
            f.write(b"PK\x01\x02" + b"\0" * 20)
        else:
            f.write(b"\x00garbage")
    repair = repair_open_zip(open_path, tmp_path)
    assert repair.path.exists() and not open_path.exists()
    assert repair.records == 4
    assert [r.key for r in repair.indexed.rows] == [r.key for r in rows]
    with zipfile.ZipFile(repair.path) as zf:
        assert zf.testzip() is None
        assert len(zf.namelist()) == 4
    assert (repair.cut_file is not None) == (damage != "partial_directory")
    for n, row in enumerate(rows):
        assert read_any(repair.path, row.offset, row.length).body == fetch(n).body
    assert repair.path.stat().st_size > good  # the new central directory


def test_recover_indexes_committed_and_uncommitted_entries(tmp_path):
    config = StoreConfig(data_dir=tmp_path, format="zip", batch_size=1000, flush_seconds=3600)
    store = Store(config)
    for n in range(6):
        store.put(fetch(n))
    store.batch.flush()
    store.put(fetch(6))  # written, never committed: the kill comes first
    abandon(store.archive)
    store.catalog.close()
    assert list(config.archive_dir.glob("*.zip.open"))
    result = recover(config)
    assert len(result.repairs) == 1 and result.indexed_rows == 1
    with Catalog(config.catalog_path, readonly=True) as catalog:
        assert catalog.count() == 7
    assert_zip_rows_readable(tmp_path)


def test_killed_sample_is_repaired(tmp_path):
    config = StoreConfig(data_dir=tmp_path, format="zip")
    config.archive_dir.mkdir(parents=True)
    shutil.copy(SAMPLES / "killed.zip.open", config.archive_dir / "sample.zip.open")
    result = recover(config)
    assert result.indexed_rows == 2
    (repair,) = result.repairs
    assert repair.path == config.archive_dir / "sample.zip" and repair.cut_file is not None
    with zipfile.ZipFile(repair.path) as zf:
        assert zf.testzip() is None and len(zf.namelist()) == 2
    assert_zip_rows_readable(tmp_path)


def test_crawl_stores_zip_bodies(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/{k}" for k in ("page/1.html", "gzip/2", "binary/5", "redirect/4")]
    result = run_crawl(
        write_urls(tmp_path / "urls.txt", urls),
        data_dir,
        "-s",
        "ARCHIVE_FORMAT=zip",
        "-o",
        str(tmp_path / "crawl.jsonl"),
    )
    assert result.returncode == 0, result.stderr
    rows = assert_zip_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    (archive,) = (data_dir / "archive").glob("*.zip")
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


def test_bad_archive_format_is_refused(site, tmp_path, data_dir):
    url_file = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/1.html"])
    result = run_crawl(url_file, data_dir, "-s", "ARCHIVE_FORMAT=tar")
    assert result.returncode != 0
    assert "ARCHIVE_FORMAT must be warc or zip" in result.stderr


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


def test_killed_zip_crawl_is_repaired_and_resumed(site, tmp_path, data_dir):
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
    assert list((data_dir / "archive").glob("*.zip.open"))
    result = run_crawl(url_file, data_dir, "-s", "ARCHIVE_FORMAT=zip", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "left open by a killed run" in result.stderr
    assert not list((data_dir / "archive").glob("*.open"))
    rows = assert_zip_rows_readable(data_dir, site)
    assert {r.url for r in rows.values()} == set(urls)
