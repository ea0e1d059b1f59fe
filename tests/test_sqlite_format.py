"""ARCHIVE_FORMAT=sqlite: bodies as rows of a bodies table, committed before the catalog
rows that name them, read back with nothing but the sqlite3 shell."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from warcio.archiveiterator import ArchiveIterator

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import SettingError
from crawler.storage.formats.base import writing_marker
from crawler.storage.formats.sqlite import FORMAT as SQLITE
from crawler.storage.formats.sqlite import SqliteWriter
from crawler.storage.store import Store, StoreConfig, recover
from crawler.tools.rebuild import Rebuild
from crawler.tools.verify import Verify
from crawler.tools.wacz import WaczBuilder
from slurm.ship import Shipper, merge_shipped
from tests.checks import assert_rows_readable, catalog_rows, rows_by_url
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.crawls import crawl_site
from tests.factories import listed_body, listed_fetch
from tests.factories import page_fetch as fetch
from tests.thirdparty import record_problem, sqlite_rows_without_body
from tests.toolvenv import wacz_program


def sqlite3_shell(path: Path, sql: str) -> str:
    """What the sqlite3 command-line shell prints for ``sql`` on ``path``."""
    out = subprocess.run(
        ["sqlite3", "-readonly", "-cmd", ".timeout 30000", str(path), sql],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("level", [0, 6])
def test_writer_round_trip_and_sql_over_bodies(tmp_path, level):
    writer = SqliteWriter(tmp_path / "archive", tmp_path, gzip_level=level)
    rows = [writer.write_fetch(fetch(n)) for n in range(5)]
    writer.write_revisit(fetch(2, body=b""), refers_to_date=rows[2].fetched_at)
    closed = writer.close()
    assert closed.name.endswith(".sqlite") and not writing_marker(closed).exists()
    # A closed file is one database: no WAL beside it, a rollback journal.
    assert sorted(p.name for p in closed.parent.iterdir()) == [closed.name]
    assert sqlite3_shell(closed, "PRAGMA journal_mode") == "delete"
    found = sqlite3_shell(closed, "SELECT key FROM bodies WHERE body LIKE '%page 3<%'")
    assert found == (rows[3].key if level == 0 else "")  # stored as served: searchable
    for n, row in enumerate(rows):
        assert record_problem(tmp_path, row.archive, row.offset, row.length) == ("", fetch(n).body)
        stored = SQLITE.read(closed, row.offset, row.length)
        assert stored.body == fetch(n).body and stored.key == row.key
        assert stored.status == 200 and stored.url == fetch(n).final_url
        assert ("ETag", f'"e{n}"') in stored.headers
    indexed = SQLITE.index(closed, tmp_path)
    assert indexed.rows == rows
    assert [t[0] for t in indexed.touches] == [rows[2].key]


def test_compression_setting_is_checked():
    assert SQLITE.options(Settings({"ARCHIVE_SQLITE_GZIP_LEVEL": "9"})) == {"sqlite_gzip_level": 9}
    assert SQLITE.options(Settings()) == {"sqlite_gzip_level": 0}
    with pytest.raises(
        SettingError, match="ARCHIVE_SQLITE_GZIP_LEVEL='fast': give an integer from 0 to 9"
    ):
        SQLITE.options(Settings({"ARCHIVE_SQLITE_GZIP_LEVEL": "fast"}))


def test_a_row_is_committed_only_after_its_body(tmp_path):
    config = StoreConfig(data_dir=tmp_path, format="sqlite", batch_size=1000, flush_seconds=3600)
    store = Store(config)
    for n in range(6):
        store.put(fetch(n))
    store.batch.flush()
    store.put(fetch(6))  # inserted, never committed: the kill comes first
    store.abandon()
    # As the kill left it, read by the sqlite3 shell: every row's body is there.
    rows = catalog_rows(tmp_path)
    assert len(rows) == 6
    for row in rows.values():
        assert record_problem(tmp_path, row.archive, row.offset, row.length)[0] == ""
    datadir = config.datadir
    (open_file,) = datadir.open_archives()
    result = recover(datadir)
    assert result.indexed_rows == 0  # the uncommitted body went with its transaction
    (repair,) = result.repairs
    assert repair.path == open_file and repair.records == 6 and repair.cut_file is None
    assert not datadir.open_archives() and not writing_marker(open_file).exists()
    assert sqlite3_shell(open_file, "SELECT count(*) FROM bodies") == "6"
    assert_rows_readable(tmp_path)


def test_the_sqlite3_shell_alone_finds_a_row_whose_body_is_missing_or_cut(tmp_path):
    store = Store(StoreConfig(data_dir=tmp_path, format="sqlite"))
    for n in range(4):
        store.put(fetch(n))
    store.close()
    assert sqlite_rows_without_body(tmp_path) == []
    rows = sorted(catalog_rows(tmp_path).values(), key=lambda row: row.offset)
    with sqlite3.connect(tmp_path / rows[0].archive) as db:
        db.execute("DELETE FROM bodies WHERE id = ?", (rows[0].offset,))
        db.execute("UPDATE bodies SET body = substr(body, 2) WHERE id = ?", (rows[1].offset,))
    found = sqlite_rows_without_body(tmp_path)
    assert found == [
        f"{rows[0].url}: no body bytes, the row says {rows[0].length}",
        f"{rows[1].url}: {rows[1].length - 1} bytes, the row says {rows[1].length}",
    ]


def test_a_killed_file_without_bodies_is_repaired(tmp_path):
    writer = SqliteWriter(tmp_path / "archive", tmp_path)
    writer.write_fetch(fetch(1))
    writer.abandon()  # killed before its first commit
    repair = SQLITE.repair(writer.path, tmp_path)
    assert repair.records == 0 and not writing_marker(writer.path).exists()
    assert sqlite3_shell(writer.path, "SELECT count(*) FROM bodies") == "0"


def test_sqlite_archives_ship_and_merge_with_their_rows(tmp_path):
    shared = tmp_path / "shared"
    for task in range(2):
        local = tmp_path / f"local{task}"
        config = StoreConfig(data_dir=local, format="sqlite", prefix=f"job_3_{task}_p0")
        store = Store(config)
        store.archive.rollover_bytes = 1  # a file per body
        for n in range(task * 10, task * 10 + 3):
            store.put(listed_fetch(n))
        store.archive.rollover_bytes = 1 << 30
        store.put(listed_fetch(task * 10 + 3))
        store.batch.flush()  # committed, its file still open: held back
        shipper = Shipper(local, shared, f"job_3_{task}_p0")
        done = shipper.ship()
        assert (len(done.archives), done.rows, done.held_back) == (3, 3, 1)
        store.close()
        assert shipper.ship().held_back == 0
    assert merge_shipped(shared) == 8
    db = sqlite3.connect(f"file:{shared / 'metadata.db'}?mode=ro", uri=True)
    rows = db.execute('SELECT url, archive, "offset", length FROM artifacts').fetchall()
    db.close()
    assert len(rows) == 8
    for url, archive, offset, length in rows:
        problem, body = record_problem(shared, archive, offset, length)
        assert problem == "" and body == listed_body(int(url.rsplit("/", 1)[1]))
    assert sqlite_rows_without_body(shared) == []


@deferred_f_from_coro_f
async def test_crawl_stores_sqlite_bodies(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/{k}" for k in ("page/1.html", "gzip/2", "binary/5", "redirect/4")]
    feed = {str(tmp_path / "crawl.jsonl"): {"format": "jsonl"}}  # -o crawl.jsonl
    await crawl_site(urls, data_dir, {"ARCHIVE_FORMAT": "sqlite", "FEEDS": feed}, summaries="1")
    rows = assert_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    (archive,) = DataDir(data_dir).archives(SQLITE)
    assert {r.archive for r in rows.values()} == {f"archive/{archive.name}"}
    for row in rows.values():
        assert record_problem(data_dir, row.archive, row.offset, row.length)[0] == ""
    # Re-parse, rebuild and verify read sqlite archives as they read WARCs.
    out = tmp_path / "re.jsonl"
    reparse = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}", "-o", str(out))
    assert reparse.returncode == 0, reparse.stderr
    assert canon(read_jsonl(out)) == canon(read_jsonl(tmp_path / "crawl.jsonl"))
    rebuilt = Rebuild(data_dir, tmp_path / "rebuilt.db").run()
    with Catalog(rebuilt.path, readonly=True) as catalog:
        assert {r.key: r for r in catalog.rows()} == rows
    assert Verify(data_dir).run().ok
    # A WACZ holds WARCs: the bodies are converted to WARC response records.
    out = tmp_path / "crawl.wacz"
    WaczBuilder(data_dir, out).run()
    check = subprocess.run(
        [str(wacz_program()), "validate", "-f", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "the passed WACZ is valid" in check.stdout, check.stdout + check.stderr
    with zipfile.ZipFile(out) as zf:
        (warc,) = [n for n in zf.namelist() if n.startswith("archive/")]
        assert warc == f"archive/{archive.name}.warc.gz"
        responses = {
            record.rec_headers.get_header("WARC-Target-URI"): record.content_stream().read()
            for record in ArchiveIterator(io.BytesIO(zf.read(warc)))
            if record.rec_type == "response"
        }
        pages = [json.loads(line)["url"] for line in zf.read("pages/pages.jsonl").splitlines()[1:]]
    assert responses == {
        row.final_url: site.payload(urlsplit(row.final_url).path) for row in rows.values()
    }
    assert set(pages) == {
        r.final_url for r in rows.values() if r.content_type.startswith("text/html")
    }
