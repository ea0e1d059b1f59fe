"""FILES_STORE / IMAGES_STORE = archive://: 300 documents and 100 images (with two
thumbnails each) kept as archived records and catalog rows, never as loose files.

Every check reads the data directory as a third party would (tests/thirdparty.py):
sqlite3 for the catalog, a seek and warcio (or the sqlite3 shell) for each record,
Pillow for the thumbnails."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from PIL import Image
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.tools.export import export_catalog
from crawler.tools.rebuild import Rebuild
from crawler.tools.verify import Verify
from slurm.ship import Shipper, merge_shipped
from tests.conftest import ROOT, crawl_command, crawl_env, kill_group, run_crawl, write_urls
from tests.crawls import crawl
from tests.faults import committed_rows, kill_moments, wait_for_rows
from tests.media_site import (
    DOCS_PER_PAGE,
    IMAGES_PER_PAGE,
    THUMBS,
    MediaSite,
    MediaSpider,
    image_path,
)
from tests.polling import wait_until
from tests.thirdparty import catalog_rows, record_problem

PAGES = 10
DOCS = PAGES * DOCS_PER_PAGE  # 300
IMAGES = PAGES * IMAGES_PER_PAGE  # 100
# What a data directory holds besides its archive files.
OWN_FILES = {"metadata.db", "metadata.db-wal", "metadata.db-shm", ".lock"}
OWN_FILES |= {"fetch_log.jsonl", "runs.jsonl"}
THUMB_URL = "http://thumbs.invalid/"


@pytest.fixture
def media_site():
    site = MediaSite()
    site.start()
    yield site
    site.stop()


def listing_urls(site: MediaSite, run: int, pages=range(PAGES)) -> list[str]:
    # Another query each run: a stored listing page is not parsed again.
    return [f"{site.base_url}/list/{page}.html?run={run}" for page in pages]


def items_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def media_crawl(
    site, data_dir, tmp_path, run: int, pages=range(PAGES), **settings
) -> list[dict]:
    urls = write_urls(tmp_path / f"urls{run}.txt", listing_urls(site, run, pages))
    feed = tmp_path / f"items{run}.jsonl"
    settings = {"FEEDS": {str(feed): {"format": "jsonl"}}, **settings}
    await crawl(MediaSpider, data_dir, settings, urls=str(urls))
    items = items_of(feed)
    assert len(items) == len(pages)
    return items


def catalog(data_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True)


def stored_body(data_dir: Path, where: str, params: tuple) -> bytes:
    """The body of the one row matching ``where``, read as a third party reads it."""
    with contextlib.closing(catalog(data_dir)) as db:
        found = db.execute(
            f'SELECT archive, "offset", length FROM artifacts WHERE {where}', params
        ).fetchall()
    assert len(found) == 1, f"{where} {params}: {len(found)} rows"
    problem, body = record_problem(data_dir, *found[0])
    assert not problem, problem
    return body


def expected_thumb_size(served: bytes, box: tuple[int, int]) -> tuple[int, int]:
    picture = Image.open(io.BytesIO(served))
    picture.thumbnail(box)
    return picture.size


def assert_thumbs(data_dir: Path, image_key: str, served: bytes) -> None:
    for thumb_id, box in THUMBS.items():
        url = f"{THUMB_URL}{thumb_id}/{image_key}"
        thumb = Image.open(io.BytesIO(stored_body(data_dir, "url = ?", (url,))))
        assert thumb.format == "JPEG"
        assert thumb.size == expected_thumb_size(served, box), url


def assert_entries_resolve(site, data_dir: Path, items: list[dict], status: str) -> None:
    """Each ``files``/``images`` entry: its checksum is the served bytes', its path's
    key names a row whose record holds them; each image has its thumbnails."""
    docs = [e for item in items for e in item["files"]]
    images = [e for item in items for e in item["images"]]
    assert len(docs) == len(items) * DOCS_PER_PAGE and len(images) == len(items) * IMAGES_PER_PAGE
    for entry in docs + images:
        served = site.payload(urlsplit(entry["url"]).path)
        assert entry["status"] == status, entry
        assert entry["checksum"] == hashlib.md5(served).hexdigest(), entry  # noqa: S324
        key = Path(entry["path"]).name.split(".", 1)[0]
        assert stored_body(data_dir, "key = ?", (key,)) == served, entry
        if entry in images:
            assert_thumbs(data_dir, key, served)


def entries(items: list[dict]) -> dict[str, tuple[str, str]]:
    return {e["url"]: (e["path"], e["checksum"]) for i in items for e in i["files"] + i["images"]}


def assert_no_loose_file(data_dir: Path) -> None:
    """The data directory holds its catalog, logs and the archive files rows name."""
    with contextlib.closing(catalog(data_dir)) as db:
        named = {a for (a,) in db.execute("SELECT DISTINCT archive FROM artifacts")}
    found = set()
    for dirpath, dirnames, filenames in os.walk(data_dir):
        rel = Path(dirpath).relative_to(data_dir)
        assert str(rel) in (".", "archive") and set(dirnames) <= {"archive"}, (rel, dirnames)
        found |= {str(rel / name) for name in filenames}
    archives = {f for f in found if f.startswith("archive/")}
    assert archives == named, archives ^ named
    assert found - archives <= OWN_FILES, found - archives - OWN_FILES
    # Nor a FILES_STORE directory of Scrapy's anywhere.
    assert not (ROOT / "archive:").exists() and not list(data_dir.parent.glob("**/full"))


@deferred_f_from_coro_f
async def test_documents_and_images_are_records_and_rows_and_a_second_crawl_fetches_none(
    media_site, data_dir, tmp_path
):
    items = await media_crawl(media_site, data_dir, tmp_path, 1)
    assert_entries_resolve(media_site, data_dir, items, "downloaded")
    assert_no_loose_file(data_dir)
    with contextlib.closing(catalog(data_dir)) as db:
        (thumbs,) = db.execute(
            "SELECT count(*) FROM artifacts WHERE url LIKE 'http://thumbs.invalid/%'"
        ).fetchone()
        # The page log (what `reparse --follow` parses) holds pages, not downloads.
        (logged,) = db.execute("SELECT count(*) FROM _page_log").fetchone()
    assert thumbs == IMAGES * len(THUMBS)
    assert logged == PAGES
    assert media_site.media_requests() == DOCS + IMAGES

    again = await media_crawl(media_site, data_dir, tmp_path, 2)
    assert media_site.media_requests() == DOCS + IMAGES  # none downloaded again
    assert_entries_resolve(media_site, data_dir, again, "uptodate")
    assert entries(again) == entries(items)
    assert_no_loose_file(data_dir)


@deferred_f_from_coro_f
async def test_an_image_stored_without_its_thumbnails_is_replayed_not_fetched(
    media_site, data_dir, tmp_path
):
    await media_crawl(media_site, data_dir, tmp_path, 1)
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as db, db:
        gone = db.execute(
            "DELETE FROM artifacts WHERE url LIKE 'http://thumbs.invalid/small/%'"
        ).rowcount
    assert gone == IMAGES
    again = await media_crawl(media_site, data_dir, tmp_path, 2)
    assert media_site.media_requests() == DOCS + IMAGES
    assert {e["status"] for i in again for e in i["images"]} == {"cached"}
    assert {e["status"] for i in again for e in i["files"]} == {"uptodate"}
    for entry in [e for i in again for e in i["images"]]:
        key = Path(entry["path"]).name.split(".", 1)[0]
        assert_thumbs(data_dir, key, media_site.payload(urlsplit(entry["url"]).path))


@deferred_f_from_coro_f
async def test_expired_downloads_are_fetched_again(media_site, data_dir, tmp_path):
    await media_crawl(media_site, data_dir, tmp_path, 1)
    expired = {"FILES_EXPIRES": 0, "IMAGES_EXPIRES": 0}
    again = await media_crawl(media_site, data_dir, tmp_path, 2, **expired)
    assert media_site.media_requests() == 2 * (DOCS + IMAGES)
    assert_entries_resolve(media_site, data_dir, again, "downloaded")


@deferred_f_from_coro_f
async def test_listed_urls_done_count_the_listed_pages_not_their_downloads(
    media_site, data_dir, tmp_path
):
    urls = write_urls(tmp_path / "urls.txt", listing_urls(media_site, 1, range(3)))
    crawler = await crawl(MediaSpider, data_dir, {}, urls=str(urls))
    assert crawler.stats.get_value("progress/list_done") == 3
    assert crawler.stats.get_value("actions/ok") == 3 * (1 + DOCS_PER_PAGE + IMAGES_PER_PAGE)
    # Stored now: the same list again is three cache hits, its downloads untouched.
    crawler = await crawl(MediaSpider, data_dir, {}, urls=str(urls))
    assert crawler.stats.get_value("progress/list_done") == 3


def listed_incomplete(data_dir: Path) -> list[str]:
    """The pages listed to be parsed again for a failed download, read with sqlite3."""
    with contextlib.closing(catalog(data_dir)) as db:
        return [
            url
            for (url,) in db.execute(
                "SELECT a.url FROM _incomplete_pages i JOIN artifacts a ON a.key = i._key"
            )
        ]


@deferred_f_from_coro_f
async def test_a_failed_download_is_tried_again_by_the_next_run(media_site, data_dir, tmp_path):
    broken = image_path(3)  # on listing page 0
    media_site.broken.add(broken)
    items = await media_crawl(media_site, data_dir, tmp_path, 1, range(2))
    assert media_site.counts[broken] == 3  # tried, retried twice: no row
    (page0,) = [i for i in items if "/list/0.html" in i["page"]]
    first = [e["url"] for e in page0["images"]]
    assert len(first) == IMAGES_PER_PAGE - 1 and not any(u.endswith(broken) for u in first)
    assert listed_incomplete(data_dir) == [page0["page"]]

    # The next run of the same list: the page is stored, its download is not.
    media_site.broken.clear()
    requests = media_site.media_requests()
    urls = write_urls(tmp_path / "again.txt", listing_urls(media_site, 1, range(2)))
    await crawl(MediaSpider, data_dir, {}, urls=str(urls))
    assert media_site.counts[broken] == 4
    assert media_site.media_requests() == requests + 1  # that one alone
    with contextlib.closing(catalog(data_dir)) as db:
        stored = dict(db.execute("SELECT page, images FROM media"))
    assert len(stored) == 2
    images = [json.loads(v) for v in stored.values()]
    assert sorted(len(i) for i in images) == [IMAGES_PER_PAGE, IMAGES_PER_PAGE]
    body = stored_body(data_dir, "url = ?", (media_site.base_url + broken,))
    assert body == media_site.payload(broken)
    assert listed_incomplete(data_dir) == []  # complete now

    # Complete now: a third run downloads nothing.
    await crawl(MediaSpider, data_dir, {}, urls=str(urls))
    assert media_site.media_requests() == requests + 1


@deferred_f_from_coro_f
async def test_an_expiry_of_two_days_keeps_downloads_two_days(
    media_site, data_dir, tmp_path, monkeypatch
):
    """FILES_EXPIRES and IMAGES_EXPIRES count days: a day later the downloads are
    uptodate, three days later they are fetched again (the pipelines' clock moved)."""
    import pipelines.archive_files as archive_files

    class Clock:
        ahead = 0.0

        @classmethod
        def time(cls) -> float:
            return time.time() + cls.ahead

    monkeypatch.setattr(archive_files, "time", Clock)
    expiry = {"FILES_EXPIRES": 2, "IMAGES_EXPIRES": 2}
    first = await media_crawl(media_site, data_dir, tmp_path, 1, range(1), **expiry)
    assert {e["status"] for e in first[0]["files"] + first[0]["images"]} == {"downloaded"}
    requests = media_site.media_requests()
    Clock.ahead = 86400.0
    again = await media_crawl(media_site, data_dir, tmp_path, 2, range(1), **expiry)
    assert {e["status"] for e in again[0]["files"] + again[0]["images"]} == {"uptodate"}
    assert media_site.media_requests() == requests
    Clock.ahead = 3 * 86400.0
    late = await media_crawl(media_site, data_dir, tmp_path, 3, range(1), **expiry)
    assert {e["status"] for e in late[0]["files"] + late[0]["images"]} == {"downloaded"}
    assert media_site.media_requests() == requests + DOCS_PER_PAGE + IMAGES_PER_PAGE


@pytest.mark.parametrize("fmt", ["warc", "sqlite"])
@deferred_f_from_coro_f
async def test_downloads_and_thumbnails_ship_and_merge_intact(media_site, tmp_path, fmt):
    shared = tmp_path / "shared"
    items = []
    for task, pages in (("a", range(0, 3)), ("b", range(3, 6))):
        local = tmp_path / f"local-{task}"
        settings = {"ARCHIVE_FORMAT": fmt, "ARCHIVE_PREFIX": f"task-{task}"}
        run = ord(task)
        items += await media_crawl(media_site, local, tmp_path, run, pages, **settings)
        done = Shipper(local, shared, f"job_1_{task}").ship()
        assert done.held_back == 0 and done.rows == len(catalog_rows(local))
    assert merge_shipped(shared) == 6 * (1 + DOCS_PER_PAGE + IMAGES_PER_PAGE * (1 + len(THUMBS)))
    assert_entries_resolve(media_site, shared, items, "downloaded")
    # The shared directory holds no loose file either (besides the shipped catalogs).
    assert {p.name for p in shared.iterdir()} <= {"archive", "catalogs", "metadata.db"}


@deferred_f_from_coro_f
async def test_the_catalog_tools_resolve_thumbnails(media_site, data_dir, tmp_path):
    items = await media_crawl(media_site, data_dir, tmp_path, 1, range(2))
    out = tmp_path / "catalog.csv"
    export_catalog(data_dir, "csv", out)
    with open(out, newline="") as f:
        exported = {row["url"]: row for row in csv.DictReader(f)}
    for entry in [e for item in items for e in item["images"]]:
        key = Path(entry["path"]).name.split(".", 1)[0]
        assert exported[entry["url"]]["key"] == key
        for thumb_id in THUMBS:
            row = exported[f"{THUMB_URL}{thumb_id}/{key}"]
            assert row["status"] == "200" and row["content_type"] == "image/jpeg"
    assert Verify(data_dir).run().ok
    # The archive alone gives back every row, thumbnails included.
    rebuilt = tmp_path / "rebuilt.db"
    Rebuild(data_dir, rebuilt).run()
    columns = 'key, url, status, archive, "offset", length'
    with contextlib.closing(catalog(data_dir)) as db:
        rows = set(db.execute(f"SELECT {columns} FROM artifacts"))
    with contextlib.closing(sqlite3.connect(rebuilt)) as db:
        assert set(db.execute(f"SELECT {columns} FROM artifacts")) == rows
    assert len(rows) == 2 * (1 + DOCS_PER_PAGE + IMAGES_PER_PAGE * (1 + len(THUMBS)))


# -- kills --------------------------------------------------------------------------------


def start(url_file, data_dir, log_path) -> subprocess.Popen:
    args = ("-s", "SPIDER_MODULES=spiders,tests.media_site", "-s", "CATALOG_BATCH_SIZE=5")
    with open(log_path, "w") as log:
        return subprocess.Popen(
            crawl_command(url_file, data_dir, *args, spider="media"),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def committed_media(site, data_dir: Path) -> dict[str, bytes]:
    """URL -> body of every committed document and image (thumbnails checked too);
    every committed row reads back, holding what was served (or a thumbnail of it)."""
    with contextlib.closing(catalog(data_dir)) as db:
        rows = db.execute('SELECT key, url, archive, "offset", length FROM artifacts').fetchall()
    by_key = {}
    for key, url, archive, offset, length in rows:
        problem, body = record_problem(data_dir, archive, offset, length)
        assert not problem, f"{url}: {problem}"
        by_key[key] = (url, body)
    media = {}
    for url, body in by_key.values():
        if url.startswith(THUMB_URL):
            thumb_id, image_key = url[len(THUMB_URL) :].split("/")
            served = site.payload(urlsplit(by_key[image_key][0]).path)
            assert Image.open(io.BytesIO(body)).size == expected_thumb_size(
                served, THUMBS[thumb_id]
            )
            continue
        assert body == site.payload(urlsplit(url).path), url
        if "/list/" not in url:
            media[url] = body
    return media


@pytest.mark.parametrize("whole_tree", [True, False], ids=["whole-tree", "crawl-alone"])
def test_a_kill_loses_no_committed_download(tmp_path, data_dir, whole_tree):
    site = MediaSite(delay=0.01)
    site.start()
    try:
        url_file = write_urls(tmp_path / "urls.txt", listing_urls(site, 1))
        with kill_moments() as rng:
            proc = start(url_file, data_dir, tmp_path / "crawl0.log")
            wait_for_rows(data_dir, rng.randint(20, 250), proc)
            if whole_tree:
                kill_group(proc, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)  # the writer process lives on, and ends
                proc.wait(timeout=60)
            kept = committed_media(site, data_dir)
            assert 0 < len(kept) < DOCS + IMAGES, len(kept)
        result = run_crawl(
            url_file, data_dir, "-s", "SPIDER_MODULES=spiders,tests.media_site", spider="media"
        )
        assert result.returncode == 0, result.stderr[-3000:]
        after = committed_media(site, data_dir)
        assert len(after) == DOCS + IMAGES
        assert committed_rows(data_dir) == PAGES + DOCS + IMAGES * (1 + len(THUMBS))
        # What was committed before the kill is intact and was not downloaded again.
        assert {url: after[url] for url in kept} == kept
        assert [u for u in kept if site.counts[urlsplit(u).path] != 1] == []
        assert_no_loose_file(data_dir)
    finally:
        site.stop()


@pytest.mark.parametrize("fmt", ["warc", "zip"])
def test_after_a_kill_only_pages_are_parsed_again_and_downloads_stay_downloads(tmp_path, fmt):
    """A kill before any commit leaves pages, documents, images and thumbnails in the
    open archive file; the next run's recovery indexes them all, and parses only the
    pages (a download's record says no callback owns it). The sqlite format keeps no
    body before its commit: tests/test_items_crash.py has it at the store's level."""
    site = MediaSite(delay=0.01)
    site.start()
    data_dir = tmp_path / "data"
    media = ("-s", "SPIDER_MODULES=spiders,tests.media_site", "-s", f"ARCHIVE_FORMAT={fmt}")
    try:
        url_file = write_urls(tmp_path / "urls.txt", listing_urls(site, 1))
        # No commit before the kill: every record stays in the open file.
        held = ("-s", "CATALOG_BATCH_SIZE=100000", "-s", "CATALOG_FLUSH_SECONDS=600")
        with open(tmp_path / "killed.log", "w") as log:
            proc = subprocess.Popen(
                crawl_command(url_file, data_dir, *media, *held, spider="media"),
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=crawl_env(),
                start_new_session=True,
            )  # fmt: skip
        wait_until(lambda: site.media_requests() >= 150, "downloads under way", proc=proc)
        kill_group(proc, signal.SIGKILL)
        assert committed_rows(data_dir) == 0

        result = run_crawl(url_file, data_dir, *media, spider="media")
        assert result.returncode == 0, result.stderr[-3000:]
        log = result.stderr
        # The pages parsed again from the archive are no more URLs of the list.
        assert f"listed URLs done: {PAGES}." in log, log[-3000:]
        assert "Spider error processing" not in log and "NotSupported" not in log, log[-3000:]
        recovered = re.search(r"Parsing (\d+) pages a killed run stored without", log)
        assert recovered and 0 < int(recovered.group(1)) <= PAGES, log[-3000:]
        # One item per listing page, none of a download, each with all its downloads.
        with contextlib.closing(catalog(data_dir)) as db:
            items = db.execute("SELECT page, files, images FROM media").fetchall()
        assert sorted(page for page, _, _ in items) == sorted(listing_urls(site, 1))
        assert all(len(json.loads(files)) == DOCS_PER_PAGE for _, files, _ in items)
        assert all(len(json.loads(images)) == IMAGES_PER_PAGE for _, _, images in items)
        assert committed_rows(data_dir) == PAGES + DOCS + IMAGES * (1 + len(THUMBS))
    finally:
        site.stop()


def test_the_site_serves_what_it_lists(media_site):
    paths = {image_path(n) for n in range(IMAGES)}
    assert all(media_site.payload(p)[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0") for p in paths)
    assert media_site.payload("/doc/7.pdf").startswith(b"%PDF-1.4")
