"""A duplicate-request filter whose memory stops growing.

Scrapy's ``RFPDupeFilter`` keeps the fingerprint of every request it has seen in a
Python set, about 100 bytes each: a gigabyte for a list of ten million URLs, in a
process that otherwise needs far less. :class:`SpillingDupeFilter` keeps them in a set
as Scrapy does until ``DUPEFILTER_MEMORY_FINGERPRINTS`` are there, then moves them into
a private temporary SQLite database and starts a new set (``crawler/spillset.py``).
SQLite holds at most ``DUPEFILTER_CACHE_MIB`` of that database in memory and the rest
in a temporary file under ``SQLITE_TMPDIR`` (node-local disk on a cluster), deleted
when the crawl ends.

A crawl below the threshold runs exactly as with Scrapy's filter; above it, a request
costs one more SQLite lookup (``benchmarks/bench_dupefilter.py``; the history of
docs/benchmarks.md).
With ``JOBDIR`` set, Scrapy's own file of fingerprints is kept as well, so a paused job
resumes with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.job import job_dir

from crawler.spillset import SpillFile, temp_dir

if TYPE_CHECKING:
    import sqlite3

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
        memory_fingerprints: int = 100_000,
        cache_mib: int = 16,
    ) -> None:
        if memory_fingerprints < 1:
            raise ValueError(
                f"DUPEFILTER_MEMORY_FINGERPRINTS must be at least 1, not {memory_fingerprints}"
            )
        self.memory_fingerprints = memory_fingerprints
        self.cache_mib = cache_mib
        self.spilled = 0
        self._db: SpillFile | None = None
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
            memory_fingerprints=settings.getint("DUPEFILTER_MEMORY_FINGERPRINTS", 100_000),
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
        if self._db is not None and self._db.has(fp):
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

    def _spill(self) -> None:
        if self._db is None:
            self._db = SpillFile(self.cache_mib, self._error)
        self._db.add_all(sorted(self._fingerprints))
        self.spilled += len(self._fingerprints)
        # clear() hands the set's table back; the new set starts small.
        self._fingerprints.clear()

    def _error(self, action: str, exc: sqlite3.Error) -> DupeFilterError:
        return DupeFilterError(
            f"duplicate filter: cannot {action} its temporary database in {temp_dir()} ({exc}); "
            "free space there, point SQLITE_TMPDIR elsewhere, or raise "
            "DUPEFILTER_MEMORY_FINGERPRINTS"
        )
