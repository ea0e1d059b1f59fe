"""Pages fetched again with the payload they had are kept as WARC ``revisit`` records
(profile identical-payload-digest) that refer to the stored record, in every format:
the row keeps pointing at the stored body and takes the new time, and every reader
(third parties, rebuild, verify, reparse, pywb) resolves them to the payload.

The site's product pages send no validators, as most dynamic sites: ``-a revalidate=1``
fetches them again in full, and 10% of them change between the two crawls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from warcio.archiveiterator import ArchiveIterator

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.records import IDENTICAL_PROFILE, payload_digest
from crawler.tools.rebuild import Rebuild
from crawler.tools.verify import Verify
from demo.site import DemoSite
from slurm.ship import Shipper, merge_shipped
from spiders.products import ProductsSpider
from tests import launcher
from tests.checks import actions, catalog_rows
from tests.conftest import ROOT, crawl_env, kill_group, run_crawl, start_crawl, write_urls
from tests.crawls import crawl, crawl_site
from tests.faults import kill_moments
from tests.polling import wait_until
from tests.test_pywb import COLLECTION, pywb_bin, wayback  # noqa: F401 - fixtures
from tests.thirdparty import record_problem

PAGES = 60
CHANGED = range(0, PAGES, 10)  # 10% of the pages change between the crawls


@pytest.fixture
def shop():
    """A site of its own: the tests change its pages."""
    demo = DemoSite(pages=PAGES, page_bytes=3000, seed=7)
    demo.start()
    yield demo
    demo.stop()


def product_urls(shop: DemoSite, query: str = "") -> list[str]:
    return [f"{shop.base_url}/product/{n}.html{query}" for n in range(PAGES)]


def change_some(shop: DemoSite) -> set[str]:
    """Change 10% of the pages; their paths."""
    paths = {f"/product/{n}.html" for n in CHANGED}
    for path in paths:
        shop.bump(path)
    return paths


def served(shop: DemoSite, url: str) -> bytes:
    return shop.payload(urlsplit(url).path)


def second_run_outcomes(data_dir: Path, since: str) -> dict[str, str]:
    """URL -> outcome of the action log's lines written after ``since``."""
    return {e["url"]: e["outcome"] for e in actions(data_dir) if e["ts"] > since}


