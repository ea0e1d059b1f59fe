"""FILES_STORE=archive://: Scrapy's FilesPipeline keeps its downloads in the archive."""

from __future__ import annotations

import hashlib
import json

import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from pipelines.archive_files import key_of
from tests.crawls import crawl

FILES = 30
# What a data directory holds besides its archive files.
OWN_FILES = {"metadata.db", "metadata.db-wal", "metadata.db-shm", ".lock"}
OWN_FILES |= {"fetch_log.jsonl", "runs.jsonl", "archive"}


class FileSpider(scrapy.Spider):
    name = "file_spider"

    def __init__(self, base: str, page: str, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [f"{base}/page/{page}.html"]
        self.base = base

    def parse(self, response):
        yield {"file_urls": [f"{self.base}/binary/{n}" for n in range(FILES)]}


def settings(tmp_path, run: int) -> dict:
    return {
        "ITEM_PIPELINES": {"pipelines.archive_files.ArchiveFilesPipeline": 1},
        "FILES_STORE": "archive://",
        "FEEDS": {str(tmp_path / f"items{run}.jsonl"): {"format": "jsonl"}},
    }


def files_of(path) -> list[dict]:
    (item,) = [json.loads(line) for line in path.read_text().splitlines()]
    return item["files"]


@deferred_f_from_coro_f
async def test_downloads_are_archived_records_and_catalog_rows(site, tmp_path, data_dir):
    await crawl(FileSpider, data_dir, settings(tmp_path, 1), base=site.base_url, page="1")
    files = files_of(tmp_path / "items1.jsonl")
    assert len(files) == FILES
    datadir = DataDir(data_dir)
    with Catalog(datadir.catalog_path, readonly=True) as catalog:
        for entry in files:
            served = site.payload(entry["url"][len(site.base_url) :])
            assert entry["status"] == "downloaded"
            assert entry["checksum"] == hashlib.md5(served).hexdigest()  # noqa: S324
            row = catalog.get(key_of(entry["path"]))
            assert row is not None and row.url == entry["url"]
            assert datadir.read(row).body == served
    # No loose file: the data directory holds its catalog, logs and archives alone.
    assert {p.name for p in data_dir.iterdir()} <= OWN_FILES
    assert set(datadir.archive_dir.iterdir()) == set(datadir.archives())
    assert not list(tmp_path.glob("**/full"))

    # A second crawl: every file is already downloaded, as the catalog says.
    before = {n: site.counts[f"/binary/{n}"] for n in range(FILES)}
    # (Another page lists them: a stored page is not parsed again.)
    await crawl(FileSpider, data_dir, settings(tmp_path, 2), base=site.base_url, page="2")
    again = files_of(tmp_path / "items2.jsonl")
    assert {e["status"] for e in again} == {"uptodate"}
    assert [(e["path"], e["checksum"]) for e in again] == [
        (e["path"], e["checksum"]) for e in files
    ]
    assert {n: site.counts[f"/binary/{n}"] for n in range(FILES)} == before
