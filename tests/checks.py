"""Assertions on a data directory, shared by the crawl tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from crawler.actionlog import read as read_log
from crawler.archive import (
    Indexed,
    TruncatedRecordError,
    index_any,
    index_file,
    index_record,
    is_zip,
    iter_members,
    parse_record,
    read_any,
    resolve,
)
from crawler.catalog import Catalog, Row


def catalog_rows(data_dir: Path) -> dict[str, Row]:
    db = data_dir / "metadata.db"
    if not db.exists():
        return {}
    with Catalog(db, readonly=True) as catalog:
        return {row.key: row for row in catalog.rows()}


def rows_by_url(data_dir: Path) -> dict[str, Row]:
    return {row.url: row for row in catalog_rows(data_dir).values()}


def assert_rows_readable(data_dir: Path, site=None) -> dict[str, Row]:
    """Every row's record is readable, its body has the row's size and digest, and
    (given the site) equals what the server meant to send."""
    rows = catalog_rows(data_dir)
    for row in rows.values():
        stored = read_any(resolve(data_dir, row.archive), row.offset, row.length)
        assert len(stored.body) == row.bytes, row
        assert stored.status == row.status, row
        assert dict(stored.warc_headers)["WARC-Payload-Digest"] == row.payload_digest
        if site is not None:
            path = urlsplit(row.final_url).path
            assert stored.body == site.payload(path), f"{row.url}: stored bytes differ"
    return rows


def response_records(data_dir: Path) -> Counter:
    """How many complete response records each key has across the archives."""
    counts: Counter = Counter()
    for path in sorted((data_dir / "archive").glob("*")):
        if ".cut-" in path.name:
            continue
        indexed = index_file_tolerant(path, data_dir)
        counts.update(row.key for row in indexed)
    return counts


def index_file_tolerant(path: Path, data_dir: Path) -> list[Row]:
    """The rows of one archive file. A closed file must index whole; a file still
    ``.open`` may end inside a record (a kill), and only that is forgiven."""
    if is_zip(path):
        return index_any(path, data_dir).rows
    if not path.name.endswith(".open"):
        return index_file(path, data_dir).rows
    out = Indexed()
    with open(path, "rb") as f:
        try:
            for offset, length, raw in iter_members(f):
                record, _ = parse_record(raw)
                index_record(record, path.name, offset, length, out)
        except TruncatedRecordError:
            pass  # the torn tail: the complete records before it are counted
    return out.rows


def actions(data_dir: Path) -> list[dict]:
    return read_log(data_dir / "fetch_log.jsonl")