def archive_records(data_dir: Path) -> list[dict]:
    """Every WARC record of every archive file, as warcio (a third party) reads it."""
    out = []
    for path in sorted((data_dir / "archive").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                headers = dict(record.rec_headers.headers)
                out.append({"type": record.rec_type, "file": path.name, **headers})
    return out


def assert_rows_read_back_as_served(data_dir: Path, shop: DemoSite) -> None:
    """Each row, read with no code of the project's, holds what the site serves now."""
    problems = []
    for row in catalog_rows(data_dir).values():
        problem, body = record_problem(data_dir, row.archive, row.offset, row.length)
        if not problem and body != served(shop, row.final_url):
            problem = "holds other bytes than the site serves"
        if problem:
            problems.append(f"{row.url}: {problem}")
    assert not problems, problems[:5]


async def two_crawls(shop, data_dir, settings=None, query=""):
    """Crawl the shop, change 10% of its pages, crawl it again revalidating: the rows
    after each crawl, the paths changed, the time the second crawl started and its
    stats."""
    urls = write_urls(data_dir.parent / "urls.txt", product_urls(shop, query))
    await crawl_site(urls, data_dir, settings, revalidate="1")
    first = catalog_rows(data_dir)
    changed = change_some(shop)
    since = max(row.fetched_at for row in first.values())
    crawler = await crawl_site(urls, data_dir, settings, revalidate="1")
    return first, catalog_rows(data_dir), changed, since, crawler.stats.get_stats()


@pytest.mark.parametrize("fmt", ["warc", "zip", "sqlite"])
@deferred_f_from_coro_f
async def test_unchanged_pages_become_revisits_of_the_stored_record(shop, data_dir, fmt, caplog):
    caplog.set_level(logging.INFO)
    first, second, changed, since, stats = await two_crawls(
        shop, data_dir, settings={"ARCHIVE_FORMAT": fmt}
    )
    assert len(second) == PAGES
    # The end summary tells whole copies from revisits.
    unchanged = PAGES - len(CHANGED)
    said = f"This run stored {len(CHANGED)} responses ("
    assert said in caplog.text and f", {unchanged} unchanged as revisits," in caplog.text
    # The writer tells unchanged pages; the crawl's counters follow it.
    changed_bytes = sum(r.bytes for r in second.values() if urlsplit(r.url).path in changed)
    assert {name: stats.get(name) for name in COUNTERS} == {
        "archive/stored": len(CHANGED),
        "archive/stored_bytes": changed_bytes,
        "archive/revisits": unchanged,
        "actions/ok": len(CHANGED),
        "actions/unchanged": unchanged,
    }
    outcomes = second_run_outcomes(data_dir, since)
    for key, row in second.items():
        was = first[key]
        assert row.fetched_at > was.fetched_at, row.url  # every page was fetched again
        assert row.payload_digest == payload_digest(served(shop, row.url))
        if urlsplit(row.url).path in changed:
            assert outcomes[row.url] == "ok"
            assert (row.archive, row.offset) != (was.archive, was.offset)
        else:
            assert outcomes[row.url] == "unchanged"
            # The row keeps pointing at the body stored by the first crawl.
            assert (row.archive, row.offset, row.length) == (was.archive, was.offset, was.length)
    assert_rows_read_back_as_served(data_dir, shop)
    # The archive alone gives the same rows back, and the catalog checks out.
    rebuilt = Rebuild(data_dir, data_dir.parent / "rebuilt.db").run()
    assert not rebuilt.problems
    assert catalog_rows_of(rebuilt.path) == second
    report = Verify(data_dir).run()
    assert report.ok, report.lines()


COUNTERS = (
    "archive/stored",
    "archive/stored_bytes",
    "archive/revisits",
    "actions/ok",
    "actions/unchanged",
)


def catalog_rows_of(path: Path) -> dict:
    with Catalog(path, readonly=True) as catalog:
        return {row.key: row for row in catalog.rows()}


@deferred_f_from_coro_f
async def test_warc_revisit_records_name_the_payload_and_the_record_holding_it(shop, data_dir):
    first, second, changed, since, stats = await two_crawls(shop, data_dir)
    records = archive_records(data_dir)
    revisits = {r["WARC-Target-URI"]: r for r in records if r["type"] == "revisit"}
    responses = [r for r in records if r["type"] == "response" and r["WARC-Date"] > since]
    unchanged = {row.url for row in second.values() if urlsplit(row.url).path not in changed}
    assert set(revisits) == unchanged
    assert {urlsplit(r["WARC-Target-URI"]).path for r in responses} == changed
    for url, record in revisits.items():
        row = next(r for r in first.values() if r.url == url)
        assert record["WARC-Profile"] == IDENTICAL_PROFILE
        assert record["WARC-Refers-To-Target-URI"] == url
        assert record["WARC-Refers-To-Date"] == row.fetched_at
        assert record["WARC-Payload-Digest"] == payload_digest(served(shop, url))
    # Checked by the web archives' own tools.
    paths = [str(p) for p in DataDir(data_dir).archives()]
    check = subprocess.run(
        [str(Path(sys.executable).with_name("warcio")), "check", "-v", *paths],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    cdxj = subprocess.run(
        [str(Path(sys.executable).with_name("cdxj-indexer")), *paths],
        capture_output=True,
        text=True,
    )
    assert cdxj.returncode == 0, cdxj.stderr[-3000:]
    lines = [json.loads(line.split(" ", 2)[2]) for line in cdxj.stdout.splitlines()]
    indexed = [x for x in lines if x.get("mime") == "warc/revisit"]
    assert len(indexed) == len(unchanged)


@deferred_f_from_coro_f
async def test_reparse_gives_the_items_of_both_crawls_for_unchanged_pages(shop, data_dir):
    urls = write_urls(data_dir.parent / "urls.txt", product_urls(shop))
    await crawl(ProductsSpider, data_dir, urls=str(urls), revalidate="1")
    crawled = products(data_dir)
    changed = change_some(shop)
    since = max(row.fetched_at for row in catalog_rows(data_dir).values())
    await crawl(ProductsSpider, data_dir, urls=str(urls), revalidate="1")
    again = products(data_dir)
    outcomes = second_run_outcomes(data_dir, since)
    assert list(outcomes.values()).count("unchanged") == PAGES - len(changed)
    reparse = launcher.run(
        [sys.executable, "-m", "scrapy", "reparse", "products", "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=crawl_env(),
    )
    assert reparse.returncode == 0, reparse.stderr[-3000:]
    reparsed = products(data_dir)
    assert set(reparsed) == set(crawled) == set(again)
    for url in crawled:
        if urlsplit(url).path in changed:
            assert reparsed[url] == again[url] != crawled[url]
        else:
            assert reparsed[url] == again[url] == crawled[url]


def products(data_dir: Path) -> dict[str, tuple]:
    """The ``product`` table by URL, but for when each row was parsed."""
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(product)") if r[1] != "_parsed_at"]
        rows = conn.execute(f"SELECT {', '.join(cols)} FROM product").fetchall()
    at = cols.index("url")
    return {row[at]: row for row in rows}


@deferred_f_from_coro_f
async def test_dedup_off_stores_every_payload_whole(shop, data_dir):
    first, second, changed, since, stats = await two_crawls(
        shop, data_dir, settings={"ARCHIVE_DEDUP": "off"}
    )
    assert set(second_run_outcomes(data_dir, since).values()) == {"ok"}
    assert stats.get("archive/revisits") is None and stats["archive/stored"] == PAGES
    for key, row in second.items():
        assert row.archive != first[key].archive  # a new record for every page
    records = archive_records(data_dir)
    assert not [r for r in records if r["type"] == "revisit"]
    assert_rows_read_back_as_served(data_dir, shop)


@pytest.mark.parametrize("fmt", ["warc", "zip", "sqlite"])
@deferred_f_from_coro_f
async def test_dedup_digest_refers_to_the_same_payload_under_another_url(shop, data_dir, fmt):
    # /page/N.html and /chunked/N serve the same page: one payload under two URLs.
    pages = [f"{shop.base_url}/page/{n}.html" for n in range(20)]
    chunked = [f"{shop.base_url}/chunked/{n}" for n in range(20)]
    settings = {"ARCHIVE_DEDUP": "digest", "ARCHIVE_FORMAT": fmt}
    await crawl_site(pages, data_dir, settings)
    await crawl_site(pages + chunked, data_dir, settings)
    rows = catalog_rows(data_dir)
    by_url = {row.url: row for row in rows.values()}
    for page, twin in zip(pages, chunked, strict=True):
        a, b = by_url[page], by_url[twin]
        assert (a.archive, a.offset, a.length) == (b.archive, b.offset, b.length)
        assert b.final_url == twin and a.payload_digest == b.payload_digest
    assert {e["outcome"] for e in actions(data_dir)} == {"ok", "cache_hit"}
    assert_rows_read_back_as_served(data_dir, shop)
    # Readers give each row its own URL with the shared payload.
    datadir = DataDir(data_dir)
    stored = datadir.read(by_url[chunked[3]])
    assert stored.url == chunked[3] and stored.key == by_url[chunked[3]].key
    assert stored.body == served(shop, chunked[3])
    rebuilt = Rebuild(data_dir, data_dir.parent / "rebuilt.db").run()
    assert catalog_rows_of(rebuilt.path) == rows
    assert Verify(data_dir).run().ok
    # The index the lookups use is in the catalog.
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(artifacts)")}
    assert "artifacts_digest" in indexes
    # Re-parsed, each row is a page of its own URL.
    reparse = launcher.run(
        [sys.executable, "-m", "scrapy", "reparse", "site", "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=crawl_env(),
    )
    assert reparse.returncode == 0, reparse.stderr[-3000:]
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
        summaries = dict(conn.execute("SELECT final_url, title FROM page_summary"))
    assert set(summaries) == set(pages + chunked)
    for page, twin in zip(pages, chunked, strict=True):
        assert summaries[twin] == summaries[page]
    if fmt == "warc":
        revisits = [r for r in archive_records(data_dir) if r["type"] == "revisit"]
        assert {r["WARC-Target-URI"] for r in revisits} == set(chunked)
        assert {r["WARC-Refers-To-Target-URI"] for r in revisits} == set(pages)


@deferred_f_from_coro_f
async def test_the_end_of_a_run_counts_revisits_by_digest_as_its_outcomes_do(
    shop, data_dir, caplog
):
    # A first fetch of a payload stored under another URL: an `ok` line (new to its
    # key, not unchanged), stored as a revisit of the other URL's record.
    caplog.set_level(logging.INFO)
    pages = [f"{shop.base_url}/page/{n}.html" for n in range(10)]
    chunked = [f"{shop.base_url}/chunked/{n}" for n in range(10)]
    await crawl_site(pages + chunked, data_dir, {"ARCHIVE_DEDUP": "digest"})
    outcomes = re.search(r"Outcomes of this run: (\d+) ok, .* (\d+) unchanged", caplog.text)
    stored = re.search(r"This run stored (\d+) responses \(", caplog.text)
    assert outcomes and stored, caplog.text[-3000:]
    ok, unchanged = map(int, outcomes.groups())
    said_unchanged = re.search(r"(\d+) unchanged as revisits", caplog.text)
    assert (ok, unchanged) == (20, 0)
    assert int(stored.group(1)) == ok
    assert (int(said_unchanged.group(1)) if said_unchanged else 0) == unchanged
    assert "10 of them as revisits of the same payload under another URL" in caplog.text


@deferred_f_from_coro_f
async def test_dedup_url_keeps_another_urls_identical_payload_whole(shop, data_dir):
    pages = [f"{shop.base_url}/page/{n}.html" for n in range(10)]
    chunked = [f"{shop.base_url}/chunked/{n}" for n in range(10)]
    await crawl_site(pages + chunked, data_dir)
    rows = catalog_rows(data_dir)
    assert len({(r.archive, r.offset) for r in rows.values()}) == 20
    assert not [r for r in archive_records(data_dir) if r["type"] == "revisit"]


# -- kills during the second crawl ---------------------------------------------------------

KILL_PAGES = 300


def refreshed_since(data_dir: Path, since: str) -> int:
    """Rows committed with a fetch later than ``since``, read as a third party would."""
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        return db.execute(
            "SELECT count(*) FROM artifacts WHERE fetched_at > ?", (since,)
        ).fetchone()[0]


def assert_rows_hold_a_version(data_dir: Path, shop: DemoSite, since: str) -> dict[str, str]:
    """Every row reads back (no code of the project's) as a version the site served; a
    row fetched after ``since`` holds what it serves now. Returns each URL's time."""
    problems, times = [], {}
    for row in catalog_rows(data_dir).values():
        n = int(urlsplit(row.url).path.split("/")[2].split(".")[0])
        versions = [shop.product_html(n, v) for v in range(2)]
        problem, body = record_problem(data_dir, row.archive, row.offset, row.length)
        if not problem and body not in versions:
            problem = "holds bytes the site never served"
        if not problem and row.fetched_at > since and body != served(shop, row.url):
            problem = "fetched in the second crawl, holds the page as it was before"
        if problem:
            problems.append(f"{row.url}: {problem}")
        times[row.url] = row.fetched_at
    assert not problems, problems[:5]
    return times


def full_records(data_dir: Path) -> dict[str, int]:
    """How many response records (not revisits) each URL has, as warcio reads them."""
    counts: dict[str, int] = {}
    for record in archive_records(data_dir):
        if record["type"] == "response" and "X-Crawl-Key" in record:
            url = record["X-Crawl-Requested-URI"]
            counts[url] = counts.get(url, 0) + 1
    return counts


def test_kills_during_the_second_crawl_lose_nothing(tmp_path, data_dir):
    shop = DemoSite(pages=KILL_PAGES, page_bytes=3000, seed=11)
    shop.start()
    try:
        with kill_moments() as rng:
            kill_during_the_second_crawl(rng, shop, tmp_path, data_dir)
    finally:
        shop.stop()


def kill_during_the_second_crawl(rng, shop, tmp_path, data_dir):
    urls = [f"{shop.base_url}/product/{n}.html?ms=30" for n in range(KILL_PAGES)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    args = ("-s", "CATALOG_BATCH_SIZE=7", "-s", "ARCHIVE_ROLLOVER_BYTES=100000")
    first = run_crawl(url_file, data_dir, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    stored = {row.url: row for row in catalog_rows(data_dir).values()}
    for n in range(0, KILL_PAGES, 10):
        shop.bump(f"/product/{n}.html")
    since = max(row.fetched_at for row in stored.values())
    args += ("-a", "revalidate=1")
    times = assert_rows_hold_a_version(data_dir, shop, since)
    for attempt in range(4):
        proc = start_crawl(url_file, data_dir, *args, log_path=tmp_path / f"{attempt}.log")
        try:
            start = max(times.values())
            target = rng.randint(5, 60)
            wait_until(
                lambda start=start, target=target: refreshed_since(data_dir, start) >= target,
                f"{target} rows refreshed",
                proc=proc,
            )
            if attempt % 2 == 0:
                kill_group(proc)
            else:
                os.kill(proc.pid, signal.SIGKILL)  # the crawl alone: its writer goes on
                proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        now = assert_rows_hold_a_version(data_dir, shop, since)
        # Nothing committed is lost: no row goes back to an older fetch.
        assert not [url for url, at in times.items() if now[url] < at]
        times = now
    result = run_crawl(url_file, data_dir, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_rows_read_back_as_served(data_dir, shop)
    rows = {row.url: row for row in catalog_rows(data_dir).values()}
    assert set(rows) == set(urls)
    changed = {u for u in urls if int(urlsplit(u).path.split("/")[2].split(".")[0]) % 10 == 0}
    for url, row in rows.items():
        was = stored[url]
        assert row.fetched_at > since
        if url in changed:
            assert (row.archive, row.offset) != (was.archive, was.offset)
        else:
            assert (row.archive, row.offset, row.length) == (was.archive, was.offset, was.length)
    # One full record per payload a page had: the rest are revisits, records a killed
    # run left were indexed on restart, not fetched and stored whole again.
    assert full_records(data_dir) == {u: 2 if u in changed else 1 for u in urls}
    assert not DataDir(data_dir).open_archives()


# -- replay --------------------------------------------------------------------------------


# (pywb's fixtures are tests/test_pywb.py's, imported above.)
@deferred_f_from_coro_f
async def test_pywb_replays_an_unchanged_page_from_its_revisit(
    tmp_path,
    data_dir,
    wayback,  # noqa: F811
    pywb_bin,  # noqa: F811
):
    shop = DemoSite(pages=20, page_bytes=3000, seed=5)
    shop.start()
    try:
        urls = write_urls(
            tmp_path / "urls.txt", [f"{shop.base_url}/product/{n}.html" for n in range(20)]
        )
        await crawl_site(urls, data_dir)
        shop.bump("/product/0.html")
        second = run_crawl(urls, data_dir, "-a", "revalidate=1")
        assert second.returncode == 0, second.stderr[-3000:]
        root, base = wayback
        archives = [str(p) for p in DataDir(data_dir).archives()]
        subprocess.run(
            [str(pywb_bin / "wb-manager"), "add", COLLECTION, *archives],
            cwd=root,
            check=True,
            capture_output=True,
        )
        url = f"{shop.base_url}/product/3.html"
        row = next(r for r in catalog_rows(data_dir).values() if r.url == url)
        revisit = next(
            r
            for r in archive_records(data_dir)
            if r["type"] == "revisit" and r["WARC-Target-URI"] == url
        )
        assert revisit["WARC-Date"] == row.fetched_at
        # The capture closest to the second crawl's time is the revisit: pywb serves
        # it with the payload of the record it refers to, the bytes the site served.
        stamp = "".join(c for c in row.fetched_at[:19] if c.isdigit())
        with urllib.request.urlopen(f"{base}/{COLLECTION}/{stamp}id_/{url}", timeout=60) as answer:
            body = answer.read()
            memento = answer.headers.get("Memento-Datetime")
        assert body == served(shop, url)
        assert parsedate_to_datetime(memento) == datetime.fromisoformat(
            row.fetched_at[:19] + "+00:00"
        )
    finally:
        shop.stop()


# -- Slurm shipping and merging ------------------------------------------------------------


@deferred_f_from_coro_f
async def test_shipped_and_merged_revisits_point_at_shipped_records(shop, tmp_path, data_dir):
    shared = tmp_path / "shared"
    urls = write_urls(tmp_path / "urls.txt", product_urls(shop))
    shipper = Shipper(data_dir, shared, "job_1_0_p0")
    await crawl_site(urls, data_dir)
    shipper.ship()
    first = catalog_rows(data_dir)
    change_some(shop)
    await crawl_site(urls, data_dir, revalidate="1")
    shipment = shipper.ship()
    # The revisits' rows point into the file shipped the first time: none held back.
    assert shipment.held_back == 0 and shipment.rows == PAGES
    merge_shipped(shared)
    merged = catalog_rows(shared)
    assert merged == catalog_rows(data_dir)
    assert_rows_read_back_as_served(shared, shop)
    # A record is its file and offset: a changed page's new record may sit at the
    # offset its old one had, in another file.
    unchanged = [
        k
        for k, row in merged.items()
        if (row.archive, row.offset) == (first[k].archive, first[k].offset)
    ]
    assert len(unchanged) == PAGES - len(CHANGED)
