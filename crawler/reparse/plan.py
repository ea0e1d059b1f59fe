"""What a re-parse reads: catalog rows selected, then cut into byte ranges of one file.

The catalog selects the rows (``--where``, ``--limit``, ``--archive``); rows are
grouped by archive file and cut into byte ranges (:func:`plan`), each read with one
read by a worker (:mod:`crawler.reparse.runner`).
"""

from __future__ import annotations

import glob
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.records import Row

CHUNK_ROWS = 200
CHUNK_BYTES = 16 << 20
# Several workers: a task is at most 1/(workers x TAPER) of the records left, and at
# least MIN_TASK_ROWS (a task's own cost, a read and a message, is that of well under
# one page's parse).
TAPER = 4
MIN_TASK_ROWS = 4


class ReparseError(Exception):
    """The re-parse cannot start (bad spider, callback, selection or output)."""


@dataclass
class ReparseConfig:
    spider: str
    data_dir: Path
    archive_glob: str | None = None
    callback: str = "parse"
    output: Path | None = None
    workers: int = 0  # 0: every core
    where: str | None = None
    limit: int | None = None
    spider_args: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    chunk_rows: int = CHUNK_ROWS  # records per task (a byte range of one file)

    @property
    def worker_count(self) -> int:
        if self.workers > 0:
            return self.workers
        # The cores this process may run on (a batch scheduler's share), not the machine's.
        affinity = getattr(os, "sched_getaffinity", None)
        return len(affinity(0)) if affinity else (os.cpu_count() or 1)


@dataclass
class Task:
    """A byte range of one archive file and the catalog rows inside it."""

    path: str
    # (key, url, final_url, method, fetched_at, offset, length, status, payload_digest)
    rows: list[tuple]

    @property
    def start(self) -> int:
        return self.rows[0][5]

    @property
    def end(self) -> int:
        return self.rows[-1][5] + self.rows[-1][6]


def archive_files(data_dir: Path, pattern: str | None) -> set[str]:
    """Relative paths (to ``data_dir``) of the closed archives that ``pattern`` names."""
    if pattern is None:
        found = DataDir(data_dir).archives()
    else:
        base = pattern if os.path.isabs(pattern) else None
        found = [Path(p) for p in glob.glob(base or str(data_dir / pattern))]
        if not found and base is None:
            found = [Path(p) for p in glob.glob(pattern)]
    return {os.path.relpath(p.resolve(), data_dir.resolve()) for p in found if p.is_file()}


class Selection:
    """The catalog rows a re-parse reads, streamed in archive and offset order."""

    # SQLite binds at most 32,766 parameters; past that the archive filter runs here
    # (and --limit and the progress total then count rows of every archive).
    MAX_BOUND_FILES = 30_000

    def __init__(self, config: ReparseConfig):
        self.catalog_path = DataDir(config.data_dir).catalog_path
        self.data_dir = Path(config.data_dir)
        self.archive_glob = config.archive_glob
        self.files = sorted(archive_files(config.data_dir, config.archive_glob))
        self.user_where = config.where
        self.limit = config.limit
        where = f"({config.where})" if config.where else "1"
        self.params: list[str] = []
        if len(self.files) <= self.MAX_BOUND_FILES:
            where += f" AND archive IN ({','.join('?' * len(self.files))})"
            self.params = list(self.files)
        self.where = where

    def count(self) -> int:
        if not self.files:
            return 0
        with Catalog(self.catalog_path, readonly=True) as catalog:
            try:
                return catalog.count(self.where, self.params, self.limit)
            except sqlite3.Error as exc:
                raise ReparseError(f"--where {self.user_where!r}: {exc}") from exc

    def missing_files(self) -> list[str]:
        """The archive files that rows of the selection name and that are not there
        (deleted, or never shipped): their pages cannot be parsed. With ``--archive``
        the user named the files: none is missing."""
        if self.archive_glob is not None:
            return []
        where = f"({self.user_where})" if self.user_where else "1"
        with Catalog(self.catalog_path, readonly=True) as catalog:
            try:
                names = catalog.archive_names(where)
            except sqlite3.Error as exc:
                raise ReparseError(f"--where {self.user_where!r}: {exc}") from exc
        return sorted(n for n in names if not (self.data_dir / n).exists())

    def __iter__(self) -> Iterator[Row]:
        if not self.files:
            return
        files = set(self.files)
        sql = f'{self.where} ORDER BY archive, "offset"'
        if self.limit is not None:
            sql += f" LIMIT {int(self.limit)}"
        with Catalog(self.catalog_path, readonly=True) as catalog:
            for row in catalog.rows(sql, self.params):
                if row.archive in files:
                    yield row


def select_rows(config: ReparseConfig) -> Selection:
    return Selection(config)


def task_size(most: int, left: int, workers: int) -> int:
    """Records in the next task: ``most`` for one worker; for several, a share of the
    ``left`` records that shrinks as they run out (guided scheduling), so that the
    workers finish together instead of one parsing a long last task while the others
    have nothing left to do."""
    if workers <= 1:
        return most
    return min(most, max(MIN_TASK_ROWS, left // (workers * TAPER)))


def plan(
    rows: Iterable[Row],
    data_dir: Path,
    chunk_rows: int = CHUNK_ROWS,
    workers: int = 1,
    total: int = 0,
) -> Iterator[Task]:
    """Cut rows (sorted by archive and offset) into byte ranges of one file each, of
    at most ``chunk_rows`` records; with several ``workers`` and the ``total`` number
    of rows, smaller ones as the rows run out (:func:`task_size`)."""
    current: Task | None = None
    limit = chunk_rows
    for done, row in enumerate(rows):
        path = str(data_dir / row.archive)
        entry = (
            row.key,
            row.url,
            row.final_url,
            row.method,
            row.fetched_at,
            row.offset,
            row.length,
            row.status,
            row.payload_digest,
        )
        if current is not None and (
            current.path != path
            or len(current.rows) >= limit
            or row.offset + row.length - current.start > CHUNK_BYTES
        ):
            yield current
            current = None
        if current is None:
            current = Task(path, [])
            limit = task_size(chunk_rows, total - done, workers)
        current.rows.append(entry)
    if current is not None:
        yield current
