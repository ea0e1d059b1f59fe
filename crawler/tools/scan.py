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
    """Index every readable record; a bad one is reported (file, offset) and skipped,
    and so is a revisit whose original record is in a file missing or cut short."""
    scan = Scan()
    elsewhere: dict[str, list[tuple[str, Row]]] = {}
    for path in paths:
        relpath = os.path.relpath(path, data_dir)
        start = len(scan.indexed.rows)
        formats.for_path(path).scan(path, relpath, scan)
        for row in scan.indexed.rows[start:]:
            if row.archive != relpath:  # a revisit of a record in another file
                elsewhere.setdefault(row.archive, []).append((relpath, row))
    if elsewhere:
        _resolve_revisits(scan, DataDir(data_dir), elsewhere)
    return scan


def _resolve_revisits(
    scan: Scan, datadir: DataDir, elsewhere: dict[str, list[tuple[str, Row]]]
) -> None:
    """Leave out of ``scan.indexed`` the revisits whose original file is missing or cut
    short of their records (``scan.unresolved`` names each)."""
    lost: set[int] = set()
    for name, revisits in elsewhere.items():
        path = datadir.resolve(name)
        fmt = formats.for_path(path)
        end = max(row.offset + row.length for _, row in revisits)
        if fmt.holds(path, end, max(row.offset for _, row in revisits)):
            continue
        why = "cut short" if path.exists() else "missing"
        for relpath, row in revisits:
            if why == "cut short" and fmt.holds(path, row.offset + row.length, row.offset):
                continue
            lost.add(id(row))
            scan.unresolved.append(
                f"{relpath}: a revisit of {row.url} ({row.fetched_at}) refers to {name}, "
                f"offset {row.offset}: that file is {why}; not indexed"
            )
    if lost:
        indexed = scan.indexed
        indexed.rows = [row for row in indexed.rows if id(row) not in lost]


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
