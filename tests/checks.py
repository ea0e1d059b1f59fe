"""Assertions on a data directory, shared by the crawl tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from crawler.storage import formats
from crawler.storage.actionlog import read as read_log
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import TruncatedRecordError
from crawler.storage.formats.base import Scan, writing_marker
from crawler.storage.records import Row


def catalog_rows(data_dir: Path) -> dict[str, Row]:
    db = DataDir(data_dir).catalog_path
    if not db.exists():
        return {}
    with Catalog(db, readonly=True) as catalog:
        return {row.key: row for row in catalog.rows()}


def rows_by_url(data_dir: Path) -> dict[str, Row]:
    return {row.url: row for row in catalog_rows(data_dir).values()}


def assert_rows_readable(
    data_dir: Path, site=None, rows: dict[str, Row] | None = None
) -> dict[str, Row]:
    """Every row's record is readable, its body has the row's size and digest, and
    (given the site) equals what the server meant to send. ``rows``: those of another
    catalog than the data directory's (a rebuilt one)."""
    datadir = DataDir(data_dir)
    rows = catalog_rows(data_dir) if rows is None else rows
    for row in rows.values():
        stored = datadir.read(row)
        assert len(stored.body) == row.bytes, row
        assert stored.status == row.status, row
        assert dict(stored.warc_headers)["WARC-Payload-Digest"] == row.payload_digest
        if site is not None:
            path = urlsplit(row.final_url).path
            assert stored.body == site.payload(path), f"{row.url}: stored bytes differ"
    return rows


def response_records(data_dir: Path) -> Counter:
    """How many complete response records each key has across the archives."""
    datadir = DataDir(data_dir)
    counts: Counter = Counter()
    for path in [*datadir.archives(), *datadir.open_archives()]:
        indexed = index_file_tolerant(path, data_dir)
        counts.update(row.key for row in indexed)
    return counts


def index_file_tolerant(path: Path, data_dir: Path) -> list[Row]:
    """The rows of one archive file. A closed file must index whole; a file still
    open for writing may end inside a record (a kill), and only that is forgiven."""
    fmt = formats.for_path(path)
    if not (writing_marker(path).exists() or path.name.endswith(".open")):
        return fmt.index(path, data_dir).rows
    try:
        return fmt.index(path, data_dir).rows
    except TruncatedRecordError:
        scan = Scan()
        fmt.scan(path, path.name, scan)
        return scan.indexed.rows


def actions(data_dir: Path) -> list[dict]:
    return read_log(DataDir(data_dir).action_log_path)
