"""``scrapy catalog``: stats, verify, rebuild, merge, export, CDXJ index, WACZ."""

from __future__ import annotations

import csv
import shutil
import sqlite3
import subprocess
import zipfile
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.tools.export import export_catalog
from crawler.tools.rebuild import Rebuild
from crawler.tools.scan import ToolError, scan_archives
from crawler.tools.stats import catalog_stats
from crawler.tools.verify import Verify
from tests.checks import assert_rows_readable, catalog_rows
from tests.cmdline import run_scrapy
from tests.conftest import ROOT
from tests.crawls import crawl_site, crawled
from tests.toolvenv import wacz_program

BIN = ROOT / ".venv" / "bin"


@pytest.fixture(scope="module", name="crawled")
def crawled_dir(site, tmp_path_factory):
    """A data directory with 200s, a 404, a redirect, and a 304 refresh (revisit record)."""
    root = tmp_path_factory.mktemp("catalog")
    base = site.base_url
    urls = [f"{base}/page/{n}.html" for n in (300, 301, 302, 303)]
    urls += [f"{base}/missing/5", f"{base}/redirect/7", f"{base}/binary/3"]
    data_dir = root / "data"
    crawled(crawl_site(urls, data_dir))
    site.bump("/page/301.html")
    # Whole copies of the pages without validators fetched again (not revisits of the
    # first copies), so that a damaged record has an older one to fall back to.
    crawled(crawl_site(urls, data_dir, {"ARCHIVE_DEDUP": "off"}, revalidate="1"))
    return data_dir


def test_stats_table(crawled):
    stats = catalog_stats(crawled)
    assert stats.rows == 7
    assert dict(stats.by_status) == {200: 6, 404: 1}
    assert dict(stats.by_content_type)["text/html"] == 6
    assert stats.by_host == [("127.0.0.1", 7)]
    assert stats.archive_bytes > 0 and stats.ratio > 0
    assert stats.oldest < stats.newest
    result = run_scrapy("catalog", "stats", "-s", f"DATA_DIR={crawled}")
    assert result.returncode == 0, result.stderr
    assert "compression" in result.stdout and "127.0.0.1" in result.stdout


def test_rebuild_reproduces_the_catalog_row_for_row(crawled, tmp_path):
    out = tmp_path / "rebuilt.db"
    result = run_scrapy("catalog", "rebuild", "-s", f"DATA_DIR={crawled}", "-o", str(out))
    assert result.returncode == 0, result.stderr
    with Catalog(out, readonly=True) as rebuilt:
        rows = {r.key: r for r in rebuilt.rows()}
    original = catalog_rows(crawled)
    assert rows == original
    # The 304 refresh was applied: the unchanged page has its second fetch time.
    assert (
        sum(
            1
            for r in original.values()
            if r.fetched_at > min(x.fetched_at for x in original.values())
        )
        >= 6
    )


def test_rebuild_refuses_to_overwrite_the_live_catalog(crawled):
    with pytest.raises(ToolError, match="live catalog"):
        Rebuild(crawled, crawled / "metadata.db").run()


