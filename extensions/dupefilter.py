"""A duplicate-request filter whose memory stops growing.

Scrapy's ``RFPDupeFilter`` keeps the fingerprint of every request it has seen in a
Python set, about 100 bytes each: a gigabyte for a list of ten million URLs, in a
process that otherwise needs far less. :class:`SpillingDupeFilter` keeps them in a set
as Scrapy does until ``DUPEFILTER_MEMORY_FINGERPRINTS`` are there, then moves them into
a private temporary SQLite database and starts a new set. SQLite holds at most
``DUPEFILTER_CACHE_MIB`` of that database in memory and the rest in a temporary file
under ``SQLITE_TMPDIR`` (node-local disk on a cluster), deleted when the crawl ends.

A crawl below the threshold runs exactly as with Scrapy's filter; above it, a request
costs one more SQLite lookup (``benchmarks/bench_dupefilter.py``; the history of
docs/benchmarks.md).
With ``JOBDIR`` set, Scrapy's own file of fingerprints is kept as well, so a paused job
resumes with them.
"""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING

from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.job import job_dir

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


class DupeFilterError(Exception):
    """The filter's temporary database could not be used."""


class SpillingDupeFilter(RFPDupeFilter):
    def __init__(
        self,
        path: str | None = None,
        debug: bool = False,
        *,
        fingerprinter=None,
        memory_fingerprints: int = 250_000,
        cache_mib: int = 16,
    ) -> None:
        if memory_fingerprints < 1:
            raise ValueError(
                f"DUPEFILTER_MEMORY_FINGERPRINTS must be at least 1, not {memory_fingerprints}"
            )
        self.memory_fingerprints = memory_fingerprints
        self.cache_mib = cache_mib
        self.spilled = 0
        self._db: sqlite3.Connection | None = None
        super().__init__(path, debug, fingerprinter=fingerprinter)
        if len(self._fingerprints) >= memory_fingerprints:  # loaded from JOBDIR
            self._spill()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SpillingDupeFilter:
        settings = crawler.settings
        return cls(
            job_dir(settings),
            settings.getbool("DUPEFILTER_DEBUG"),
            fingerprinter=crawler.request_fingerprinter,
            memory_fingerprints=settings.getint("DUPEFILTER_MEMORY_FINGERPRINTS", 250_000),
            cache_mib=settings.getint("DUPEFILTER_CACHE_MIB", 16),
        )

    @property
    def in_memory(self) -> int:
        """Fingerprints held in memory now (the rest are in the temporary database)."""
        return len(self._fingerprints)

    def request_seen(self, request: Request) -> bool:
        fp = self._fingerprint(request)
        if fp in self._fingerprints:
            return True
        if self._db is not None and self._spilled_has(fp):
            return True
        self._fingerprints.add(fp)
        if self.file:
            self.file.write(len(fp).to_bytes(2, "big") + fp)
        if len(self._fingerprints) >= self.memory_fingerprints:
            self._spill()
        return False

    def close(self, reason: str) -> None:
        super().close(reason)
        if self._db is not None:
            self._db.close()
            self._db = None

    def _spilled_has(self, fp: bytes) -> bool:
        try:
            return self._lookup.execute(_SELECT, (fp,)).fetchone() is not None
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    def _spill(self) -> None:
        try:
            if self._db is None:
                self._open()
            # In key order the B-tree is walked once: a spill takes half the time, and
            # stays flat as the table grows (the history of docs/benchmarks.md).
            self._db.executemany(_INSERT, ((fp,) for fp in sorted(self._fingerprints)))
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc
        self.spilled += len(self._fingerprints)
        # clear() hands the set's table back; the new set starts small.
        self._fingerprints.clear()

    def _open(self) -> None:
        # "" is SQLite's private temporary database: a file in SQLITE_TMPDIR (or
        # TMPDIR) that only this connection sees and that goes when it closes.
        db = sqlite3.connect("", isolation_level=None)
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute(f"PRAGMA cache_size=-{self.cache_mib * 1024}")
        db.execute("CREATE TABLE seen (fp BLOB PRIMARY KEY) WITHOUT ROWID")
        # Never committed: nothing needs to outlive the crawl, and one open
        # transaction spares a commit per insert.
        db.execute("BEGIN")
        self._db = db
        self._lookup = db.cursor()

    def _error(self, action: str, exc: sqlite3.Error) -> DupeFilterError:
        where = os.environ.get("SQLITE_TMPDIR") or os.environ.get("TMPDIR") or "/var/tmp"
        return DupeFilterError(
            f"duplicate filter: cannot {action} its temporary database in {where} ({exc}); "
            "free space there, point SQLITE_TMPDIR elsewhere, or raise "
            "DUPEFILTER_MEMORY_FINGERPRINTS"
        )


_SELECT = "SELECT 1 FROM seen WHERE fp = ?"
_INSERT = "INSERT OR IGNORE INTO seen VALUES (?)"
