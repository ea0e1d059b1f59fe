"""What the tools share: the catalog of a data directory, and what its archives hold.

The archive is the source of truth: :func:`scan_archives` reads every record it can,
whatever the format, and reports the places it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from crawler.storage import formats
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.formats.base import Scan
from crawler.storage.records import Indexed, Row

__all__ = ["Scan", "ToolError", "newest_rows", "open_catalog", "scan_archives"]


class ToolError(Exception):
    """A catalog tool cannot do what was asked (the message says what to change)."""


def open_catalog(data_dir: Path) -> Catalog:
    """The catalog of a data directory, read-only."""
    return Catalog(DataDir(data_dir).catalog_path, readonly=True)


def scan_archives(paths: Iterable[Path], data_dir: Path) -> Scan:
    """Index every readable record; a bad one is reported (file, offset) and skipped."""
    scan = Scan()
    for path in paths:
        formats.for_path(path).scan(path, os.path.relpath(path, data_dir), scan)
    return scan


def newest_rows(indexed: Indexed) -> dict[str, Row]:
    """The catalog the records imply: the newest fetch of each key, then its 304s."""
    rows: dict[str, Row] = {}
    for row in indexed.rows:
        have = rows.get(row.key)
        if have is None or have.fetched_at < row.fetched_at:
            rows[row.key] = row
    for key, etag, last_modified, fetched_at in sorted(indexed.touches, key=lambda t: t[3]):
        row = rows.get(key)
        if row is not None and row.fetched_at < fetched_at:
            row.etag = etag if etag is not None else row.etag
            row.last_modified = last_modified if last_modified is not None else row.last_modified
            row.fetched_at = fetched_at
    return rows