def test_rebuild_without_an_archive_drops_its_rows(crawled, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(crawled, data_dir)
    archives = sorted((data_dir / "archive").glob("*.warc.gz"))
    assert len(archives) == 2
    archives[1].unlink()
    result = Rebuild(data_dir, tmp_path / "r.db").run()
    with Catalog(result.path, readonly=True) as rebuilt:
        rows = {r.key: r for r in rebuilt.rows()}
    kept = {
        k: r
        for k, r in catalog_rows(data_dir).items()
        if r.archive != str(archives[1].relative_to(data_dir))
    }
    # Rows whose newest fetch was in the lost file fall back to the older record.
    assert set(rows) == set(catalog_rows(data_dir))
    for key, row in kept.items():
        assert rows[key].archive == row.archive and rows[key].offset == row.offset


def test_verify_finds_and_fixes(site, crawled, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(crawled, data_dir)
    ok = run_scrapy("catalog", "verify", "-s", f"DATA_DIR={data_dir}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rows = sorted(catalog_rows(data_dir).values(), key=lambda r: r.url)
    damaged, forgotten = rows[0], rows[1]
    with open(data_dir / damaged.archive, "r+b") as f:
        f.seek(damaged.offset + damaged.length // 2)
        f.write(b"\x00" * 32)
    conn = sqlite3.connect(data_dir / "metadata.db")
    conn.execute("DELETE FROM artifacts WHERE key = ?", (forgotten.key,))
    conn.commit()
    conn.close()
    bad = run_scrapy("catalog", "verify", "-s", f"DATA_DIR={data_dir}")
    assert bad.returncode == 1
    assert f"{damaged.archive}: offset {damaged.offset}: {damaged.url}" in bad.stdout
    assert f"{forgotten.url}: in the archive, not in the catalog" in bad.stdout
    assert "scrapy catalog verify --fix" in bad.stdout
    unconfirmed = run_scrapy("catalog", "verify", "--fix", "-s", f"DATA_DIR={data_dir}")
    assert "not fixed" in unconfirmed.stderr
    fixed = run_scrapy("catalog", "verify", "--fix", "--yes", "-s", f"DATA_DIR={data_dir}")
    assert "fixed: dropped 1 rows" in fixed.stdout, fixed.stdout + fixed.stderr
    after = catalog_rows(data_dir)
    assert after[forgotten.key] == forgotten
    # The damaged fetch (binary/3, fetched again by the second crawl: it has no
    # validators) falls back to the older copy the first crawl stored.
    assert damaged.url.endswith("/binary/3")
    assert after[damaged.key].fetched_at < damaged.fetched_at
    assert after[damaged.key].archive != damaged.archive
    assert_rows_readable(data_dir, site)
    report = Verify(data_dir).run()
    assert report.bad_rows == [] and report.orphans == []


@deferred_f_from_coro_f
async def test_merge_keeps_the_newest_fetch(site, tmp_path):
    base = site.base_url
    old, new = tmp_path / "old", tmp_path / "new"
    await crawl_site([f"{base}/page/310.html", f"{base}/page/311.html"], old)
    site.bump("/page/310.html")
    await crawl_site([f"{base}/page/310.html", f"{base}/page/312.html"], new)
    old_rows, new_rows = catalog_rows(old), catalog_rows(new)
    out = tmp_path / "merged.db"
    for order in ([new, old], [old, new]):
        result = run_scrapy(
            "catalog", "merge", *(str(d / "metadata.db") for d in order), "-o", str(out)
        )
        assert result.returncode == 0, result.stderr
        with Catalog(out, readonly=True) as merged:
            rows = {r.key: r for r in merged.rows()}
        assert len(rows) == 3
        for key, row in new_rows.items():
            assert rows[key] == row  # page 310 was fetched again later: the new row wins
        for key, row in old_rows.items():
            if key not in new_rows:
                assert rows[key] == row
    bad = run_scrapy("catalog", "merge", str(old / "metadata.db"), "-o", str(out))
    assert bad.returncode == 2


def test_export_parquet_and_csv(crawled, tmp_path):
    n = export_catalog(crawled, "parquet", tmp_path / "c.parquet")
    table = pq.read_table(tmp_path / "c.parquet")
    assert n == table.num_rows == 7
    assert table.column("status").type == "int32"
    assert table.column("fetched_at").type == pa.timestamp("us", tz="UTC")
    exported = {r["key"]: r["fetched_at"] for r in table.to_pylist()}
    for key, row in catalog_rows(crawled).items():
        assert exported[key] == datetime.fromisoformat(row.fetched_at)
    result = run_scrapy(
        "catalog",
        "export",
        "--format",
        "csv",
        "-o",
        str(tmp_path / "c.csv"),
        "-s",
        f"DATA_DIR={crawled}",
    )
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "c.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 7 and {r["key"] for r in rows} == set(catalog_rows(crawled))


def test_cdxj_index_equals_cdxj_indexer(crawled, tmp_path):
    out = tmp_path / "index.cdxj"
    result = run_scrapy("catalog", "index", "-o", str(out), "-s", f"DATA_DIR={crawled}")
    assert result.returncode == 0, result.stderr
    archives = sorted((crawled / "archive").glob("*.warc.gz"))
    reference = subprocess.run(
        [str(BIN / "cdxj-indexer"), "--sort", *map(str, archives)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reference.returncode == 0, reference.stderr
    assert out.read_text() == reference.stdout
    assert len(reference.stdout.splitlines()) >= 7


def test_wacz_validates(crawled, tmp_path):
    wacz = wacz_program()
    out = tmp_path / "crawl.wacz"
    result = run_scrapy("catalog", "wacz", str(out), "-s", f"DATA_DIR={crawled}")
    assert result.returncode == 0, result.stderr
    check = subprocess.run(
        [str(wacz), "validate", "-f", str(out)], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "the passed WACZ is valid" in check.stdout
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {"datapackage.json", "pages/pages.jsonl", "indexes/index.cdx.gz"} <= names
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
        pages = zf.read("pages/pages.jsonl").decode().splitlines()
    assert len(pages) == 1 + 5  # header + the HTML pages (4 pages and the redirected one)


def test_wacz_without_a_path_lands_in_derived(crawled, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(crawled, data_dir)
    result = run_scrapy("catalog", "wacz", "-s", f"DATA_DIR={data_dir}")
    assert result.returncode == 0, result.stderr
    out = data_dir / "derived" / "crawl.wacz"
    assert f"wrote {out}" in result.stdout
    with zipfile.ZipFile(out) as zf:
        assert "datapackage.json" in zf.namelist()


def test_a_corrupt_record_is_reported_by_rebuild(crawled, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(crawled, data_dir)
    row = sorted(catalog_rows(data_dir).values(), key=lambda r: r.offset)[2]
    with open(data_dir / row.archive, "r+b") as f:
        f.seek(row.offset + 20)
        f.write(b"\xff" * 40)
    result = run_scrapy(
        "catalog", "rebuild", "-o", str(tmp_path / "r.db"), "-s", f"DATA_DIR={data_dir}"
    )
    assert result.returncode == 1
    assert f"offset {row.offset}" in result.stderr
    with Catalog(tmp_path / "r.db", readonly=True) as rebuilt:
        assert rebuilt.count() >= 6  # the records after the bad one are still indexed


SAMPLES = ROOT / "tests" / "data" / "broken"


def test_broken_samples_are_reported_with_file_and_offset(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    for name in ("truncated.warc.gz", "corrupt.warc.gz"):
        shutil.copy(SAMPLES / name, archive / name)
    scan = scan_archives(DataDir(tmp_path).archives(), tmp_path)
    assert len(scan.problems) == 2, scan.problems
    truncated, corrupt = archive / "truncated.warc.gz", archive / "corrupt.warc.gz"
    assert any(p.startswith(f"{corrupt}: offset 1150:") for p in scan.problems), scan.problems
    assert any(p.startswith(f"{truncated}: offset 1940:") for p in scan.problems), scan.problems
    found = sorted((r.archive, r.key[-1]) for r in scan.indexed.rows)
    # The corrupt file's third record is found again after the bad one; the truncated
    # file's third record is lost.
    assert found == [
        ("archive/corrupt.warc.gz", "0"),
        ("archive/corrupt.warc.gz", "2"),
        ("archive/truncated.warc.gz", "0"),
        ("archive/truncated.warc.gz", "1"),
    ]


# -- a revisit whose original is missing or cut short --------------------------------------


def revisited_dir(root, damage: str | None, fmt: str = "warc"):
    """Pages 0-9 stored whole in one file, fetched again unchanged (revisits referring
    to that file, in a second one, with pages 10-19 stored whole); then the first file
    deleted, or cut short after its third page (``damage``). Returns the data
    directory, the first file's name and a revisited page's URL."""
    from crawler.storage.store import Store, StoreConfig
    from tests.factories import listed_fetch

    data_dir = root / "data"
    store = Store(StoreConfig(data_dir, format=fmt))
    stored = [store.put(listed_fetch(n)) for n in range(10)]
    store.close()
    store = Store(StoreConfig(data_dir, format=fmt))
    for n in range(20):
        again = listed_fetch(n, fetched_at=1_800_000_000.0 + n)
        store.put(again, stored=stored[n] if n < 10 else None)
    store.close()
    original = data_dir / stored[0].archive
    if damage == "missing":
        original.unlink()
    elif damage == "cut":
        with open(original, "r+b") as f:
            f.truncate(stored[3].offset + stored[3].length // 2)
    return data_dir, stored[0].archive, stored[5].url


@pytest.mark.parametrize("damage", ["missing", "cut"])
def test_tools_over_a_revisits_missing_original_name_it_and_fail(tmp_path, damage):
    data_dir, original, url = revisited_dir(tmp_path, damage)
    where = ("-s", f"DATA_DIR={data_dir}")

    wacz = run_scrapy("catalog", "wacz", str(tmp_path / "out.wacz"), *where)
    assert wacz.returncode == 1 and original in wacz.stderr, wacz.stdout + wacz.stderr
    assert "Traceback" not in wacz.stderr and not (tmp_path / "out.wacz").exists()

    rebuilt = tmp_path / "rebuilt.db"
    rebuild = run_scrapy("catalog", "rebuild", "-o", str(rebuilt), *where)
    assert rebuild.returncode == 1 and original in rebuild.stderr, rebuild.stderr
    # No row of the rebuilt catalog points at a record that is not there.
    assert_rows_readable(data_dir, rows=catalog_rows_of(rebuilt))

    shell = run_scrapy("shell", url, "-c", "response.status", "-s", "ARCHIVE_SHELL=offline", *where)
    assert shell.returncode == 1 and "Traceback" not in shell.stderr, shell.stderr[-2000:]
    (line,) = shell.stderr.strip().splitlines()
    assert line.startswith("error: ") and original in line, line

    # verify --fix drops the rows it cannot read (and cuts a partial tail off): once.
    before = run_scrapy("catalog", "verify", *where)
    assert before.returncode == 1 and original in before.stdout, before.stdout
    fixed = run_scrapy("catalog", "verify", "--fix", "--yes", *where)
    assert fixed.returncode == 0 and "fixed:" in fixed.stdout, fixed.stdout + fixed.stderr
    after = run_scrapy("catalog", "verify", *where)
    assert after.returncode == 0, after.stdout + after.stderr
    assert run_scrapy("catalog", "verify", "--fix", "--yes", *where).returncode == 0
    assert_rows_readable(data_dir)
    assert run_scrapy("catalog", "wacz", str(tmp_path / "out.wacz"), *where).returncode == 0


def catalog_rows_of(path) -> dict:
    with Catalog(path, readonly=True) as catalog:
        return {row.key: row for row in catalog.rows()}


@pytest.mark.parametrize("fmt", ["warc", "zip", "sqlite"])
def test_a_wacz_of_revisits_refers_to_the_records_it_holds(tmp_path, fmt):
    """Each revisit in a WACZ names the response it stands for by URI and date
    (WARC-Refers-To-Target-URI, WARC-Refers-To-Date), as replay tools look it up: read
    with warcio, every such pair is a response record of the package."""
    from warcio.archiveiterator import ArchiveIterator

    data_dir, _, _ = revisited_dir(tmp_path, None, fmt)
    out = tmp_path / "out.wacz"
    made = run_scrapy("catalog", "wacz", str(out), "-s", f"DATA_DIR={data_dir}")
    assert made.returncode == 0, made.stderr
    responses, revisits = set(), []
    with zipfile.ZipFile(out) as zf:
        for name in zf.namelist():
            if not name.startswith("archive/"):
                continue
            with zf.open(name) as f:
                for record in ArchiveIterator(f):
                    headers = record.rec_headers
                    uri, date = headers["WARC-Target-URI"], headers["WARC-Date"]
                    if record.rec_type == "response":
                        responses.add((uri, date))
                    elif record.rec_type == "revisit":
                        refers = (
                            headers["WARC-Refers-To-Target-URI"],
                            headers["WARC-Refers-To-Date"],
                        )
                        revisits.append((uri, date, refers))
    assert len(revisits) == 10 and len(responses) == 20, (len(revisits), len(responses))
    for uri, date, refers in revisits:
        assert refers in responses and refers[1] != date, (uri, date, refers)
